"""Tensor-parallel sharding of a checkpoint: ``tools/convert_weights.py --tp N``.

Writes a pre-sharded folder (docs/checkpoint_format.md, "Tensor-parallel shards"; format
version 2) that the runtime maps in place, one file per rank, instead of cutting a TP-1
folder at load time. The split is Megatron-style and padded so that any TP degree works
(heads and FFN need not divide): :func:`plan` is the runtime's own ``TpPlan::make``
(``cpp/include/swiftspec/tensor_parallel.h``), so a folder is cut as the runtime would cut it.

Files of a TP-N folder::

    manifest.json                    format_version 2, tp_degree N, files, tensor_parallel (the plan)
    config.json, tokenizer*.json, generation_config.json   copied unchanged (the unsharded model)
    model-tp-shared.safetensors      replicated: embed_tokens, every RMSNorm weight
    model-tp{r}-of-{N}.safetensors   rank r: q/k/v_proj (+bias), o_proj, gate/up/down_proj, lm_head slice

Per-rank shapes (hd = head_dim): q_proj [q_heads_per_rank*hd, hidden], k/v_proj
[kv_heads_per_rank*hd, hidden], o_proj [hidden, q_heads_per_rank*hd], gate/up_proj
[ffn_per_rank, hidden], down_proj [hidden, ffn_per_rank], lm_head [vocab slice, hidden].
Padding rows / columns are zero, so they add exactly 0 to every output.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .config_check import read_checkpoint_config
from .manifest import MANIFEST, read_manifest
from .safetensors_reader import SafetensorsFile
from .writer import CheckpointWriter, check_not_source

SHARED_FILE = "model-tp-shared.safetensors"
FORMAT_VERSION = 2


def rank_file(rank: int, tp: int) -> str:
    return f"model-tp{rank}-of-{tp}.safetensors"


def plan(config: dict, tp: int, ffn_align: int = 8) -> dict:
    """The tensor-parallel plan of a model over ``tp`` ranks: the runtime's own ``TpPlan::make``
    (``cpp/include/swiftspec/tensor_parallel.h``, through ``swiftspec_core.tp_plan_of_config``)
    of ``config`` (the checkpoint's config.json dict), as its JSON.

    Query heads: rank r owns heads [Hq*r/tp, Hq*(r+1)/tp), padded to ceil(Hq/tp) per rank (-1).
    KV heads: the distinct groups its query heads read, padded to the largest count over ranks.
    FFN rows: [I*r/tp, I*(r+1)/tp), padded to round_up(ceil(I/tp), ffn_align).
    Vocabulary (lm_head rows): [V*r/tp, V*(r+1)/tp), not padded.

    Raises :class:`CheckpointError` with the runtime's message (tp < 1, more ranks than attention
    heads, a config it refuses).
    """
    from ..errors import InvalidRequestError
    from ..swiftspec_core import tp_plan_of_config

    if not isinstance(tp, int) or isinstance(tp, bool):
        raise CheckpointError(f"tp (TP degree) must be an integer, got {tp!r}")
    try:
        return json.loads(tp_plan_of_config(json.dumps(config), "config.json", tp, ffn_align))
    except InvalidRequestError as exc:
        raise CheckpointError(str(exc)) from None


def _head_rows(w: np.ndarray, heads: list[int], head_dim: int) -> np.ndarray:
    """Rows of ``w`` ([heads*hd, ...] or [heads*hd]) for ``heads`` (-1: zeros)."""
    out = np.zeros((len(heads) * head_dim,) + w.shape[1:], dtype=np.float32)
    for j, h in enumerate(heads):
        if h >= 0:
            out[j * head_dim : (j + 1) * head_dim] = w[h * head_dim : (h + 1) * head_dim]
    return out


def _head_cols(w: np.ndarray, heads: list[int], head_dim: int) -> np.ndarray:
    """Columns of ``w`` ([n, heads*hd]) for ``heads`` (-1: zeros)."""
    out = np.zeros((w.shape[0], len(heads) * head_dim), dtype=np.float32)
    for j, h in enumerate(heads):
        if h >= 0:
            out[:, j * head_dim : (j + 1) * head_dim] = w[:, h * head_dim : (h + 1) * head_dim]
    return out


def _padded_rows(w: np.ndarray, begin: int, end: int, total: int) -> np.ndarray:
    out = np.zeros((total,) + w.shape[1:], dtype=np.float32)
    out[: end - begin] = w[begin:end]
    return out


def _padded_cols(w: np.ndarray, begin: int, end: int, total: int) -> np.ndarray:
    out = np.zeros((w.shape[0], total), dtype=np.float32)
    out[:, : end - begin] = w[:, begin:end]
    return out


def shard_checkpoint(
    src_dir: str | Path,
    out_dir: str | Path,
    tp: int,
    *,
    ffn_align: int = 8,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Shard the TP-1 checkpoint folder ``src_dir`` into a TP-``tp`` folder ``out_dir`` (tp >= 2).

    The values are copied exactly (same storage dtype). Peak memory: one rank's shard plus one
    float32 tensor. Returns ``out_dir``. Raises :class:`CheckpointError` naming the folder and
    problem (not a TP-1 checkpoint, missing tensors, tp < 2, non-empty output).
    """
    if not isinstance(tp, int) or tp < 2:
        raise CheckpointError(
            f"shard_checkpoint: tp must be an integer >= 2 (a TP-1 folder needs no sharding), got {tp!r}"
        )
    src = Path(src_dir)
    check_not_source(src, out_dir)
    manifest = read_manifest(src)
    if manifest["dtype"] == "int4":
        raise CheckpointError(
            f"{src}: tensor-parallel sharding of int4 checkpoints is not supported yet; load the "
            "int4 folder with a placement tp (sharded at load time), or shard a bfloat16 or float32 "
            "folder"
        )
    if manifest.get("tp_degree", 1) != 1:
        raise CheckpointError(f"{src}: already sharded (tp_degree {manifest['tp_degree']}); shard the TP-1 folder")
    config = read_checkpoint_config(src)
    dtype = manifest["dtype"]
    p = plan(config, tp, ffn_align)
    files = [SafetensorsFile(src / f) for f in manifest["files"]]
    where = {name: f for f in files for name in f.entries}

    def get(name: str) -> np.ndarray:
        if name not in where:
            raise CheckpointError(f"{src}: missing tensor {name!r}")
        return where[name].float32(name)

    hd = config["head_dim"]
    layers = config["num_hidden_layers"]
    bias = bool(config.get("swiftspec", {}).get("attention_bias", False))
    lm_name = "model.embed_tokens.weight" if config["tie_word_embeddings"] else "lm_head.weight"

    writer = CheckpointWriter(out_dir, dtype, overwrite=overwrite)
    steps = tp + 1
    bar = _progress(steps, progress)
    # Replicated tensors.
    writer.add("model.embed_tokens.weight", get("model.embed_tokens.weight"))
    writer.add("model.norm.weight", get("model.norm.weight"))
    for i in range(layers):
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            writer.add(f"model.layers.{i}.{n}", get(f"model.layers.{i}.{n}"))
    writer.write_weights(SHARED_FILE)
    writer.release()
    bar(1)
    # One file per rank.
    for r in range(tp):
        qh, kvh = p["q_heads"][r], p["kv_heads"][r]
        f0, f1 = p["ffn_bounds"][r], p["ffn_bounds"][r + 1]
        v0, v1 = p["vocab_bounds"][r], p["vocab_bounds"][r + 1]
        for i in range(layers):
            pre = f"model.layers.{i}."
            writer.add(pre + "self_attn.q_proj.weight", _head_rows(get(pre + "self_attn.q_proj.weight"), qh, hd))
            writer.add(pre + "self_attn.k_proj.weight", _head_rows(get(pre + "self_attn.k_proj.weight"), kvh, hd))
            writer.add(pre + "self_attn.v_proj.weight", _head_rows(get(pre + "self_attn.v_proj.weight"), kvh, hd))
            if bias:
                writer.add(pre + "self_attn.q_proj.bias", _head_rows(get(pre + "self_attn.q_proj.bias"), qh, hd))
                writer.add(pre + "self_attn.k_proj.bias", _head_rows(get(pre + "self_attn.k_proj.bias"), kvh, hd))
                writer.add(pre + "self_attn.v_proj.bias", _head_rows(get(pre + "self_attn.v_proj.bias"), kvh, hd))
            writer.add(pre + "self_attn.o_proj.weight", _head_cols(get(pre + "self_attn.o_proj.weight"), qh, hd))
            for n in ("gate_proj", "up_proj"):
                writer.add(
                    pre + f"mlp.{n}.weight", _padded_rows(get(pre + f"mlp.{n}.weight"), f0, f1, p["ffn_per_rank"])
                )
            writer.add(
                pre + "mlp.down_proj.weight", _padded_cols(get(pre + "mlp.down_proj.weight"), f0, f1, p["ffn_per_rank"])
            )
        writer.add("lm_head.weight", get(lm_name)[v0:v1])
        writer.write_weights(rank_file(r, tp))
        writer.release()
        bar(1)
    for f in src.iterdir():
        if f.is_file() and f.name != MANIFEST and f.suffix != ".safetensors":
            writer.copy_in(f)
    new_manifest = dict(manifest)
    new_manifest.update(
        {
            "format_version": FORMAT_VERSION,
            "tp_degree": tp,
            "files": [SHARED_FILE] + [rank_file(r, tp) for r in range(tp)],
            "tensor_parallel": p,
        }
    )
    return writer.finish(new_manifest)


def convert_sharded(
    source: str | Path,
    out_dir: str | Path,
    tp: int,
    *,
    dtype: str = "bfloat16",
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """``convert_weights.py --tp N``: a GGUF file, an HF folder or a TP-1 swiftspec folder into a
    TP-``tp`` folder. GGUF / HF inputs are converted to a temporary TP-1 folder first."""
    source = Path(source)
    check_not_source(source, out_dir)
    if source.is_dir() and (source / MANIFEST).is_file():
        return shard_checkpoint(source, out_dir, tp, overwrite=overwrite, progress=progress)
    from . import convert_gguf, convert_hf

    parent = Path(out_dir).resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.TemporaryDirectory(dir=parent, prefix=".tp1-")
    except OSError as exc:
        raise CheckpointError(f"cannot write the output folder {out_dir}: {exc.strerror or exc}") from None
    with scratch as tmp:
        tp1 = Path(tmp) / "tp1"
        convert = convert_hf if source.is_dir() else convert_gguf
        convert(source, tp1, dtype=dtype, progress=progress)
        return shard_checkpoint(tp1, out_dir, tp, overwrite=overwrite, progress=progress)


def _progress(total: int, enabled: bool):
    if not enabled:
        return lambda n: None
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="sharding", unit="file")

    def step(n: int) -> None:
        bar.update(n)
        if bar.n >= total:
            bar.close()

    return step
