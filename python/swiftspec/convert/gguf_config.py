"""config.json (HF keys + the "swiftspec" object) from a GGUF file's metadata."""

from __future__ import annotations

import numpy as np

from ..errors import CheckpointError
from .config_check import check_config, check_positive_int
from .gguf_file import GGUFModelFile
from .tokenizer_from_gguf import GGUFTokenizerInfo

#: GGUF general.architecture -> (HF model_type, HF architectures entry)
SUPPORTED_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
}

#: GGUF architectures whose Q/K rows the GGUF writer permuted for adjacent-pair RoPE
PERMUTED_QK_ARCHITECTURES = frozenset({"llama"})

_DEFAULT_ROPE_THETA = {"llama": 10000.0, "qwen2": 1000000.0}


def _f32(value: float) -> float:
    """The shortest decimal that reads back as the same float32 (GGUF stores float32)."""
    return float(str(np.float32(value)))


def check_architecture(g: GGUFModelFile) -> str:
    """Return ``g.architecture`` if supported, else raise :class:`CheckpointError` naming it."""
    if g.architecture not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{g.path}: general.architecture is {g.architecture!r}, which swiftspec cannot convert; "
            f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    return g.architecture


def _check_no_rope_scaling(g: GGUFModelFile) -> None:
    """None (no RoPE scaling), else :class:`CheckpointError`: the runtime implements RoPE scaling as
    HF's "llama3" and "yarn" rope_scaling of a Hugging Face config.json; GGUF files carry llama3 as a
    ``rope_freqs.weight`` tensor and YaRN in llama.cpp's own metadata keys, neither mapped yet
    ('linear' and 'yarn' scaling were once written into config.json, and the runtime refused the
    folder on every load)."""
    kind = g.arch_get("rope.scaling.type")
    if kind in (None, "none"):
        if "rope_freqs.weight" in g.tensors:
            raise CheckpointError(
                f"{g.path}: tensor 'rope_freqs.weight' (Llama-3.1-style RoPE frequency scaling) is not supported yet"
            )
        return None
    raise CheckpointError(
        f"{g.path}: {g.architecture}.rope.scaling.type is {kind!r}; RoPE scaling from GGUF metadata is not "
        "supported (the runtime implements HF's 'llama3' and 'yarn' rope_scaling from a Hugging Face config.json)"
    )


def build_config(g: GGUFModelFile, tok: GGUFTokenizerInfo, dtype: str) -> dict:
    """The checkpoint's config.json dict.

    Sizes come from ``<arch>.*`` metadata (block_count, embedding_length, feed_forward_length,
    attention.head_count, attention.head_count_kv, attention.key_length, rope.freq_base,
    attention.layer_norm_rms_epsilon, context_length); ``vocab_size`` is the row count of
    ``token_embd.weight``; ``tie_word_embeddings`` is true exactly when the file has no
    ``output.weight``; ``attention_bias`` is true for qwen2 (and for llama when ``attn_q.bias``
    exists); ``eos_token_id`` is the list from :func:`tokenizer_from_gguf.end_token_ids`.
    float32 metadata is written as its shortest round-tripping decimal (1e-06, not
    9.999999974752427e-07). Raises :class:`CheckpointError` naming any missing or inconsistent field.
    """
    arch = check_architecture(g)
    model_type, hf_class = SUPPORTED_ARCHITECTURES[arch]
    hidden = g.arch_require("embedding_length", int)
    heads = check_positive_int(g.arch_require("attention.head_count", int), f"{arch}.attention.head_count", str(g.path))
    kv_heads = g.arch_get("attention.head_count_kv", heads)
    if not isinstance(kv_heads, int) or kv_heads <= 0 or heads % kv_heads:
        raise CheckpointError(
            f"{g.path}: {arch}.attention.head_count_kv is {kv_heads!r}, which must divide head_count {heads}"
        )
    head_dim = g.arch_get("attention.key_length", hidden // heads)
    value_dim = g.arch_get("attention.value_length", head_dim)
    rope_dim = g.arch_get("rope.dimension_count", head_dim)
    if value_dim != head_dim or rope_dim != head_dim:
        raise CheckpointError(
            f"{g.path}: head_dim {head_dim} differs from {arch}.attention.value_length {value_dim} or "
            f"{arch}.rope.dimension_count {rope_dim}; partial RoPE and distinct value heads are not supported"
        )
    if "token_embd.weight" not in g.tensors:
        raise CheckpointError(f"{g.path}: tensor 'token_embd.weight' is missing")
    embd_shape = [int(d) for d in g.tensors["token_embd.weight"].shape]  # GGUF lists the fastest axis first
    if len(embd_shape) != 2:
        raise CheckpointError(
            f"{g.path}: tensor 'token_embd.weight' has {len(embd_shape)} dimensions {embd_shape}, expected 2 "
            "(embedding_length, vocabulary size)"
        )
    vocab = embd_shape[1]
    meta_vocab = g.arch_get("vocab_size")
    if meta_vocab is not None and meta_vocab != vocab:
        raise CheckpointError(f"{g.path}: {arch}.vocab_size is {meta_vocab} but token_embd.weight has {vocab} rows")
    if len(tok.tokens) > vocab:
        raise CheckpointError(
            f"{g.path}: tokenizer.ggml.tokens lists {len(tok.tokens)} tokens, more than the {vocab} embedding rows"
        )
    attention_bias = arch == "qwen2" or "blk.0.attn_q.bias" in g.tensors
    eps = g.arch_require("attention.layer_norm_rms_epsilon", (int, float))
    theta = g.arch_get("rope.freq_base", _DEFAULT_ROPE_THETA[arch])
    eos = tok.eos_token_ids

    _check_no_rope_scaling(g)
    config = {
        "architectures": [hf_class],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": g.arch_require("feed_forward_length", int),
        "num_hidden_layers": g.arch_require("block_count", int),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(eps),
        "rope_theta": _f32(theta),
        "rope_scaling": None,  # (_check_no_rope_scaling refused any other)
        "max_position_embeddings": g.arch_require("context_length", int),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "pad_token_id": tok.pad_token_id,
        "torch_dtype": dtype,
    }
    if model_type == "llama":
        config["attention_bias"] = attention_bias
        config["mlp_bias"] = False
    else:
        config["use_sliding_window"] = False
    config["swiftspec"] = {"rope_style": "neox", "attention_bias": attention_bias}
    check_config(config, f"{g.path} (config.json made from its metadata)")
    return config
