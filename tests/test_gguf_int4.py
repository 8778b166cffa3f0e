"""GGUF block quants -> the int4 layout (swiftspec.convert.gguf_int4, ``convert_gguf(..., dtype="int4")``).

The blocks are built here from 4-bit / 6-bit / 8-bit values and scales by packers written from
the published ggml block layouts (``block_q4_0``, ``block_q4_1``, ``block_q4_K``, ``block_q6_K``,
``block_q8_0`` in ggml-common.h), independently of the converter's unpacking; gguf-py's
``dequantize`` confirms each packer. Checked: the converter reads back the very values packed
(Q4_0 / Q4_1 / Q4_K), exactness where the int4 format can hold the GGUF's weights (Q4_0 always;
Q4_1 / Q4_K when the zero point ``b / a`` is an integer and the scale a float16; Q8_0 on 16
levels), error bounds where it cannot, and a tiny model converted end to end. One test runs on
the real 0.5B GGUF's tensors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from safetensors import safe_open

from swiftspec.convert import convert_gguf
from swiftspec.convert.gguf_int4 import four_bit_blocks, quantize_from_gguf
from swiftspec.convert.int4 import dequantize as int4_dequantize
from swiftspec.convert.int4 import quantize_rtn
from swiftspec.errors import CheckpointError

T = gguf.GGMLQuantizationType
CONVERT = Path(__file__).resolve().parents[1] / "tools" / "convert_weights.py"
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


# --------------------------------------------------------------------------- packers (ggml layouts)


def _half(x) -> np.ndarray:
    """float16 little-endian bytes [..., 2]."""
    return np.ascontiguousarray(np.asarray(x, dtype="<f2")[..., None]).view(np.uint8)


def pack_q4_0(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """block_q4_0 {half d; uint8 qs[16]}: qs[j] = q[j] | q[j + 16] << 4; w = d (q - 8). d [R, B], q [R, B, 32]."""
    qs = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)
    return np.concatenate([_half(d), qs], axis=-1).reshape(d.shape[0], -1)


def pack_q4_1(d: np.ndarray, m: np.ndarray, q: np.ndarray) -> np.ndarray:
    """block_q4_1 {half d; half m; uint8 qs[16]}: nibbles as Q4_0; w = d q + m."""
    qs = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)
    return np.concatenate([_half(d), _half(m), qs], axis=-1).reshape(d.shape[0], -1)


def pack_q8_0(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """block_q8_0 {half d; int8 qs[32]}: w = d q."""
    return np.concatenate([_half(d), q.astype(np.int8).view(np.uint8)], axis=-1).reshape(d.shape[0], -1)


def pack_q4_k(d, dmin, sc, mn, q) -> np.ndarray:
    """block_q4_K {half d; half dmin; uint8 scales[12]; uint8 qs[128]} of 256 values in 8 sub-blocks of
    32: w = d sc[j] q - dmin mn[j], j = i // 32; sc, mn 6-bit [R, B, 8], q [R, B, 256].
    scales: bytes 0-3 sc[0..3] (low 6 bits) with sc[4..7] >> 4 in bits 6-7; bytes 4-7 mn[0..3] with
    mn[4..7] >> 4 in bits 6-7; bytes 8-11 sc[4..7] & 15 | (mn[4..7] & 15) << 4. qs: 64 values per 32
    bytes, value 64c + l in the low nibble of byte 32c + l, value 64c + 32 + l in its high nibble."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    scales = np.concatenate(
        [
            (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6),
            (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6),
            (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4),
        ],
        axis=-1,
    )
    runs = q.reshape(*q.shape[:-1], 4, 2, 32)
    qs = (runs[..., 0, :] | (runs[..., 1, :] << 4)).reshape(*q.shape[:-1], 128).astype(np.uint8)
    return np.concatenate([_half(d), _half(dmin), scales, qs], axis=-1).reshape(d.shape[0], -1)


def pack_q6_k(d, sc, q) -> np.ndarray:
    """block_q6_K {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d} of 256 values: w = d sc[i // 16]
    (q - 32), q 6-bit. Per half h of 128 values (base 128h), l < 32: ql[64h + l] holds the low 4 bits of
    values base+l (low nibble) and base+l+64 (high); ql[64h + 32 + l] of base+l+32 and base+l+96;
    qh[32h + l] the top 2 bits of base+l, +32, +64, +96 in bits 0-1, 2-3, 4-5, 6-7."""
    r, b = d.shape
    q = q.reshape(r, b, 2, 4, 32).astype(np.uint8)  # [.., half, quarter, l]
    lo, hi = q & 15, q >> 4
    ql = np.concatenate([lo[..., 0, :] | (lo[..., 2, :] << 4), lo[..., 1, :] | (lo[..., 3, :] << 4)], axis=-1)
    qh = hi[..., 0, :] | (hi[..., 1, :] << 2) | (hi[..., 2, :] << 4) | (hi[..., 3, :] << 6)
    return np.concatenate(
        [ql.reshape(r, b, 128), qh.reshape(r, b, 64), sc.astype(np.int8).view(np.uint8), _half(d)], axis=-1
    ).reshape(r, -1)


def _random_q4_k(rng, rows, k, integer_zero=False):
    """(raw, q, a, b) of a random Q4_K tensor [rows, k]: a, b per 32 as the formula gives them."""
    nb = k // 256
    d = rng.uniform(0.0005, 0.002, (rows, nb)).astype(np.float16)
    sc = rng.integers(1, 64, (rows, nb, 8))
    q = rng.integers(0, 16, (rows, nb, 256))
    if integer_zero:  # dmin = d and mn = z sc: b / a = z, an integer; d a power of two, so d sc is a float16
        d = np.full((rows, nb), 2.0**-10, np.float16)
        sc = rng.integers(1, 8, (rows, nb, 8))
        dmin = d.copy()
        mn = sc * rng.integers(0, 8, (rows, nb, 8))
    else:
        dmin = rng.uniform(0.0005, 0.002, (rows, nb)).astype(np.float16)
        mn = rng.integers(0, 64, (rows, nb, 8))
    raw = pack_q4_k(d, dmin, sc, mn, q)
    a = (d.astype(np.float32)[..., None] * sc).reshape(rows, -1)
    b = (dmin.astype(np.float32)[..., None] * mn).reshape(rows, -1)
    return raw, q.reshape(rows, k), a.astype(np.float32), b.astype(np.float32)


def _values(raw, qtype, rows, k) -> np.ndarray:
    return gguf_dequantize(raw, qtype).astype(np.float32).reshape(rows, k)


def _rel(ours, ref) -> float:
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def _convert(w, group, blocks=None):
    qweight, scales, zeros, stats = quantize_from_gguf(w, group, "t", blocks)
    return int4_dequantize(qweight, scales, zeros, group), stats


def _rtn(w, group):
    return int4_dequantize(*quantize_rtn(w, group), group)


# --------------------------------------------------------------------------- synthetic blocks


def test_packers_agree_with_gguf_dequantize():
    """Each packer here, through gguf-py's dequantize, gives the documented formula's values."""
    rng = np.random.default_rng(1)
    rows, k = 4, 256
    d = rng.uniform(-0.01, 0.01, (rows, k // 32)).astype(np.float16)
    m = rng.uniform(-0.05, 0.0, (rows, k // 32)).astype(np.float16)
    q4 = rng.integers(0, 16, (rows, k // 32, 32))
    rep = lambda x: np.repeat(x.astype(np.float32), 32, axis=1)  # noqa: E731
    np.testing.assert_allclose(
        _values(pack_q4_0(d, q4), T.Q4_0, rows, k), rep(d) * (q4.reshape(rows, k) - 8), rtol=1e-6
    )
    np.testing.assert_allclose(
        _values(pack_q4_1(d, m, q4), T.Q4_1, rows, k), rep(d) * q4.reshape(rows, k) + rep(m), rtol=1e-6, atol=1e-7
    )
    q8 = rng.integers(-128, 128, (rows, k // 32, 32))
    np.testing.assert_allclose(_values(pack_q8_0(d, q8), T.Q8_0, rows, k), rep(d) * q8.reshape(rows, k), rtol=1e-6)
    raw, q, a, b = _random_q4_k(rng, rows, k)
    np.testing.assert_allclose(_values(raw, T.Q4_K, rows, k), rep(a) * q - rep(b), rtol=1e-5, atol=1e-7)
    d6 = rng.uniform(0.0001, 0.001, (rows, k // 256)).astype(np.float16)
    sc6 = rng.integers(-128, 128, (rows, k // 256, 16))
    q6 = rng.integers(0, 64, (rows, k // 256, 256))
    want = (np.repeat(d6.astype(np.float32)[..., None] * sc6, 16, axis=-1) * (q6 - 32)).reshape(rows, k)
    np.testing.assert_allclose(_values(pack_q6_k(d6, sc6, q6), T.Q6_K, rows, k), want, rtol=1e-6)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_four_bit_blocks_reads_back_the_packed_values(kind):
    rng = np.random.default_rng(2)
    rows, k = 3, 512
    if kind == "Q4_K":
        raw, q, a, b = _random_q4_k(rng, rows, k)
    else:
        d = rng.uniform(-0.01, 0.01, (rows, k // 32)).astype(np.float16)
        m = rng.uniform(-0.05, 0.0, (rows, k // 32)).astype(np.float16)
        q = rng.integers(0, 16, (rows, k // 32, 32))
        raw = pack_q4_0(d, q) if kind == "Q4_0" else pack_q4_1(d, m, q)
        q = q.reshape(rows, k)
        a = d.astype(np.float32)
        b = 8 * a if kind == "Q4_0" else -m.astype(np.float32)
    got_q, got_a, got_b = four_bit_blocks(raw, kind, rows, k)
    assert got_q.dtype == np.uint8 and np.array_equal(got_q, q)
    assert np.array_equal(got_a, a) and np.array_equal(got_b, b)


def test_four_bit_blocks_refuses_other_types_and_sizes():
    with pytest.raises(CheckpointError, match="GGUF type Q6_K has no 4-bit values"):
        four_bit_blocks(np.zeros((1, 210), np.uint8), "Q6_K", 1, 256)
    with pytest.raises(CheckpointError, match="does not hold 2 x 256 values"):
        four_bit_blocks(np.zeros((1, 144), np.uint8), "Q4_K", 2, 256)


@pytest.mark.parametrize("group", [32, 16, 8])
def test_q4_0_is_exact(group):
    """w = d (q - 8) is the int4 group (q, z = 8, s = d) exactly, d of either sign (a negative d stores
    15 - q, z = 7, s = -d)."""
    rng = np.random.default_rng(3)
    rows, k = 8, 256
    d = rng.uniform(-0.02, 0.02, (rows, k // 32)).astype(np.float16)
    raw = pack_q4_0(d, rng.integers(0, 16, (rows, k // 32, 32)))
    w = _values(raw, T.Q4_0, rows, k)
    ours, stats = _convert(w, group, four_bit_blocks(raw, "Q4_0", rows, k))
    assert np.array_equal(ours, w)  # every value (a zero may be +0 where the GGUF has -0: d < 0, q = 8)
    assert stats["kept"] == stats["exact"] == stats["groups"] == rows * k // group and stats["sq_error"] == 0


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K"])
def test_integer_zero_point_is_exact(kind):
    """Q4_1 / Q4_K groups whose b / a is an integer in 0..15 and a a float16 keep q exactly."""
    rng = np.random.default_rng(4)
    rows, k = 6, 512
    if kind == "Q4_K":
        raw, *_ = _random_q4_k(rng, rows, k, integer_zero=True)
    else:
        d = (2.0 ** rng.integers(-12, -6, (rows, k // 32))).astype(np.float16)
        m = (-d.astype(np.float32) * rng.integers(0, 16, d.shape)).astype(np.float16)
        raw = pack_q4_1(d, m, rng.integers(0, 16, (rows, k // 32, 32)))
    w = _values(raw, T[kind], rows, k)
    ours, stats = _convert(w, 32, four_bit_blocks(raw, kind, rows, k))
    assert np.array_equal(ours, w)
    assert stats["exact"] == stats["groups"]


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K"])
def test_fractional_zero_point_error_is_bounded(kind):
    """In general b / a is not an integer: the int4 weights are not the GGUF's. Their error is at most
    that of keeping q with the zero point rounded (|a| / 2 per weight), of round-to-nearest from the
    dequantized values at group 32, and well under that of the old route (RTN, group 128)."""
    rng = np.random.default_rng(5)
    rows, k = 64, 1024
    if kind == "Q4_K":
        raw, q, a, b = _random_q4_k(rng, rows, k)
    else:
        d = rng.uniform(0.001, 0.01, (rows, k // 32)).astype(np.float16)
        m = (-d.astype(np.float32) * rng.uniform(0, 15, d.shape)).astype(np.float16)
        raw = pack_q4_1(d, m, rng.integers(0, 16, (rows, k // 32, 32)))
        a, b = d.astype(np.float32), -m.astype(np.float32)
    w = _values(raw, T[kind], rows, k)
    ours, stats = _convert(w, 32, four_bit_blocks(raw, kind, rows, k))
    rms = np.sqrt(np.square(ours - w).reshape(rows, -1, 32).mean(axis=2))
    inside = (b >= 0) & (b <= 15 * a)  # a zero point in 0..15 reaches the GGUF's offset (random Q4_K: not all)
    assert inside.mean() > 0.5
    assert (rms[inside] <= a[inside] / 2 * (1 + 1e-3)).all()  # half a step, up to the scale's fp16 rounding
    rel = _rel(ours, w)
    assert 0.01 < rel < 0.09, rel
    assert rel <= _rel(_rtn(w, 32), w) and rel < 0.8 * _rel(_rtn(w, 128), w)
    assert 0 < stats["kept"] < stats["groups"]  # per group: the kept values or the requantized ones
    np.testing.assert_allclose(np.sqrt(stats["sq_error"] / stats["sq_norm"]), rel, rtol=1e-4)


def test_q8_0_on_sixteen_levels_is_exact():
    """Q8_0 values that use 16 consecutive levels (-8..7) are an int4 group (z = 8, s = d)."""
    rng = np.random.default_rng(6)
    rows, k = 4, 256
    d = rng.uniform(0.001, 0.01, (rows, k // 32)).astype(np.float16)
    q = rng.integers(-8, 8, (rows, k // 32, 32))
    q[..., 0], q[..., 1] = -8, 7  # the full range in every block
    w = _values(pack_q8_0(d, q), T.Q8_0, rows, k)
    ours, stats = _convert(w, 32)
    assert np.array_equal(ours, w) and stats["exact"] == stats["groups"] and stats["kept"] == 0


@pytest.mark.parametrize("kind", ["Q8_0", "Q6_K"])
def test_more_bits_are_requantized_with_bounded_error(kind):
    """Q8_0 / Q6_K hold more than 16 levels: requantized; the error is below round-to-nearest's at the
    same group size and within a 4-bit quantizer's range on near-Gaussian weights."""
    rng = np.random.default_rng(7)
    rows, k = 64, 1024
    w0 = rng.standard_normal((rows, k)).astype(np.float32) * 0.02
    if kind == "Q8_0":
        d = (np.abs(w0.reshape(rows, -1, 32)).max(axis=2) / 127).astype(np.float16)
        q = np.rint(w0.reshape(rows, -1, 32) / d.astype(np.float32)[..., None])
        raw = pack_q8_0(d, np.clip(q, -127, 127))
    else:
        blocks = w0.reshape(rows, -1, 16, 16)
        sub = np.abs(blocks).max(axis=3) / 31  # per-16 scale
        d = (sub.max(axis=2) / 127).astype(np.float16)
        sc = np.clip(np.rint(sub / d.astype(np.float32)[..., None]), 1, 127)
        step = d.astype(np.float32)[..., None] * sc
        q = np.clip(np.rint(blocks / step[..., None]) + 32, 0, 63)
        raw = pack_q6_k(d, sc, q.reshape(rows, -1, 256))
    w = _values(raw, T[kind], rows, k)
    ours, stats = _convert(w, 32)
    rel = _rel(ours, w)
    assert 0.02 < rel < 0.1, rel
    assert rel < _rel(_rtn(w, 32), w) < _rel(_rtn(w, 128), w)
    assert stats["kept"] == 0


def test_group_sizes_above_32_requantize():
    """Group 64 spans two Q4_K sub-blocks of different scales: no group keeps the GGUF's values, and
    the search still beats round-to-nearest at that group size."""
    rng = np.random.default_rng(8)
    raw, *_ = _random_q4_k(rng, 16, 512)
    w = _values(raw, T.Q4_K, 16, 512)
    ours, stats = _convert(w, 64, four_bit_blocks(raw, "Q4_K", 16, 512))
    assert stats["kept"] == 0 and _rel(ours, w) < _rel(_rtn(w, 64), w)


# --------------------------------------------------------------------------- a tiny model end to end


def _byte_alphabet() -> list[str]:
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, n = [], 0
    for b in range(256):
        out.append(chr(b) if b in keep else chr(256 + n))
        n += b not in keep
    return out


def _write_tiny_quantized_gguf(path, rng) -> dict:
    """A 1-layer llama (hidden 256, 2 heads of 128, 1 KV head, FFN 256) whose projections are of six
    GGUF types. Returns GGUF name -> (type, raw blocks)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(256)
    w.add_feed_forward_length(256)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(_byte_alphabet() + ["he", "<|endoftext|>", "<|im_end|>"])
    w.add_token_types([1] * 257 + [3, 3])
    w.add_token_merges(["h e"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(258)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    for name, shape in {
        "token_embd.weight": (259, 256),
        "output_norm.weight": (256,),
        "blk.0.attn_norm.weight": (256,),
        "blk.0.ffn_norm.weight": (256,),
        "blk.0.ffn_up.weight": (256, 256),
    }.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.02)
    d = lambda rows, per: rng.uniform(-0.002, 0.002, (rows, 256 // per)).astype(np.float16)  # noqa: E731
    quantized = {
        "blk.0.attn_q.weight": (T.Q4_K, _random_q4_k(rng, 256, 256)[0]),
        "blk.0.attn_k.weight": (T.Q4_0, pack_q4_0(d(128, 32), rng.integers(0, 16, (128, 8, 32)))),
        "blk.0.attn_v.weight": (
            T.Q6_K,
            pack_q6_k(np.abs(d(128, 256)), rng.integers(-60, 60, (128, 1, 16)), rng.integers(0, 64, (128, 1, 256))),
        ),
        "blk.0.attn_output.weight": (
            T.Q4_1,
            pack_q4_1(np.abs(d(256, 32)), -np.abs(d(256, 32)) * 8, rng.integers(0, 16, (256, 8, 32))),
        ),
        "blk.0.ffn_gate.weight": (T.Q8_0, pack_q8_0(d(256, 32), rng.integers(-127, 128, (256, 8, 32)))),
        "blk.0.ffn_down.weight": (T.Q4_K, _random_q4_k(rng, 256, 256)[0]),
    }
    for name, (qtype, raw) in quantized.items():
        w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return quantized


def test_tiny_quantized_gguf_converts_with_the_error_recorded(tmp_path):
    from swiftspec.convert.gguf_names import unpermute_llama_rows

    quantized = _write_tiny_quantized_gguf(tmp_path / "tiny.gguf", np.random.default_rng(9))
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "int4", "int4", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    quant = manifest["quantization"]
    assert quant["method"] == "gguf" and quant["group_size"] == 32 and quant["bits"] == 4
    types = quant["gguf_types"]
    assert sorted(types) == ["F32", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q8_0"]
    assert types["Q4_K"]["tensors"] == 2 and types["Q4_K"]["groups"] == 2 * 256 * 8
    assert types["Q4_0"] == {
        "tensors": 1,
        "groups": 128 * 8,
        "kept_groups": 128 * 8,
        "exact_groups": 128 * 8,
        "relative_error": 0.0,
    }
    hf = {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_down": "mlp.down_proj",
    }
    with safe_open(str(out / "model.safetensors"), "np") as f:
        for name, (qtype, raw) in quantized.items():
            p = "model.layers.0." + hf[name.split(".")[2]]
            ref = _values(raw, qtype, raw.shape[0], 256)
            if p.endswith("q_proj"):
                ref = unpermute_llama_rows(ref, 2)
            elif p.endswith("k_proj"):
                ref = unpermute_llama_rows(ref, 1)
            ours = int4_dequantize(
                f.get_tensor(p + ".qweight"), f.get_tensor(p + ".scales"), f.get_tensor(p + ".zeros"), 32
            )
            rel = _rel(ours, ref)
            assert rel == pytest.approx(types[qtype.name]["relative_error"], abs=2e-6) or qtype == T.Q4_K, name
            assert rel < 0.1 and (rel == 0) == (qtype == T.Q4_0), (name, rel)


def test_rtn_method_and_bad_method(tmp_path):
    _write_tiny_quantized_gguf(tmp_path / "tiny.gguf", np.random.default_rng(10))
    out = convert_gguf(
        tmp_path / "tiny.gguf", tmp_path / "rtn", "int4", int4_method="rtn", group_size=64, progress=False
    )
    quant = json.loads((out / "manifest.json").read_text())["quantization"]
    assert quant["method"] == "rtn" and quant["group_size"] == 64 and "gguf_types" not in quant
    with pytest.raises(CheckpointError, match="int4 method 'awq'"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "x", "int4", int4_method="awq", progress=False)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CONVERT), *map(str, args), "--quiet"], capture_output=True, text=True, timeout=600
    )


def test_convert_weights_int4_method_option(tmp_path):
    """``--dtype int4`` from a GGUF: method gguf, group 32 by default; ``--int4-method rtn``: group 128.
    ``--int4-method`` without int4 or with a folder input is refused in one line, before any work."""
    _write_tiny_quantized_gguf(tmp_path / "tiny.gguf", np.random.default_rng(11))
    for extra, method, group in (
        ([], "gguf", 32),
        (["--int4-method", "rtn"], "rtn", 128),
        (["--int4-method", "gguf", "--group-size", "16"], "gguf", 16),
    ):
        out = tmp_path / f"{method}{group}"
        proc = _cli(tmp_path / "tiny.gguf", "--out", out, "--dtype", "int4", *extra)
        assert proc.returncode == 0, proc.stderr[-2000:]
        quant = json.loads((out / "manifest.json").read_text())["quantization"]
        assert (quant["method"], quant["group_size"]) == (method, group)
    proc = _cli(tmp_path / "tiny.gguf", "--out", tmp_path / "x", "--int4-method", "rtn")
    assert proc.returncode == 2 and "error: --int4-method rtn applies to --dtype int4 only" in proc.stderr
    proc = _cli(tmp_path / "gguf32", "--out", tmp_path / "y", "--dtype", "int4", "--int4-method", "gguf")
    assert proc.returncode == 2 and "error: --int4-method gguf applies to a GGUF file" in proc.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


# --------------------------------------------------------------------------- the real 0.5B GGUF


def test_real_gguf_tensors(gguf_path):
    """Layers 0 and 2 of the reference 0.5B GGUF (Q4_K, Q6_K, Q5_0 and Q8_0 projections): Q4_K blocks read
    back as gguf-py dequantizes them, and every type converts with a relative error under 0.09, below
    round-to-nearest's at group 32 and at group 128 (the old route)."""
    r = gguf.GGUFReader(gguf_path("qwen2.5-coder-0.5b-instruct"))
    seen = {}
    for t in r.tensors:  # the first projection of each type in layers 0 and 2
        parts = t.name.split(".")
        if parts[0] == "blk" and parts[1] in ("0", "2") and parts[2] in PROJECTIONS and parts[3] == "weight":
            seen.setdefault(t.tensor_type.name, t)
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0"} <= set(seen)
    for kind, t in seen.items():
        k, rows = (int(x) for x in t.shape)
        w = gguf_dequantize(np.array(t.data), t.tensor_type).astype(np.float32).reshape(rows, k)
        blocks = None
        if kind == "Q4_K":
            blocks = four_bit_blocks(np.array(t.data), kind, rows, k)
            q, a, b = blocks
            assert np.array_equal(np.repeat(a, 32, axis=1) * q - np.repeat(b, 32, axis=1), w)
        ours, stats = _convert(w, 32, blocks)
        rel = _rel(ours, w)
        print(
            f"{t.name} {kind} [{rows}, {k}]: relative error {rel:.4f} (rtn 32: {_rel(_rtn(w, 32), w):.4f}, "
            f"rtn 128: {_rel(_rtn(w, 128), w):.4f}), kept {stats['kept'] / stats['groups']:.3f}"
        )
        assert rel < 0.09 and rel < _rel(_rtn(w, 32), w) < _rel(_rtn(w, 128), w), (t.name, rel)
