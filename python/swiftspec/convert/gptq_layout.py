"""The GPTQ layout (AutoGPTQ / GPTQModel ``QuantLinear``, 4 bits) -> the 4-bit values, zero points
and scales of the project's int4 format (:mod:`.int4`), exactly.

Source: the GPTQ paper (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", ICLR 2023) for the quantizer, and AutoGPTQ
(``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py``: ``QuantLinear.pack`` and its torch forward)
for the packing. For a projection with K input features, N output features and group size G (K when
``group_size`` is -1), with ``P`` the HF module name:

* ``P.qweight`` int32 [K/8, N]: packed along the *input* rows: bits ``4j .. 4j+3`` of word (r, n)
  hold the value of input row ``8r + j``, output column n;
* ``P.qzeros`` int32 [K/G, N/8]: zero points packed along the output columns in natural order (bits
  ``4j .. 4j+3`` of word (g, c) for column ``8c + j``); with ``checkpoint_format`` ``"gptq"`` (the
  original, the default) a field holds the zero point minus 1 and readers add 1 (AutoGPTQ's
  ``zeros + 1``), with ``"gptq_v2"`` (GPTQModel) the zero point itself. Symmetric GPTQ stores z = 8
  (7 in a ``"gptq"`` file) for every group;
* ``P.scales`` float16 [K/G, N];
* ``P.g_idx`` int32 [K] (optional): the group of each input row; with ``desc_act`` false it is
  ``k // G`` (checked: anything else is act-order, refused).

Weight (n, k) is ``(q - z) * s`` with z, s of group ``k // G``: the project's formula, so the
conversion is a re-packing, lossless, except in one corner: a ``"gptq"`` field of 15 means z = 16,
which a 4-bit zero point cannot hold (AutoGPTQ writes it when a zero point 0 minus 1 wraps around).
Such a group is stored as ``(q - 1) - 15``, the same weights, when none of its q is 0; otherwise the
folder is refused naming the tensor and group.
"""

from __future__ import annotations

import numpy as np

from ..errors import CheckpointError
from .int4 import nibbles_of_int32


def gptq_tensor_shapes(n: int, k: int, group_size: int) -> dict[str, tuple[int, ...]]:
    """Suffix -> shape of the tensors of a 4-bit GPTQ projection with ``n`` output and ``k`` input
    features (``g_idx`` is optional in a folder)."""
    return {"qweight": (k // 8, n), "qzeros": (k // group_size, n // 8), "scales": (k // group_size, n), "g_idx": (k,)}


def check_g_idx(g_idx: np.ndarray, group_size: int, name: str) -> None:
    """Raise :class:`CheckpointError` naming ``name`` unless ``g_idx[k] == k // group_size`` for every k
    (the groups of a ``desc_act`` false folder)."""
    expect = np.arange(g_idx.shape[0]) // group_size
    if not np.array_equal(np.asarray(g_idx, dtype=np.int64), expect):
        k = int(np.argmax(np.asarray(g_idx, dtype=np.int64) != expect))
        raise CheckpointError(
            f"tensor {name!r}: g_idx[{k}] is {int(g_idx[k])}, expected {int(expect[k])} "
            f"(k // group_size {group_size}): the input rows are permuted (act-order), which "
            "swiftspec's int4 format cannot hold"
        )


def unpack_gptq(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, zero_offset: int, name: str = "qzeros"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The values of one GPTQ projection in the HF orientation:
    ``(q uint8 [N, K], z uint8 [N, K/G], s [N, K/G] in the dtype of scales)``, C-contiguous.

    ``qweight`` int32 [K/8, N], ``qzeros`` int32 [K/G, N/8], ``scales`` [K/G, N] (shapes checked by
    the caller); ``zero_offset`` 1 for ``checkpoint_format`` ``"gptq"``, 0 for ``"gptq_v2"``. A zero
    point of 16 is folded into 15 as the module docstring says; raises :class:`CheckpointError`
    naming ``name`` (the qzeros tensor) and the group when it cannot be.
    """
    kq, n = qweight.shape
    # [K/8, N, 8] fields (row r, column n, field j = input row 8r + j) -> [N, K]
    q = np.ascontiguousarray(nibbles_of_int32(qweight).transpose(1, 0, 2).reshape(n, kq * 8))
    z = nibbles_of_int32(qzeros).reshape(qzeros.shape[0], n).T.astype(np.int16) + zero_offset  # [N, K/G]
    over = z > 15
    if over.any():
        qg = q.reshape(n, z.shape[1], -1)  # a view: the groups of each row
        stuck = over & (qg == 0).any(axis=2)
        if stuck.any():
            row, g = (int(i) for i in np.argwhere(stuck)[0])
            raise CheckpointError(
                f'tensor {name!r}: zero point 16 (a stored 15 plus 1, checkpoint_format "gptq") in group {g} '
                f"of output feature {row}, whose 4-bit values include 0: the weight -16 x scale cannot be held with "
                "a 4-bit zero point"
            )
        qg[over] -= 1
        z[over] = 15
    return q, np.ascontiguousarray(z.astype(np.uint8)), np.ascontiguousarray(np.asarray(scales).T)
