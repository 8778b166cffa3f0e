"""Floating-point storage conversions done with plain numpy (no bfloat16 numpy dtype needed).

bfloat16 is the upper half of an IEEE float32. numpy has no bfloat16 dtype, so bfloat16 data
is carried as ``uint16`` bit patterns and labelled ``bfloat16`` only when written to the
safetensors header.
"""

from __future__ import annotations

import numpy as np

from ..errors import CheckpointError

#: Float checkpoint dtypes: every tensor is stored in it (format version 1).
FLOAT_DTYPES = ("bfloat16", "float32")
#: Checkpoint dtypes the converters write. "int4": the linear projections as 4-bit groups
#: (swiftspec.convert.int4, format version 3), every other tensor bfloat16.
SUPPORTED_DTYPES = FLOAT_DTYPES + ("int4",)

_CHUNK = 1 << 24  # elements converted per step, bounds the temporaries of huge tensors


def check_dtype(dtype: str) -> str:
    """Return ``dtype`` if it is a supported checkpoint dtype, else raise :class:`CheckpointError`."""
    if dtype not in SUPPORTED_DTYPES:
        raise CheckpointError(f"unsupported checkpoint dtype {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return dtype


def float32_to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16, round-to-nearest-even, as raw bits.

    ``x``: float32 array of any shape. Returns a C-contiguous ``uint16`` array of the same shape
    holding bfloat16 bit patterns. Rounding matches PyTorch's ``tensor.to(torch.bfloat16)``:
    ties go to the even mantissa, values past the largest bfloat16 become +-inf, NaNs stay NaN
    (made quiet, sign kept).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.reshape(-1).view(np.uint32)
    out = np.empty(bits.shape, dtype=np.uint16)
    for start in range(0, bits.size, _CHUNK):
        u = bits[start : start + _CHUNK]
        lsb = (u >> 16) & 1
        rounded = ((u + (0x7FFF + lsb)) >> 16).astype(np.uint16)  # wraps only for NaN payloads
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        if nan.any():
            rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
        out[start : start + _CHUNK] = rounded
    return out.reshape(x.shape)


def bfloat16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (``uint16`` array) to float32 exactly. Same shape."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """Convert a float32 tensor to the checkpoint storage array for ``dtype``.

    ``"float32"`` -> C-contiguous float32; ``"bfloat16"`` -> uint16 bit patterns (see
    :func:`float32_to_bfloat16_bits`). Raises :class:`CheckpointError` for other dtypes.
    """
    if dtype not in FLOAT_DTYPES:
        raise CheckpointError(f"{dtype!r} is not a float storage dtype ({', '.join(FLOAT_DTYPES)})")
    if dtype == "float32":
        return np.ascontiguousarray(x, dtype=np.float32)
    return float32_to_bfloat16_bits(x)
