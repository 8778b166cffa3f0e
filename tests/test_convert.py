"""GGUF / HF -> swiftspec checkpoint conversion, checked against gguf's dequantization and against
HF transformers loading the same GGUF files (an independent implementation)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from safetensors import safe_open

from swiftspec.convert import SUPPORTED_DTYPES, convert_gguf, convert_hf, read_manifest
from swiftspec.convert.gguf_names import unpermute_llama_rows
from swiftspec.datasets import prompt_messages
from swiftspec.errors import CheckpointError
from swiftspec.tokenizer import Tokenizer

QWEN_05 = "qwen2.5-coder-0.5b-instruct"
QWEN_15 = "qwen2.5-coder-1.5b-instruct"
SMOL = "smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[1]


_READERS: dict[Path, gguf.GGUFReader] = {}


def reader(path: Path) -> gguf.GGUFReader:
    """GGUFReader per file, shared by the tests of this module (parsing the metadata takes seconds)."""
    if path not in _READERS:
        _READERS[path] = gguf.GGUFReader(path)
    return _READERS[path]


def meta(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def load_tensors(folder: Path, framework: str = "pt") -> dict:
    with safe_open(str(folder / "model.safetensors"), framework=framework) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def doc_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """The table of docs/checkpoint_format.md, written out independently of the converter."""
    h, i, v, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
        if c["swiftspec"]["attention_bias"]:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                }
            )
    return shapes


GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        return f"model.layers.{layer}.{GGUF_TO_HF[rest]}"
    return GGUF_TO_HF[gguf_name]


# --------------------------------------------------------------------------- real models


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES)
def test_manifest(checkpoint_dir, gguf_path, dtype):
    folder = checkpoint_dir(QWEN_05, dtype)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert read_manifest(folder) == manifest
    expected = {
        "format": "swiftspec-checkpoint",
        "format_version": 1,
        "dtype": dtype,
        "files": ["model.safetensors"],
        "tp_degree": 1,
        "source": {
            "kind": "gguf",
            "path": str(gguf_path(QWEN_05).resolve()),
            "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        },
    }
    if dtype == "int4":  # format version 3: the quantization object (docs/checkpoint_format.md)
        from swiftspec.convert.manifest import quantization_entry

        # from a GGUF: method "gguf", group 32, and the error against the GGUF per type of its projections
        types = manifest["quantization"].pop("gguf_types")
        assert {t: v["tensors"] for t, v in types.items()} == {"Q4_K": 12, "Q5_0": 132, "Q6_K": 12, "Q8_0": 12}
        assert all(0 < v["relative_error"] < 0.12 and v["groups"] > 0 for v in types.values())
        expected.update(format_version=3, quantization={**quantization_entry(32), "method": "gguf"})
    assert manifest == expected
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "generation_config.json",
        "manifest.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


@pytest.mark.parametrize("name", [QWEN_05, QWEN_15, SMOL])
def test_config_equals_gguf_metadata(name, checkpoint_dir, gguf_path):
    config = json.loads((checkpoint_dir(name, "float32") / "config.json").read_text())
    r = reader(gguf_path(name))
    arch = meta(r, "general.architecture")
    tensors = {t.name: t for t in r.tensors}
    tokens = meta(r, "tokenizer.ggml.tokens")
    assert config["model_type"] == arch
    assert config["hidden_size"] == meta(r, f"{arch}.embedding_length")
    assert config["intermediate_size"] == meta(r, f"{arch}.feed_forward_length")
    assert config["num_hidden_layers"] == meta(r, f"{arch}.block_count")
    assert config["num_attention_heads"] == meta(r, f"{arch}.attention.head_count")
    assert config["num_key_value_heads"] == meta(r, f"{arch}.attention.head_count_kv")
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"]
    assert np.float32(config["rms_norm_eps"]) == np.float32(meta(r, f"{arch}.attention.layer_norm_rms_epsilon"))
    assert np.float32(config["rope_theta"]) == np.float32(meta(r, f"{arch}.rope.freq_base"))
    assert config["rope_scaling"] is None
    assert config["max_position_embeddings"] == meta(r, f"{arch}.context_length")
    assert config["vocab_size"] == len(tokens) == tensors["token_embd.weight"].shape[1]
    assert config["bos_token_id"] == meta(r, "tokenizer.ggml.bos_token_id")
    assert config["eos_token_id"][0] == meta(r, "tokenizer.ggml.eos_token_id")
    assert config["torch_dtype"] == "float32"
    assert config["swiftspec"]["rope_style"] == "neox"
    generation = json.loads((checkpoint_dir(name, "float32") / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"]
    if arch == "qwen2":
        assert config["tie_word_embeddings"] is False and "output.weight" in tensors
        assert config["swiftspec"]["attention_bias"] is True
        assert config["eos_token_id"] == [151645, 151643]
        assert [tokens[i] for i in config["eos_token_id"]] == ["<|im_end|>", "<|endoftext|>"]
        assert config["bos_token_id"] == 151643
    else:
        assert config["tie_word_embeddings"] is True and "output.weight" not in tensors
        assert config["swiftspec"]["attention_bias"] is False
        assert config["eos_token_id"] == [2, 0]
    expected = {
        QWEN_05: (896, 4864, 24, 14, 2, 151936, 32768),
        QWEN_15: (1536, 8960, 28, 12, 2, 151936, 32768),
        SMOL: (576, 1536, 30, 9, 3, 49152, 8192),
    }[name]
    assert (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["vocab_size"],
        config["max_position_embeddings"],
    ) == expected


@pytest.mark.parametrize("name,dtype", [(QWEN_05, "float32"), (QWEN_05, "bfloat16"), (SMOL, "float32")])
def test_tensor_names_shapes_and_dtypes_follow_the_docs(name, dtype, checkpoint_dir):
    folder = checkpoint_dir(name, dtype)
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        assert f.metadata() == {"format": "pt"}
    assert found == doc_shapes(config)
    assert dtypes == {"F32" if dtype == "float32" else "BF16"}


def test_qwen_weights_equal_gguf_dequantization_bit_exact(checkpoint_dir, gguf_path):
    ours = load_tensors(checkpoint_dir(QWEN_05, "float32"), framework="np")
    r = reader(gguf_path(QWEN_05))
    assert len(r.tensors) == len(ours) == 291
    for t in r.tensors:
        ref = dequantize(np.array(t.data), t.tensor_type).astype(np.float32, copy=False)
        got = ours[hf_name(t.name)]
        assert got.shape == ref.shape, t.name
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), t.name


def test_qwen_15b_weights_equal_gguf_dequantization_bit_exact(checkpoint_dir, gguf_path):
    """A sample covering every tensor type: all of layers 0 and 27, and the final norm."""
    folder = checkpoint_dir(QWEN_15, "float32")
    r = reader(gguf_path(QWEN_15))
    sample = [t for t in r.tensors if t.name == "output_norm.weight" or t.name.split(".")[1] in ("0", "27")]
    assert {t.tensor_type.name for t in sample} == {"Q4_K", "Q6_K", "F32"}
    with safe_open(str(folder / "model.safetensors"), framework="np") as f:
        assert len(list(f.keys())) == len(r.tensors) == 339
        for t in sample:
            ref = dequantize(np.array(t.data), t.tensor_type).astype(np.float32, copy=False)
            got = f.get_tensor(hf_name(t.name))
            assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), t.name


def test_bfloat16_checkpoint_is_nearest_even_rounding_of_float32(checkpoint_dir):
    f32 = load_tensors(checkpoint_dir(QWEN_05, "float32"))
    bf16 = load_tensors(checkpoint_dir(QWEN_05, "bfloat16"))
    assert f32.keys() == bf16.keys()
    for name, value in f32.items():
        assert bf16[name].dtype == torch.bfloat16
        assert torch.equal(bf16[name].view(torch.int16), value.to(torch.bfloat16).view(torch.int16)), name
    json_32 = json.loads((checkpoint_dir(QWEN_05, "float32") / "config.json").read_text())
    json_16 = json.loads((checkpoint_dir(QWEN_05, "bfloat16") / "config.json").read_text())
    assert json_16.pop("torch_dtype") == "bfloat16" and json_32.pop("torch_dtype") == "float32"
    assert json_16 == json_32


@pytest.fixture(scope="module")
def smol_hf_from_gguf(gguf_path):
    from transformers import AutoModelForCausalLM

    path = gguf_path(SMOL)
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def test_smollm2_unpermuted_qk_gives_hf_logits(checkpoint_dir, gguf_path, smol_hf_from_gguf, humaneval, mtbench):
    """SmolLM2 is Llama-arch: its GGUF stores Q/K rows permuted. HF transformers loading our
    folder must agree with HF transformers loading the GGUF itself."""
    from transformers import AutoModelForCausalLM

    folder = checkpoint_dir(SMOL, "float32")
    ours = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert type(ours).__name__ == "LlamaForCausalLM" and ours.config.tie_word_embeddings

    ref_state, our_state = smol_hf_from_gguf.state_dict(), ours.state_dict()
    assert ref_state.keys() == our_state.keys()
    for k in ref_state:
        assert torch.equal(ref_state[k], our_state[k]), k

    # The test can see the permutation: raw GGUF rows differ, un-permuted rows are ours.
    r = reader(gguf_path(SMOL))
    raw = {t.name: t for t in r.tensors}
    for gname, heads in (("blk.0.attn_q.weight", 9), ("blk.5.attn_k.weight", 3)):
        t = raw[gname]
        rows = dequantize(t.data, t.tensor_type)
        mine = our_state[hf_name(gname)].numpy()
        assert not np.array_equal(rows, mine)
        assert np.array_equal(unpermute_llama_rows(rows, heads), mine)

    tok = Tokenizer.from_checkpoint(folder)
    prompts = [
        tok.encode_chat(prompt_messages("humaneval", humaneval[0])),
        tok.encode_chat(prompt_messages("mtbench", mtbench[10])),
    ]
    for ids in prompts:
        with torch.no_grad():
            a = smol_hf_from_gguf(torch.tensor([ids])).logits[0]
            b = ours(torch.tensor([ids])).logits[0]
        rel = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max().item()
        assert rel < 1e-4, rel


def test_hf_folder_roundtrip(checkpoint_dir, tmp_path):
    """HF save_pretrained (sharded) -> convert_hf gives back the GGUF conversion bit for bit."""
    from transformers import AutoModelForCausalLM

    gguf_ckpt = checkpoint_dir(SMOL, "float32")
    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        hf_dir = tmp_path / f"hf-{dtype}"
        model = AutoModelForCausalLM.from_pretrained(str(gguf_ckpt), dtype=torch_dtype)
        model.save_pretrained(hf_dir, max_shard_size="200MB")
        del model
        assert (hf_dir / "model.safetensors.index.json").exists()
        shutil.copy(gguf_ckpt / "tokenizer.json", hf_dir)
        tok_config = json.loads((gguf_ckpt / "tokenizer_config.json").read_text())
        (hf_dir / "chat_template.jinja").write_text(tok_config.pop("chat_template"))
        (hf_dir / "tokenizer_config.json").write_text(json.dumps(tok_config))

        out = convert_hf(hf_dir, tmp_path / f"ckpt-{dtype}", dtype, progress=False)
        manifest = read_manifest(out)
        assert manifest["source"]["kind"] == "hf" and manifest["dtype"] == dtype
        got, want = load_tensors(out), load_tensors(checkpoint_dir(SMOL, dtype))
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), k
        config = json.loads((out / "config.json").read_text())
        reference = json.loads((gguf_ckpt / "config.json").read_text())
        for key in (
            "model_type",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "tie_word_embeddings",
            "rope_scaling",
            "max_position_embeddings",
            "swiftspec",
            "eos_token_id",
        ):
            assert config[key] == reference[key], key
        assert np.float32(config["rope_theta"]) == np.float32(reference["rope_theta"])
        assert config["torch_dtype"] == dtype
        assert Tokenizer.from_checkpoint(out).chat_template == Tokenizer.from_checkpoint(gguf_ckpt).chat_template


# --------------------------------------------------------------------------- tiny GGUF files


def byte_alphabet() -> list[str]:
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, n = [], 0
    for b in range(256):
        out.append(chr(b) if b in keep else chr(256 + n))
        n += b not in keep
    return out


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    pre: str = "smollm",
    skip: tuple[str, ...] = (),
    extra_tensors: dict | None = None,
    seed: int = 0,
    meta: dict | None = None,
) -> dict[str, np.ndarray]:
    """A complete tiny model: 1 layer, hidden 8, 2 heads of 4, 1 KV head, 259 tokens.

    ``meta`` replaces the values of the ``<arch>.*`` size fields written by name (``block_count``,
    ``head_count``, ``layer_norm_rms_epsilon``, ``rope_freq_base``, ``context_length``) and may add
    ``rope_scaling_type``."""
    meta = dict(meta or {})
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(meta.pop("block_count", 1))
    w.add_context_length(meta.pop("context_length", 64))
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(meta.pop("head_count", 2))
    w.add_head_count_kv(1)
    w.add_rope_freq_base(meta.pop("rope_freq_base", 10000.0))
    if "eps" not in skip:
        w.add_layer_norm_rms_eps(meta.pop("layer_norm_rms_epsilon", 1e-5))
    if "rope_scaling_type" in meta:
        w.add_rope_scaling_type(gguf.RopeScalingType(meta.pop("rope_scaling_type")))
        w.add_rope_scaling_factor(4.0)
    assert not meta, f"unknown meta keys {sorted(meta)}"
    tokens = byte_alphabet() + ["he", "<|endoftext|>", "<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3, 3])
    w.add_token_merges(["h e"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(258)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    shapes = {
        "token_embd.weight": (259, 8),
        "output_norm.weight": (8,),
        "blk.0.attn_norm.weight": (8,),
        "blk.0.attn_q.weight": (8, 8),
        "blk.0.attn_k.weight": (4, 8),
        "blk.0.attn_v.weight": (4, 8),
        "blk.0.attn_output.weight": (8, 8),
        "blk.0.ffn_norm.weight": (8,),
        "blk.0.ffn_gate.weight": (16, 8),
        "blk.0.ffn_up.weight": (16, 8),
        "blk.0.ffn_down.weight": (8, 16),
    }
    if arch == "qwen2":
        shapes.update({"blk.0.attn_q.bias": (8,), "blk.0.attn_k.bias": (4,), "blk.0.attn_v.bias": (4,)})
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items() if n not in skip}
    tensors.update(extra_tensors or {})
    for n, a in tensors.items():
        w.add_tensor(n, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def test_tiny_llama_conversion(tmp_path):
    raw = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "ckpt", "float32", progress=False)
    got = load_tensors(out, framework="np")
    # Q has 2 heads of head_dim 4: GGUF rows (0,1,2,3 | 4,5,6,7) hold HF rows (0,2,1,3 | 4,6,5,7)
    q = raw["blk.0.attn_q.weight"]
    assert np.array_equal(got["model.layers.0.self_attn.q_proj.weight"], q[[0, 2, 1, 3, 4, 6, 5, 7]])
    k = raw["blk.0.attn_k.weight"]
    assert np.array_equal(got["model.layers.0.self_attn.k_proj.weight"], k[[0, 2, 1, 3]])
    assert np.array_equal(got["model.layers.0.self_attn.v_proj.weight"], raw["blk.0.attn_v.weight"])
    assert np.array_equal(got["model.embed_tokens.weight"], raw["token_embd.weight"])
    assert "lm_head.weight" not in got
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is True and config["eos_token_id"] == [258, 257]
    tok = Tokenizer.from_checkpoint(out)
    assert tok.encode("hehe<|im_end|>") == [256, 256, 258]
    assert tok.decode(tok.encode("héllo 12")) == "héllo 12"


def test_tiny_qwen2_conversion_keeps_row_order(tmp_path):
    raw = write_tiny_gguf(tmp_path / "tiny.gguf", arch="qwen2", pre="qwen2")
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "ckpt", "bfloat16", progress=False)
    got = load_tensors(out)
    for gname in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_q.bias"):
        want = torch.from_numpy(raw[gname]).to(torch.bfloat16)
        assert torch.equal(got[hf_name(gname)].view(torch.int16), want.view(torch.int16)), gname
    assert json.loads((out / "config.json").read_text())["swiftspec"]["attention_bias"] is True


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match=f"GGUF file {tmp_path / 'absent.gguf'} does not exist"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a GGUF")
    with pytest.raises(CheckpointError, match=rf"{path} is not a GGUF file: it starts with b'PK\\x03\\x04'"):
        convert_gguf(path, tmp_path / "out")
    path.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    with pytest.raises(CheckpointError, match=f"{path} cannot be parsed as GGUF"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 600])
    with pytest.raises(CheckpointError, match=str(path)):
        convert_gguf(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_unknown_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    write_tiny_gguf(path, arch="mamba")
    with pytest.raises(CheckpointError, match=r"general\.architecture is 'mamba'.*supported: llama, qwen2"):
        convert_gguf(path, tmp_path / "out")


def test_unknown_pre_tokenizer(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, pre="deepseek-coder")
    with pytest.raises(CheckpointError, match=r"tokenizer\.ggml\.pre is 'deepseek-coder'"):
        convert_gguf(path, tmp_path / "out")


def test_missing_metadata_and_tensors(tmp_path):
    write_tiny_gguf(tmp_path / "a.gguf", skip=("eps",))
    with pytest.raises(CheckpointError, match=r"'llama\.attention\.layer_norm_rms_epsilon' is missing"):
        convert_gguf(tmp_path / "a.gguf", tmp_path / "out")
    write_tiny_gguf(tmp_path / "b.gguf", skip=("blk.0.ffn_up.weight",))
    with pytest.raises(CheckpointError, match=r"missing tensors \['model\.layers\.0\.mlp\.up_proj\.weight'\]"):
        convert_gguf(tmp_path / "b.gguf", tmp_path / "out")
    write_tiny_gguf(tmp_path / "c.gguf", extra_tensors={"blk.0.attn_output.bias": np.zeros(8, np.float32)})
    with pytest.raises(CheckpointError, match=r"GGUF tensor 'blk\.0\.attn_output\.bias' is not supported"):
        convert_gguf(tmp_path / "c.gguf", tmp_path / "out")


def test_output_folder_and_dtype_checks(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    with pytest.raises(CheckpointError, match="unsupported checkpoint dtype 'float16'"):
        convert_gguf(path, tmp_path / "out", "float16")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError) as info:
        convert_gguf(path, busy, progress=False)
    assert (
        str(info.value)
        == f"output folder {busy} is not empty; choose a new folder or pass overwrite=True to write into it"
    )
    convert_gguf(path, busy, progress=False, overwrite=True)
    assert (busy / "notes.txt").read_text() == "keep me" and read_manifest(busy)["dtype"] == "bfloat16"


def test_hf_input_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist or is not a folder"):
        convert_hf(tmp_path / "nothing", tmp_path / "out")
    hf = tmp_path / "hf"
    hf.mkdir()
    with pytest.raises(CheckpointError, match=f"{hf / 'config.json'} does not exist"):
        convert_hf(hf, tmp_path / "out")
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (hf / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match="model_type is 'gpt2'"):
        convert_hf(hf, tmp_path / "out")
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(CheckpointError, match="holds no \\*.safetensors weights"):
        convert_hf(hf, tmp_path / "out")
    (hf / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(CheckpointError, match="header length"):
        convert_hf(hf, tmp_path / "out")


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "convert_weights.py"), *args], capture_output=True, text=True
    )


def test_convert_weights_cli(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    done = run_tool(str(path), "--out", str(tmp_path / "ckpt"), "--dtype", "float32", "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "ckpt")
    assert read_manifest(tmp_path / "ckpt")["dtype"] == "float32"

    missing = run_tool(str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "x"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: input {tmp_path / 'nope.gguf'} does not exist"

    not_gguf = run_tool(str(tmp_path / "ckpt" / "config.json"), "--out", str(tmp_path / "x"))
    assert not_gguf.returncode == 2 and "is not a GGUF file" in not_gguf.stderr
    assert "Traceback" not in not_gguf.stderr

    tp = run_tool(str(path), "--out", str(tmp_path / "y"), "--tp", "2", "--quiet")
    assert tp.returncode == 0, tp.stderr
    assert json.loads((tmp_path / "y" / "manifest.json").read_text())["tp_degree"] == 2
    bad_tp = run_tool(str(path), "--out", str(tmp_path / "z"), "--tp", "0")
    assert bad_tp.returncode == 2 and "--tp 0" in bad_tp.stderr and "Traceback" not in bad_tp.stderr


def test_convert_weights_cli_checks_the_output_folder_first(tmp_path):
    """A non-empty --out is refused before the input is read (it was refused after the whole
    conversion's reading and hashing), naming the flag that allows it; --overwrite writes into it."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    message = f"error: output folder {busy} is not empty; choose a new folder or pass --overwrite to write into it"
    refused = run_tool(str(path), "--out", str(busy), "--quiet")
    assert refused.returncode == 2 and refused.stderr.strip() == message
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a GGUF file")  # never opened: the folder is checked first
    refused = run_tool(str(not_gguf), "--out", str(busy), "--tp", "2", "--quiet")
    assert refused.returncode == 2 and refused.stderr.strip() == message
    done = run_tool(str(path), "--out", str(busy), "--overwrite", "--quiet")
    assert done.returncode == 0, done.stderr
    assert (busy / "notes.txt").read_text() == "keep me" and read_manifest(busy)["dtype"] == "bfloat16"


# --------------------------------------------------------------------------- configs the runtime refuses, outputs


def tiny_hf_folder(tmp_path: Path) -> Path:
    """An HF folder (config.json, model.safetensors under HF names, tokenizer files): a tiny float32
    conversion without its manifest."""
    write_tiny_gguf(tmp_path / "tiny.gguf")
    hf = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf", "float32", progress=False)
    (hf / "manifest.json").unlink()
    return hf


@pytest.mark.parametrize(
    "edit, needle",
    [
        ({"num_attention_heads": 0}, "field 'num_attention_heads' is 0, expected an integer in [1, 2147483647]"),
        ({"num_hidden_layers": 1.0}, "field 'num_hidden_layers' must be an integer, got 1.0"),
        ({"num_hidden_layers": 10**12}, "field 'num_hidden_layers' is out of range: 1000000000000"),
        ({"num_hidden_layers": 10**6}, "config says num_hidden_layers = 1000000, but the weights hold only 11 tensors"),
        ({"hidden_size": 8.0}, "field 'hidden_size' must be an integer, got 8.0"),
        ({"num_key_value_heads": "1"}, "field 'num_key_value_heads' must be an integer, got \"1\""),
        ({"head_dim": 3}, "head_dim must be even for RoPE, got 3"),
        ({"rms_norm_eps": float("nan")}, "field 'rms_norm_eps' is nan, expected a finite number"),
        ({"rms_norm_eps": -1}, "field 'rms_norm_eps' must be > 0, got -1"),
        ({"rope_theta": True}, "rope_theta is True, expected a number"),
        ({"rope_theta": 0.0}, "field 'rope_theta' must be > 0, got 0"),
        ({"max_position_embeddings": 0}, "field 'max_position_embeddings' must be > 0, got 0"),
        ({"tie_word_embeddings": "no"}, "field 'tie_word_embeddings' must be true or false, got \"no\""),
        ({"eos_token_id": 10**6}, "eos_token_id 1000000 is outside the vocabulary [0, 259)"),
        ({"rope_scaling": "linear"}, "field 'rope_scaling' must be an object or null"),
        (
            {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
            "unsupported rope_scaling type 'dynamic' (supported: llama3, yarn, default)",
        ),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 0.5}}, "field 'rope_scaling.factor' must be >= 1, got 0.5"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": float("nan")}},
            "field 'rope_scaling.factor' is nan, expected a finite number",
        ),
        (
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": float("inf"),
                    "original_max_position_embeddings": 64,
                }
            },
            "field 'rope_scaling.high_freq_factor' is inf, expected a finite number",
        ),
        (
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 0.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                }
            },
            "field 'rope_scaling.factor' must be >= 1, got 0",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 2.0,
                    "high_freq_factor": 2.0,
                    "original_max_position_embeddings": 64,
                }
            },
            "field 'rope_scaling.high_freq_factor' must be greater than low_freq_factor (2), got 2",
        ),
    ],
)
def test_hf_config_the_runtime_would_refuse_is_refused_before_writing(tmp_path, edit, needle):
    """Each of these configs was converted (a checkpoint the runtime then refused on every load, a
    non-JSON NaN in its config.json, rope_theta true read as 1.0), or crashed the converter with a
    traceback (0 heads: ZeroDivisionError; a float layer count: TypeError), or hung it (10^12 layers)."""
    hf = tiny_hf_folder(tmp_path)
    config = json.loads((hf / "config.json").read_text())
    config.update(edit)
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as info:
        convert_hf(hf, tmp_path / "out", "float32", progress=False)
    assert str(info.value).startswith(str(hf)) and needle in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "meta, needle",
    [
        ({"head_count": 0}, "field 'llama.attention.head_count' is 0, expected an integer in [1, 2147483647]"),
        (
            {"block_count": 2**31},
            "(config.json made from its metadata): field 'num_hidden_layers' is out of range: 2147483648",
        ),
        ({"block_count": 10**6}, "config says num_hidden_layers = 1000000, but the weights hold only 11 tensors"),
        ({"layer_norm_rms_epsilon": -1.0}, "field 'rms_norm_eps' must be > 0, got -1"),
        ({"rope_freq_base": 0.0}, "field 'rope_theta' must be > 0, got 0"),
        ({"context_length": 0}, "field 'max_position_embeddings' must be > 0, got 0"),
        (
            {"rope_scaling_type": "linear"},
            "llama.rope.scaling.type is 'linear'; RoPE scaling from GGUF metadata is not supported",
        ),
    ],
)
def test_gguf_metadata_the_runtime_would_refuse_is_refused_before_writing(tmp_path, meta, needle):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, meta=meta)
    with pytest.raises(CheckpointError) as info:
        convert_gguf(path, tmp_path / "out", progress=False)
    assert str(info.value).startswith(str(path)) and needle in str(info.value)
    assert not (tmp_path / "out").exists()


def test_output_path_that_cannot_be_made_is_one_line(tmp_path):
    """An --out whose parent cannot hold a folder was a FileNotFoundError traceback (exit status 1)."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    for extra in ([], ["--tp", "2"]):
        done = run_tool(str(path), "--out", "/proc/swiftspec-out", "--quiet", *extra)
        assert done.returncode == 2, done.stderr
        assert done.stderr == "error: cannot write the output folder /proc/swiftspec-out: No such file or directory\n"
    with pytest.raises(CheckpointError, match="cannot write the output folder /proc/swiftspec-out"):
        convert_gguf(path, "/proc/swiftspec-out", progress=False)


def test_output_folder_that_is_the_input_folder_is_refused_and_the_input_kept(tmp_path):
    """--out equal to the input folder with --overwrite deleted the input's manifest, wrote the new
    weights over it (int4: the float weights replaced) and ended in a SameFileError traceback."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    ckpt = convert_gguf(path, tmp_path / "ckpt", "float32", progress=False)
    (tmp_path / "h").mkdir()
    hf = tiny_hf_folder(tmp_path / "h")
    before = {f.name: f.read_bytes() for d in (ckpt, hf) for f in d.iterdir()}
    cases = [
        (ckpt, ckpt, ["--tp", "2"]),
        (ckpt, Path(str(ckpt) + "/"), ["--dtype", "int4", "--group-size", "8"]),
        (hf, hf, []),
    ]
    for source, out, extra in cases:
        done = run_tool(str(source), "--out", str(out), "--overwrite", "--quiet", *extra)
        assert done.returncode == 2, done.stderr
        assert done.stderr == (
            f"error: output folder {out} is the input folder {source}; write the converted "
            "checkpoint to another folder\n"
        )
    assert {f.name: f.read_bytes() for d in (ckpt, hf) for f in d.iterdir()} == before
    from swiftspec.convert.int4_checkpoint import quantize_checkpoint
    from swiftspec.convert.tp_shard import shard_checkpoint

    for call in (
        lambda: quantize_checkpoint(ckpt, ckpt, 8, progress=False, overwrite=True),
        lambda: shard_checkpoint(ckpt, ckpt, 2, progress=False, overwrite=True),
        lambda: convert_hf(hf, hf, progress=False, overwrite=True),
    ):
        with pytest.raises(CheckpointError, match="is the input folder"):
            call()
    assert read_manifest(ckpt)["dtype"] == "float32"


def test_tp_degree_above_the_head_count_is_refused(tmp_path):
    """--tp 3 of a 2-head model wrote a folder the runtime refuses (TpPlan: each rank needs a head);
    --tp 99999 wrote 100005 files (411 MB) of it."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    done = run_tool(str(path), "--out", str(tmp_path / "tp3"), "--tp", "3", "--quiet")
    assert done.returncode == 2
    assert (
        done.stderr == "error: tp (TP degree) 3 exceeds the model's 2 attention heads: each rank needs at least one\n"
    )
    assert not (tmp_path / "tp3").exists() and [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]


def _rewrite_header(path: Path, edit) -> None:
    import struct

    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


UP = "model.layers.0.mlp.up_proj.weight"


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda h: h.__setitem__(UP, "x"), f"tensor '{UP}': header entry 'x' is not an object"),
        (
            lambda h: h[UP].__setitem__("data_offsets", [0, 1, 2]),
            "field 'data_offsets' is [0, 1, 2], expected [begin, end]",
        ),
        (lambda h: h[UP].__setitem__("data_offsets", "0-4"), "field 'data_offsets' is '0-4', expected [begin, end]"),
        (
            lambda h: h[UP].__setitem__("shape", [16.0, 8]),
            "field 'shape' is [16.0, 8], expected a list of integers >= 0",
        ),
        (lambda h: h[UP].pop("shape"), "field 'shape' is None, expected a list of integers >= 0"),
        (lambda h: h[UP].pop("dtype"), "field 'dtype' is None, expected a string"),
        (lambda h: h[UP].__setitem__("dtype", ["F32"]), "field 'dtype' is ['F32'], expected a string"),
    ],
)
def test_malformed_safetensors_header_entry_is_named(tmp_path, edit, needle):
    """A header entry that is not an object, or a missing or mistyped dtype / shape / data_offsets,
    was an AttributeError / KeyError / TypeError / ValueError traceback (exit status 1)."""
    hf = tiny_hf_folder(tmp_path)
    _rewrite_header(hf / "model.safetensors", edit)
    for extra in ([], ["--dtype", "int4", "--group-size", "8"]):
        done = run_tool(str(hf), "--out", str(tmp_path / "out"), "--quiet", *extra)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: {hf / 'model.safetensors'}: ") and needle in done.stderr
        assert done.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("shard", [1, "../elsewhere/model.safetensors", ""])
def test_index_naming_a_shard_that_is_not_a_file_name_is_refused(tmp_path, shard):
    """weight_map values other than a shard's file name: 1 was a TypeError traceback; a path
    outside the folder was read."""
    hf = tiny_hf_folder(tmp_path)
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {UP: shard}}))
    with pytest.raises(CheckpointError) as info:
        convert_hf(hf, tmp_path / "out", progress=False)
    assert str(info.value) == (
        f"{hf / 'model.safetensors.index.json'}: weight_map[{UP!r}] is {shard!r}, expected "
        "the file name of a shard in the folder"
    )


@pytest.mark.parametrize(
    "file, edit, needle",
    [
        (
            "config.json",
            {"head_dim": None},
            "config.json: field 'head_dim' is None, expected an integer in [1, 2147483647]",
        ),
        (
            "config.json",
            {"num_hidden_layers": "1"},
            "config.json: field 'num_hidden_layers' is '1', expected an integer",
        ),
        ("config.json", {"swiftspec": None}, "config.json: field 'swiftspec' must be an object"),
        (
            "config.json",
            {"swiftspec": {}},
            "config.json: field 'swiftspec' is {}, expected an object with the boolean 'attention_bias'",
        ),
        ("config.json", "{", "config.json cannot be read as JSON: Expecting property name"),
        ("config.json", "[]", "config.json: expected a JSON object"),
        (
            "manifest.json",
            {"files": ["../hf/model.safetensors"]},
            "manifest.json: listed file '../hf/model.safetensors' must be a plain file name inside the folder",
        ),
    ],
)
def test_edited_checkpoint_folder_is_named_when_quantized_or_sharded(tmp_path, file, edit, needle):
    """An edited config.json of a checkpoint folder given to --dtype int4 or --tp was a KeyError /
    TypeError / JSONDecodeError traceback; a manifest naming a weight file outside the folder (which
    the runtime refuses) was read and converted."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    ckpt = convert_gguf(path, tmp_path / "ckpt", "float32", progress=False)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes())
    if isinstance(edit, str):
        (ckpt / file).write_text(edit)
    else:
        (ckpt / file).write_text(json.dumps({**json.loads((ckpt / file).read_text()), **edit}))
    for extra in (["--tp", "2"], ["--dtype", "int4", "--group-size", "8"]):
        done = run_tool(str(ckpt), "--out", str(tmp_path / "out"), "--quiet", *extra)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: {ckpt / file}") and needle in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_an_interrupted_conversion_is_named_as_such_when_loaded(tmp_path, monkeypatch):
    """A checkpoint folder without its manifest (an interrupted --dtype int4 or --tp conversion) was
    read as a Hugging Face folder, and refused for missing q_proj.weight tensors or a tensor in two
    files, without a word about the conversion. A complete float folder without its manifest still
    converts (it is a valid HF folder)."""
    from swiftspec.models import resolve_checkpoint

    monkeypatch.setenv("SWIFTSPEC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    ckpt = convert_gguf(path, tmp_path / "ckpt", "float32", progress=False)
    half = run_tool(str(ckpt), "--out", str(tmp_path / "half4"), "--dtype", "int4", "--group-size", "8", "--quiet")
    assert half.returncode == 0, half.stderr
    (tmp_path / "half4" / "manifest.json").unlink()
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint(tmp_path / "half4")
    assert str(info.value).startswith(
        f"{tmp_path / 'half4'} looks like an incomplete swiftspec checkpoint: its config.json is one the converter "
        "writes, but manifest.json, written last, is missing (the conversion was interrupted or failed; convert it "
        f"again). Read as a Hugging Face folder it fails: {tmp_path / 'half4'}: missing tensors"
    )
    # the failed conversion left nothing in the cache (paths.build_folder_atomically)
    assert list((tmp_path / "cache" / "checkpoints").iterdir()) == []
    (ckpt / "manifest.json").unlink()
    out = resolve_checkpoint(ckpt, "float32")
    assert read_manifest(out)["source"]["kind"] == "hf"
    assert load_tensors(out, "np").keys() == load_tensors(ckpt, "np").keys()
