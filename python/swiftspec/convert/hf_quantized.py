"""The projections of a Hugging Face folder quantized with AutoAWQ (GEMM) or GPTQ, read into the
project's int4 format: checked in full from the safetensors headers before any weight is read, then
re-packed projection by projection (lossless: both layouts dequantize as ``(q - z) * s`` with an
fp16 scale and a 4-bit zero point per group of input features, as the int4 format does).

Layouts: :mod:`.awq_gemm_layout`, :mod:`.gptq_layout`; settings: :mod:`.hf_quant_config`. The other
tensors (embedding, norms, biases, ``lm_head``) are float in these folders and are converted as in a
float folder.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CheckpointError
from .awq_gemm_layout import awq_tensor_shapes, unpack_awq_gemm
from .gptq_layout import check_g_idx, gptq_tensor_shapes, unpack_gptq
from .hf_quant_config import QuantConfig
from .int4 import dequantize, pack, projection_prefix, regroup
from .layout import expected_tensor_shapes
from .safetensors_reader import SafetensorsFile

_INT_WORDS = ("I32", "U32")
_SCALE_DTYPES = ("F16", "BF16", "F32")
_G_IDX_DTYPES = ("I32", "I64")
_INPUT_OF = {
    "q_proj": "hidden_size",
    "k_proj": "hidden_size",
    "v_proj": "hidden_size",
    "gate_proj": "hidden_size",
    "up_proj": "hidden_size",
    "o_proj": "num_attention_heads * head_dim",
    "down_proj": "intermediate_size",
}


def projections(config: Mapping) -> dict[str, tuple[int, int]]:
    """Projection prefix (``model.layers.0.mlp.up_proj``) -> (N, K) of the model ``config``."""
    out: dict[str, tuple[int, int]] = {}
    for name, shape in expected_tensor_shapes(config).items():
        prefix = projection_prefix(name)
        if prefix:
            n, k = shape
            out[prefix] = (n, k)
    return out


def storage_group_size(qc: QuantConfig, config: Mapping, requested: int | None) -> int:
    """The int4 folder's group size for a quantized folder: its own (``requested``, a ``--group-size``,
    must then be None or equal), or for one group per row (-1) ``requested`` or the largest of 128, 64,
    32, 16, 8 dividing every projection's input features (each row's scale is repeated per group).

    Raises :class:`CheckpointError` naming ``quantization_config.group_size`` when it does not divide
    a projection's input features, or conflicts with ``requested``.
    """
    dims = {_INPUT_OF[p.rsplit(".", 1)[1]]: k for p, (n, k) in projections(config).items()}
    if qc.group_size is not None:
        for what, k in dims.items():
            if k % qc.group_size:
                raise CheckpointError(
                    f"{qc.field_name('group_size')} is {qc.group_size}, which does not divide "
                    f"{what} = {k} (a projection's input features)"
                )
        if requested is not None and requested != qc.group_size:
            raise CheckpointError(
                f"group size {requested} was asked for, but the folder is quantized in groups of "
                f"{qc.group_size} ({qc.field_name('group_size')}); leave the group size out"
            )
        return qc.group_size
    if requested is not None:
        for what, k in dims.items():
            if k % requested:
                raise CheckpointError(f"group size {requested} does not divide {what} = {k}")
        return requested
    for g in (128, 64, 32, 16, 8):
        if all(k % g == 0 for k in dims.values()):
            return g
    raise CheckpointError(
        f"{qc.field_name('group_size')} is -1 (one group per row), but no group size from 8 "
        f"to 128 divides every projection's input features {sorted(set(dims.values()))}"
    )


def _expected(qc: QuantConfig, n: int, k: int) -> dict[str, tuple[int, ...]]:
    g = qc.group_size or k
    return awq_tensor_shapes(n, k, g) if qc.method == "awq" else gptq_tensor_shapes(n, k, g)


def check_quantized_tensors(
    where: Mapping[str, SafetensorsFile], config: Mapping, qc: QuantConfig, source: str
) -> dict[str, tuple[int, int]]:
    """Check every projection's tensors of a quantized folder from the headers: present (``g_idx``
    optional), no float ``P.weight`` beside them, shapes and dtypes as the layout says. Returns the
    projections (prefix -> (N, K)); the caller checks the other tensors with the float rules.

    Raises :class:`CheckpointError` naming ``source`` and the first missing, mis-shaped or mistyped
    tensors (a projection left in float, ``modules_to_not_convert``, is a missing ``qweight``).
    """
    problems = []
    projs = projections(config)
    for prefix, (n, k) in projs.items():
        if n % 8:
            problems.append(f"{prefix} has {n} output features, not a multiple of 8 as 4-bit packing needs")
            continue
        for suffix, shape in _expected(qc, n, k).items():
            name = f"{prefix}.{suffix}"
            if name not in where:
                if suffix == "g_idx":
                    continue
                hint = (
                    f" (the folder holds the float {prefix}.weight: every projection must be quantized)"
                    if f"{prefix}.weight" in where and suffix == "qweight"
                    else ""
                )
                problems.append(f"missing tensor {name!r}{hint}")
                continue
            found = where[name].shape(name)
            if found != shape:
                problems.append(
                    f"tensor {name!r} has shape {list(found)}, expected {list(shape)} ({qc.layout} "
                    f"layout, {n} out x {k} in features, group size {qc.group_size or k})"
                )
            dtype = where[name].dtype(name)
            allowed = _SCALE_DTYPES if suffix == "scales" else _G_IDX_DTYPES if suffix == "g_idx" else _INT_WORDS
            if dtype not in allowed:
                problems.append(f"tensor {name!r} has dtype {dtype}, expected {' or '.join(allowed)}")
        if f"{prefix}.weight" in where and f"{prefix}.qweight" in where:
            problems.append(f"tensor '{prefix}.weight' is present next to the quantized '{prefix}.qweight'")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckpointError(f"{source} ({qc.layout}): " + "; ".join(problems[:5]) + more)
    return projs


def quantized_tensor_names(projs: Mapping[str, tuple[int, int]]) -> set[str]:
    """Every name a quantized projection may use, so the caller can set them aside."""
    return {f"{p}.{s}" for p in projs for s in ("qweight", "qzeros", "scales", "g_idx")}


def _scales_fp16(f: SafetensorsFile, name: str) -> np.ndarray:
    s32 = f.float32(name)
    if not np.isfinite(s32).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(s32))[0])
        raise CheckpointError(f"{f.path}: tensor {name!r} holds a non-finite scale at {list(where)}")
    s16 = s32.astype(np.float16)
    if not np.array_equal(s16.astype(np.float32), s32):
        raise CheckpointError(
            f"{f.path}: tensor {name!r} ({f.dtype(name)}) holds scales float16 cannot hold "
            "exactly; swiftspec's int4 format stores float16 scales"
        )
    return s16


def read_projection(
    where: Mapping[str, SafetensorsFile], prefix: str, qc: QuantConfig, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q uint8 [N, K], z uint8 [N, K/G], s float16 [N, K/G])`` of projection ``prefix`` (checked by
    :func:`check_quantized_tensors`), G the folder's group size (K for -1). Raises
    :class:`CheckpointError` naming the tensor for a non-finite scale, a scale float16 cannot hold, a
    GPTQ ``g_idx`` that is not ``k // G``, a zero point 16 that cannot be folded (:mod:`.gptq_layout`).
    """

    def ints(suffix):
        name = f"{prefix}.{suffix}"
        return where[name].integers(name)

    scales_name = f"{prefix}.scales"
    scales = _scales_fp16(where[scales_name], scales_name)
    if qc.method == "awq":
        return unpack_awq_gemm(ints("qweight"), ints("qzeros"), scales)
    if f"{prefix}.g_idx" in where:
        check_g_idx(ints("g_idx"), qc.group_size or k, f"{prefix}.g_idx")
    return unpack_gptq(ints("qweight"), ints("qzeros"), scales, qc.zero_offset, f"{prefix}.qzeros")


def add_projection(writer, where: Mapping[str, SafetensorsFile], prefix: str, k: int, qc: QuantConfig) -> None:
    """Add projection ``prefix`` to ``writer`` (:class:`.writer.CheckpointWriter`): an int4 writer gets
    the values re-packed (scales and zero points repeated when its group size is smaller than the
    folder's); a float writer gets ``P.weight``, the dequantized values ``(q - z) * s`` (exact in
    float32; a bfloat16 writer rounds them)."""
    q, z, s = read_projection(where, prefix, qc, k)
    group = qc.group_size or k
    if writer.dtype == "int4":
        g = writer.group_size
        writer.add_int4(prefix, pack(q), regroup(s, group, g), regroup(z, group, g))
    else:
        writer.add(f"{prefix}.weight", dequantize(pack(q), s, z, group))
