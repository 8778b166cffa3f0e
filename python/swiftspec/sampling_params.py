"""The sampling parameters (temperature, top_p, top_k, seed): one validator for every caller.

:meth:`swiftspec.Engine.generate`, ``swiftspec generate`` and ``swiftspec bench``
(:func:`swiftspec.bench.config.check_sampling`) accept the same values, so a setting the
benchmark takes runs in the engine and the reverse. Each caller names the parameters as its
user wrote them (``top_p`` in Python, ``--top-p`` on a command line).
"""

from __future__ import annotations

import numbers

from swiftspec.errors import InvalidRequestError

#: float32's largest finite number and smallest normal number: the runtime samples in float32.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_MIN_NORMAL = 1.1754943508222875e-38
#: The runtime's top_k is a 32-bit count, its seed a 64-bit unsigned integer.
TOP_K_MAX = 2**31 - 1
SEED_MAX = 2**64 - 1
#: The parameters with their greedy (no-effect) values, in the order messages name them.
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0}


def _number(value) -> bool:  # numpy's too; a bool is not a number here
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_sampling_params(temperature=0.0, top_p=1.0, top_k=0, seed=0, *, names: dict[str, str] | None = None,
                          explain: bool = False, seeds: int = 1, seed_note: str | None = None,
                          error: type[Exception] = InvalidRequestError) -> dict:
    """Validates sampling parameters; returns them as Python numbers
    ``{"temperature": float, "top_p": float, "top_k": int, "seed": int}`` (numpy scalars are
    taken as numbers and converted).

    The ranges: ``temperature`` (softmax temperature; 0: greedy decoding) a finite number >= 0,
    at most float32's largest number and not below its smallest normal one (but 0: the runtime
    samples in float32, where a smaller one is 0 or a denormal whose logits / T overflow);
    ``top_p`` (nucleus probability mass; 1: off) in (0, 1]; ``top_k`` (tokens kept; 0: off) an
    integer in [0, 2**31 - 1]; ``seed`` an integer >= 0 with ``seed + seeds - 1`` within 64 bits.
    What a value means at temperature 0 (nothing) is the caller's business.

    Args:
        temperature, top_p, top_k, seed: the values to check, as given.
        names: how messages name each parameter (default: its keyword, e.g. ``{"top_p": "--top-p"}``
            for a command line); missing keys keep the keyword.
        explain: messages state each parameter's whole domain and its "off" value ("top_p must
            be a number in (0, 1] (1: off), got 0.0"), as ``swiftspec bench`` words them; False:
            the type first, then the range ("top_p must be in (0, 1], got 1.5"), as the runtime's
            own messages do.
        seeds: the request uses seeds ``seed`` ... ``seed + seeds - 1`` (``swiftspec bench``:
            one per prompt index), each of which must fit in 64 bits.
        seed_note: why (shown in the seed's range message), e.g. "request i of a data set
            samples with seed + i".
        error: the exception class raised (:class:`InvalidRequestError`; the bench passes its
            ``BenchConfigError``).

    Raises:
        error: one line naming the parameter (as ``names`` spells it) and the value given:
            temperature not a number, negative, NaN, infinite, beyond float32 or between 0 and
            float32's smallest normal number; top_p not a number or outside (0, 1]; top_k not an
            integer, negative or beyond 32 bits; seed not an integer, negative, or ``seed +
            seeds - 1`` beyond 64 bits.
    """
    names = {k: k for k in SAMPLING_DEFAULTS} | dict(names or {})
    t, p, k, s = names["temperature"], names["top_p"], names["top_k"], names["seed"]

    domain = f"{t} must be a finite number >= 0{' (0: greedy decoding)' if explain else ''}, got {temperature!r}"
    if not _number(temperature):
        raise error(domain if explain else f"{t} must be a number, got {temperature!r}")
    if not temperature >= 0 or temperature == float("inf"):  # NaN fails the first
        raise error(domain)
    if temperature > FLOAT32_MAX:
        raise error(f"{t} must be at most {FLOAT32_MAX:.4g} (the runtime samples in float32), got {temperature!r}")
    if 0 < temperature < FLOAT32_MIN_NORMAL:  # float32 reads it as 0 (greedy) or a denormal; logits / T overflow
        raise error(f"{t} must be 0 (greedy decoding) or at least {FLOAT32_MIN_NORMAL:.8g} (the runtime samples in "
                    f"float32), got {temperature!r}")
    if not _number(top_p) or not (0 < top_p <= 1):  # NaN fails
        if explain:
            raise error(f"{p} must be a number in (0, 1] (1: off), got {top_p!r}")
        if not _number(top_p):
            raise error(f"{p} must be a number, got {top_p!r}")
        raise error(f"{p} must be in (0, 1], got {top_p!r}")
    if not _integer(top_k) or top_k < 0:
        raise error(f"{k} must be an integer >= 0 (0: off), got {top_k!r}")
    if top_k > TOP_K_MAX:
        raise error(f"{k} must be at most {TOP_K_MAX} (a 32-bit count; any top-k of at least the vocabulary keeps "
                    f"every token), got {top_k}")
    if not _integer(seed) or seed < 0:
        raise error(f"{s} must be an integer >= 0, got {seed!r}")
    seed = int(seed)  # as a Python int: numpy's uint64 + an int wraps around or becomes a float
    seeds = max(1, int(seeds))
    if seed + seeds - 1 > SEED_MAX:
        note = f"{seed_note}, " if seed_note else ""
        raise error(f"{s} must be at most {SEED_MAX - seeds + 1} ({note}a 64-bit seed), got {seed}")
    return {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k), "seed": seed}


def check_unused_under_greedy(values: dict, given=None, *, names: dict[str, str] | None = None,
                              error: type[Exception] = InvalidRequestError) -> None:
    """Refuses top_p / top_k / seed set under greedy decoding (temperature 0), where they have no
    effect: a command line that samples only with a temperature (``swiftspec generate``,
    ``swiftspec bench``) must not run greedy decoding silently when given one of them alone.

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
    if values["temperature"] != 0:
        return
    names = {k: k for k in SAMPLING_DEFAULTS} | dict(names or {})
    if given is None:
        given = [k for k in ("top_p", "top_k", "seed") if values[k] != SAMPLING_DEFAULTS[k]]
    given = [k for k in ("top_p", "top_k", "seed") if k in given]
    if not given:
        return

    def show(k):
        return f"{names[k]} {values[k]}" if names[k].startswith("-") else f"{names[k]}={values[k]!r}"

    t = names["temperature"]
    raise error(f"{', '.join(show(k) for k in given)} {'has' if len(given) == 1 else 'have'} no effect under greedy "
                f"decoding ({t} 0); give {t} > 0 to sample, or drop {'it' if len(given) == 1 else 'them'}")
