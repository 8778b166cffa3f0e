"""GGUF tensor names -> Hugging Face tensor names, and the Llama Q/K row un-permutation."""

from __future__ import annotations

import re

import numpy as np

from ..errors import CheckpointError

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_PER_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face name of GGUF tensor ``gguf_name`` (e.g. ``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``).

    Raises :class:`CheckpointError` naming the tensor if it has no place in the checkpoint
    format (for example ``rope_freqs.weight`` of Llama-3.1-style RoPE scaling, or an
    ``attn_output.bias``).
    """
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _PER_LAYER:
        return f"model.layers.{int(m.group(1))}.{_PER_LAYER[m.group(2)]}"
    raise CheckpointError(
        f"GGUF tensor {gguf_name!r} is not supported by the swiftspec checkpoint format "
        f"(known: {', '.join(_GLOBAL)}, blk.N.{{{', '.join(_PER_LAYER)}}})"
    )


def unpermute_llama_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo the row permutation GGUF applies to Llama-architecture Q/K projections.

    llama.cpp rotates adjacent dimension pairs ``(2i, 2i+1)`` of each head; Hugging Face (and
    the swiftspec checkpoint, "neox" style) rotates ``i`` with ``i + head_dim/2``. To make the
    GGUF weights work with adjacent-pair RoPE, the GGUF writer reorders the rows of each head so
    that GGUF row ``2i + j`` is HF row ``j * head_dim/2 + i`` (``j`` in {0, 1},
    ``i < head_dim/2``). This function applies the inverse.

    ``w``: ``[n_heads * head_dim, in_features]`` weight or ``[n_heads * head_dim]`` bias, GGUF
    row order. ``n_heads``: attention heads for Q, key/value heads for K. Returns the same shape
    in HF row order (a new C-contiguous array). Raises :class:`CheckpointError` if the rows do
    not split into ``n_heads`` heads of even size.
    """
    rows = w.shape[0]
    if n_heads <= 0 or rows % n_heads or (rows // n_heads) % 2:
        raise CheckpointError(f"cannot un-permute {rows} Q/K rows into {n_heads} heads of even head_dim")
    half = rows // n_heads // 2
    # GGUF rows of one head, indexed [i, j] (row 2i + j) -> HF rows indexed [j, i] (row j*half + i)
    return np.ascontiguousarray(w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
