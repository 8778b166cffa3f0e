"""The tensors a checkpoint must hold, and their shapes (docs/checkpoint_format.md, "Tensors")."""

from __future__ import annotations

from typing import Mapping

from ..errors import CheckpointError


def expected_tensor_shapes(config: Mapping, group_size: int | None = None) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape, for a config.json dict with the swiftspec keys.

    Shapes are ``[out_features, in_features]`` as in Hugging Face. Q/K/V biases are included
    when ``config["swiftspec"]["attention_bias"]`` is true; ``lm_head.weight`` is absent when
    ``tie_word_embeddings`` is true. With ``group_size`` (an int4 checkpoint) every projection
    ``P.weight`` [N, K] is replaced by ``P.qweight`` [N, K/2], ``P.scales`` and ``P.zeros``
    [N, K/group_size].
    """
    shapes = _float_tensor_shapes(config)
    if group_size is None:
        return shapes
    from .int4 import int4_tensor_shapes, projection_prefix

    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        prefix = projection_prefix(name)
        if prefix:
            n, k = shape
            out.update(int4_tensor_shapes(prefix, n, k, group_size))
        else:
            out[name] = shape
    return out


def _float_tensor_shapes(config: Mapping) -> dict[str, tuple[int, ...]]:
    hidden = config["hidden_size"]
    inter = config["intermediate_size"]
    vocab = config["vocab_size"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = config["head_dim"]
    bias = bool(config["swiftspec"]["attention_bias"])
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (heads * head_dim, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv_heads * head_dim, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv_heads * head_dim, hidden)
        if bias:
            shapes[p + "self_attn.q_proj.bias"] = (heads * head_dim,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_heads * head_dim,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_heads * head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
    return shapes


def check_tensor_set(
    found: Mapping[str, tuple[int, ...]], config: Mapping, source: str, group_size: int | None = None
) -> None:
    """Raise :class:`CheckpointError` unless ``found`` (name -> shape) is exactly the expected set
    (of an int4 checkpoint with ``group_size`` when given).

    ``source`` (a path) is named in the message, with the first missing, unexpected or
    mis-shaped tensors.
    """
    layers = config["num_hidden_layers"]
    if isinstance(layers, int) and layers > len(found):  # each layer has 9 tensors or more
        raise CheckpointError(
            f"{source}: config says num_hidden_layers = {layers}, but the weights hold only "
            f"{len(found)} tensors (the config does not match the weights)"
        )
    expected = expected_tensor_shapes(config, group_size)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(n for n in set(expected) & set(found) if tuple(found[n]) != expected[n])
    problems = []
    if missing:
        problems.append(f"missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if extra:
        problems.append(f"unexpected tensors {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    if wrong:
        problems.append(
            "wrong shapes " + ", ".join(f"{n}: {tuple(found[n])} (expected {expected[n]})" for n in wrong[:5])
        )
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))
