"""Int4 weights (AWQ-style W4A16): group-wise asymmetric 4-bit quantization of the linear projections.

Storage format: the one of AWQ (Lin et al., "AWQ: Activation-aware Weight Quantization for LLM
Compression and Acceleration", MLSys 2024) in spirit — 4-bit integers with one fp16 scale and one
integer zero point per group of ``group_size`` consecutive input features, activations kept in
floating point — laid out row-major for the CPU backend (docs/checkpoint_format.md, "int4 weights").
For a projection weight ``W`` [N, K] (out x in) named ``P.weight``:

* ``P.qweight`` uint8 [N, K/2]: byte ``j`` of row ``n`` packs element ``2j`` in its low nibble
  (bits 0-3) and element ``2j + 1`` in its high nibble (bits 4-7);
* ``P.scales`` float16 [N, K/G]: the scale ``s`` of each group;
* ``P.zeros`` uint8 [N, K/G]: the zero point ``z`` of each group, 0..15.

Element ``(n, k)`` dequantizes to ``(q - z) * s`` in float32, with ``z, s`` of group ``k // G``.

Quantization here is plain **round-to-nearest (RTN)**. AWQ's activation-aware search for
per-channel scales (``tools/convert_weights.py --awq``) lives in :mod:`.awq`: it scales the float
weights from calibration activations, then quantizes them with this same RTN. Per group,
``lo = min(min(w), 0)``, ``hi = max(max(w), 0)`` (the range always holds 0, as GPTQ's quantizer does, so the zero point
is always a representable integer), ``s = fp16(max(hi - lo, 1e-5) / 15)``,
``z = clip(round(-lo / s), 0, 15)``, ``q = clip(round(w / s) + z, 0, 15)`` with ``s`` the
fp16-rounded scale widened back to float32 (so dequantization uses the exact scale that chose
``q``); ``round`` is numpy's round-half-to-even.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

import numpy as np

from ..errors import CheckpointError

#: The group size ``--dtype int4`` uses unless told otherwise (AWQ's default).
DEFAULT_GROUP_SIZE = 128
#: Bits per quantized weight.
BITS = 4

_PROJECTION = re.compile(r"^(model\.layers\.\d+\.(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj))\.weight$")
_ROWS_PER_STEP = 2048  # bounds the float32 temporaries of one quantization step (2048 x K x 4 B x ~4)


def projection_prefix(name: str) -> str | None:
    """``"model.layers.3.mlp.up_proj"`` for ``"model.layers.3.mlp.up_proj.weight"``; None for tensors
    that stay float (embedding, norms, biases, ``lm_head``: the LM head is tied to the embedding in
    the Qwen models and is the most quantization-sensitive matrix)."""
    m = _PROJECTION.match(name)
    return m.group(1) if m else None


def check_group_size(group_size: object, config: Mapping | None = None, source: str = "") -> int:
    """Return ``group_size`` if it is a positive multiple of 8 that divides every projection's input
    features (``hidden_size`` for q/k/v/gate/up, ``num_attention_heads * head_dim`` for o_proj,
    ``intermediate_size`` for down_proj) of ``config`` (when given); else raise
    :class:`CheckpointError` naming the group size, the dimension and ``source``."""
    if (
        not isinstance(group_size, (int, np.integer))
        or isinstance(group_size, bool)
        or group_size < 8
        or group_size % 8
    ):
        raise CheckpointError(f"int4 group size {group_size!r} must be a positive multiple of 8 (e.g. 32, 64, 128)")
    group_size = int(group_size)
    if config is not None:
        dims = {
            "hidden_size (q/k/v/gate/up_proj input)": config["hidden_size"],
            "num_attention_heads * head_dim (o_proj input)": config["num_attention_heads"] * config["head_dim"],
            "intermediate_size (down_proj input)": config["intermediate_size"],
        }
        for what, k in dims.items():
            if k % group_size:
                common = math.gcd(*dims.values())
                fits = [g for g in (512, 256, 128, 64, 32, 16, 8) if g < group_size and common % g == 0]
                hint = (
                    f"--group-size {fits[0]} does"
                    if fits
                    else f"no power of two from 8 below {group_size} divides them all"
                )
                raise CheckpointError(
                    f"{source}: int4 group size {group_size} does not divide {what} = {k}; "
                    f"choose a group size that divides every projection's input features ({hint})"
                )
    return group_size


def quantize_rtn(w: np.ndarray, group_size: int, name: str = "weight") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest int4 quantization of one projection (the formula in the module docstring).

    ``w``: float array [N, K] (HF layout, out x in); ``group_size`` a multiple of 8 dividing K.
    Returns ``(qweight uint8 [N, K/2], scales float16 [N, K/G], zeros uint8 [N, K/G])``, all
    C-contiguous. Works on blocks of rows, so temporaries stay a few times 2048 x K float32.

    Raises :class:`CheckpointError` naming ``name`` if ``w`` is not 2-D, K is not a multiple of
    ``group_size``, a value is not finite, or a group's range exceeds what an fp16 scale holds.
    """
    if w.ndim != 2:
        raise CheckpointError(f"tensor {name!r}: int4 quantization needs a 2-D weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    check_group_size(group_size)
    if k % group_size:
        raise CheckpointError(f"tensor {name!r}: int4 group size {group_size} does not divide its {k} input features")
    groups = k // group_size
    qweight = np.empty((n, k // 2), dtype=np.uint8)
    scales = np.empty((n, groups), dtype=np.float16)
    zeros = np.empty((n, groups), dtype=np.uint8)
    for r0 in range(0, n, _ROWS_PER_STEP):
        r1 = min(n, r0 + _ROWS_PER_STEP)
        g = np.asarray(w[r0:r1], dtype=np.float32).reshape(r1 - r0, groups, group_size)
        if not np.isfinite(g).all():
            row = r0 + int(np.argwhere(~np.isfinite(g))[0][0])
            raise CheckpointError(f"tensor {name!r}: row {row} holds a non-finite value; cannot quantize it")
        lo = np.minimum(g.min(axis=2), 0.0)
        hi = np.maximum(g.max(axis=2), 0.0)
        with np.errstate(over="ignore"):
            s16 = (np.maximum(hi - lo, 1e-5) / 15.0).astype(np.float16)
        if not np.isfinite(s16).all():
            raise CheckpointError(
                f"tensor {name!r}: a group's value range exceeds the largest float16 scale "
                f"(65504 x 15); it cannot be stored as int4"
            )
        s = s16.astype(np.float32)
        z = np.clip(np.round(-lo / s), 0, 15)
        q = np.clip(np.round(g / s[:, :, None]) + z[:, :, None], 0, 15).astype(np.uint8).reshape(r1 - r0, k)
        qweight[r0:r1] = pack(q)
        scales[r0:r1] = s16
        zeros[r0:r1] = z.astype(np.uint8)
    return qweight, scales, zeros


def pack(q: np.ndarray) -> np.ndarray:
    """uint8 [N, K/2] ``qweight`` of the 4-bit values ``q`` (integers 0..15, [N, K], K even): element
    ``2j`` in the low nibble of byte ``j``, ``2j + 1`` in the high one. The inverse of :func:`unpack`."""
    q = np.asarray(q, dtype=np.uint8)
    return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4))


def nibbles_of_int32(words: np.ndarray) -> np.ndarray:
    """The eight 4-bit fields of each 32-bit word: uint8 [..., 8] for int32/uint32 ``words`` [...],
    field ``i`` holding bits ``4i .. 4i+3`` (the unit AutoAWQ and GPTQ pack their weights in)."""
    w = np.asarray(words).astype(np.uint32, copy=False)  # same bits for int32
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    return ((w[..., None] >> shifts) & 0xF).astype(np.uint8)


def regroup(per_group: np.ndarray, group_size: int, new_group_size: int) -> np.ndarray:
    """Scales or zero points [N, K/group_size] for the smaller ``new_group_size`` (which divides
    ``group_size``): each value repeated ``group_size // new_group_size`` times, so the weights they
    dequantize to are unchanged."""
    if group_size == new_group_size:
        return per_group
    return np.ascontiguousarray(np.repeat(per_group, group_size // new_group_size, axis=1))


def unpack(qweight: np.ndarray) -> np.ndarray:
    """The 4-bit values of ``qweight`` (uint8 [N, K/2]) as uint8 [N, K], element order restored."""
    q = np.empty((qweight.shape[0], qweight.shape[1] * 2), dtype=np.uint8)
    q[:, 0::2] = qweight & 0x0F
    q[:, 1::2] = qweight >> 4
    return q


def dequantize(qweight: np.ndarray, scales: np.ndarray, zeros: np.ndarray, group_size: int) -> np.ndarray:
    """float32 [N, K] weights ``(q - z) * s`` of an int4 projection: the values the C++ backend uses
    (bit for bit: the integer difference is exact in float32 and the product is one IEEE rounding).

    ``qweight`` uint8 [N, K/2], ``scales`` float16 [N, K/G], ``zeros`` uint8 [N, K/G]. Raises
    :class:`CheckpointError` if the shapes do not agree with ``group_size``.
    """
    n, half = qweight.shape
    k = 2 * half
    if k % group_size or scales.shape != (n, k // group_size) or zeros.shape != scales.shape:
        raise CheckpointError(
            f"int4 tensors disagree: qweight {qweight.shape}, scales {scales.shape}, "
            f"zeros {zeros.shape} for group size {group_size}"
        )
    q = unpack(qweight).reshape(n, k // group_size, group_size).astype(np.int32)
    diff = (q - zeros.astype(np.int32)[:, :, None]).astype(np.float32)
    return (diff * scales.astype(np.float32)[:, :, None]).reshape(n, k)


def int4_tensor_shapes(prefix: str, n: int, k: int, group_size: int) -> dict[str, tuple[int, int]]:
    """The three tensors that replace ``prefix.weight`` [n, k] in an int4 checkpoint, with shapes."""
    return {
        f"{prefix}.qweight": (n, k // 2),
        f"{prefix}.scales": (n, k // group_size),
        f"{prefix}.zeros": (n, k // group_size),
    }
