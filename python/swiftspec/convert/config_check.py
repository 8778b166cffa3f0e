"""The runtime's own check of config.json (``cpp/src/runtime/config.cpp``), made by the converters on the
config they are about to write, before any weight is read: a model the runtime would refuse at load time
is refused at conversion time instead, naming the field (it was written, then refused on every load).
"""

from __future__ import annotations

import json
import math
from typing import Mapping

from ..errors import CheckpointError

_INT32_MAX = 2**31 - 1
# The sizes the sharding and int4 converters read from a swiftspec checkpoint's config.json, which
# the converter writes explicitly (the runtime would derive a null head_dim; they do not).
_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(value, key: str, origin: str) -> int:
    """``value`` if it is an integer in [1, 2^31 - 1] (the runtime reads sizes as int32), else
    :class:`CheckpointError` naming ``origin`` and ``key``."""
    if not _is_int(value) or not 1 <= value <= _INT32_MAX:
        raise CheckpointError(f"{origin}: field {key!r} is {value!r}, expected an integer in [1, {_INT32_MAX}]")
    return value


def check_config(config: Mapping, origin: str) -> None:
    """Raise :class:`CheckpointError` naming ``origin`` and the field unless the runtime would load
    ``config`` (a checkpoint's config.json dict, as the converter is about to write it): the runtime's
    own parser (``ModelConfig::from_json_text``, ``cpp/src/runtime/config.cpp``, through
    ``swiftspec_core.parse_model_config``) reads its JSON text, so converter and runtime cannot
    disagree. A float that is not finite (at the top level or in an object there, e.g. rope_scaling) is
    refused first: JSON has no NaN or infinity (``json.dumps`` would write a config.json no JSON parser
    reads)."""
    from ..swiftspec_core import parse_model_config

    fields = list(config.items())
    # one level down too: rope_scaling / rope_parameters hold numbers (Python's json reads NaN)
    fields += [(f"{key}.{k}", v) for key, value in config.items() if isinstance(value, dict) for k, v in value.items()]
    for key, value in fields:
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(f"{origin}: field {key!r} is {value!r}, expected a finite number")
    parse_model_config(json.dumps(config), origin)


def read_checkpoint_config(folder) -> dict:
    """config.json of the swiftspec checkpoint ``folder``, checked as the runtime checks it (:func:`check_config`)
    and holding what the converters read from it (the sizes as explicit integers, ``tie_word_embeddings``,
    ``swiftspec.attention_bias``).
    Raises :class:`CheckpointError` naming the file and the field: an edited config was a JSONDecodeError,
    KeyError or TypeError traceback when a folder was quantized or sharded."""
    from pathlib import Path

    from .._json_file import read_json

    path = Path(folder) / "config.json"
    try:
        config = read_json(path, "config file")
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    for key in _SIZES:
        check_positive_int(config.get(key), key, str(path))
    check_config(config, str(path))
    if not isinstance(config.get("tie_word_embeddings"), bool):
        raise CheckpointError(
            f"{path}: field 'tie_word_embeddings' is {config.get('tie_word_embeddings')!r}, expected true or false"
        )
    ours = config.get("swiftspec")
    if not isinstance(ours, dict) or not isinstance(ours.get("attention_bias"), bool):
        raise CheckpointError(
            f"{path}: field 'swiftspec' is {ours!r}, expected an object with the boolean 'attention_bias'"
        )
    return config
