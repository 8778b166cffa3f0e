"""AutoAWQ's GEMM layout (``WQLinear_GEMM``) -> the 4-bit values, zero points and scales of the
project's int4 format (:mod:`.int4`), exactly.

Source: the AWQ paper (Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression
and Acceleration", MLSys 2024) for the quantizer, and AutoAWQ (``awq/modules/linear/gemm.py``,
``WQLinear_GEMM.from_linear``; ``awq/utils/packing_utils.py``) for the packing. For a projection with
K input features, N output features and group size G (K when ``group_size`` is -1), with ``P`` the
HF module name (``model.layers.0.mlp.up_proj``):

* ``P.qweight`` int32 [K, N/8]: row k holds the 4-bit values of input feature k; word c packs output
  columns 8c .. 8c+7, column ``8c + AWQ_ORDER[i]`` in bits ``4i .. 4i+3``,
  ``AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)`` (the order AutoAWQ's CUDA kernel dequantizes in);
* ``P.qzeros`` int32 [K/G, N/8]: the integer zero points 0..15, packed like ``qweight``;
* ``P.scales`` float16 [K/G, N].

Weight (n, k) is ``(q - z) * s`` with z, s of group ``k // G`` (AutoAWQ's ``dequantize_gemm``): the
same formula as the project's format, so the conversion is a re-packing, lossless. Transposed here to
the HF orientation [N, K] (out x in).
"""

from __future__ import annotations

import numpy as np

from .int4 import nibbles_of_int32

#: AutoAWQ's packing order: bits 4i..4i+3 of a word hold output column AWQ_ORDER[i] of its eight.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
#: column j of a word's eight sits in field AWQ_FIELD_OF_COLUMN[j] (the inverse permutation)
AWQ_FIELD_OF_COLUMN = tuple(AWQ_ORDER.index(j) for j in range(8))


def awq_tensor_shapes(n: int, k: int, group_size: int) -> dict[str, tuple[int, ...]]:
    """Suffix -> shape of the three tensors of an AutoAWQ GEMM projection with ``n`` output and
    ``k`` input features (``n`` a multiple of 8, ``group_size`` dividing ``k``)."""
    return {"qweight": (k, n // 8), "qzeros": (k // group_size, n // 8), "scales": (k // group_size, n)}


def unpack_awq_columns(words: np.ndarray) -> np.ndarray:
    """uint8 [R, 8C] values of int32 words [R, C] packed along columns in AutoAWQ's order."""
    fields = nibbles_of_int32(words)  # [R, C, 8], field i = column AWQ_ORDER[i]
    return fields[:, :, AWQ_FIELD_OF_COLUMN].reshape(words.shape[0], -1)


def unpack_awq_gemm(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The values of one AutoAWQ GEMM projection in the HF orientation:
    ``(q uint8 [N, K], z uint8 [N, K/G], s [N, K/G] in the dtype of scales)``, C-contiguous.

    ``qweight`` int32 [K, N/8], ``qzeros`` int32 [K/G, N/8], ``scales`` [K/G, N] (shapes checked by
    the caller). Every q and z is 0..15 by construction (4-bit fields).
    """
    q = np.ascontiguousarray(unpack_awq_columns(qweight).T)
    z = np.ascontiguousarray(unpack_awq_columns(qzeros).T)
    s = np.ascontiguousarray(np.asarray(scales).T)
    return q, z, s
