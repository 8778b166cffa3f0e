"""The tiny llama checkpoint the bad-input tests write and the fuzz seeds start from: its config.json
and manifest.json tables (one file, and sharded over 2 ranks) and its random float32 weights (2
layers, hidden size 32, vocabulary 64; it loads and runs in milliseconds on the CPU backend); and a
tiny llama GGUF file.

Test modules import it as a sibling (pytest puts tests/ on sys.path); fuzz/make_seeds.py puts
tests/ on sys.path itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

#: config.json of a 2-layer llama: vocabulary 64, hidden size 32, FFN 64, 4 query heads and 2 KV
#: heads of head_dim 8, tied embeddings, eos token 2.
TINY_CONFIG = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}
#: manifest.json of a float32 checkpoint whose weights are all in model.safetensors.
TINY_MANIFEST = {
    "format": "swiftspec-checkpoint",
    "format_version": 1,
    "dtype": "float32",
    "files": ["model.safetensors"],
}
#: The tensor-parallel plan of TINY_CONFIG over 2 ranks (manifest.json's "tensor_parallel"): query
#: heads 0-1 and 2-3, KV heads 0 and 1, FFN rows and vocabulary rows 0-31 and 32-63.
TINY_TP_PLAN = {
    "tp_degree": 2,
    "q_heads_per_rank": 2,
    "kv_heads_per_rank": 1,
    "ffn_per_rank": 32,
    "vocab_per_rank": 32,
    "q_heads": [[0, 1], [2, 3]],
    "kv_heads": [[0], [1]],
    "q_to_kv": [[0, 0], [0, 0]],
    "ffn_bounds": [0, 32, 64],
    "vocab_bounds": [0, 32, 64],
}
#: manifest.json of a float32 checkpoint sharded by TINY_TP_PLAN: the shared tensors in one file,
#: each rank's slices in one file per rank.
TINY_TP_MANIFEST = {
    "format": "swiftspec-checkpoint",
    "format_version": 2,
    "dtype": "float32",
    "tp_degree": 2,
    "tensor_parallel": TINY_TP_PLAN,
    "files": ["model-tp-shared.safetensors", "model-tp0-of-2.safetensors", "model-tp1-of-2.safetensors"],
}


def tiny_tensors(cfg: Mapping = TINY_CONFIG, norm_mean: float = 1.0) -> dict[str, np.ndarray]:
    """Random weights of the llama ``cfg`` under their Hugging Face names, float32, drawn from
    ``np.random.default_rng(0)`` in a fixed order: N(0, 0.1^2), the RMSNorm weights (the 1-D ones)
    centred on ``norm_mean`` instead. Shapes, with H hidden_size, I intermediate_size, Q
    num_attention_heads * head_dim and KV num_key_value_heads * head_dim: embed_tokens [vocab_size,
    H], norm [H]; per layer q_proj [Q, H], k_proj and v_proj [KV, H], o_proj [H, Q], gate_proj and
    up_proj [I, H], down_proj [H, I], input_layernorm and post_attention_layernorm [H]."""
    rng = np.random.default_rng(0)
    h, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    return {
        k: (rng.standard_normal(s) * 0.1 + (norm_mean if len(s) == 1 else 0.0)).astype(np.float32)
        for k, s in shapes.items()
    }


#: The tiny GGUF's vocabulary: "h" and "e", their merge "he", and an end-of-text token.
TINY_GGUF_TOKENS = ("h", "e", "he", "<|endoftext|>")


def write_tiny_gguf(
    path: Path,
    tokens: Sequence[str] = TINY_GGUF_TOKENS,
    token_types: Sequence[int] = (1, 1, 1, 3),
    embd: np.ndarray | None = None,
    eos_token_id: int | None = None,
) -> bytes:
    """Writes a tiny llama GGUF to ``path`` and returns its bytes: 1 block, embedding length 8, FFN
    16, 2 heads and 1 KV head, context 64; a gpt2 tokenizer of ``tokens`` (``token_types``, one per
    token: 1 normal, 3 control) with the one merge "h e", and an eos token only where
    ``eos_token_id`` is given; two tensors, token_embd.weight ``embd`` (float32 [len(tokens), 8];
    zeros where None) and output_norm.weight (float32 [8], ones)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(list(tokens))
    w.add_token_types(list(token_types))
    w.add_token_merges(["h e"])
    if eos_token_id is not None:
        w.add_eos_token_id(eos_token_id)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32) if embd is None else embd)
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()
