"""Hugging Face folders quantized with AutoAWQ (GEMM) and GPTQ, converted to the int4 format.

The folders are written here in the published layouts, from random float weights: quantized per
AutoAWQ's and GPTQ's quantizers (round-to-nearest with their scale / zero-point rules; GPTQ's
Hessian-driven rounding changes which values are chosen, not how they are stored), packed per
AutoAWQ's ``WQLinear_GEMM`` and AutoGPTQ's ``QuantLinear.pack``, written independently of the
converter's unpacking code. Checked: the converted folder dequantizes to exactly the values the source
folder holds, and its logits on the CPU backend equal those of a float32 folder of those values; bad
folders are refused naming the field or tensor before any weight is written.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from swiftspec import CheckpointError
from swiftspec import swiftspec_core as core
from swiftspec.convert import convert_hf
from swiftspec.convert.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from swiftspec.convert.int4 import dequantize
from swiftspec.convert.manifest import read_manifest
from swiftspec.convert.safetensors_reader import SafetensorsFile

CONVERT = Path(__file__).resolve().parents[1] / "tools" / "convert_weights.py"
HF_CONFIG = {
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
}
PROJ = {
    "self_attn.q_proj": (32, 32),
    "self_attn.k_proj": (16, 32),
    "self_attn.v_proj": (16, 32),
    "self_attn.o_proj": (32, 32),
    "mlp.gate_proj": (64, 32),
    "mlp.up_proj": (64, 32),
    "mlp.down_proj": (32, 64),
}
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's order_map: bits 4i..4i+3 hold column AWQ_ORDER[i]


# ---------------------------------------------------------------------------- the published quantizers
def _fp16_exact(x):
    """Round to bfloat16 and drop magnitudes below fp16's normal range: values exact in fp16 *and*
    bf16, so the float tensors are the same in the fp16 source, the bf16 int4 folder and float32."""
    b = bfloat16_bits_to_float32(float32_to_bfloat16_bits(np.asarray(x, np.float32)))
    return np.where(np.abs(b) < 2.0**-14, 0.0, b).astype(np.float32)


def awq_quantize(w, group):
    """AutoAWQ's ``pseudo_quantize_tensor`` with ``zero_point`` true, per group of input features of
    each row: scale = (max - min) / 15 (stored fp16), zero = clamp(-round(min / scale), 0, 15),
    q = clamp(round(w / scale) + zero, 0, 15). Returns q [N, K], z [N, K/G] (int) and s fp16 [N, K/G]."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    s = (np.maximum(g.max(2) - g.min(2), 1e-5) / 15).astype(np.float16)
    s32 = s.astype(np.float32)
    z = np.clip(-np.round(g.min(2) / s32), 0, 15)
    q = np.clip(np.round(g / s32[:, :, None]) + z[:, :, None], 0, 15)
    return q.reshape(n, k).astype(np.int64), z.astype(np.int64), s


def gptq_quantize(w, group, sym):
    """GPTQ's ``Quantizer`` (4 bits, per group): the range [min(x, 0), max(x, 0)], symmetric made
    +-max(|min|, max); scale = range / 15 (stored fp16); zero = 8 if sym else round(-min / scale);
    q = clamp(round(w / scale) + zero, 0, 15)."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = np.minimum(g.min(2), 0), np.maximum(g.max(2), 0)
    if sym:
        hi = np.maximum(np.abs(lo), hi)
        lo = np.where(lo < 0, -hi, 0)
    s = ((hi - lo) / 15).astype(np.float16)
    s32 = s.astype(np.float32)
    z = np.full(s.shape, 8.0) if sym else np.round(-lo / s32)
    q = np.clip(np.round(g / s32[:, :, None]) + z[:, :, None], 0, 15)
    return q.reshape(n, k).astype(np.int64), z.astype(np.int64), s


def _words(fields):
    """int32 words of 4-bit fields [..., 8] (field i in bits 4i..4i+3)."""
    out = np.zeros(fields.shape[:-1], np.uint32)
    for i in range(8):
        out |= (fields[..., i].astype(np.uint32) & 0xF) << np.uint32(4 * i)
    return out.view(np.int32)


def awq_pack(q, z, s):
    """AutoAWQ GEMM tensors: qweight [K, N/8] and qzeros [K/G, N/8] packed along output columns in
    AWQ_ORDER, scales [K/G, N]."""

    def cols(a):  # [R, N] -> [R, N/8] words
        a = a.reshape(a.shape[0], -1, 8)
        return _words(np.stack([a[:, :, AWQ_ORDER[i]] for i in range(8)], axis=-1))

    return {"qweight": cols(q.T), "qzeros": cols(z.T), "scales": np.ascontiguousarray(s.T)}


def gptq_pack(q, z, s, group, v1=True):
    """AutoGPTQ tensors: qweight [K/8, N] packed along input rows, qzeros [K/G, N/8] along output
    columns (zero - 1 in the original "gptq" format, 4 bits wide), scales [K/G, N], g_idx [K]."""
    n, k = q.shape
    qweight = _words(q.T.reshape(k // 8, 8, n).transpose(0, 2, 1))
    zeros = (z - 1 if v1 else z).T  # [K/G, N]
    qzeros = _words(zeros.reshape(zeros.shape[0], n // 8, 8))
    return {
        "qweight": qweight,
        "qzeros": qzeros,
        "scales": np.ascontiguousarray(s.T),
        "g_idx": (np.arange(k) // group).astype(np.int32),
    }


def quantized_folder(folder, method="awq", group=16, sym=False, fmt="gptq", seed=0, edit=None):
    """An HF folder of the tiny model quantized with ``method`` in its published layout.

    Returns (folder, values): values[prefix] the float32 [N, K] weights the folder holds,
    ``(q - z) * s``, and values[name] every float tensor as stored (fp16-exact).
    """
    rng = np.random.default_rng(seed)
    tensors, values = {}, {}
    hidden, vocab = HF_CONFIG["hidden_size"], HF_CONFIG["vocab_size"]
    floats = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(HF_CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        floats.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.bias": (32,),
                p + "self_attn.k_proj.bias": (16,),
                p + "self_attn.v_proj.bias": (16,),
            }
        )
        for proj, (n, k) in PROJ.items():
            w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
            g = k if group == -1 else group
            if method == "awq":
                q, z, s = awq_quantize(w, g)
                packed = awq_pack(q, z, s)
            else:
                q, z, s = gptq_quantize(w, g, sym)
                packed = gptq_pack(q, z, s, g, v1=fmt == "gptq")
            values[p + proj] = ((q - np.repeat(z, g, axis=1)) * np.repeat(s.astype(np.float32), g, axis=1)).astype(
                np.float32
            )
            tensors.update({f"{p}{proj}.{t}": a for t, a in packed.items()})
    for name, shape in floats.items():
        v = _fp16_exact(rng.standard_normal(shape) * 0.1 + (1.0 if name.endswith("norm.weight") else 0.0))
        values[name] = v
        tensors[name] = v.astype(np.float16)
    if method == "awq":
        qc = {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        }
    else:
        qc = {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": group,
            "desc_act": False,
            "sym": sym,
            "checkpoint_format": fmt,
            "damp_percent": 0.01,
            "true_sequential": True,
        }
    config = {**HF_CONFIG, "torch_dtype": "float16", "quantization_config": qc}
    if edit:
        edit(config, tensors)
    Path(folder).mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    (Path(folder) / "config.json").write_text(json.dumps(config))
    (Path(folder) / "tokenizer.json").write_text("{}")
    return Path(folder), values


def float_folder(folder, values):
    """A plain float32 HF folder holding ``values`` (projection prefixes get ``.weight``)."""
    tensors = {(n + ".weight" if n.endswith("_proj") else n): v for n, v in values.items()}
    Path(folder).mkdir(parents=True)
    save_file(tensors, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    (Path(folder) / "config.json").write_text(json.dumps(HF_CONFIG))
    (Path(folder) / "tokenizer.json").write_text("{}")
    return Path(folder)


def _int4_values(folder):
    """prefix -> float32 [N, K] dequantized from an int4 checkpoint (the format's formula)."""
    group = read_manifest(folder)["quantization"]["group_size"]
    f = SafetensorsFile(Path(folder) / "model.safetensors")
    out = {}
    for name in f.entries:
        if name.endswith(".qweight"):
            p = name[: -len(".qweight")]
            out[p] = dequantize(
                f.integers(name), f.float32(p + ".scales").astype(np.float16), f.integers(p + ".zeros"), group
            )
        elif name.endswith(("norm.weight", "bias", "embed_tokens.weight")):
            out[name] = f.float32(name)
    return out


CASES = {
    "awq g16": dict(method="awq", group=16),
    "awq g32": dict(method="awq", group=32),
    "awq per-row": dict(method="awq", group=-1),
    "gptq asym g16": dict(method="gptq", group=16, sym=False),
    "gptq sym g32": dict(method="gptq", group=32, sym=True),
    "gptq_v2 asym g16": dict(method="gptq", group=16, sym=False, fmt="gptq_v2"),
    "gptq sym per-row": dict(method="gptq", group=-1, sym=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_folder_converts_to_exactly_its_values(tmp_path, case):
    """Every projection of the int4 folder dequantizes to exactly the source folder's (q - z) * s;
    the float tensors are the same values; the logits on the CPU backend equal those of a float32
    folder of those values (bit for bit when the group size is not a multiple of 32, where the int4
    GEMM sums in the same order as the float32 one; else to float32 rounding)."""
    src, values = quantized_folder(tmp_path / "src", **CASES[case])
    out = convert_hf(src, tmp_path / "int4", dtype="int4", progress=False)
    got = _int4_values(out)
    assert sorted(got) == sorted(values)
    for name, v in values.items():
        assert np.array_equal(got[name], v), name
    manifest = read_manifest(out)
    q = manifest["quantization"]
    group = CASES[case]["group"]
    assert q["method"] == CASES[case]["method"] and q["source_group_size"] == group
    assert q["group_size"] == (32 if group == -1 else group)  # per-row: the largest of 128..8 dividing 32 and 64
    assert q["symmetric"] == CASES[case].get("sym", False)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())

    ref = convert_hf(float_folder(tmp_path / "ref", values), tmp_path / "f32", dtype="float32", progress=False)
    tokens = [1, 5, 7, 9, 30, 2, 63]
    ours = core.load_model(str(out)).forward(tokens, logits="all")
    theirs = core.load_model(str(ref)).forward(tokens, logits="all")
    assert np.isfinite(ours).all()
    if q["group_size"] % 32:
        assert np.array_equal(ours, theirs)
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))


def test_quantized_folder_as_float32_is_dequantized_exactly(tmp_path):
    src, values = quantized_folder(tmp_path / "src", method="gptq", group=16)
    out = convert_hf(src, tmp_path / "f32", dtype="float32", progress=False)
    f = SafetensorsFile(out / "model.safetensors")
    for name, v in values.items():
        t = name + ".weight" if name.endswith("_proj") else name
        assert np.array_equal(f.float32(t), v), name
    assert read_manifest(out)["dequantized_from"]["source_layout"] == "gptq"


def test_awq_unpacking_follows_the_order_map():
    """One word per published example: columns 0..7 with values 0..7 pack as 0x75316420 in AutoAWQ's
    order (field i holds column AWQ_ORDER[i]) and unpack to 0..7; GPTQ's natural order is 0x76543210."""
    from swiftspec.convert.awq_gemm_layout import unpack_awq_columns
    from swiftspec.convert.int4 import nibbles_of_int32

    words = awq_pack(np.arange(8)[:, None].repeat(8, 1), np.zeros((8, 1), int), np.ones((8, 1), np.float16))
    assert words["qweight"][0, 0].view(np.uint32) == 0x75316420
    assert unpack_awq_columns(np.array([[0x75316420]], np.uint32).view(np.int32)).tolist() == [list(range(8))]
    assert nibbles_of_int32(np.array([0x76543210], np.int32)).tolist() == [list(range(8))]


def test_gptq_zero_point_16_is_folded_or_refused(tmp_path):
    """A "gptq"-format qzeros field of 15 means zero point 16 (AutoGPTQ's zero - 1 wrapped). A group
    without a 0 value is stored as (q - 1) - 15, the same weights; one with a 0 cannot be, and is
    refused naming the tensor."""
    from swiftspec.convert.gptq_layout import unpack_gptq

    rng = np.random.default_rng(3)
    q = rng.integers(1, 16, size=(8, 16))
    z = np.array([[16, 3]] * 8)
    s = np.full((8, 2), 0.5, np.float16)
    t = gptq_pack(q, z, s, 8)
    q2, z2, s2 = unpack_gptq(t["qweight"], t["qzeros"], t["scales"], 1)
    assert z2[:, 0].tolist() == [15] * 8 and z2[:, 1].tolist() == [3] * 8
    want = (q - np.repeat(z, 8, 1)) * 0.5
    assert np.array_equal((q2.astype(int) - np.repeat(z2.astype(int), 8, 1)) * 0.5, want)
    q[5, 2] = 0
    t = gptq_pack(q, z, s, 8)
    with pytest.raises(CheckpointError, match=r"'blk\.qzeros': zero point 16 .* group 0 of output feature 5"):
        unpack_gptq(t["qweight"], t["qzeros"], t["scales"], 1, "blk.qzeros")


# ---------------------------------------------------------------------------- bad folders
def _qc(**changes):
    def edit(config, tensors):
        config["quantization_config"].update(changes)

    return edit


def _tensor(name, fn):
    def edit(config, tensors):
        fn(tensors, name)

    return edit


Q0 = "model.layers.0.self_attn.q_proj"


def _unquantize(tensors, prefix):
    """The projection left in float (as ``modules_to_not_convert`` does)."""
    for suffix in ("qweight", "qzeros", "scales"):
        tensors.pop(f"{prefix}.{suffix}")
    tensors[prefix + ".weight"] = np.zeros((32, 32), np.float16)


BAD = {
    "bits 8": ("awq", _qc(bits=8), r"config\.json: field 'quantization_config\.bits' is 8; .*4-bit weights only"),
    "gptq bits 3": ("gptq", _qc(bits=3), r"field 'quantization_config\.bits' is 3"),
    "desc_act": ("gptq", _qc(desc_act=True), r"field 'quantization_config\.desc_act' is true; .*act-order"),
    "awq gemv": ("awq", _qc(version="gemv"), r"field 'quantization_config\.version' is \"gemv\"; only AutoAWQ's GEMM"),
    "awq no zero point": ("awq", _qc(zero_point=False), r"field 'quantization_config\.zero_point' is false"),
    "gptq marlin format": (
        "gptq",
        _qc(checkpoint_format="marlin"),
        r"field 'quantization_config\.checkpoint_format' is \"marlin\"",
    ),
    "other method": (
        "awq",
        _qc(quant_method="bitsandbytes"),
        r"field 'quantization_config\.quant_method' is \"bitsandbytes\"",
    ),
    "group size not dividing": (
        "awq",
        _qc(group_size=64),
        r"field 'quantization_config\.group_size' is 64, which "
        r"does not divide hidden_size = 32",
    ),
    "group size not a multiple of 8": (
        "gptq",
        _qc(group_size=12),
        r"'quantization_config\.group_size' is 12; "
        r"expected a positive multiple of 8",
    ),
    "missing qzeros": (
        "awq",
        _tensor(Q0 + ".qzeros", lambda t, n: t.pop(n)),
        r"\(autoawq-gemm\): missing tensor 'model\.layers\.0\.self_attn\.q_proj\.qzeros'",
    ),
    "gptq missing qzeros": (
        "gptq",
        _tensor("model.layers.1.mlp.down_proj.qzeros", lambda t, n: t.pop(n)),
        r"missing tensor 'model\.layers\.1\.mlp\.down_proj\.qzeros'",
    ),
    "awq qweight transposed": (
        "awq",
        _tensor(Q0 + ".qweight", lambda t, n: t.__setitem__(n, np.zeros((4, 32), np.int32))),
        r"tensor 'model\.layers\.0\.self_attn\.q_proj\.qweight' has shape \[4, 32\], "
        r"expected \[32, 4\]",
    ),
    "gptq scales wrong": (
        "gptq",
        _tensor(Q0 + ".scales", lambda t, n: t.__setitem__(n, t[n][:1])),
        r"'model\.layers\.0\.self_attn\.q_proj\.scales' has shape \[1, 32\], expected \[2, 32\]",
    ),
    "qweight as float": (
        "awq",
        _tensor(Q0 + ".qweight", lambda t, n: t.__setitem__(n, t[n].view(np.float32))),
        r"'model\.layers\.0\.self_attn\.q_proj\.qweight' has dtype F32, expected I32 or U32",
    ),
    "float projection left": (
        "awq",
        _tensor(Q0, lambda t, n: _unquantize(t, n)),
        r"missing tensor 'model\.layers\.0\.self_attn\.q_proj\.qweight' \(the folder holds the "
        r"float model\.layers\.0\.self_attn\.q_proj\.weight",
    ),
    "quantized lm_head": (
        "gptq",
        _tensor("lm_head.qweight", lambda t, n: t.__setitem__(n, np.zeros((8, 64), np.int32))),
        r"unexpected tensors \['lm_head\.qweight'\]",
    ),
    "act-order g_idx": (
        "gptq",
        _tensor(Q0 + ".g_idx", lambda t, n: t.__setitem__(n, t[n][::-1].copy())),
        r"tensor 'model\.layers\.0\.self_attn\.q_proj\.g_idx': g_idx\[0\] is 1, expected 0",
    ),
    "infinite scale": (
        "awq",
        _tensor(Q0 + ".scales", lambda t, n: t[n].__setitem__((1, 2), np.inf)),
        r"tensor 'model\.layers\.0\.self_attn\.q_proj\.scales' holds a non-finite scale at \[1, 2\]",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_quantized_folder_is_refused_before_any_weight_is_written(tmp_path, case):
    method, edit, pattern = BAD[case]
    src, _ = quantized_folder(tmp_path / "src", method=method, edit=edit)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError, match=pattern):
        convert_hf(src, out, dtype="int4", progress=False)
    assert not (out / "model.safetensors").exists() and not (out / "manifest.json").exists()


def test_side_file_settings_are_read_and_checked(tmp_path):
    """AutoGPTQ's quantize_config.json (no quantization_config in config.json) is read the same way."""

    def move(config, tensors):
        qc = config.pop("quantization_config")
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "quantize_config.json").write_text(json.dumps({**qc, "desc_act": True}))

    src, _ = quantized_folder(tmp_path / "src", method="gptq", edit=move)
    with pytest.raises(CheckpointError, match=r"quantize_config\.json: field 'desc_act' is true"):
        convert_hf(src, tmp_path / "out", dtype="int4", progress=False)


def _convert_cli(*args):
    return subprocess.run(
        [sys.executable, str(CONVERT), *map(str, args), "--quiet"], capture_output=True, text=True, timeout=300
    )


def test_convert_cli_reads_a_quantized_folder(tmp_path):
    src, values = quantized_folder(tmp_path / "src", method="awq", group=32)
    proc = _convert_cli(src, "--out", tmp_path / "q", "--dtype", "int4")
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(tmp_path / "q")["quantization"]["group_size"] == 32
    proc = _convert_cli(src, "--out", tmp_path / "q2", "--dtype", "int4", "--group-size", "16")
    assert (
        proc.returncode == 2
        and "group size 16 was asked for, but the folder is quantized in groups of 32" in proc.stderr
    ), proc.stderr


def test_a_quantized_folder_given_as_a_model_is_converted_once(tmp_path, monkeypatch):
    """``Engine(folder, dtype="int4")`` / ``swiftspec generate --target folder --dtype int4`` resolve an
    AWQ folder through the same converter (into the cache), and the model loads."""
    from swiftspec.models import resolve_checkpoint

    monkeypatch.setenv("SWIFTSPEC_CACHE", str(tmp_path / "cache"))
    src, _ = quantized_folder(tmp_path / "src", method="awq", group=32)
    folder = resolve_checkpoint(str(src), dtype="int4")
    assert folder.parent == tmp_path / "cache" / "checkpoints"
    assert read_manifest(folder)["quantization"]["method"] == "awq"
    assert np.isfinite(core.load_model(str(folder)).forward([1, 2, 3], logits="all")).all()
