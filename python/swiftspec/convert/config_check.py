"""The checks the runtime makes on config.json (``cpp/src/config.cpp``), made by the converters on the
config they are about to write, before any weight is read: a model the runtime would refuse at load time
is refused at conversion time instead, naming the field (it was written, then refused on every load).
"""

from __future__ import annotations

import math
from typing import Mapping

from ..errors import CheckpointError

_INT32_MAX = 2**31 - 1
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(value, key: str, origin: str) -> int:
    """``value`` if it is an integer in [1, 2^31 - 1] (the runtime reads sizes as int32), else
    :class:`CheckpointError` naming ``origin`` and ``key``."""
    if not _is_int(value) or not 1 <= value <= _INT32_MAX:
        raise CheckpointError(f"{origin}: field {key!r} is {value!r}, expected an integer in [1, {_INT32_MAX}]")
    return value


def check_config(config: Mapping, origin: str) -> None:
    """Raise :class:`CheckpointError` naming ``origin`` and the field unless ``config`` (a checkpoint's
    config.json dict) passes the runtime's checks: positive int32 sizes, heads a multiple of KV heads, an
    even head_dim, finite positive rms_norm_eps and rope_theta, a positive max_position_embeddings,
    boolean tie_word_embeddings / attention_bias, eos ids inside the vocabulary, rope_scaling an
    object or null."""
    for key in _SIZES:
        check_positive_int(config.get(key), key, origin)
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    if heads % kv:
        raise CheckpointError(f"{origin}: num_attention_heads ({heads}) must be a multiple of "
                              f"num_key_value_heads ({kv})")
    if config["head_dim"] % 2:
        raise CheckpointError(f"{origin}: head_dim must be even for RoPE, got {config['head_dim']}")
    for key in ("rms_norm_eps", "rope_theta"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise CheckpointError(f"{origin}: field {key!r} is {value!r}, expected a finite number > 0")
    if config.get("max_position_embeddings") is not None:
        check_positive_int(config["max_position_embeddings"], "max_position_embeddings", origin)
    for key in ("tie_word_embeddings", "attention_bias"):
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise CheckpointError(f"{origin}: field {key!r} is {config[key]!r}, expected true or false")
    vocab = config["vocab_size"]
    eos = config.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    for e in ids:
        if not _is_int(e) or not 0 <= e < vocab:
            raise CheckpointError(f"{origin}: field 'eos_token_id' is {eos!r}; every id must be an integer in "
                                  f"[0, {vocab}) (vocab_size)")
    bos = config.get("bos_token_id")
    if bos is not None and not _is_int(bos):
        raise CheckpointError(f"{origin}: field 'bos_token_id' is {bos!r}, expected an integer or null")
    scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise CheckpointError(f"{origin}: field 'rope_scaling' is {scaling!r}, expected an object or null")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in (None, "", "default", "llama3"):
            raise CheckpointError(f"{origin}: unsupported rope_scaling type {kind!r} (supported: llama3, default)")


def read_checkpoint_config(folder) -> dict:
    """config.json of the swiftspec checkpoint ``folder``, checked as the runtime checks it (:func:`check_config`)
    and holding what the converters read from it (``tie_word_embeddings``, ``swiftspec.attention_bias``).
    Raises :class:`CheckpointError` naming the file and the field: an edited config was a JSONDecodeError,
    KeyError or TypeError traceback when a folder was quantized or sharded."""
    import json
    from pathlib import Path

    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    check_config(config, str(path))
    if not isinstance(config.get("tie_word_embeddings"), bool):
        raise CheckpointError(f"{path}: field 'tie_word_embeddings' is {config.get('tie_word_embeddings')!r}, "
                              "expected true or false")
    ours = config.get("swiftspec")
    if not isinstance(ours, dict) or not isinstance(ours.get("attention_bias"), bool):
        raise CheckpointError(f"{path}: field 'swiftspec' is {ours!r}, expected an object with the boolean "
                              "'attention_bias'")
    return config
