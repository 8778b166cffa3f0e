"""Reading the JSON files of checkpoint and model folders under the runtime's limits (issue 28).

Python's own readers had none: a config.json nested 1,000 deep was a RecursionError traceback, a
FIFO in place of a file blocked for ever, a symlink to /dev/zero was read until memory ran out.
:func:`read_text` reads through ``swiftspec_core.read_file_bytes``, the C++ loaders' own reader
(``cpp/src/runtime/json_read.h``): the same regular-file check before the file is opened and the same
size caps. :func:`loads` and :func:`check_limits` apply the runtime's depth and number limits
(``swiftspec_core.JSON_LIMITS``, ``swiftspec_core.json_text_problem``) before ``json.loads``, so
both sides refuse the same deep or out-of-range files with the same one-line messages; syntax
errors keep ``json.loads``' own words.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .errors import CheckpointError


def limit(name: str) -> int:
    """``swiftspec_core.JSON_LIMITS[name]``: ``max_depth``, ``max_small_json_bytes`` (config.json,
    manifest.json, tokenizer_config.json ...), ``max_tokenizer_json_bytes``,
    ``max_safetensors_header_bytes``."""
    from .swiftspec_core import JSON_LIMITS

    return int(JSON_LIMITS[name])


def read_text(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> str:
    """The text of the file ``path`` (``what`` names it in errors, e.g. "config file"), read by the
    runtime's reader: only a regular file (a FIFO or a device is refused before it is opened), of
    at most ``max_bytes`` (default: the small-JSON cap). Raises :class:`FileNotFoundError` if it
    does not exist (callers name what that means), :class:`CheckpointError` "<path>: ..." for
    anything else, text that is not UTF-8 included."""
    from .swiftspec_core import read_file_bytes

    try:
        os.stat(path)
    except FileNotFoundError:
        raise
    except OSError:
        pass  # (read_file_bytes names it)
    data = read_file_bytes(str(path), limit("max_small_json_bytes") if max_bytes is None else max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} cannot be read as JSON: {exc}") from None


def loads(text: str | bytes, origin: str | os.PathLike, error: str | None = None) -> Any:
    """``json.loads(text)`` after the runtime's check of its limits: nesting deeper than
    ``JSON_LIMITS['max_depth']`` (json.loads recursed until RecursionError past ~1,000) or a number
    past the double range is :class:`CheckpointError` "<origin>: malformed JSON: field '...': ...".
    Syntax is json.loads' own, as before (it takes NaN, which the config checks then name): a
    syntax error is :class:`CheckpointError` "<error>: <reason>", ``error`` by default
    "<origin> cannot be read as JSON"."""
    from .swiftspec_core import json_text_problem

    raw = text.encode("utf-8") if isinstance(text, str) else text
    problem, is_limit = json_text_problem(raw)
    if is_limit:
        raise CheckpointError(f"{origin}: malformed JSON: {problem}")
    try:
        return json.loads(text)
    except RecursionError:  # deep nesting past a syntax error the runtime stopped at (json.loads takes NaN)
        raise CheckpointError(
            f"{origin}: malformed JSON: arrays and objects nested deeper than {limit('max_depth')} levels"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise CheckpointError(
            f"{origin} cannot be read as JSON: {exc}" if error is None else f"{error}: {exc}"
        ) from None


def check_limits(text: str, origin: str | os.PathLike) -> str:
    """``text`` if it is within the runtime's JSON limits (depth, number range), else
    :class:`CheckpointError` as :func:`loads` raises it; for JSON another parser reads
    (tokenizer.json, read by the ``tokenizers`` library)."""
    from .swiftspec_core import json_text_problem

    problem, is_limit = json_text_problem(text.encode("utf-8"))
    if is_limit:
        raise CheckpointError(f"{origin}: malformed JSON: {problem}")
    return text


def read_json(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> Any:
    """:func:`read_text` then :func:`loads`: a JSON file of a checkpoint or model folder."""
    return loads(read_text(path, what, max_bytes), path)
