"""One request's Python side, around the runtime's ``Engine.generate`` (which checks the request,
serialises it with the engine's other requests and decodes it): its arguments converted to what
the binding takes, and :class:`RequestText`, which turns its tokens into text (stop strings,
``on_text``), polls its cancellation, and makes its :class:`~swiftspec.result.GenerationResult`.
"""

from __future__ import annotations

import numbers

from swiftspec.errors import InvalidRequestError
from swiftspec.prompt import check_text
from swiftspec.result import GenerationResult
from swiftspec.text_stream import TextStream

INT32_MAX = 2**31 - 1


def check_int(name: str, value, low: int, high: int = INT32_MAX) -> int:
    """``value`` as an int in [low, high]; InvalidRequestError naming ``name`` otherwise (a float,
    a bool or a string is refused rather than rounded: 1.5 threads or "64" tokens are mistakes)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}")
    value = int(value)  # numpy integers too
    if value > high:
        raise InvalidRequestError(f"{name} must be at most {high}, got {value}")
    if value < low:
        raise InvalidRequestError(f"{name} must be at least {low}, got {value}")
    return value


def int32_args(**values) -> dict:
    """Counts as the binding's int32 parameters take them (numpy integers too): beyond them the
    binding would refuse the call without naming the parameter. The runtime checks the
    meaningful ranges (max_new_tokens >= 1, ...)."""
    return {name: check_int(name, value, -INT32_MAX) for name, value in values.items()}


class RequestText:
    """The text of one request: its stop strings and ``on_text`` (checked when made), the
    runtime's token callback and cancellation check, and its result.

    Args:
        tokenizer: the engine's tokenizer.
        stop: a stop string, a list of them, or None.
        on_text: ``on_text(delta) -> bool | None`` or None; returning False cancels.
        cancel: an object with ``is_set()`` (a ``threading.Event``) or None.
        exiting: polled with ``cancel``: the interpreter's exit cancels too.
    """

    def __init__(self, tokenizer, stop, on_text, cancel, exiting) -> None:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise InvalidRequestError("stop must be a non-empty string or a list of non-empty strings")
        for s in stops:
            check_text("a stop string", s)
        if on_text is not None and not callable(on_text):  # else a TypeError once the prompt is prefilled
            raise InvalidRequestError(f"on_text must be callable or None, got {type(on_text).__name__}")
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):  # else an error mid-prefill
            raise InvalidRequestError(
                f"cancel must be a threading.Event (an object with is_set()) or None, got {type(cancel).__name__}"
            )
        self._stream = TextStream(tokenizer, stops)
        self._on_text, self._cancel, self._exiting = on_text, cancel, exiting
        self._cancelled_by_user = False

    def on_tokens(self, new_ids: list[int]) -> bool:
        """The runtime's token callback: False stops the request (a stop string, on_text's False)."""
        delta = self._stream.push(new_ids)
        if delta and self._on_text is not None and self._on_text(delta) is False:
            self._cancelled_by_user = True
            return False
        return not self._stream.stopped

    def cancelled(self) -> bool:
        """The runtime's cancellation check: polled between prefill chunks and decode steps, and while
        the request waits for its turn (Ctrl-C is polled by the runtime itself)."""
        return self._exiting() or (self._cancel is not None and bool(self._cancel.is_set()))

    def result(self, out: dict, prompt_ids: list[int]) -> GenerationResult:
        """The GenerationResult of the runtime's answer ``out``; the text's tail goes to on_text."""
        stats = dict(out["stats"])
        finish = stats["finish_reason"]
        if self._stream.stopped and not self._cancelled_by_user:
            finish = "stop"
        tail = self._stream.finish()
        if tail and self._on_text is not None and not self._cancelled_by_user:
            self._on_text(tail)
        return GenerationResult(
            text=self._stream.text,
            token_ids=list(out["tokens"]),
            prompt_token_ids=prompt_ids,
            finish_reason=finish,
            ttft_s=stats["prefill_time"],
            decode_s=stats["decode_time"],
            stats=stats,
            timeline=out.get("timeline"),
            report=out.get("report"),
        )
