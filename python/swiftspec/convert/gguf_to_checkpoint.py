"""GGUF file -> swiftspec checkpoint folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .._wheels import sha256_file
from ..errors import CheckpointError
from .dtypes import check_dtype
from .gguf_config import PERMUTED_QK_ARCHITECTURES, build_config, check_architecture
from .gguf_file import GGUFModelFile
from .gguf_int4 import DEFAULT_GGUF_GROUP_SIZE, KEPT_TYPES, four_bit_blocks, quantize_from_gguf
from .gguf_names import hf_tensor_name, unpermute_llama_rows
from .int4 import DEFAULT_GROUP_SIZE, check_group_size, projection_prefix
from .layout import check_tensor_set
from .manifest import make_manifest
from .tokenizer_from_gguf import build_tokenizer, read_tokenizer_info, tokenizer_config
from .writer import CheckpointWriter


def dequantize_tensor(g: GGUFModelFile, gguf_name: str) -> np.ndarray:
    """The float32 values of GGUF tensor ``gguf_name``, in numpy (row-major) shape.

    GGUF lists dimensions fastest-first, so a GGUF ``[in, out]`` matrix comes back ``[out, in]``
    (the HF shape). Uses ``gguf.quants.dequantize``; no un-permutation here. Raises
    :class:`CheckpointError` naming the tensor and its type if that fails.
    """
    from gguf.quants import dequantize

    t = g.tensors[gguf_name]
    try:
        # Copy the raw blocks out of the memory map first: dequantizing straight from the memmap
        # pays numpy's memmap bookkeeping on every block slice (about twice as slow).
        values = dequantize(np.array(t.data), t.tensor_type)
    except Exception as exc:
        raise CheckpointError(
            f"{g.path}: cannot dequantize tensor {gguf_name!r} of type {t.tensor_type.name}: {exc}"
        ) from exc
    shape = tuple(int(d) for d in reversed(t.shape))
    if values.size != int(np.prod(shape)):
        raise CheckpointError(
            f"{g.path}: tensor {gguf_name!r} dequantized to {values.size} values, its shape {shape} needs "
            f"{int(np.prod(shape))} (file truncated?)"
        )
    return np.asarray(values, dtype=np.float32).reshape(shape)


def _hf_rows(g: GGUFModelFile, name: str, values: np.ndarray, config: dict) -> np.ndarray:
    """``values`` (rows in GGUF order of HF tensor ``name``) in HF row order: un-permuted for the Q/K
    projections of permuted-Q/K architectures (llama, see :func:`unpermute_llama_rows`)."""
    if g.architecture in PERMUTED_QK_ARCHITECTURES:
        if ".self_attn.q_proj." in name:
            return unpermute_llama_rows(values, config["num_attention_heads"])
        if ".self_attn.k_proj." in name:
            return unpermute_llama_rows(values, config["num_key_value_heads"])
    return values


def hf_tensor(g: GGUFModelFile, gguf_name: str, config: dict) -> tuple[str, np.ndarray]:
    """``(hf_name, float32 array in HF layout)`` for one GGUF tensor: renamed, dequantized, and
    for permuted-Q/K architectures (llama) un-permuted (see :func:`unpermute_llama_rows`)."""
    name = hf_tensor_name(gguf_name)
    return name, _hf_rows(g, name, dequantize_tensor(g, gguf_name), config)


def hf_four_bit_blocks(
    g: GGUFModelFile, gguf_name: str, config: dict
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The 4-bit values and sub-block scales ``(q, a, b)`` of GGUF tensor ``gguf_name``
    (:func:`.gguf_int4.four_bit_blocks`) with rows in HF order, or None if its type is not one of
    :data:`.gguf_int4.KEPT_TYPES`."""
    t = g.tensors[gguf_name]
    if t.tensor_type.name not in KEPT_TYPES or len(t.shape) != 2:
        return None
    name = hf_tensor_name(gguf_name)
    k, rows = (int(d) for d in t.shape)
    try:
        q, a, b = four_bit_blocks(np.array(t.data), t.tensor_type.name, rows, k)
    except CheckpointError as exc:
        raise CheckpointError(f"{g.path}: tensor {gguf_name!r}: {exc}") from None
    return _hf_rows(g, name, q, config), _hf_rows(g, name, a, config), _hf_rows(g, name, b, config)


#: ``int4_method`` values of :func:`convert_gguf`.
INT4_METHODS = ("gguf", "rtn")


def _type_summary(types: dict) -> dict:
    """manifest["quantization"]["gguf_types"]: per GGUF type of the projections, the tensor and group
    counts, the groups that keep the GGUF's 4-bit values and those equal to it, and the relative error
    ``sqrt(sum (int4 - gguf)^2 / sum gguf^2)`` of the int4 weights against the GGUF's dequantized ones."""
    out = {}
    for type_name, st in sorted(types.items()):
        out[type_name] = {
            "tensors": st["tensors"],
            "groups": st["groups"],
            "kept_groups": st["kept"],
            "exact_groups": st["exact"],
            "relative_error": round(float(np.sqrt(st["sq_error"] / st["sq_norm"])), 6) if st["sq_norm"] > 0 else 0.0,
        }
    return out


def convert_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    dtype: str = "bfloat16",
    *,
    source_sha256: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    group_size: int | None = None,
    int4_method: str = "gguf",
) -> Path:
    """Convert a GGUF model file into a swiftspec checkpoint folder (docs/checkpoint_format.md).

    Every tensor is dequantized to float32 with ``gguf.quants.dequantize``, renamed to its HF
    name, un-permuted for Llama Q/K, and stored as ``dtype`` (``"bfloat16"``: round-to-nearest-
    even from the float32 values; ``"float32"``: exact; ``"int4"``: the linear projections in 4 bits,
    the rest bfloat16) in ``model.safetensors``. For int4, ``int4_method`` ``"gguf"`` (default; group
    size 32 unless ``group_size`` says otherwise) stores per group either the GGUF's own 4-bit values
    (Q4_0, Q4_1, Q4_K) or a requantization of the dequantized values found by an error search,
    whichever is closer to the GGUF (:mod:`.gguf_int4`), and records the error per GGUF type in the
    manifest; ``"rtn"`` (group size 128 by default) quantizes the dequantized values round-to-nearest
    (:func:`.int4.quantize_rtn`). Also writes
    config.json, generation_config.json, tokenizer.json, tokenizer_config.json, and manifest.json
    last. ``source_sha256`` (hex) is recorded in the manifest; if omitted the file is hashed.
    ``overwrite`` allows a non-empty ``out_dir`` (see :class:`CheckpointWriter`).

    Peak memory is about the checkpoint size (all tensors are held until written) plus one
    float32 tensor. Returns ``out_dir`` as a Path.

    Raises :class:`CheckpointError` naming the file and field/tensor/value for: a missing file, a
    non-GGUF file, an unsupported ``general.architecture``, ``tokenizer.ggml.model`` or
    ``tokenizer.ggml.pre``, missing metadata, unknown/missing/mis-shaped tensors, a bad dtype,
    or a non-empty output folder; for int4, a group size that is not a multiple of 8 or does not
    divide every projection's input features.
    """
    check_dtype(dtype)
    int4 = dtype == "int4"
    if int4_method not in INT4_METHODS:
        raise CheckpointError(f"int4 method {int4_method!r}: expected one of {', '.join(INT4_METHODS)}")
    if group_size is None:
        group_size = DEFAULT_GGUF_GROUP_SIZE if int4_method == "gguf" else DEFAULT_GROUP_SIZE
    g = GGUFModelFile(gguf_path)
    check_architecture(g)
    tok_info = read_tokenizer_info(g)
    config = build_config(g, tok_info, "bfloat16" if int4 else dtype)
    if int4:
        check_group_size(group_size, config, str(g.path))
    tokenizer = build_tokenizer(g, tok_info)
    for name in g.tensors:
        hf_tensor_name(name)  # reject unknown tensors before any heavy work
    shapes = {hf_tensor_name(n): tuple(int(d) for d in reversed(t.shape)) for n, t in g.tensors.items()}
    check_tensor_set(shapes, config, str(g.path))

    writer = CheckpointWriter(out_dir, dtype, overwrite=overwrite, group_size=group_size)
    types: dict[str, dict] = {}
    for gguf_name in tqdm(list(g.tensors), desc=f"convert {g.path.name}", unit="tensor", disable=not progress):
        name, values = hf_tensor(g, gguf_name, config)
        prefix = projection_prefix(name) if int4 and int4_method == "gguf" else None
        if prefix is None:
            writer.add(name, values)
        else:
            type_name = g.tensors[gguf_name].tensor_type.name
            blocks = hf_four_bit_blocks(g, gguf_name, config)
            qweight, scales, zeros, stats = quantize_from_gguf(values, group_size, name, blocks)
            writer.add_int4(prefix, qweight, scales, zeros)
            total = types.setdefault(
                type_name, {"tensors": 0, "groups": 0, "kept": 0, "exact": 0, "sq_error": 0.0, "sq_norm": 0.0}
            )
            total["tensors"] += 1
            for key, value in stats.items():
                total[key] += value
        del values
    check_tensor_set(writer.shapes, config, str(g.path), group_size if int4 else None)
    weights = writer.write_weights()
    writer.release()

    writer.write_json("config.json", config)
    eos = config["eos_token_id"]
    writer.write_json(
        "generation_config.json",
        {
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": eos,
            "pad_token_id": config["pad_token_id"],
        },
    )
    writer.write_text("tokenizer.json", tokenizer.to_str(pretty=False))
    writer.write_json("tokenizer_config.json", tokenizer_config(tok_info, config["max_position_embeddings"]))
    if source_sha256 is None:
        source_sha256 = sha256_file(g.path)
    quantization = None
    if int4 and int4_method == "gguf":
        quantization = {"method": "gguf", "gguf_types": _type_summary(types)}
    return writer.finish(
        make_manifest(
            dtype,
            [weights],
            "gguf",
            str(g.path.resolve()),
            source_sha256,
            group_size=group_size if int4 else None,
            quantization=quantization,
        )
    )
