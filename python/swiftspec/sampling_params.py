"""The sampling parameters (temperature, top_p, top_k, seed): one validator for every caller.

:meth:`swiftspec.Engine.generate`, ``swiftspec generate``, ``swiftspec serve`` and ``swiftspec
bench`` (:func:`swiftspec.bench.config.check_sampling`) accept the same values, so a setting the
benchmark takes runs in the engine and the reverse. Each caller names the parameters as its
user wrote them (``top_p`` in Python, ``--top-p`` on a command line). The rule and its messages
are the runtime's (``SamplingRequest`` in ``cpp/include/swiftspec/sampling.h``, reached through
``swiftspec_core.check_sampling``); this module converts Python's numbers and calls it.
"""

from __future__ import annotations

import numbers

from swiftspec.errors import InvalidRequestError

#: The parameters with their greedy (no-effect) values, in the order messages name them.
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0}


def _as_number(value, *, integer: bool):
    """``value`` as a Python int (any Integral: numpy integers too) or, unless ``integer``, a Python
    float (any Real: numpy floats too); anything else (a bool, a string, a float for an integer)
    as it is, for the runtime's check to name."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if not integer and isinstance(value, numbers.Real):
        return float(value)
    return value


def _check(values: dict, error: type[Exception], **options) -> None:
    """The runtime's check (``swiftspec_core.check_sampling``), raising ``error``."""
    from swiftspec import swiftspec_core as core

    try:
        core.check_sampling(**values, **options)
    except InvalidRequestError as exc:
        if error is InvalidRequestError:
            raise
        raise error(str(exc)) from None


def check_sampling_params(
    temperature=0.0,
    top_p=1.0,
    top_k=0,
    seed=0,
    *,
    names: dict[str, str] | None = None,
    explain: bool = False,
    seeds: int = 1,
    seed_note: str | None = None,
    error: type[Exception] = InvalidRequestError,
) -> dict:
    """Validates sampling parameters; returns them as Python numbers
    ``{"temperature": float, "top_p": float, "top_k": int, "seed": int}`` (numpy scalars are
    taken as numbers and converted).

    The ranges are the runtime's (``SamplingRequest::params``, ``cpp/include/swiftspec/sampling.h``,
    through ``swiftspec_core.check_sampling``): ``temperature`` (0: greedy decoding) a finite
    number >= 0 within float32's normal numbers (or 0); ``top_p`` (1: off) in (0, 1]; ``top_k``
    (0: off) an integer in [0, 2**31 - 1]; ``seed`` an integer >= 0 with ``seed + seeds - 1``
    within 64 bits. What a value means at temperature 0 (nothing) is the caller's business.

    Args:
        temperature, top_p, top_k, seed: the values to check, as given.
        names: how messages name each parameter (default: its keyword, e.g. ``{"top_p": "--top-p"}``
            for a command line); missing keys keep the keyword.
        explain: messages state each parameter's whole domain and its "off" value ("top_p must
            be a number in (0, 1] (1: off), got 0.0"), as ``swiftspec bench`` words them; False:
            the type first, then the range ("top_p must be in (0, 1], got 1.5").
        seeds: the request uses seeds ``seed`` ... ``seed + seeds - 1`` (``swiftspec bench``:
            one per prompt index), each of which must fit in 64 bits.
        seed_note: why (shown in the seed's range message), e.g. "request i of a data set
            samples with seed + i".
        error: the exception class raised (:class:`InvalidRequestError`; the bench passes its
            ``BenchConfigError``).

    Raises:
        error: one line naming the parameter (as ``names`` spells it) and the value given.
    """
    values = {
        "temperature": _as_number(temperature, integer=False),
        "top_p": _as_number(top_p, integer=False),
        "top_k": _as_number(top_k, integer=True),
        "seed": _as_number(seed, integer=True),
    }
    _check(values, error, names=dict(names or {}), explain=explain, seeds=max(1, int(seeds)), seed_note=seed_note or "")
    return {
        "temperature": float(values["temperature"]),
        "top_p": float(values["top_p"]),
        "top_k": values["top_k"],
        "seed": values["seed"],
    }


def check_unused_under_greedy(
    values: dict, given=None, *, names: dict[str, str] | None = None, error: type[Exception] = InvalidRequestError
) -> None:
    """Refuses top_p / top_k / seed set under greedy decoding (temperature 0), where they have no
    effect: a command line that samples only with a temperature (``swiftspec generate``,
    ``swiftspec bench``) must not run greedy decoding silently when given one of them alone.
    The rule is the runtime's (``SamplingRequest::refuse_unused_under_greedy``).

    Args:
        values: the checked parameters (:func:`check_sampling_params`'s result).
        given: the parameters the user set explicitly (a command line: the flags given); default:
            those whose value differs from greedy decoding's (``SAMPLING_DEFAULTS``).
        names: how the message names each parameter (as in :func:`check_sampling_params`).
        error: the exception class raised.

    Raises:
        error: "--top-p 0.9 has no effect under greedy decoding (--temperature 0); give
            --temperature > 0 to sample, or drop it" (every such parameter named) when the
            temperature is 0 and any of top_p, top_k, seed was given.
    """
    if given is None:
        given = [k for k in ("top_p", "top_k", "seed") if values[k] != SAMPLING_DEFAULTS[k]]
    _check({k: values[k] for k in SAMPLING_DEFAULTS}, error, names=dict(names or {}), given=list(given))
