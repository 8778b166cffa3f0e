"""GGUF block-quantized projections -> swiftspec int4 groups, keeping the GGUF's own 4-bit values.

The int4 format (docs/checkpoint_format.md) stores ``w = (q - z) * s`` with a 4-bit ``q``, an
integer zero point ``z`` in 0..15 and a float16 scale ``s`` per group of ``G`` input features.
GGUF's 4-bit types store, per sub-block of 32 input features, ``w = a * q - b`` with ``q`` 4 bits
(layouts as in ggml's ``ggml-common.h``; all little-endian):

* ``Q4_0`` (18 bytes per 32): f16 ``d``, 16 bytes of nibbles; ``a = d``, ``b = 8 d``.
* ``Q4_1`` (20 bytes per 32): f16 ``d``, f16 ``m``, 16 bytes of nibbles; ``a = d``, ``b = -m``.
* ``Q4_K`` (144 bytes per 256): f16 ``d``, f16 ``dmin``, 12 bytes holding eight 6-bit scales
  ``sc`` and eight 6-bit mins ``m``, 128 bytes of nibbles; sub-block ``j``: ``a = d sc_j``,
  ``b = dmin m_j``.

Nibble order: in Q4_0/Q4_1 byte ``i`` of a block holds element ``i`` (low nibble) and ``i + 16``
(high); in Q4_K the 128 bytes are four runs of 32, run ``c`` holding elements ``64c + l`` (low
nibble of byte ``32c + l``) and ``64c + 32 + l`` (high). Q4_K's 6-bit scale and min of sub-block
``j``: for ``j < 4`` the low 6 bits of bytes ``j`` and ``j + 4``; for ``j >= 4`` the low nibble
(scale) or high nibble (min) of byte ``j + 4``, with bits 4-5 taken from the top two bits of byte
``j - 4`` (scale) or byte ``j`` (min).

So with ``G`` = 32 (or 16, 8: the group's scale and zero point repeated) an int4 group can keep
``q`` as stored, with ``s ~ a`` and ``z ~ b / a``. Q4_0 is exact (``z = 8``, ``s = d``; a negative
``d`` stores ``15 - q``, ``z = 7``, ``s = -d``). For Q4_1 and Q4_K ``b / a`` is in general not an
integer, and the int4 format's zero point is: keeping ``q`` then shifts the whole group by up to half
a step (``a / 2``), about as much error as the GGUF's own 4-bit rounding. So per group the converter
also *requantizes* the GGUF's dequantized values and stores whichever candidate is closer to them
(squared error; the kept values win ties):

* kept: ``q`` as stored, ``z`` the floor or the ceiling of ``b / a`` (within 0..15), ``s`` the
  least-squares float16 scale for that ``q`` and ``z``;
* requantized: for each factor of :data:`SEARCH_FACTORS`, ``s = factor * span / 15`` in float16
  (``span``: the group's range, widened to hold 0 as the format needs), ``z`` centring the 16 levels
  on the range, ``q`` rounded to nearest, then :data:`REFITS` least-squares refits of ``s`` (each
  followed by rounding ``q`` again); the best of these 18 candidates.

The other GGUF types (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, ...: more levels than int4 holds; Q2_K / Q3_K;
float tensors) and group sizes above 32 (a group spanning sub-blocks of different scales) take the
requantized candidate only. On the reference GGUF files the search alone is within about 0.1 % of
the combined error on Q4_K tensors (the kept values win ties and groups whose ``b / a`` is nearly an
integer); both are well below round-to-nearest's (benchmarks/README.md, 2026-12-07). The extra error
of an int4 folder against the GGUF is exactly the error of these groups; the converter records it
per GGUF type in the manifest (``quantization.gguf_types``). There is no int8 weight layout in
swiftspec to hold Q8_0 / Q6_K / Q5_x exactly.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import CheckpointError
from .int4 import check_group_size, pack

#: The group size of ``convert_gguf(..., dtype="int4")`` (method "gguf") unless told otherwise: GGUF's
#: 4-bit sub-blocks are 32 input features.
DEFAULT_GGUF_GROUP_SIZE = 32
#: GGUF types whose 4-bit values an int4 group of 32 (or 16, 8) can keep.
KEPT_TYPES = ("Q4_0", "Q4_1", "Q4_K")
#: Elements per sub-block with its own (a, b) in those types.
SUB_BLOCK = 32
#: Scale factors tried by the requantization search (1.0: the group's full range, 0 included).
SEARCH_FACTORS = (1.05, 1.0, 0.95, 0.9, 0.85, 0.8)
#: Least-squares refits of the scale per factor.
REFITS = 2
_ELEMENTS_PER_STEP = 1 << 20  # bounds the float32 temporaries of one step (a few MB each)

_BLOCK_BYTES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144)}


def _threads() -> int:
    """Worker threads for :func:`quantize_from_gguf`: the CPUs this process may run on, at most 8."""
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except AttributeError:  # not Linux
        return max(1, min(8, os.cpu_count() or 1))


def _f16(raw: np.ndarray, offset: int) -> np.ndarray:
    """float32 of the little-endian float16 at byte ``offset`` of each block (raw [..., bytes])."""
    return np.ascontiguousarray(raw[..., offset : offset + 2]).view("<f2")[..., 0].astype(np.float32)


def four_bit_blocks(raw: np.ndarray, type_name: str, rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q uint8 [rows, k], a float32 [rows, k/32], b float32 [rows, k/32])`` of a GGUF tensor of type
    ``type_name`` (one of :data:`KEPT_TYPES`) whose blocks are ``raw`` (uint8, ``rows`` x bytes of a
    row), such that element ``(r, i)`` is ``a[r, i // 32] * q[r, i] - b[r, i // 32]`` (the GGUF's
    value up to float32 rounding; the module docstring has the layouts). Raises
    :class:`CheckpointError` for another type or a size that does not fit."""
    if type_name not in _BLOCK_BYTES:
        raise CheckpointError(f"GGUF type {type_name} has no 4-bit values int4 can keep (only {', '.join(KEPT_TYPES)})")
    per, nbytes = _BLOCK_BYTES[type_name]
    raw = np.asarray(raw, dtype=np.uint8)
    if k % per or raw.size != rows * (k // per) * nbytes:
        raise CheckpointError(f"GGUF {type_name} data of {raw.size} bytes does not hold {rows} x {k} values")
    blocks = raw.reshape(rows, k // per, nbytes)
    if type_name in ("Q4_0", "Q4_1"):
        d = _f16(blocks, 0)
        body = blocks[..., nbytes - 16 :]
        q = np.concatenate([body & 0x0F, body >> 4], axis=-1)  # elements 0..15 low nibbles, 16..31 high
        b = 8.0 * d if type_name == "Q4_0" else -_f16(blocks, 2)
        return q.reshape(rows, k), d, b.astype(np.float32)
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc_bytes = blocks[..., 4:16].astype(np.uint8)
    low, high = sc_bytes[..., 0:4], sc_bytes[..., 4:8]
    tail = sc_bytes[..., 8:12]
    sc = np.concatenate([low & 63, (tail & 0x0F) | ((low >> 6) << 4)], axis=-1)
    mn = np.concatenate([high & 63, (tail >> 4) | ((high >> 6) << 4)], axis=-1)
    qs = blocks[..., 16:].reshape(rows, k // per, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=3)  # [rows, blocks, run c, low/high, 32]
    a = d[..., None] * sc.astype(np.float32)
    b = dmin[..., None] * mn.astype(np.float32)
    return q.reshape(rows, k), a.reshape(rows, -1), b.reshape(rows, -1)


def _to_f16(s: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return s.astype(np.float16)


def _group_error(w: np.ndarray, q: np.ndarray, z: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Squared error per group of ``(q - z) * s`` against ``w`` ([M, G], z and s [M])."""
    d = (q - z[:, None]) * s[:, None] - w
    return np.einsum("ij,ij->i", d, d)


def _lsq_scale(q: np.ndarray, z: np.ndarray, w: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """float32 [M] of the float16-rounded least-squares scale of ``(q - z) * s ~ w`` per group
    (``fallback`` where there is none: q equal to z everywhere, or a scale not positive or finite)."""
    dq = q - z[:, None]
    den = np.einsum("ij,ij->i", dq, dq)
    num = np.einsum("ij,ij->i", dq, w)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = _to_f16(np.where(den > 0, num / den, fallback)).astype(np.float32)
    return np.where(np.isfinite(s) & (s > 0), s, fallback).astype(np.float32)


def _take_better(best: list | None, new: tuple) -> list:
    """Per group, the candidate (arrays [M] or [M, G], the error last) of smaller error (``best`` on ties)."""
    if best is None:
        return list(new)
    better = new[-1] < best[-1]
    return [np.where(better[:, None] if n.ndim == 2 else better, n, b) for n, b in zip(new, best)]


def requantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best-found int4 ``(q float32 [M, G], z float32 [M], s16 float16 [M], err float32 [M])`` for
    groups ``w`` (float32 [M, G], finite) by the search of the module docstring: for each factor ``f``
    of :data:`SEARCH_FACTORS`, the scale ``f * span / 15`` (``span``: the group's range with 0 in it)
    in float16, the zero point centring the 16 levels on the range, ``q`` rounded to nearest; then
    :data:`REFITS` times the least-squares float16 scale for those ``q`` and ``q`` rounded again. Every
    candidate is scored; ``err`` is the squared error of the best one. Raises :class:`CheckpointError`
    if a group's range needs a scale beyond float16.

    Scoring uses ``s^2 sum (q-z)^2 - 2 s sum (q-z) w + sum w^2`` (the sums the refit needs anyway);
    only the chosen candidate's ``q`` and error are computed directly."""
    lo = np.minimum(w.min(axis=1), 0.0)
    hi = np.maximum(w.max(axis=1), 0.0)
    span = hi - lo
    centre = (lo + hi) / 2
    w2 = np.einsum("ij,ij->i", w, w)
    best: list | None = None  # (z, s, score)
    for factor in SEARCH_FACTORS:
        s = _to_f16(span * (factor / 15.0)).astype(np.float32)
        fits = np.isfinite(s)
        s = np.where(fits & (s > 0), s, 1.0).astype(np.float32)  # an all-zero group: any scale, q = z
        z = np.clip(np.rint(7.5 - centre / s), 0, 15).astype(np.float32)
        low, high = -z[:, None], 15 - z[:, None]
        for step in range(REFITS + 1):
            dq = np.rint(w / s[:, None])
            np.clip(dq, low, high, out=dq)  # q - z
            den = np.einsum("ij,ij->i", dq, dq)
            num = np.einsum("ij,ij->i", dq, w)
            score = np.maximum(s * s * den - 2 * s * num + w2, 0.0)
            best = _take_better(best, (z, s, np.where(fits, score, np.inf).astype(np.float32)))
            if step < REFITS:  # the least-squares scale for these q
                with np.errstate(divide="ignore", invalid="ignore"):
                    s_new = _to_f16(np.where(den > 0, num / den, s)).astype(np.float32)
                s = np.where(np.isfinite(s_new) & (s_new > 0), s_new, s).astype(np.float32)
    assert best is not None  # (the loop ran at least once)
    z, s, score = best
    if not np.isfinite(score).all():
        raise CheckpointError("a group's value range exceeds the largest float16 scale (65504 x 15)")
    q = np.clip(np.rint(w / s[:, None]) + z[:, None], 0, 15)
    return q, z, s.astype(np.float16), _group_error(w, q, z, s)


def keep_values(
    q: np.ndarray, a: np.ndarray, b: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(q, z float32 [M], s16 float16 [M], err float32 [M])`` keeping the 4-bit values ``q`` (float32
    [M, G]) of groups whose GGUF values are ``a * q - b`` (``a``, ``b`` [M]; ``w`` [M, G] the GGUF's
    dequantized values, the target): per group the integer ``z`` (floor or ceiling of ``b / a``,
    clipped to 0..15) and least-squares float16 ``s`` of the smaller squared error. Where ``a < 0``
    (Q4_0's ``d`` takes the sign of the group's largest-magnitude value) the values are written
    ``|a| (15 - q) - (b + 15 |a|)``, so the returned ``q`` is ``15 - q`` there and ``s`` stays
    positive. ``err`` is inf for a group no such pair fits (``a == 0``, or q equal to z everywhere)."""
    flip = a < 0  # a q - b = |a| (15 - q) - (b + 15 |a|): keep the scale positive
    if flip.any():
        q = np.where(flip[:, None], 15 - q, q)
        b = np.where(flip, b - 15 * a, b)
        a = np.abs(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(a > 0, b / a, 0.0)
    best: list | None = None
    for z in (np.clip(np.floor(ratio), 0, 15), np.clip(np.ceil(ratio), 0, 15)):
        z = z.astype(np.float32)
        s = _lsq_scale(q, z, w, np.float32(np.nan) * np.ones_like(a))
        ok = (a > 0) & np.isfinite(s)
        s = np.where(ok, s, 1.0).astype(np.float32)
        err = np.where(ok, _group_error(w, q, z, s), np.inf).astype(np.float32)
        best = _take_better(best, (q, z, s, err))
    assert best is not None  # (the loop ran at least once)
    q, z, s, err = best
    return q, z, s.astype(np.float16), err


def quantize_from_gguf(
    w: np.ndarray,
    group_size: int,
    name: str = "weight",
    blocks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """int4 ``(qweight uint8 [N, K/2], scales float16 [N, K/G], zeros uint8 [N, K/G], stats)`` of one
    projection whose GGUF dequantized values are ``w`` (float [N, K], HF layout).

    ``blocks``: the GGUF's 4-bit values ``(q [N, K], a [N, K/32], b [N, K/32])`` (:func:`four_bit_blocks`,
    rows in the order of ``w``) when its type is one of :data:`KEPT_TYPES`; used for ``group_size``
    8, 16 or 32. Each group stores the kept or the requantized candidate, whichever has the smaller
    squared error against ``w`` (module docstring). ``stats``: ``groups``, ``kept`` (groups storing the
    GGUF's own 4-bit values), ``exact`` (groups equal to ``w`` bit for bit after dequantization),
    ``sq_error`` (sum of squared errors, float64) and ``sq_norm`` (sum of ``w`` squared).

    Raises :class:`CheckpointError` naming ``name`` for a non-2-D ``w``, a group size not dividing K,
    a non-finite value or a range no float16 scale holds.
    """
    if w.ndim != 2:
        raise CheckpointError(f"tensor {name!r}: int4 quantization needs a 2-D weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    check_group_size(group_size)
    if k % group_size:
        raise CheckpointError(f"tensor {name!r}: int4 group size {group_size} does not divide its {k} input features")
    if blocks is not None and SUB_BLOCK % group_size:
        blocks = None  # a group spans sub-blocks of different scales: requantize
    g = group_size
    groups = k // g
    qweight = np.empty((n, k // 2), dtype=np.uint8)
    scales = np.empty((n, groups), dtype=np.float16)
    zeros = np.empty((n, groups), dtype=np.uint8)

    def chunk(r0: int, r1: int) -> dict:
        wg = np.asarray(w[r0:r1], dtype=np.float32).reshape(-1, g)
        if not np.isfinite(wg).all():
            row = r0 + int(np.argwhere(~np.isfinite(wg))[0][0]) // groups
            raise CheckpointError(f"tensor {name!r}: row {row} holds a non-finite value; cannot quantize it")
        try:
            q, z, s16, err = requantize(wg)
        except CheckpointError as exc:
            raise CheckpointError(f"tensor {name!r}: {exc}; it cannot be stored as int4") from None
        kept = 0
        if blocks is not None:
            rep = SUB_BLOCK // g
            kq = blocks[0][r0:r1].reshape(-1, g).astype(np.float32)
            ka = np.repeat(blocks[1][r0:r1].reshape(-1), rep)
            kb = np.repeat(blocks[2][r0:r1].reshape(-1), rep)
            kq, kz, ks16, kerr = keep_values(kq, ka, kb, wg)
            keep = kerr <= err
            q = np.where(keep[:, None], kq, q)
            z = np.where(keep, kz, z)
            s16 = np.where(keep, ks16, s16)
            err = np.where(keep, kerr, err)
            kept = int(keep.sum())
        deq = (q - z[:, None]) * s16.astype(np.float32)[:, None]
        qweight[r0:r1] = pack(q.astype(np.uint8).reshape(r1 - r0, k))
        scales[r0:r1] = s16.reshape(r1 - r0, groups)
        zeros[r0:r1] = z.astype(np.uint8).reshape(r1 - r0, groups)
        return {
            "kept": kept,
            "exact": int((deq == wg).all(axis=1).sum()),
            "sq_error": float(err.astype(np.float64).sum()),
            "sq_norm": float(np.einsum("ij,ij->", wg, wg, dtype=np.float64)),
        }

    step = max(1, _ELEMENTS_PER_STEP // k)
    bounds = [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]
    stats = {"groups": n * groups, "kept": 0, "exact": 0, "sq_error": 0.0, "sq_norm": 0.0}
    with ThreadPoolExecutor(max_workers=min(_threads(), len(bounds))) as pool:  # numpy releases the GIL
        for part in pool.map(lambda b: chunk(*b), bounds):  # summed in row order: the same result for any count
            for key, value in part.items():
                stats[key] += value
    return qweight, scales, zeros, stats
