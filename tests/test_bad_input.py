"""Bad input gets a Python exception that names the file, field or value;
the interpreter never crashes (issue #2)."""

import json
import math
import os
import re
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import save_file
from tiny_checkpoint import TINY_CONFIG, TINY_MANIFEST, tiny_tensors

from swiftspec import CheckpointError, InvalidRequestError
from swiftspec import swiftspec_core as core


def write_checkpoint(path, cfg=TINY_CONFIG, tensors=None):
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors if tensors is not None else tiny_tensors(cfg), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "manifest.json").write_text(json.dumps(TINY_MANIFEST))
    return path


@pytest.fixture
def tiny(tmp_path):
    return write_checkpoint(tmp_path / "tiny")


def test_tiny_checkpoint_loads_and_runs(tiny):
    model = core.load_model(str(tiny))
    logits = model.forward([1, 5, 7], logits="all")
    assert logits.shape == (3, 64) and np.isfinite(logits).all()


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="does-not-exist"):
        core.load_model(str(tmp_path / "does-not-exist"))


def test_missing_manifest(tiny):
    (tiny / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest"):
        core.load_model(str(tiny))


def test_missing_weights_file(tiny):
    (tiny / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        core.load_model(str(tiny))


def test_truncated_file(tiny):
    f = tiny / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*(truncated|past the data section)"):
        core.load_model(str(tiny))


def test_file_shorter_than_header(tiny):
    (tiny / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(CheckpointError, match="truncated"):
        core.load_model(str(tiny))


def test_corrupt_header_json(tiny):
    f = tiny / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"{not json!!!"
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        core.load_model(str(tiny))


def test_header_length_beyond_file(tiny):
    f = tiny / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[:8] = struct.pack("<Q", 10**12)
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="header length"):
        core.load_model(str(tiny))


def test_header_offsets_disagree_with_shape(tiny):
    f = tiny / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    header["model.norm.weight"]["shape"] = [31]  # 124 bytes claimed vs 128 stored
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    assert len(text) == n
    f.write_bytes(raw[:8] + text + raw[8 + n :])
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight.*does not match shape"):
        core.load_model(str(tiny))


def test_wrong_tensor_shape(tmp_path):
    tensors = tiny_tensors(TINY_CONFIG)
    tensors["model.layers.1.self_attn.k_proj.weight"] = np.ones((8, 32), np.float32)
    ckpt = write_checkpoint(tmp_path / "bad", tensors=tensors)
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight.*\[8, 32\].*\[16, 32\]"):
        core.load_model(str(ckpt))


def test_missing_tensor(tmp_path):
    tensors = tiny_tensors(TINY_CONFIG)
    del tensors["model.layers.0.mlp.up_proj.weight"]
    ckpt = write_checkpoint(tmp_path / "bad", tensors=tensors)
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.0\.mlp\.up_proj\.weight'"):
        core.load_model(str(ckpt))


def test_unknown_architecture(tmp_path):
    ckpt = write_checkpoint(tmp_path / "bad", cfg={**TINY_CONFIG, "model_type": "gpt2"})
    with pytest.raises(CheckpointError, match=r"config\.json.*unknown architecture model_type='gpt2'"):
        core.load_model(str(ckpt))


@pytest.mark.parametrize(
    "field,value,pattern",
    [
        ("num_key_value_heads", 3, "multiple of num_key_value_heads"),
        ("hidden_size", 0, "hidden_size' must be > 0"),
        ("vocab_size", "many", "vocab_size' must be an integer"),
        ("max_position_embeddings", 0, "max_position_embeddings' must be > 0, got 0"),
        # was read as bos id 2 (get<int>() wrapped it), the folder loaded
        ("bos_token_id", 2**32 + 2, "bos_token_id' is out of range: 4294967298"),
        ("tie_word_embeddings", "no", 'tie_word_embeddings\' must be true or false, got "no"'),
        ("rms_norm_eps", -1e-6, "rms_norm_eps' must be > 0, got -1e-06"),
    ],
)
def test_invalid_config_fields(tmp_path, field, value, pattern):
    ckpt = write_checkpoint(tmp_path / "bad", cfg={**TINY_CONFIG, field: value}, tensors=tiny_tensors(TINY_CONFIG))
    with pytest.raises(CheckpointError, match=pattern):
        core.load_model(str(ckpt))


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize(
    "scaling,message",
    [
        # issue 28 item 9: these loaded; HF divides by high_freq_factor - low_freq_factor
        ({**LLAMA3, "factor": 0}, "field 'rope_scaling.factor' must be >= 1, got 0"),
        ({**LLAMA3, "factor": -8}, "field 'rope_scaling.factor' must be >= 1, got -8"),
        (
            {**LLAMA3, "high_freq_factor": 1.0},
            "field 'rope_scaling.high_freq_factor' must be greater than low_freq_factor (1), got 1",
        ),
        (
            {**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
            "field 'rope_scaling.high_freq_factor' must be greater than low_freq_factor (4), got 1",
        ),
        (
            {**LLAMA3, "low_freq_factor": 0, "high_freq_factor": 1.0},
            "field 'rope_scaling.low_freq_factor' must be > 0, got 0",
        ),
        (
            {**LLAMA3, "original_max_position_embeddings": 0},
            "field 'rope_scaling.original_max_position_embeddings' must be > 0, got 0",
        ),
        (
            {**LLAMA3, "original_max_position_embeddings": -5},
            "field 'rope_scaling.original_max_position_embeddings' must be > 0, got -5",
        ),
        ({**LLAMA3, "factor": "8"}, "rope_scaling: field 'factor' must be a number, got \"8\""),
        (
            {k: v for k, v in LLAMA3.items() if k != "high_freq_factor"},
            "rope_scaling: missing field 'high_freq_factor'",
        ),
        ({**YARN, "factor": 0.5}, "field 'rope_scaling.factor' must be >= 1, got 0.5"),
        ({k: v for k, v in YARN.items() if k != "factor"}, "rope_scaling: missing field 'factor'"),
        (
            {**YARN, "original_max_position_embeddings": 0},
            "field 'rope_scaling.original_max_position_embeddings' must be > 0, got 0",
        ),
        ({**YARN, "beta_fast": 1, "beta_slow": 2}, "field 'rope_scaling.beta_fast' must be >= beta_slow (2), got 1"),
        ({**YARN, "beta_slow": -1}, "field 'rope_scaling.beta_slow' must be > 0, got -1"),
        ({**YARN, "attention_factor": 0.0}, "field 'rope_scaling.attention_factor' must be > 0, got 0"),
        ({**YARN, "attention_factor": -1.5}, "field 'rope_scaling.attention_factor' must be > 0, got -1.5"),
        # 0.1 * mscale_all_dim * ln 4 + 1 = 0 (up to rounding): HF divides by it
        (
            {**YARN, "mscale": 1.0, "mscale_all_dim": -10 / math.log(4.0)},
            "and 'rope_scaling.mscale_all_dim' (-7.21348) give the attention factor",
        ),
        ({**YARN, "truncate": "yes"}, "rope_scaling: field 'truncate' must be true or false, got \"yes\""),
        ({**YARN, "truncate": [[1]]}, "rope_scaling: field 'truncate' must be true or false, got an array"),
        (
            {**YARN, "rope_type": "longrope"},
            "unsupported rope_scaling type 'longrope' (supported: llama3, yarn, default)",
        ),
        ({**YARN, "partial_rotary_factor": 0.5}, "unsupported partial_rotary_factor 0.5"),
    ],
)
def test_invalid_rope_scaling_is_refused_naming_the_field(tmp_path, scaling, message):
    ckpt = write_checkpoint(
        tmp_path / "bad", cfg={**TINY_CONFIG, "rope_scaling": scaling}, tensors=tiny_tensors(TINY_CONFIG)
    )
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    assert str(info.value).startswith(str(ckpt / "config.json")) and message in str(info.value)
    assert "\n" not in str(info.value)


def test_rope_scaling_of_rope_parameters_is_named_so(tmp_path):
    """transformers 5 nests the scaling in rope_parameters: the error names that key."""
    cfg = {k: v for k, v in TINY_CONFIG.items() if k != "rope_theta"}
    cfg["rope_parameters"] = {**LLAMA3, "rope_theta": 10000.0, "factor": 0.0}
    ckpt = write_checkpoint(tmp_path / "bad", cfg=cfg, tensors=tiny_tensors(TINY_CONFIG))
    with pytest.raises(CheckpointError, match=r"config\.json: field 'rope_parameters\.factor' must be >= 1, got 0"):
        core.load_model(str(ckpt))


@pytest.mark.parametrize(
    "scaling",
    [LLAMA3, YARN, {**YARN, "beta_fast": 0, "beta_slow": None, "truncate": None}, {"rope_type": "yarn", "factor": 2.0}],
)
def test_valid_rope_scaling_loads_and_runs(tmp_path, scaling):
    """Both scalings load (YaRN's optional keys null or 0 take HF's defaults; without
    original_max_position_embeddings, max_position_embeddings is the original context, as in HF)."""
    ckpt = write_checkpoint(
        tmp_path / "ok", cfg={**TINY_CONFIG, "rope_scaling": scaling}, tensors=tiny_tensors(TINY_CONFIG)
    )
    model = core.load_model(str(ckpt))
    resolved = model.config["rope_scaling"]
    assert resolved["rope_type"] == scaling["rope_type"]
    assert resolved["original_max_position_embeddings"] == scaling.get("original_max_position_embeddings", 128)
    if scaling["rope_type"] == "yarn":
        assert (resolved["beta_fast"], resolved["beta_slow"]) == (32.0, 1.0)
        assert resolved["truncate"] == ("truncate" not in scaling)
    assert np.isfinite(model.forward([i % 64 for i in range(100)], logits="last")).all()  # 36 past 64


def test_malformed_config_json_names_the_position(tmp_path):
    ckpt = write_checkpoint(tmp_path / "bad", tensors=tiny_tensors(TINY_CONFIG))
    (ckpt / "config.json").write_text('{"model_type": ')
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    assert str(info.value) == (
        f"{ckpt / 'config.json'}: malformed JSON: parse error at line 1, column 16: syntax "
        "error while parsing value - unexpected end of input; expected '[', '{', or a literal"
    )


def test_missing_config_field(tmp_path):
    cfg = dict(TINY_CONFIG)
    del cfg["num_hidden_layers"]
    ckpt = write_checkpoint(tmp_path / "bad", cfg=cfg, tensors=tiny_tensors(TINY_CONFIG))
    with pytest.raises(CheckpointError, match="missing field 'num_hidden_layers'"):
        core.load_model(str(ckpt))


def test_prompt_longer_than_context(tiny):
    opts = core.ModelOptions()
    opts.max_context = 16
    engine = core.Engine(core.load_model(str(tiny), "cpu", opts))
    with pytest.raises(InvalidRequestError, match="exceeds the context of 16 tokens"):
        engine.generate(list(range(1, 15)), max_new_tokens=8)
    model = core.load_model(str(tiny), "cpu", opts)
    with pytest.raises(InvalidRequestError, match="exceed the context of 16 tokens"):
        model.forward(list(range(1, 18)))
    assert model.committed_len == 0
    assert engine.generate([1, 2, 3], max_new_tokens=4)["stats"]["new_tokens"] >= 1


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, r"top_k must be an integer >= 0 \(0: off\), got -1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be > 0"),
        ({"mode": "turbo"}, "mode must be"),
        ({"mode": "serial"}, "needs a draft model"),
    ],
)
def test_invalid_generation_parameters(tiny, kwargs, pattern):
    engine = core.Engine(core.load_model(str(tiny)))
    with pytest.raises(InvalidRequestError, match=pattern):
        engine.generate([1, 2, 3], **kwargs)
    assert len(engine.generate([1, 2, 3], max_new_tokens=3)["tokens"]) == 3


def test_out_of_vocabulary_prompt_token(tiny):
    engine = core.Engine(core.load_model(str(tiny)))
    with pytest.raises(InvalidRequestError, match="token id 64 at index 1"):
        engine.generate([1, 64, 3])
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        engine.generate([])


def test_bad_tree_batch(tiny):
    model = core.load_model(str(tiny))
    with pytest.raises(InvalidRequestError, match="must end with its own slot"):
        model.forward(
            [1, 2], positions=[0, 1], logits="all", tree_slots=[0, 1], attend_offsets=[0, 1, 2], attend_slots=[0, 0]
        )
    with pytest.raises(InvalidRequestError, match="outside the tree KV"):
        model.forward([1], positions=[0], tree_slots=[10**6], attend_offsets=[0, 1], attend_slots=[10**6])
    # Before, the CPU backend ran these (the CUDA one refused the first two): two tokens writing one
    # slot (the result depended on the write order), a token attending a later token's slot, a slot
    # attended twice (weighted twice in the softmax); an offset past attend_slots was read out of bounds.
    tree = dict(positions=[3, 4], logits="all")
    valid = dict(tree_slots=[0, 1], attend_offsets=[0, 1, 3], attend_slots=[0, 0, 1], **tree)
    want = model.forward([4, 5], **valid)
    with pytest.raises(InvalidRequestError, match="tokens 0 and 1 both write tree slot 0"):
        model.forward([4, 5], tree_slots=[0, 0], attend_offsets=[0, 1, 3], attend_slots=[0, 0, 0], **tree)
    with pytest.raises(InvalidRequestError, match="token 0 attends tree slot 1, written by the later token 1"):
        model.forward([4, 5], tree_slots=[0, 1], attend_offsets=[0, 2, 4], attend_slots=[1, 0, 0, 1], **tree)
    with pytest.raises(InvalidRequestError, match="token 1 attends tree slot 0 twice"):
        model.forward([4, 5], tree_slots=[0, 1], attend_offsets=[0, 1, 4], attend_slots=[0, 0, 0, 1], **tree)
    with pytest.raises(InvalidRequestError, match="CSR index.*entry 1 = 100 of 3 slots"):
        model.forward([4, 5], tree_slots=[0, 1], attend_offsets=[0, 100, 3], attend_slots=[0, 0, 1], **tree)
    # the refusals left the model as it was: the valid batch gives the same logits again
    np.testing.assert_array_equal(model.forward([4, 5], **valid), want)


def test_unknown_backend(tiny):
    with pytest.raises(InvalidRequestError, match="backend"):
        core.load_model(str(tiny), "tpu")


def test_cli_version_and_a_closed_stdout(tmp_path):
    """`swiftspec --version` says the version (it was 'the following arguments are required'), and a
    reader that closes stdout early (`swiftspec bench --print-schema | head`) ends the command quietly
    with SIGPIPE's status 141 (it was a BrokenPipeError traceback)."""
    import swiftspec

    done = subprocess.run(
        [sys.executable, "-m", "swiftspec.cli", "--version"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout == f"swiftspec {swiftspec.__version__}\n", done
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader from the start: the first write fails, whatever the timing
    try:
        done = subprocess.run(
            [sys.executable, "-m", "swiftspec.cli", "bench", "--print-schema"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_cli_reports_bad_path_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "swiftspec.cli", "generate", "--target", str(tmp_path / "nope.gguf"), "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "nope.gguf" in proc.stderr and "Traceback" not in proc.stderr


def test_cpp_example_reports_bad_checkpoint(tmp_path):
    from swiftspec.paths import binary

    proc = subprocess.run(
        [str(binary("swiftspec-decode")), "--checkpoint", str(tmp_path / "missing"), "--tokens", "1,2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "missing" in proc.stderr


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--tree-budget", "0", "hi"], "--tree-budget must be >= 1, got 0"),
        (["--max-new-tokens", "-5", "hi"], "--max-new-tokens must be >= 1, got -5"),
        (["--top-p", "2", "hi"], "--top-p must be in (0, 1], got 2.0"),
        (["--temperature", "nan", "hi"], "--temperature must be a finite number >= 0, got nan"),
        # the checks Engine.generate and swiftspec bench share (swiftspec.sampling_params): these were
        # the engine's, after loading (seed: "seed must be at least 0"), or passed (a denormal temperature)
        (["--seed", "-1", "hi"], "--seed must be an integer >= 0, got -1"),
        (["--top-k", "-1", "hi"], "--top-k must be an integer >= 0 (0: off), got -1"),
        (
            ["--temperature", "1e-40", "hi"],
            "--temperature must be 0 (greedy decoding) or at least 1.1754944e-38 (the "
            "runtime samples in float32), got 1e-40",
        ),
        (
            ["--max-context", "4096", "--max-new-tokens", "5000", "hi"],
            "--max-new-tokens 5000 does not fit in --max-context 4096 (the prompt needs room too)",
        ),
        # sampling options without --temperature ran greedy decoding silently (bench refused them)
        (
            ["--top-p", "0.9", "hi"],
            "swiftspec generate: error: --top-p 0.9 has no effect under greedy decoding "
            "(--temperature 0); give --temperature > 0 to sample, or drop it\n",
        ),
        (
            ["--top-k", "40", "hi"],
            "swiftspec generate: error: --top-k 40 has no effect under greedy decoding "
            "(--temperature 0); give --temperature > 0 to sample, or drop it\n",
        ),
        (
            ["--temperature", "0", "--top-p", "1", "--top-k", "5", "--seed", "3", "hi"],
            "--top-p 1.0, --top-k 5, --seed 3 have no effect under greedy decoding (--temperature 0); give --temperature > 0 "
            "to sample, or drop them\n",
        ),
        (["   "], "the prompt is empty"),
        (["--stop", "x", "--stop", "", "hi"], "swiftspec generate: error: --stop must be a non-empty string, got ''\n"),
        (
            ["--placement", '{"target": {"megakernel": "yes"}}', "hi"],
            "--placement: placement.target.megakernel must be true or false",
        ),
        # the parser's position and reason, without nlohmann's "[json.exception.parse_error.101] "
        (
            ["--placement", "{not json", "hi"],
            "swiftspec generate: error: --placement: placement is not valid JSON: parse "
            "error at line 1, column 3: syntax error while parsing object key - invalid literal; last read: '{no'; expected "
            "string literal\n",
        ),
        (["--placement", "no-such-file.json", "hi"], "--placement: placement 'no-such-file.json' is neither 'auto'"),
        (
            ["--placement", '{"target": {"megakernel": true}}', "hi"],
            "--placement: placement.target.megakernel applies to the cuda backend only (add --backend cuda",
        ),
        (
            ["--placement", '{"draft": {"sm_partition": [0, 16]}, "target": {"devices": [0]}}', "hi"],
            "--placement: placement.draft.sm_partition, placement.target.devices applies to the cuda backend only",
        ),
        # before: the draft was loaded and speculated with, --no-draft ignored
        (
            ["--draft", "d", "--no-draft", "hi"],
            "swiftspec generate: error: --no-draft and --draft contradict each other: give one of them\n",
        ),
        # before: GGUF / reference models were converted to int4 (minutes), then the backend refused them
        (
            ["--dtype", "int4", "--backend", "cuda", "--placement", '{"target": {"megakernel": true}}', "hi"],
            "swiftspec generate: error: --dtype int4: placement.target.megakernel: int4 weights run on the cuda "
            "backend's layered step; the decode megakernel streams bf16 weights (issue 31): drop megakernel, or "
            "use bfloat16 weights\n",
        ),
        (
            ["--dtype", "int4", "--backend", "cuda", "--placement", '{"target": {"tp": 2}}', "hi"],
            "swiftspec generate: error: --dtype int4: placement.target.tp 2: int4 weights run on one GPU",
        ),
    ],
)
def test_cli_generate_names_the_flag_before_loading(tmp_path, extra, message):
    """Bad generate options fail at once (a missing --target is never opened) naming the flag."""
    proc = subprocess.run(
        [sys.executable, "-m", "swiftspec.cli", "generate", "--target", str(tmp_path / "never-loaded"), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert "never-loaded" not in proc.stderr


@pytest.mark.parametrize(
    "backend,placement,message",
    [
        (
            "cuda",
            {"draft": {"megakernel": True}},
            "dtype='int4': placement.draft.megakernel: int4 weights run on the cuda backend's layered step; the "
            "decode megakernel streams bf16 weights (issue 31): drop megakernel, or use bfloat16 weights",
        ),
        (
            "cuda",
            {"target": {"tp": 2, "devices": [0, 1]}},
            "dtype='int4': placement.target.tp 2: int4 weights run on one GPU on the cuda backend; the "
            "tensor-parallel GEMMs read bf16 weights (issue 31): use tp 1, bfloat16 weights, or the cpu backend",
        ),
        ("tpu", None, "dtype='int4' runs on the cpu and cuda backends, not 'tpu'"),
    ],
)
def test_engine_int4_with_what_the_backend_cannot_run_is_refused_before_converting(
    tmp_path, backend, placement, message
):
    """Engine(dtype="int4") with a placement the cuda backend cannot run int4 weights with (the decode
    megakernel, tp > 1), or on another backend: refused before the model is looked at (a GGUF file or
    reference name would otherwise be converted to int4, minutes, and then refused by the backend)."""
    from swiftspec import Engine

    with pytest.raises(InvalidRequestError) as err:
        Engine(tmp_path / "never-converted.gguf", backend=backend, dtype="int4", placement=placement)
    assert str(err.value) == message
    assert not (tmp_path / "never-converted.gguf").exists()


@pytest.mark.parametrize(
    "argv,usage,message",
    [
        # an option's value ("10") was taken as the prompt and the top-level parser named the rest
        (
            ["generate", "--max-tokens", "10", "Write a Python function"],
            "usage: swiftspec generate ",
            "swiftspec generate: error: unrecognized arguments: --max-tokens (did you mean --max-new-tokens?)\n",
        ),
        (
            ["generate", "--max-tokens=10", "hi"],
            "usage: swiftspec generate ",
            "swiftspec generate: error: unrecognized arguments: --max-tokens=10 (did you mean --max-new-tokens?)\n",
        ),
        (
            ["generate", "--frobnicate", "hi"],
            "usage: swiftspec generate ",
            "swiftspec generate: error: unrecognized arguments: --frobnicate\n",
        ),
        (
            ["generate", "one", "two"],
            "usage: swiftspec generate ",
            "swiftspec generate: error: unrecognized arguments: two\n",
        ),
        (
            ["bench", "--num-promts", "3"],
            "usage: swiftspec bench ",
            "swiftspec bench: error: unrecognized arguments: --num-promts (did you mean --num-prompts?)\n",
        ),
        # abbreviations are not expanded (argparse would read --temp as --temperature)
        (
            ["generate", "--temp", "0.5", "hi"],
            "usage: swiftspec generate ",
            "swiftspec generate: error: unrecognized arguments: --temp (did you mean --temperature?)\n",
        ),
        (
            ["bench", "--num-prompt", "3"],
            "usage: swiftspec bench ",
            "swiftspec bench: error: unrecognized arguments: --num-prompt (did you mean --num-prompts?)\n",
        ),
        (
            ["generate", "--t", "x", "hi"],
            "usage: swiftspec generate ",
            "swiftspec generate: error: unrecognized arguments: --t (did you mean one of --target, --temperature, "
            "--threads, --top-k, --top-p, --tree-budget?)\n",
        ),
    ],
)
def test_cli_unknown_options_are_named_by_the_subcommand(capsys, argv, usage, message):
    """An unknown option is reported by the subcommand's parser (its usage, not swiftspec's), by
    name, with the closest option when one is close; nothing is loaded."""
    from swiftspec.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and err.endswith(message), err
    assert "usage: swiftspec [-h] COMMAND" not in err


def test_cli_generate_sampling_options_with_a_temperature():
    """With --temperature > 0 the sampling options pass; the ones not given get their defaults."""
    from swiftspec.cli import build_parser
    from swiftspec.cli.generate import check_options

    args = build_parser().parse_args(["generate", "--temperature", "0.7", "--top-p", "0.9", "hi"])
    check_options(args)
    assert (args.temperature, args.top_p, args.top_k, args.seed) == (0.7, 0.9, 0, 0)
    args = build_parser().parse_args(["generate", "hi"])
    check_options(args)
    assert (args.temperature, args.top_p, args.top_k, args.seed) == (0.0, 1.0, 0, 0)


def test_cpp_example_help():
    from swiftspec.paths import binary

    proc = subprocess.run([str(binary("swiftspec-decode")), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage: swiftspec-decode --checkpoint DIR" in proc.stdout
    assert "--mode target|serial|async" in proc.stdout


def test_cli_generate_cpu_placement_and_an_ignored_draft_group(checkpoint_dir):
    """--placement on the cpu backend places the target on the cores it names; a draft group
    placed without a draft model is reported, not silently dropped."""
    target = checkpoint_dir("qwen2.5-coder-0.5b-instruct", "bfloat16")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swiftspec.cli",
            "generate",
            "--target",
            str(target),
            "--max-new-tokens",
            "2",
            "--json",
            "--placement",
            '{"target": {"cores": [[0]]}, "draft": {"cores": [[0]]}}',
            "Say hi",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--placement: the draft group is ignored: no draft model is loaded" in proc.stderr
    assert len(json.loads(proc.stdout)["token_ids"]) == 2


@pytest.mark.parametrize("mode,loads_draft", [(["--mode", "target"], False), ([], True), (["--mode", "async"], True)])
def test_cli_generate_loads_the_reference_draft_only_to_use_it(monkeypatch, capsys, mode, loads_draft):
    """Target-only decoding of the reference pair does not load the reference draft (a new
    user's `--mode target` used to load it for nothing); speculative modes do."""
    import swiftspec.engine
    from swiftspec.cli import main
    from swiftspec.fetch import DEFAULT_PAIR

    seen = {}

    class StopBeforeLoading:
        def __init__(self, target, draft=None, **kwargs):
            seen.update(target=target, draft=draft)
            raise InvalidRequestError("stopped before loading")

    monkeypatch.setattr(swiftspec.engine, "Engine", StopBeforeLoading)
    assert main(["generate", *mode, "hi"]) == 2
    assert seen["target"] == DEFAULT_PAIR["target"]
    assert seen["draft"] == (DEFAULT_PAIR["draft"] if loads_draft else None)
    err = capsys.readouterr().err
    assert ("and draft" in err) == loads_draft and "weights where converted" not in err
    # a --dtype other than bf16 is said on the loading line (an int4 run looked like a bf16 one)
    assert main(["generate", *mode, "--dtype", "int4", "hi"]) == 2
    assert "(int4 weights where converted)\n" in capsys.readouterr().err


@pytest.mark.parametrize(
    "streamed,stdout",
    [
        (["Check if", " a number"], "Check if a number\n"),  # was glued: "Check if a numberswiftspec generate: ..."
        (["def f():\n"], "def f():\n"),  # already at a line start: no empty line
        ([], ""),  # nothing streamed yet (e.g. during prefill)
    ],
)
def test_cli_generate_interrupted_ends_the_streamed_line(monkeypatch, capsys, streamed, stdout):
    """Ctrl-C during a streamed generate: the streamed text gets its line end before
    "interrupted" is reported, which stays on a line of its own."""
    import swiftspec.engine
    from swiftspec.cli import main

    class InterruptedEngine:
        def __init__(self, target, draft=None, **kwargs):
            pass

        def generate(self, request, on_text=None, **kwargs):
            for piece in streamed:
                on_text(piece)
            raise KeyboardInterrupt

    monkeypatch.setattr(swiftspec.engine, "Engine", InterruptedEngine)
    assert main(["generate", "--target", "t", "hi"]) == 130
    out = capsys.readouterr()
    assert out.out == stdout
    assert out.err.endswith("\nswiftspec generate: interrupted\n")


# ------------------------------------------- found by an adversarial pass (2026-11-30)
SMALL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def small_pair(checkpoint_dir):
    import swiftspec

    small = checkpoint_dir(SMALL, "bfloat16")
    return swiftspec.Engine(small, small, max_context=256)


def test_a_callback_that_reenters_the_model_gets_an_error_not_a_crash(small_pair):
    """A model runs one request at a time: its KV cache is the request's state. Calling into it
    (directly, or through a second engine made over the same models) from inside a request used
    to corrupt it (segfaults in threads); now the call is refused by name and nothing breaks."""
    e = small_pair
    with pytest.raises(InvalidRequestError, match="the model is in use by another request"):
        e.generate("hi", max_new_tokens=4, on_text=lambda d: e.target_model.forward([1, 2]))
    other = core.Engine(e.target_model, e.draft_model)
    with pytest.raises(InvalidRequestError, match="the model is in use by another request"):
        e.generate("hi", max_new_tokens=4, on_text=lambda d: other.generate([1, 2, 3], max_new_tokens=2))
    with pytest.raises(InvalidRequestError, match="called from a callback of a request running on this engine"):
        e.generate("hi", max_new_tokens=4, on_text=lambda d: e.generate("x", max_new_tokens=2))
    first = e.generate("def f(x):", max_new_tokens=4, mode="target").token_ids
    assert first == other.generate(e.encode_prompt("def f(x):"), max_new_tokens=4)["tokens"]


def test_two_threads_on_shared_models_never_crash(small_pair):
    """Two engines over the same models, driven from two threads: every call either completes
    with the target's own tokens or is refused as busy (before: a segfault 6 runs out of 6)."""
    import threading

    e = small_pair
    other = core.Engine(e.target_model, e.draft_model)
    prompt = e.encode_prompt("def add(a, b):")
    want = e.generate(prompt, max_new_tokens=8, mode="target").token_ids
    outcomes = []

    def run(fn):
        for _ in range(5):
            try:
                outcomes.append(("ok", fn()))
            except InvalidRequestError as exc:
                outcomes.append(("busy", str(exc)))

    threads = [
        threading.Thread(target=run, args=(lambda: e.generate(prompt, max_new_tokens=8, mode="target").token_ids,)),
        threading.Thread(target=run, args=(lambda: other.generate(prompt, max_new_tokens=8)["tokens"],)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(outcomes) == 10
    for kind, value in outcomes:
        assert value == want if kind == "ok" else "in use by another request" in value


@pytest.mark.parametrize(
    "prompt,needle",
    [
        (b"hello", "prompt is bytes"),
        (bytearray(b"\xff\xfe"), "prompt is bytes"),
        ("a\udcff b", "the prompt is not valid text"),
        ([{"role": "user", "content": "caf\udce9"}], "the content of message 0 is not valid text"),
    ],
)
def test_bytes_and_undecodable_prompts_are_refused(small_pair, prompt, needle):
    with pytest.raises(InvalidRequestError, match=needle):
        small_pair.generate(prompt, max_new_tokens=2)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"max_new_tokens": 2**40}, "max_new_tokens must be at most 2147483647"),
        ({"top_k": 2**40}, "top_k must be at most"),
        ({"seed": 2**64}, "seed must be at most 18446744073709551615"),
        ({"temperature": 1e300}, "temperature must be at most 3.403e+38"),
        ({"mode": "async", "async_options": {"bogus": 1}}, "async_options: unknown option"),
        ({"mode": "serial", "async_options": {"growth_depth": 2}}, "async_options apply to mode='async' only"),
    ],
)
def test_out_of_range_parameters_are_named(small_pair, kwargs, needle):
    with pytest.raises(InvalidRequestError, match=re.escape(needle)):
        small_pair.generate("hi", **kwargs)


def test_a_tiny_top_p_keeps_the_most_likely_token(small_pair):
    """top_p below float32's smallest normal number used to round to 0 and be refused; the nucleus
    is the most likely token alone, so sampling equals greedy decoding."""
    greedy = small_pair.generate("def f(x):", max_new_tokens=6, mode="target").token_ids
    assert (
        small_pair.generate(
            "def f(x):", max_new_tokens=6, mode="target", temperature=1.0, top_p=1e-60, seed=3
        ).token_ids
        == greedy
    )


def test_numpy_sampling_parameters_are_numbers(small_pair):
    """A numpy float temperature / top_p was refused as "temperature must be a number, got
    np.float32(0.7)" (numpy integers were taken for top_k and seed); the request samples as with the
    Python float. The top_p message names the value given (the runtime showed 1.0000001 as 1.000000)."""
    want = small_pair.generate(
        "def f(x):", max_new_tokens=6, mode="target", temperature=0.5, top_p=0.75, seed=4
    ).token_ids
    got = small_pair.generate(
        "def f(x):",
        max_new_tokens=6,
        mode="target",
        temperature=np.float32(0.5),
        top_p=np.float64(0.75),
        seed=np.uint64(4),
    ).token_ids
    assert got == want
    with pytest.raises(InvalidRequestError) as info:
        small_pair.generate("hi", max_new_tokens=2, temperature=1.0, top_p=1.0000001)
    assert str(info.value) == "top_p must be in (0, 1], got 1.0000001"
    with pytest.raises(InvalidRequestError) as info:
        small_pair.generate("hi", max_new_tokens=2, temperature="0.5")
    assert str(info.value) == "temperature must be a number, got '0.5'"


def test_generate_refuses_top_p_and_top_k_under_greedy_decoding(small_pair):
    """top_p / top_k with temperature 0 were ignored silently (greedy decoding ran); they are refused
    by name, as swiftspec generate and swiftspec serve do. A seed under greedy decoding is accepted
    and changes nothing."""
    with pytest.raises(InvalidRequestError) as info:
        small_pair.generate("hi", max_new_tokens=2, top_p=0.9)
    assert str(info.value) == (
        "top_p=0.9 has no effect under greedy decoding (temperature 0); give temperature > 0 to sample, or drop it"
    )
    with pytest.raises(InvalidRequestError) as info:
        small_pair.generate("hi", max_new_tokens=2, temperature=0, top_k=40, top_p=0.5)
    assert str(info.value) == (
        "top_p=0.5, top_k=40 have no effect under greedy decoding (temperature 0); give "
        "temperature > 0 to sample, or drop them"
    )
    greedy = small_pair.generate("def f(x):", max_new_tokens=4, mode="target").token_ids
    assert small_pair.generate("def f(x):", max_new_tokens=4, mode="target", seed=7).token_ids == greedy


@pytest.mark.parametrize(
    "kwargs,message",
    [
        # a temperature float32 holds as a denormal: the engine ran it (logits / T overflow), bench refused it
        (
            dict(temperature=1e-40),
            "temperature must be 0 (greedy decoding) or at least 1.1754944e-38 (the runtime "
            "samples in float32), got 1e-40",
        ),
        (dict(temperature=1.0, top_k=-1), "top_k must be an integer >= 0 (0: off), got -1"),
        (dict(temperature=1.0, top_k=2.0), "top_k must be an integer >= 0 (0: off), got 2.0"),
        (
            dict(temperature=1.0, top_k=2**31),
            "top_k must be at most 2147483647 (a 32-bit count; any top-k of at least "
            "the vocabulary keeps every token), got 2147483648",
        ),
        (dict(temperature=1.0, seed=-1), "seed must be an integer >= 0, got -1"),
        (
            dict(temperature=1.0, seed=2**64),
            "seed must be at most 18446744073709551615 (a 64-bit seed), got 18446744073709551616",
        ),
        (dict(temperature=float("inf")), "temperature must be a finite number >= 0, got inf"),
        (dict(temperature=1e300), "temperature must be at most 3.403e+38 (the runtime samples in float32), got 1e+300"),
    ],
)
def test_engine_and_bench_refuse_the_same_sampling_parameters(small_pair, kwargs, message):
    """Engine.generate and swiftspec bench's check_sampling check the sampling parameters with one
    validator (swiftspec.sampling_params): the same values are refused, with the same message up to
    the bench's notes on each option's off value."""
    from swiftspec.bench.config import BenchConfigError, check_sampling

    with pytest.raises(InvalidRequestError) as info:
        small_pair.generate("hi", max_new_tokens=2, **kwargs)
    assert str(info.value) == message
    with pytest.raises(BenchConfigError) as info:
        check_sampling(**kwargs)
    assert str(info.value) in (
        message,
        message.replace(">= 0,", ">= 0 (0: greedy decoding),"),
        message.replace("(a 64-bit", "(request i of a data set samples with seed + i, a 64-bit"),
    )


@pytest.mark.parametrize(
    "messages,message",
    [
        (
            [{"role": "usr", "content": "hi"}],
            "messages[0] has the role 'usr', which the chat template of {source} does "
            "not take (roles: system, user, assistant)",
        ),
        (
            [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}],
            "messages[1] has the role 'tool', which the chat template of {source} does not take (roles: system, user, "
            "assistant)",
        ),  # SmolLM2's template names no tool role
        ([{"role": "user"}], "messages[0] has no 'content'; a message needs a string 'content'"),
        ([{"role": "user", "content": ["hi"]}], "messages[0] needs a string 'content', got list"),
    ],
)
def test_bad_chat_messages_are_named(small_pair, messages, message):
    """An unknown chat role ran (the template rendered it as is, or dropped the message); it is
    refused naming the message and the role, as is a message without string content."""
    with pytest.raises(InvalidRequestError) as info:
        small_pair.generate(messages, max_new_tokens=2)
    assert str(info.value) == message.format(source=small_pair.tokenizer.source)


def test_numpy_token_ids_are_a_prompt(small_pair):
    ids = small_pair.encode_prompt("def f(x):")
    assert (
        small_pair.generate(np.array(ids), max_new_tokens=4, mode="target").token_ids
        == small_pair.generate(ids, max_new_tokens=4, mode="target").token_ids
    )


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"max_context": 1.5}, "max_context must be an integer, got 1.5"),
        ({"max_context": "64"}, "max_context must be an integer, got '64'"),
        ({"num_threads": 100000}, "num_threads must be at most"),
        ({"placement": {"target": {"tp": 1000}}}, "tp (TP degree) 1000 exceeds the model's 9 attention heads"),
        ({"placement": {"target": {"tp": True}}}, "placement.target.tp must be an integer, got true"),
        ({"placement": {"target": {"tp": 1.5}}}, "placement.target.tp must be an integer, got 1.5"),
        ({"placement": {"target": {"threads_per_rank": 100000}}}, "placement.target.threads_per_rank must be at most"),
    ],
)
def test_engine_options_are_checked_before_any_thread_or_buffer(checkpoint_dir, kwargs, needle):
    """Before: 100000 threads aborted the process, tp 1000 was killed out of memory, 1.5 became 1."""
    import swiftspec

    small = checkpoint_dir(SMALL, "bfloat16")
    with pytest.raises(InvalidRequestError, match=re.escape(needle)):
        swiftspec.Engine(small, **kwargs)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("hidden_act", "gelu", 'unsupported hidden_act "gelu"'),
        ("mlp_bias", True, "unsupported mlp_bias = true"),
        ("use_sliding_window", True, "unsupported use_sliding_window = true"),
        ("vocab_size", 2**32 + 64, "field 'vocab_size' is out of range"),
    ],
)
def test_config_settings_the_runtime_does_not_implement_are_refused(tmp_path, field, value, needle):
    """Accepted and ignored before: a silently different model."""
    ckpt = write_checkpoint(tmp_path / "bad", cfg={**TINY_CONFIG, field: value}, tensors=tiny_tensors(TINY_CONFIG))
    with pytest.raises(CheckpointError, match=re.escape(needle)):
        core.load_model(str(ckpt))


def test_config_with_fewer_layers_than_the_weights_is_refused(tmp_path):
    ckpt = write_checkpoint(
        tmp_path / "bad", cfg={**TINY_CONFIG, "num_hidden_layers": 1}, tensors=tiny_tensors(TINY_CONFIG)
    )
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'model\.layers\.1\..*' belongs to layer 1, but config\.json says "
        r"num_hidden_layers = 1",
    ):
        core.load_model(str(ckpt))


def test_undecodable_bytes_in_a_safetensors_header_give_a_checkpoint_error(tiny):
    """The error text quotes the header; bytes that are not UTF-8 used to turn it into a
    UnicodeDecodeError (a traceback in the CLI)."""
    (tiny / "model.safetensors").write_bytes(struct.pack("<Q", 16) + b"\xff" * 16 + b"\0" * 100)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        core.load_model(str(tiny))


def test_a_closed_engine_refuses_requests(checkpoint_dir):
    import swiftspec

    small = checkpoint_dir(SMALL, "bfloat16")
    with swiftspec.Engine(small, max_context=64) as engine:
        assert len(engine.generate("hi", max_new_tokens=2).token_ids) == 2
    with pytest.raises(InvalidRequestError, match="the engine is closed"):
        engine.generate("hi", max_new_tokens=2)
    engine.close()  # idempotent


def test_a_placement_with_a_value_json_cannot_hold(checkpoint_dir):
    import swiftspec

    with pytest.raises(InvalidRequestError, match="placement must hold JSON values"):
        swiftspec.Engine(checkpoint_dir(SMALL, "bfloat16"), placement={"target": {"cores": {0, 1}}})


@pytest.mark.parametrize(
    "kwargs", [{}, {"temperature": 1.0, "seed": 3}, {"mode": "serial", "temperature": 1.0}, {"mode": "serial"}]
)
def test_nan_weights_raise_instead_of_a_silently_wrong_answer(tmp_path, kwargs):
    """A NaN in the weights used to give token 0 ('' with finish 'stop') greedily, or blame the
    request in stochastic verification; every decode path now stops with an error naming it
    (greedy ones read the logits through Model.forward_top_k, which checks every row)."""
    from swiftspec import SwiftspecError

    tensors = tiny_tensors(TINY_CONFIG)
    tensors["model.norm.weight"][3] = np.nan
    ckpt = write_checkpoint(tmp_path / "nan", tensors=tensors)
    model = core.load_model(str(ckpt))
    engine = core.Engine(model, core.load_model(str(ckpt)) if kwargs.get("mode") == "serial" else None)
    with pytest.raises(SwiftspecError, match="the model produced NaN logits") as info:
        engine.generate([1, 2, 3], max_new_tokens=4, **kwargs)
    assert not isinstance(info.value, InvalidRequestError)  # the request is not at fault
    model.truncate_committed(0)
    with pytest.raises(SwiftspecError, match="the model produced NaN logits"):
        model.forward_top_k([1, 2, 3], 2, log_normalizer=True, logits="all")


# ------------------------------------ max_position_embeddings bounds max_context (2026-12-01)
def test_max_context_beyond_max_position_embeddings_is_refused(tiny):
    """Accepted silently before: positions the model was never trained for. The default
    context is the model's limit (here 128)."""
    opts = core.ModelOptions()
    opts.max_context = 129
    with pytest.raises(
        InvalidRequestError,
        match=re.escape(f"max_context 129 exceeds the model's max_position_embeddings 128 ({tiny / 'config.json'})"),
    ):
        core.load_model(str(tiny), "cpu", opts)
    opts.max_context = 128
    assert core.load_model(str(tiny), "cpu", opts).max_context == 128
    assert core.ModelOptions().max_context == 0  # the model's default
    model = core.load_model(str(tiny))
    assert model.max_context == 128
    assert len(core.Engine(model).generate([5] * 120, max_new_tokens=8)["tokens"]) == 8


def linked_variant(src, out, **json_files):
    """A checkpoint folder `out` whose files link to `src`'s, except the JSON files given (name ->
    dict of fields replacing those of src's file)."""
    out.mkdir()
    for f in src.iterdir():
        if f.name not in json_files:
            (out / f.name).symlink_to(f)
    for name, fields in json_files.items():
        (out / name).write_text(json.dumps({**json.loads((src / name).read_text()), **fields}))
    return out


@pytest.fixture
def small_limited(checkpoint_dir, tmp_path):
    """The small model with config.json saying max_position_embeddings 1024 (other files linked)."""
    small = checkpoint_dir(SMALL, "bfloat16")
    assert json.loads((small / "config.json").read_text())["max_position_embeddings"] == 8192
    return small, linked_variant(small, tmp_path / "small-1024", **{"config.json": {"max_position_embeddings": 1024}})


@pytest.mark.filterwarnings("ignore:placement. the draft group is ignored")  # (the target-only Engine below)
@pytest.mark.parametrize("placement", [None, {"target": {"cores": [[0]]}, "draft": {"tp": 3}}])
def test_engine_max_context_is_checked_for_the_target_and_the_draft(small_limited, placement):
    import swiftspec

    small, limited = small_limited
    with pytest.raises(
        InvalidRequestError,
        match=re.escape(f"max_context 9000 exceeds the model's max_position_embeddings 8192 ({small / 'config.json'})"),
    ):
        swiftspec.Engine(small, max_context=9000, placement=placement)
    with pytest.raises(
        InvalidRequestError,
        match=re.escape(
            f"max_context 2000 exceeds the model's max_position_embeddings 1024 ({limited / 'config.json'})"
        ),
    ):
        swiftspec.Engine(small, limited, max_context=2000, placement=placement)
    with swiftspec.Engine(small, limited, placement=placement) as engine:  # default: each model's
        assert engine.target_model.max_context == 8192 and engine.draft_model.max_context == 1024
        with pytest.raises(InvalidRequestError, match="exceeds the context of 1024 tokens"):
            engine.generate([1] * 1000, max_new_tokens=30, mode="serial")
        assert len(engine.generate([1] * 1000, max_new_tokens=30, mode="target").token_ids) == 30


# ------------------------------ an end-of-generation id outside the vocabulary (2026-12-01)
@pytest.mark.parametrize(
    "file,value,needle",
    [
        ("generation_config.json", [2, 99999], "eos_token_id 99999 is outside the vocabulary [0, 49152)"),
        ("generation_config.json", 49152, "eos_token_id 49152 is outside the vocabulary [0, 49152)"),
        ("generation_config.json", -1, "eos_token_id -1 is outside the vocabulary [0, 49152)"),
        ("generation_config.json", [2, "0"], 'eos_token_id must be an integer or a list of integers, got [2, "0"]'),
        ("config.json", [2, 60000], "eos_token_id 60000 is outside the vocabulary [0, 49152)"),
    ],
)
def test_an_out_of_vocabulary_eos_id_is_reported_when_the_engine_loads(checkpoint_dir, tmp_path, file, value, needle):
    """Before: the engine loaded, and every request failed with 'stop token id 99999 is outside
    the vocabulary' (the file never named). Now loading fails with the file, the id and the size."""
    import swiftspec
    from swiftspec.tokenizer import Tokenizer

    bad = linked_variant(checkpoint_dir(SMALL, "bfloat16"), tmp_path / "bad-eos", **{file: {"eos_token_id": value}})
    for load in (lambda: swiftspec.Engine(bad, max_context=64), lambda: Tokenizer.from_checkpoint(bad)):
        with pytest.raises(CheckpointError, match=re.escape(f"{bad / file}: {needle}")):
            load()
    good = linked_variant(checkpoint_dir(SMALL, "bfloat16"), tmp_path / "null-eos", **{file: {"eos_token_id": None}})
    with swiftspec.Engine(good, max_context=64) as engine:  # absent or null: no ids from that file
        assert len(engine.generate("hi", max_new_tokens=2).token_ids) >= 1


@pytest.mark.parametrize(
    "value,shown", [(2**32 + 2, 2**32 + 2), ([2, 2**32 + 3], 2**32 + 3), (-(2**32) + 2, -(2**32) + 2), (2**63, 2**63)]
)
def test_an_eos_id_beyond_int32_in_config_json_is_refused_not_wrapped(tmp_path, value, shown):
    """The runtime's own config.json reader (core.load_model, the C++ API, whose stop ids these are)
    read eos_token_id 2^32 + 2 as the id 2 (a real token: generation would stop on it) and loaded."""
    ckpt = write_checkpoint(
        tmp_path / "bad", cfg={**TINY_CONFIG, "eos_token_id": value}, tensors=tiny_tensors(TINY_CONFIG)
    )
    with pytest.raises(CheckpointError, match=re.escape(f"eos_token_id {shown} is outside the vocabulary [0, 64)")):
        core.load_model(str(ckpt))


# ------------------------- the low-level speculative objects run one call at a time (2026-12-01)
@pytest.fixture(scope="module")
def qwen_small_model(checkpoint_dir):
    opts = core.ModelOptions()
    opts.max_context, opts.max_tree = 1024, 64
    return core.load_model(str(checkpoint_dir("qwen2.5-coder-0.5b-instruct", "bfloat16")), "cpu", opts)


def while_running(call, checks):
    """Runs `call` on a thread (a prefill of a few seconds, the GIL released inside) and, while it
    runs, each of `checks` (callable, message) on this thread: each must raise InvalidRequestError
    containing its message. Before: no error (and state corrupted under the running call, or a crash)."""
    errors = []

    def run():
        try:
            call()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        # Wait until the call holds its object (the first check refuses), not a fixed time: on a
        # loaded machine the worker may take longer than any fixed delay to enter the call.
        first, first_message = checks[0]
        deadline = time.monotonic() + 30
        while worker.is_alive() and time.monotonic() < deadline:
            try:
                first()
            except InvalidRequestError as exc:  # another refusal: the call has not started yet
                if first_message in str(exc):
                    break
            time.sleep(0.02)
        for check, message in checks:
            with pytest.raises(InvalidRequestError, match=re.escape(message)):
                check()
        assert worker.is_alive(), "the long call ended before the checks: they did not run beside it"
    finally:
        worker.join()
    assert not errors, errors


LONG_IDS = [(i * 7919) % 30000 + 100 for i in range(300)]


def test_a_tree_kv_cache_refuses_a_second_thread(qwen_small_model):
    model = qwen_small_model
    cache = core.spec.TreeKvCache(model)
    tree = core.spec.TokenTree(5)
    busy = "the TreeKvCache is in use by another call (a TreeKvCache runs one call at a time: give each thread its own)"
    model.truncate_committed(0)
    while_running(
        lambda: cache.prefill(LONG_IDS, logits="none"),
        [
            (lambda: cache.slot(0), busy),
            (lambda: cache.pending_tokens, busy),
            (lambda: cache.clear(), busy),
            (lambda: cache.forward_nodes(tree, [0]), busy),
            (lambda: cache.prefill([1, 2]), busy),
            (lambda: core.spec.TreeKvCache(model).prefill([1, 2]), "the model is in use by another request"),
            (lambda: model.forward([1, 2]), "the model is in use by another request"),
        ],
    )
    assert model.committed_len == len(LONG_IDS) and cache.free_slots == 64  # the one call went through whole
    row0, logits = cache.forward_nodes(tree, [0])
    assert row0 == 0 and logits.shape == (1, model.config["vocab_size"])


def test_a_draft_tree_and_a_tree_verifier_refuse_a_second_thread(qwen_small_model):
    model = qwen_small_model
    drafter = core.spec.DraftTree(model, tree_budget=8)
    busy = "the DraftTree is in use by another call (a DraftTree runs one call at a time: give each thread its own)"
    while_running(
        lambda: drafter.start(LONG_IDS, 7),
        [
            (lambda: drafter.tree, busy),
            (lambda: drafter.can_grow(4), busy),
            (lambda: drafter.grow_step(4), busy),
            (lambda: drafter.advance([], 9), busy),
            (lambda: drafter.cache.free_slots, "the TreeKvCache is in use"),  # its own cache, handed out
            (lambda: model.forward([1, 2]), "the model is in use by another request"),
        ],
    )
    drafter.grow_to(8, 4)
    tree, to_draft = drafter.select(8, 4)
    assert len(tree) == 9
    model.truncate_committed(0)

    verifier = core.spec.TreeVerifier(model)
    busy = "the TreeVerifier is in use by another call"
    while_running(
        lambda: verifier.start(LONG_IDS),
        [
            (lambda: verifier.steps, busy),
            (lambda: verifier.verify(tree), busy),
            (lambda: drafter.grow_step(4), "the model is in use by another request"),  # both drive the model
        ],
    )
    assert verifier.verify(tree)["bonus_token"] >= 0 and verifier.steps == 1


def test_forward_top_k_refuses_a_second_thread_and_changes_nothing(qwen_small_model):
    """Model.forward_top_k holds the model like forward(): a second thread's call, either way round,
    gets InvalidRequestError and leaves the committed KV as the running call makes it."""
    model = qwen_small_model
    busy = "the model is in use by another request"
    model.truncate_committed(0)
    while_running(
        lambda: model.forward(LONG_IDS, logits="none"),
        [
            (lambda: model.forward_top_k([1, 2], 1), busy),
            (lambda: model.forward_top_k([1, 2], 0), busy),  # refused before k is looked at
        ],
    )
    assert model.committed_len == len(LONG_IDS)
    model.truncate_committed(0)
    while_running(
        lambda: model.forward_top_k(LONG_IDS, 4, log_normalizer=True, logits="all"),
        [
            (lambda: model.forward([1, 2]), busy),
            (lambda: model.forward_top_k([1, 2], 1), busy),
            (lambda: model.truncate_committed(0), busy),
        ],
    )
    assert model.committed_len == len(LONG_IDS)
    ids, values, lse = model.forward_top_k([LONG_IDS[0]], 2, log_normalizer=True)
    assert ids.shape == (1, 2) and values[0, 0] >= values[0, 1] and lse[0] >= values[0, 0]
    assert model.committed_len == len(LONG_IDS) + 1


def test_generate_cancel_is_a_public_event(small_pair):
    """Engine.generate(cancel=event) stops a request from another thread (what swiftspec serve
    uses for a client that leaves); before, only the private _cancel existed."""
    e = small_pair
    ready = threading.Event()
    ready.set()
    r = e.generate("def add(a, b):", max_new_tokens=8, mode="target", cancel=ready)
    assert r.finish_reason == "cancelled" and r.token_ids == [] and r.text == ""
    cancel, pieces = threading.Event(), []

    def on_text(delta):  # the first text: another thread sets the event
        pieces.append(delta)
        if len(pieces) == 1:
            t = threading.Thread(target=cancel.set)
            t.start()
            t.join()

    r = e.generate(
        [{"role": "user", "content": "Write a long story about a dragon."}],
        max_new_tokens=64,
        mode="target",
        cancel=cancel,
        on_text=on_text,
    )
    assert r.finish_reason == "cancelled" and 1 <= len(r.token_ids) < 64 and r.text == "".join(pieces)
    with pytest.raises(
        InvalidRequestError, match="cancel must be a threading.Event .an object with is_set... or None, got str"
    ):
        e.generate("hi", max_new_tokens=2, cancel="stop")
    with pytest.raises(InvalidRequestError, match="stream.. is cancelled by closing the iterator"):
        next(e.stream("hi", max_new_tokens=2, cancel=cancel))
    assert (
        "".join(e.stream("def add(a, b):", max_new_tokens=4, mode="target"))
        == e.generate("def add(a, b):", max_new_tokens=4, mode="target").text
    )


def test_a_format_version_past_int32_is_refused_not_read_as_another(tiny):
    """format_version 2^32 + 1 was read as 1 (nlohmann's get<int>) and the folder loaded."""
    manifest = json.loads((tiny / "manifest.json").read_text())
    (tiny / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2**32 + 1}))
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(tiny))
    assert str(info.value) == (
        f"{tiny / 'manifest.json'}: unsupported format_version 4294967297 (this build reads 1, 2 and 3)"
    )


def test_a_safetensors_shape_whose_size_overflows_is_refused(tiny):
    """shape [2^62, 4] of F32 is 2^64 bytes, which wrapped to 0 and matched empty data_offsets."""
    f = tiny / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    begin = header["model.norm.weight"]["data_offsets"][0]
    header["model.norm.weight"].update(shape=[2**62, 4], data_offsets=[begin, begin])
    text = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(tiny))
    assert str(info.value) == f"{f}: tensor 'model.norm.weight': shape [4611686018427387904,4] is too large"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tokens", "4294967297"], "--tokens: 4294967297 is out of the range of token ids"),  # was decoded as token 1
        (["--tokens", "2147483648"], "--tokens: 2147483648 is out of the range of token ids"),
        (["--tokens", ""], "--tokens: the prompt is empty; give at least one token id"),
        (["--tokens", "1,"], "--tokens: '' is not an integer token id"),
        (["--tokens", "1", "--max-new-tokens", "2.7"], "--max-new-tokens: '2.7' is not an integer"),  # decoded 2 tokens
        (
            ["--tokens", "1", "--max-new-tokens", "1e20"],
            "--max-new-tokens: '1e20' is not an integer",
        ),  # "got -2147483648"
        (
            ["--tokens", "1", "--max-new-tokens", "99999999999"],
            "--max-new-tokens: 99999999999 is out of range [-2147483648, 2147483647]",
        ),
        (["--tokens", "1", "--top-k", "1e12"], "--top-k: '1e12' is not an integer"),
        (["--tokens", "1", "--seed", "-1"], "--seed: '-1' is not an integer >= 0"),  # sampled with another seed
        (["--tokens", "1", "--seed", "1.5"], "--seed: '1.5' is not an integer >= 0"),  # sampled with seed 1
        (
            ["--tokens", "1", "--seed", "18446744073709551616"],
            "--seed: 18446744073709551616 is out of range [0, 18446744073709551615]",
        ),
        (["--tokens", "1", "--threads", "1.5"], "--threads: '1.5' is not an integer"),
    ],
)
def test_cpp_example_refuses_arguments_it_would_misread(tmp_path, args, message):
    """swiftspec-decode read integers as doubles and cast them, and token ids as longs cast to int32:
    values were wrapped, truncated or became another number, silently. The arguments are checked
    before the checkpoint is opened."""
    from swiftspec.paths import binary

    proc = subprocess.run(
        [str(binary("swiftspec-decode")), "--checkpoint", str(tmp_path / "missing"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == f"swiftspec-decode: {message}"
    assert proc.stdout == ""
