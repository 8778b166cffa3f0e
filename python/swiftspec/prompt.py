"""A request's prompt as token ids: text, chat messages or ids (:func:`encode_prompt`)."""

from __future__ import annotations

import numbers
from typing import Sequence

from swiftspec.errors import InvalidRequestError


def check_text(what: str, text: str) -> None:
    """Text must encode to UTF-8 (lone surrogates, e.g. from undecodable bytes, do not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{what} is not valid text: {exc.reason} at position {exc.start} "
            "(decode bytes with the right encoding first)"
        ) from None


def encode_prompt(tokenizer, prompt) -> list[int]:
    """Token ids for a prompt: a string (encoded as is), a list of chat messages (``[{"role": ...,
    "content": ...}]``, rendered with the model's chat template and a generation prompt), or a list
    of token ids (each in the vocabulary). InvalidRequestError naming what is wrong otherwise."""
    if hasattr(prompt, "tolist") and not isinstance(prompt, (str, bytes)):  # a numpy array of token ids
        prompt = prompt.tolist()
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise InvalidRequestError(
            "prompt is bytes: decode it to text first (e.g. prompt.decode('utf-8')), or "
            "pass token ids as a list of ints"
        )
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt is an empty string; give non-empty text, chat messages or token ids")
        check_text("the prompt", prompt)
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, Sequence) and len(prompt) > 0 and all(isinstance(m, dict) for m in prompt):
        for i, m in enumerate(prompt):
            if isinstance(m.get("content"), str):
                check_text(f"the content of message {i}", m["content"])
        ids = tokenizer.encode_chat(list(prompt))
    elif (
        isinstance(prompt, Sequence)
        and len(prompt) > 0
        and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt)
    ):
        ids = [int(t) for t in prompt]
        vocab = tokenizer.vocab_size
        bad = [t for t in ids if t < 0 or t >= vocab]
        if bad:
            raise InvalidRequestError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
    else:
        raise InvalidRequestError(
            "prompt must be a non-empty string, a non-empty list of chat messages "
            f"(dicts with 'role' and 'content'), or a non-empty list of token ids; got {type(prompt).__name__}"
            + (" (empty)" if isinstance(prompt, (str, Sequence)) and len(prompt) == 0 else "")
        )
    if not ids:
        raise InvalidRequestError("the prompt encodes to zero tokens")
    return ids
