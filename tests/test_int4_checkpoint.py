"""Int4 checkpoints without the real models: the quantizer's arithmetic and packing, the
converter's checks, and bad int4 folders, which the runtime must refuse with a CheckpointError
naming the tensor and file (never a crash or silently wrong weights)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import TensorSpec, serialize_file

from swiftspec import CheckpointError
from swiftspec import swiftspec_core as core
from swiftspec.convert.int4 import check_group_size, dequantize, quantize_rtn, unpack
from swiftspec.convert.layout import expected_tensor_shapes
from swiftspec.convert.manifest import make_manifest, read_manifest
from swiftspec.convert.writer import CheckpointWriter

CONVERT = Path(__file__).resolve().parents[1] / "tools" / "convert_weights.py"
GROUP = 16
TINY = {
    "model_type": "qwen2",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
    "swiftspec": {"rope_style": "neox", "attention_bias": True},
}


# ---------------------------------------------------------------------------- the quantizer
def test_rtn_packs_known_values_low_nibble_first():
    # One group of 8: lo = -1, hi = 6, s = fp16(7/15), z = round(1/s) = 2,
    # q = round(w/s) + 2 = [0, 2, 4, 6, 8, 11, 13, 15].
    w = np.array([[-1, 0, 1, 2, 3, 4, 5, 6]], dtype=np.float32)
    qweight, scales, zeros = quantize_rtn(w, 8)
    assert qweight.dtype == np.uint8 and scales.dtype == np.float16 and zeros.dtype == np.uint8
    assert scales[0, 0] == np.float16(7 / 15) and zeros[0, 0] == 2
    assert qweight.tolist() == [[0x20, 0x64, 0xB8, 0xFD]]
    assert unpack(qweight).tolist() == [[0, 2, 4, 6, 8, 11, 13, 15]]
    expect = (np.array([0, 2, 4, 6, 8, 11, 13, 15], np.float32) - 2) * np.float32(scales[0, 0])
    assert np.array_equal(dequantize(qweight, scales, zeros, 8)[0], expect)


@pytest.mark.parametrize("group", [8, 32, 128])
def test_rtn_error_is_at_most_half_a_step(group):
    rng = np.random.default_rng(group)
    w = (rng.standard_normal((40, 256)) * 0.05).astype(np.float32)
    w[3, :group] = np.abs(w[3, :group]) + 0.5  # an all-positive group: the range is widened to 0
    w[5, :group] = 0.0  # an all-zero group
    qweight, scales, zeros = quantize_rtn(w, group)
    assert qweight.shape == (40, 128) and scales.shape == zeros.shape == (40, 256 // group)
    assert zeros.max() <= 15
    deq = dequantize(qweight, scales, zeros, group)
    step = np.repeat(scales.astype(np.float32), group, axis=1)
    # Half a step, plus the float16 rounding of the scale (relative 2^-11 over up to 15 steps).
    assert np.all(np.abs(deq - w) <= step * (0.5 + 15 * 2.0**-11) + 1e-7)
    assert np.all(deq[5, :group] == 0.0)


def test_quantizer_and_group_size_errors_name_the_problem():
    for bad in (0, 12, 7, -8, 8.0, True):
        with pytest.raises(CheckpointError, match="multiple of 8"):
            check_group_size(bad)
    with pytest.raises(CheckpointError, match=r"group size 24 does not divide hidden_size .* = 32"):
        check_group_size(24, TINY, "tiny/config.json")
    # the error names a group size that fits (the README's command with the default 128 on
    # SmolLM2-135M, hidden_size 576, gave no hint), or says none does
    smol = {**TINY, "hidden_size": 576, "num_attention_heads": 9, "head_dim": 64, "intermediate_size": 1536}
    with pytest.raises(CheckpointError, match=r"= 576; .*features \(--group-size 64 does\)$"):
        check_group_size(128, smol, "smol/config.json")
    assert check_group_size(64, smol) == 64
    with pytest.raises(CheckpointError, match=r"\(no power of two from 8 below 128 divides them all\)$"):
        check_group_size(128, {**TINY, "hidden_size": 36}, "odd/config.json")
    with pytest.raises(CheckpointError, match="'blk.w': int4 group size 32 does not divide its 48 input"):
        quantize_rtn(np.zeros((4, 48), np.float32), 32, "blk.w")
    w = np.zeros((4, 32), np.float32)
    w[2, 5] = np.nan
    with pytest.raises(CheckpointError, match="'blk.w': row 2 holds a non-finite value"):
        quantize_rtn(w, 16, "blk.w")


def test_int4_layout_replaces_every_projection():
    shapes = expected_tensor_shapes(TINY, GROUP)
    p = "model.layers.1."
    assert shapes[p + "mlp.down_proj.qweight"] == (32, 32) and shapes[p + "mlp.down_proj.scales"] == (32, 4)
    assert shapes[p + "self_attn.k_proj.zeros"] == (16, 2) and shapes[p + "self_attn.k_proj.bias"] == (16,)
    assert not any(n.endswith("_proj.weight") for n in shapes)
    assert shapes["model.embed_tokens.weight"] == (64, 32)


# ---------------------------------------------------------------------------- tiny int4 folders
def _tiny_float_tensors(config=TINY):
    rng = np.random.default_rng(0)
    shapes = expected_tensor_shapes(config)
    return {
        n: (rng.standard_normal(s) * 0.1 + (1.0 if n.endswith("norm.weight") else 0.0)).astype(np.float32)
        for n, s in shapes.items()
    }


def _write_int4(folder, tensors=None, group=GROUP, config=TINY):
    w = CheckpointWriter(folder, "int4", group_size=group)
    for name, value in (tensors or _tiny_float_tensors(config)).items():
        w.add(name, value)
    w.write_weights()
    w.write_json("config.json", config)
    return w.finish(make_manifest("int4", ["model.safetensors"], "hf", "tiny", None, group_size=group))


@pytest.fixture(scope="module")
def tiny_int4(tmp_path_factory):
    return _write_int4(tmp_path_factory.mktemp("int4") / "tiny")


def _read_storage(folder):
    """name -> (numpy storage array, safetensors dtype name) of the folder's weights."""
    import struct

    path = folder / "model.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    kinds = {"U8": np.uint8, "F16": np.float16, "BF16": np.uint16, "F32": np.float32, "I8": np.int8}
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        out[name] = (
            np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=kinds[e["dtype"]]).reshape(e["shape"]).copy(),
            e["dtype"],
        )
    return out


_SPEC = {"U8": "uint8", "F16": "float16", "BF16": "bfloat16", "F32": "float32", "I8": "int8"}


def _variant(src, dst, change_tensors=None, change_manifest=None):
    """A copy of the int4 folder `src` with its tensors and/or manifest changed."""
    dst.mkdir()
    tensors = _read_storage(src)
    if change_tensors:
        change_tensors(tensors)
    specs = {
        n: TensorSpec(dtype=_SPEC[k], shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
        for n, (a, k) in tensors.items()
    }
    serialize_file(specs, str(dst / "model.safetensors"), metadata=None)
    (dst / "config.json").write_text((src / "config.json").read_text())
    manifest = json.loads((src / "manifest.json").read_text())
    if change_manifest:
        change_manifest(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def _dequantized_copy(int4_folder, dense):
    """A float32 folder `dense` of the int4 folder's weights dequantized in numpy (the format's formula)."""
    storage = _read_storage(int4_folder)
    floats = {}
    for name, (a, kind) in storage.items():
        if name.endswith(".qweight"):
            p = name[: -len(".qweight")]
            floats[p + ".weight"] = dequantize(a, storage[p + ".scales"][0], storage[p + ".zeros"][0], GROUP)
        elif kind == "BF16":
            floats[name] = (a.astype(np.uint32) << 16).view(np.float32)
    w = CheckpointWriter(dense, "float32")
    for name, value in floats.items():
        w.add(name, value)
    w.write_weights()
    w.write_json("config.json", TINY)
    return w.finish(make_manifest("float32", ["model.safetensors"], "hf", "tiny", None))


def test_tiny_int4_folder_loads_and_matches_its_dequantized_float_copy(tiny_int4, tmp_path):
    """The runtime's int4 forward equals, bit for bit, a float32 folder of the weights dequantized
    in numpy (the format's formula; the int4 GEMM reduces like the float32 one)."""
    manifest = read_manifest(tiny_int4)
    assert manifest["format_version"] == 3 and manifest["quantization"]["group_size"] == GROUP
    dense = _dequantized_copy(tiny_int4, tmp_path / "dense")
    tokens = [1, 5, 7, 9, 30, 2]
    ours = core.load_model(str(tiny_int4)).forward(tokens, logits="all")
    ref = core.load_model(str(dense)).forward(tokens, logits="all")
    assert np.isfinite(ours).all() and np.array_equal(ours, ref)


def _prefix(layer=0, proj="self_attn.q_proj"):
    return f"model.layers.{layer}.{proj}"


def _set(name, fn):
    def change(tensors):
        a, kind = tensors[name]
        tensors[name] = fn(a, kind)

    return change


BAD_FOLDERS = {
    "mis-shaped qweight": (
        _set(_prefix() + ".qweight", lambda a, k: (np.ascontiguousarray(a[:, :8]), k)),
        None,
        r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.q_proj\.qweight' has shape \[32, 8\], "
        r"expected \[32, 16\]",
    ),
    "missing scales": (
        lambda t: t.pop(_prefix(1, "mlp.down_proj") + ".scales"),
        None,
        r"missing tensor 'model\.layers\.1\.mlp\.down_proj\.scales'",
    ),
    "scales as bf16": (
        _set(_prefix() + ".scales", lambda a, k: (a.view(np.uint16), "BF16")),
        None,
        r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.q_proj\.scales' has dtype BF16 but the manifest "
        r"\(dtype \"int4\"\) says F16",
    ),
    "qweight as int8": (
        _set(_prefix() + ".qweight", lambda a, k: (a.view(np.int8), "I8")),
        None,
        r"tensor 'model\.layers\.0\.self_attn\.q_proj\.qweight' has dtype I8 .* says U8",
    ),
    "zero point 16": (
        _set(
            _prefix(1, "mlp.up_proj") + ".zeros",
            lambda a, k: (np.where(np.arange(a.size).reshape(a.shape) == 5, 16, a).astype(np.uint8), k),
        ),
        None,
        r"tensor 'model\.layers\.1\.mlp\.up_proj\.zeros' holds 16 at \[2, 1\]; 4-bit zero points are 0\.\.15",
    ),
    "infinite scale": (
        _set(
            _prefix(0, "mlp.gate_proj") + ".scales",
            lambda a, k: (np.where(np.arange(a.size).reshape(a.shape) == 0, np.float16(np.inf), a), k),
        ),
        None,
        r"tensor 'model\.layers\.0\.mlp\.gate_proj\.scales' holds a non-finite scale at \[0, 0\]",
    ),
    "float weight next to qweight": (
        lambda t: t.__setitem__(_prefix() + ".weight", (np.zeros((32, 32), np.uint16), "BF16")),
        None,
        r"tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' is present next to the int4",
    ),
    "manifest group size of another folder": (
        None,
        lambda m: m["quantization"].__setitem__("group_size", 8),
        r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.q_proj\.scales' has shape \[32, 2\], expected "
        r"\[32, 4\] \(group_size 8 from manifest\.json",
    ),
    "group size not dividing K": (
        None,
        lambda m: m["quantization"].__setitem__("group_size", 64),
        r"quantization\.group_size 64 does not divide the 32 input features of 'model\.layers\.0\.self_attn\.q_proj'",
    ),
    "group size not a multiple of 8": (
        None,
        lambda m: m["quantization"].__setitem__("group_size", 12),
        r"manifest\.json: field 'quantization\.group_size' is 12; it must be a positive multiple of 8",
    ),
    "3 bits": (None, lambda m: m["quantization"].__setitem__("bits", 3), r"'quantization\.bits' is 3"),
    "no quantization object": (None, lambda m: m.pop("quantization"), r"needs the object 'quantization'"),
    "int4 with format_version 1": (
        None,
        lambda m: m.__setitem__("format_version", 1),
        r"'dtype' is \"int4\" but format_version is 1",
    ),
    "format_version 3 with bfloat16": (
        None,
        lambda m: m.__setitem__("dtype", "bfloat16"),
        r"field 'dtype' must be \"int4\", got \"bfloat16\"",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_bad_int4_folder_is_refused_naming_the_tensor(tiny_int4, tmp_path, case):
    change_tensors, change_manifest, pattern = BAD_FOLDERS[case]
    bad = _variant(tiny_int4, tmp_path / "bad", change_tensors, change_manifest)
    with pytest.raises(CheckpointError, match=pattern):
        core.load_model(str(bad))


def test_truncated_int4_file_is_refused_naming_the_file(tiny_int4, tmp_path):
    bad = _variant(tiny_int4, tmp_path / "bad")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: tensor '.*': data_offsets end \d+ lies past the data "
        r"section .*truncated",
    ):
        core.load_model(str(bad))


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_int4_equals_its_dequantized_float_copy_at_the_same_degree(tiny_int4, tmp_path, tp):
    """Load-time TP sharding of int4 weights: each rank's packed rows, column slices, scales and zero
    points dequantize to exactly the float32 copy's shard, so TP-N int4 logits equal TP-N float32
    logits bit for bit (group size 16: both reduce in the natural order). At tp 4 every rank's
    o_proj columns are one 8-column head, half a group of 16: the shard repeats that group's scale
    and zero point for its own groups of 8."""
    dense = _dequantized_copy(tiny_int4, tmp_path / "dense")
    group = json.dumps({"tp": tp, "threads_per_rank": 1})
    tokens = [1, 5, 7, 9, 30, 2]
    ours = core.load_group_model(str(tiny_int4), group).forward(tokens, logits="all")
    ref = core.load_group_model(str(dense), group).forward(tokens, logits="all")
    assert ours.shape == (len(tokens), TINY["vocab_size"])
    assert np.isfinite(ours).all() and np.array_equal(ours, ref)
    tp1 = core.load_model(str(tiny_int4)).forward(tokens, logits="all")
    assert np.abs(ours - tp1).max() < 1e-5  # only the row-parallel sums' order differs from TP 1


def test_tensor_parallel_int4_splits_the_ffn_on_whole_groups(tiny_int4):
    """The runtime's plan for an int4 folder puts the FFN bounds on multiples of the group size (16:
    64 rows in 4 groups over 3 ranks), so no rank's down_proj columns cut a group; a float folder's
    plan splits the rows evenly."""
    plan = json.loads(core.tp_plan(str(tiny_int4), 3))
    assert plan["ffn_bounds"] == [0, 16, 32, 64] and plan["ffn_per_rank"] == 32
    logits = core.load_group_model(str(tiny_int4), json.dumps({"tp": 3})).forward([1, 5, 7], logits="all")
    assert np.abs(logits - core.load_model(str(tiny_int4)).forward([1, 5, 7], logits="all")).max() < 1e-5


def test_tensor_parallel_int4_refuses_a_slice_that_cuts_below_8_columns(tmp_path):
    """Heads of 4 columns (head_dim 4): at tp 3, rank 1's o_proj columns start at column 4, inside an
    8-column unit of the int4 kernels; refused naming the projection, int4 and the TP degree."""
    config = {**TINY, "head_dim": 4}
    folder = _write_int4(tmp_path / "hd4", config=config)
    core.load_group_model(str(folder), json.dumps({"tp": 2}))  # 8-column heads per rank: fine
    with pytest.raises(
        CheckpointError,
        match=r"'model\.layers\.0\.self_attn\.o_proj': tensor parallelism \(tp 3\) "
        r"with int4 weights \(group size 16\) would cut its input columns at a "
        r"multiple of only 4",
    ):
        core.load_group_model(str(folder), json.dumps({"tp": 3}))


# ---------------------------------------------------------------------------- the converter CLI
def _convert(*args):
    return subprocess.run(
        [sys.executable, str(CONVERT), *map(str, args), "--quiet"], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def tiny_float(tmp_path_factory):
    folder = tmp_path_factory.mktemp("float") / "tiny"
    w = CheckpointWriter(folder, "bfloat16")
    for name, value in _tiny_float_tensors().items():
        w.add(name, value)
    w.write_weights()
    w.write_json("config.json", TINY)
    (folder / "tokenizer.json").write_text("{}")
    return w.finish(make_manifest("bfloat16", ["model.safetensors"], "gguf", "tiny.gguf", "ab" * 32))


def test_convert_cli_quantizes_a_checkpoint_folder(tiny_float, tmp_path):
    proc = _convert(tiny_float, "--out", tmp_path / "q", "--dtype", "int4", "--group-size", "32")
    assert proc.returncode == 0, proc.stderr
    manifest = read_manifest(tmp_path / "q")
    assert manifest["quantization"]["group_size"] == 32 and manifest["source"]["kind"] == "gguf"
    assert manifest["quantized_from"]["dtype"] == "bfloat16" and (tmp_path / "q" / "tokenizer.json").is_file()
    # Every projection is quantize_rtn of the source's (bf16) values; the rest is copied exactly.
    src, out = _read_storage(tiny_float), _read_storage(tmp_path / "q")
    for name, (a, kind) in src.items():
        if name.endswith("_proj.weight"):
            p = name[: -len(".weight")]
            q, sc, z = quantize_rtn((a.astype(np.uint32) << 16).view(np.float32), 32)
            assert np.array_equal(out[p + ".qweight"][0], q) and np.array_equal(out[p + ".zeros"][0], z)
            assert np.array_equal(out[p + ".scales"][0], sc)
            assert name not in out
        else:
            assert out[name][1] == kind == "BF16" and np.array_equal(out[name][0], a)
    logits = core.load_model(str(tmp_path / "q")).forward([3, 4, 5], logits="all")
    assert np.isfinite(logits).all()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--dtype", "int4", "--group-size", "24"], "int4 group size 24 does not divide hidden_size"),
        (["--dtype", "int4", "--group-size", "20"], "int4 group size 20 must be a positive multiple of 8"),
        (["--dtype", "int4", "--tp", "2"], "--tp 2 with --dtype int4: tensor-parallel int4 folders are not supported"),
        (["--dtype", "bfloat16", "--group-size", "64"], "--group-size 64 applies to --dtype int4 only"),
    ],
)
def test_convert_cli_rejects_bad_int4_options(tiny_float, tmp_path, args, needle):
    proc = _convert(tiny_float, "--out", tmp_path / "q", *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "q" / "manifest.json").exists()


def test_int4_source_cannot_be_quantized_or_sharded_again(tiny_int4, tmp_path):
    (tiny_int4 / "tokenizer.json").write_text("{}")
    proc = _convert(tiny_int4, "--out", tmp_path / "q", "--dtype", "int4")
    assert proc.returncode == 2 and "already an int4 checkpoint" in proc.stderr, proc.stderr
    proc = _convert(tiny_int4, "--out", tmp_path / "tp", "--tp", "2")
    assert proc.returncode == 2 and "sharding of int4 checkpoints is not supported" in proc.stderr, proc.stderr


def test_cpp_int4_kernel_units():
    """cpp/tests/test_int4.cpp: fp16 widening, dequantization (SIMD and scalar paths) against the
    formula, and the int4 linear bit-identical to the float32 linear over the dequantized weights."""
    from swiftspec.paths import binary

    proc = subprocess.run([str(binary("swiftspec-cpp-tests")), "int4_"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.count("[  OK  ]") == 3 and "3 tests, 0 failed" in proc.stdout


def test_hf_folder_and_checkpoint_folder_give_the_same_int4_weights(tiny_float, tmp_path):
    """convert_hf(..., dtype="int4") and quantize_checkpoint quantize the same values the same way."""
    import shutil

    from swiftspec.convert import convert_hf
    from swiftspec.convert.int4_checkpoint import quantize_checkpoint

    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        shutil.copy(tiny_float / name, hf / name)
    (hf / "config.json").write_text(json.dumps({k: v for k, v in TINY.items() if k != "swiftspec"}))
    a = convert_hf(hf, tmp_path / "from-hf", dtype="int4", group_size=16, progress=False)
    b = quantize_checkpoint(tiny_float, tmp_path / "from-ckpt", 16, progress=False)
    ta, tb = _read_storage(a), _read_storage(b)
    assert sorted(ta) == sorted(tb) and any(n.endswith(".qweight") for n in ta)
    for name in ta:
        assert ta[name][1] == tb[name][1] and np.array_equal(ta[name][0], tb[name][0]), name
    assert read_manifest(a)["format_version"] == 3 and read_manifest(a)["source"]["kind"] == "hf"
    assert json.loads((a / "config.json").read_text())["torch_dtype"] == "bfloat16"


# ---------------------------------------------------------------------------- int4 on the cuda backend (issue 31)
def test_cpp_cuda_int4_rules():
    """cpp/tests/test_cuda_int4_rules.cpp: the bytes the CUDA memory plan counts per projection
    (bf16 2 n k; int4 n k / 2 + 4 n k / G) and the options the cuda backend refuses for int4."""
    from swiftspec.paths import binary

    proc = subprocess.run([str(binary("swiftspec-cpp-tests")), "for_int4"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.count("[  OK  ]") == 2 and "2 tests, 0 failed" in proc.stdout


@pytest.mark.parametrize(
    "placement,message",
    [
        (
            {"target": {"megakernel": True}},
            "placement.target.megakernel: int4 weights run on the cuda backend's layered step; the decode "
            "megakernel streams bf16 weights (issue 31): drop megakernel, or use bfloat16 weights",
        ),
        ({"draft": {"megakernel": True}}, "placement.draft.megakernel: int4 weights run on the cuda backend's"),
        (
            {"target": {"tp": 2}},
            "placement.target.tp 2: int4 weights run on one GPU on the cuda backend; the tensor-parallel GEMMs "
            "read bf16 weights (issue 31): use tp 1, bfloat16 weights, or the cpu backend",
        ),
    ],
)
def test_int4_folder_on_cuda_is_refused_with_the_megakernel_or_tp(tiny_int4, placement, message):
    """The loader refuses what the cuda backend cannot run int4 checkpoints with, naming the group and
    field, before either model is planned or loaded (so also in a build without CUDA)."""
    from swiftspec.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as err:
        core.load_model_pair(str(tiny_int4), str(tiny_int4), json.dumps(placement), core.ModelOptions(), "cuda")
    assert str(err.value).startswith(message), str(err.value)


def test_int4_problems_of_a_placement():
    """swiftspec.placement.int4_problems: the runtime's rule per group, target first; nothing on the cpu
    backend or for a placement without the megakernel and tp > 1."""
    from swiftspec.placement import int4_problems, normalize

    both = normalize({"draft": {"megakernel": True}, "target": {"tp": 2, "devices": [0, 1]}})
    problems = int4_problems(both, "cuda")
    assert [p.split(":")[0] for p in problems] == ["placement.target.tp 2", "placement.draft.megakernel"]
    assert int4_problems(both, "cpu") == []
    assert int4_problems(None, "cuda") == []
    assert int4_problems(normalize({"draft": {"devices": [1]}, "target": {"gemm_engine": "mma"}}), "cuda") == []
    assert core.int4_backend_problem("cuda", False, 1) == ""
    assert core.int4_backend_problem("cuda", True, 1).startswith("megakernel: int4 weights run on")
