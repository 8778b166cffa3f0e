"""The OpenAI chat-completions wire format as swiftspec serves it: a request body checked field
by field into a :class:`ChatRequest`, and the bodies of responses, stream chunks and errors.

Request fields (``POST /v1/chat/completions``, a JSON object; a field sent as ``null`` counts as
absent, as OpenAI's clients send nulls):

  messages      required, a non-empty list of ``{"role": str, "content": str}`` (no other keys:
                ``name``, ``tool_calls``, ... are refused, not dropped); ``content`` may
                also be a list of text parts ``[{"type": "text", "text": str}, ...]`` (joined);
                the role ``developer`` is taken as ``system``. Roles and contents are checked by
                the model's chat template (:meth:`swiftspec.tokenizer.Tokenizer.apply_chat_template`).
  model         optional; when given, the id the server serves (``GET /v1/models``).
  max_tokens    new tokens at most, an integer >= 1 (``max_completion_tokens`` is its newer name;
                both given must agree); prompt + max_tokens must fit the context. Default: 256, or
                the room the prompt leaves in the context when that is less.
  temperature   a number >= 0 (default 1.0, as OpenAI's; 0: greedy decoding).
  top_p         in (0, 1] (default 1); a value below 1 needs temperature > 0.
  seed          an integer in [0, 2**64) (default: a fresh random seed, reported back in the
                response's ``swiftspec.seed`` so a reply can be reproduced).
  stop          a non-empty string or a list of at most 16 of them, each at most 256 characters:
                the text ends before the first one.
  stream        true: Server-Sent Events, one ``data: {chunk}`` per text piece, ``data: [DONE]`` last.
  stream_options  ``{"include_usage": bool}``, with stream only: a last chunk with ``usage``.
  user          accepted and unused (OpenAI's end-user id for abuse reports).
  swiftspec     swiftspec's own settings: ``{"mode": "auto"|"target"|"serial"|"async", "tree_budget": int >= 1
                (speculative modes and auto: its largest tree), "top_k": int >= 0 (0: off; needs temperature > 0)}``.
  n, presence_penalty, frequency_penalty, logprobs, top_logprobs, logit_bias, tools,
  tool_choice, response_format, parallel_tool_calls: only their no-effect value (n 1, penalties 0,
                ...), which clients often send; any other value is refused as not supported.

Any other field is refused: a parameter swiftspec would ignore is an error, not a surprise. So is
a key given twice in one object (:func:`decode_body`: JSON decoders differ on which one wins), and
lists and objects nested deeper than :data:`MAX_JSON_DEPTH`.
Every refusal is a :class:`RequestError` naming the field (``param``) in OpenAI's error shape.
"""

from __future__ import annotations

import json
import numbers
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from swiftspec import swiftspec_core
from swiftspec.errors import InvalidRequestError
from swiftspec.sampling_params import SAMPLING_DEFAULTS, check_sampling_params, check_unused_under_greedy

#: The decode modes (the runtime's list, generation.h kDecodeModes).
MODES: tuple[str, ...] = tuple(swiftspec_core.DECODE_MODES)
DEFAULT_MAX_TOKENS = 256  # as `swiftspec generate --max-new-tokens`
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default: what its clients assume when they send none
#: What a request that leaves these fields out gets (GET /v1/models reports it; the chat page starts
#: its settings from it): max_tokens (at most what the context leaves), temperature, top_p.
API_DEFAULTS = {
    "max_tokens": DEFAULT_MAX_TOKENS,
    "temperature": DEFAULT_TEMPERATURE,
    "top_p": SAMPLING_DEFAULTS["top_p"],
}

# OpenAI fields swiftspec does not implement, with the values that ask for nothing (clients send
# them as defaults): accepted at those values, refused at any other.
_NO_EFFECT_VALUES: dict[str, tuple] = {
    "n": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none",),
    "response_format": ({"type": "text"},),
    "parallel_tool_calls": (False, True),  # without tools it means nothing either way
}
_FIELDS = {
    "messages",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "user",
    "swiftspec",
} | set(_NO_EFFECT_VALUES)
_SWIFTSPEC_FIELDS = ("mode", "tree_budget", "top_k")
_MESSAGE_FIELDS = ("role", "content")

#: Objects and lists inside one another at most this deep in a request body. A chat request is 4
#: deep (body, messages, message, content parts, part); far deeper nesting is an attack on the
#: recursive JSON decoder and on repr() in error messages (RecursionError).
MAX_JSON_DEPTH = 32
#: Stop strings per request and characters per stop string, at most. Every new token checks every
#: stop string against the text's tail (time ~ strings x length^2), so unbounded lists would let
#: one request slow the engine for everyone waiting; OpenAI itself takes 4 strings.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with OpenAI's error body naming ``param``."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class ChatRequest:
    """A checked request. ``max_tokens`` None: the default, fixed once the prompt's length is
    known; ``mode`` / ``tree_budget`` None: the server's defaults; ``seed`` is always set (random
    when not given) but only used when ``temperature`` > 0."""

    messages: list[dict]
    max_tokens: int | None = None
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    seed_given: bool = False
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    mode: str | None = None
    tree_budget: int | None = None


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list) -> dict:
    """json.loads' object hook: Python keeps the last of two equal keys, silently dropping the
    first value; a client sending both meant one of them, and the server cannot know which."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _depth(value) -> int:
    """How deep lists and objects nest in ``value`` (a scalar: 0); iterative, so no recursion limit."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if deepest > MAX_JSON_DEPTH:
                break
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def decode_body(raw: bytes) -> Any:
    """The JSON value of a request body (UTF-8, or UTF-16/32 as json.loads detects them).

    Raises:
        RequestError: 400 when ``raw`` is not JSON, has one key twice in an object (naming it), or
            nests objects and lists deeper than :data:`MAX_JSON_DEPTH`.
    """
    try:
        value = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as exc:
        raise RequestError(
            f"the request body has the key {exc.key!r:.80} twice in one object; give it once", exc.key[:80]
        ) from None
    except RecursionError:  # the decoder recurses per nesting level; the interpreter's limit is ~1000
        raise RequestError(f"the request body nests lists and objects deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise RequestError(f"the request body is not JSON: {exc}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise RequestError(f"the request body nests lists and objects deeper than {MAX_JSON_DEPTH} levels")
    return value


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _same(value, allowed) -> bool:
    """JSON equality: 1 and 1.0 are one number, but true is not 1."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    return value == allowed


def _messages(value) -> list[dict]:
    """The messages as the tokenizer takes them (text parts joined, ``developer`` as ``system``);
    the shape only: roles and contents are the chat template's to check."""
    if not isinstance(value, list) or not value:
        raise RequestError(
            'messages must be a non-empty list of {"role", "content"} objects, got '
            + ("an empty list" if value == [] else type(value).__name__),
            "messages",
        )
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise RequestError(
                f"messages[{i}] must be an object with 'role' and 'content', got {type(m).__name__}", "messages"
            )
        extra = sorted(k for k, v in m.items() if k not in _MESSAGE_FIELDS and v is not None)
        if extra:  # e.g. OpenAI's "name" or "tool_calls": the chat template would drop or misuse them
            raise RequestError(
                f"messages[{i}].{extra[0]:.80} is not supported by this server (a message takes "
                f"{' and '.join(_MESSAGE_FIELDS)})",
                "messages",
            )
        m = {k: v for k, v in m.items() if k in _MESSAGE_FIELDS}
        if m.get("role") == "developer":  # OpenAI's newer name for the system message
            m["role"] = "system"
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(
                        f'messages[{i}].content[{j}] must be a text part {{"type": "text", '
                        f'"text": str}} (this server takes text only), got {part!r:.80}',
                        "messages",
                    )
                texts.append(part["text"])
            m["content"] = "".join(texts)
        if isinstance(m.get("content"), str):
            try:
                m["content"].encode("utf-8")
            except UnicodeEncodeError as exc:  # a lone surrogate (JSON's "\\ud800"): not text the tokenizer takes
                raise RequestError(
                    f"messages[{i}].content is not valid text: {exc.reason} at position {exc.start}", "messages"
                ) from None
        out.append(m)
    return out


def _sampling(body: dict) -> dict:
    """temperature, top_p, swiftspec.top_k and seed, each checked by the package's validator and
    named as the request spells it; top_p / top_k that would have no effect under greedy decoding
    are refused as `swiftspec generate` refuses them."""
    ext = body.get("swiftspec") or {}
    given = {
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "top_k": ext.get("top_k"),
        "seed": body.get("seed"),
    }
    names = {"temperature": "temperature", "top_p": "top_p", "top_k": "swiftspec.top_k", "seed": "seed"}
    values = dict(SAMPLING_DEFAULTS, temperature=DEFAULT_TEMPERATURE)
    for key, value in given.items():
        if value is None:
            continue
        one = dict(SAMPLING_DEFAULTS, **{key: value})  # one at a time: the error then names its field
        try:
            values[key] = check_sampling_params(**one, names=names)[key]
        except InvalidRequestError as exc:
            raise RequestError(str(exc), names[key]) from None
    # A seed asks for a reproducible reply, which greedy decoding gives anyway: it is not refused.
    unused = [k for k in ("top_p", "top_k") if given[k] is not None and values[k] != SAMPLING_DEFAULTS[k]]
    try:
        check_unused_under_greedy(values, unused, names=names)
    except InvalidRequestError as exc:
        raise RequestError(str(exc), names[unused[0]]) from None
    return values


def parse_chat_request(body: Any, model_id: str) -> ChatRequest:
    """Checks a decoded JSON body (see the module docstring for the fields).

    Args:
        body: the JSON value the client sent.
        model_id: the id this server serves; a ``model`` field must equal it.

    Raises:
        RequestError: status 400, naming the first field that is wrong (``param``): a missing or
            malformed field, an unknown one, a value out of range, a not supported OpenAI option.
    """
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}; this server takes: {', '.join(sorted(_FIELDS))}", unknown[0])
    body = {k: v for k, v in body.items() if v is not None}
    for name, allowed in _NO_EFFECT_VALUES.items():
        if name in body and not any(_same(body[name], a) for a in allowed):
            raise RequestError(
                f"{name}={body[name]!r:.80} is not supported by this server (it takes only "
                f"{' or '.join(repr(a) for a in allowed)})",
                name,
            )
    if "messages" not in body:
        raise RequestError(
            'messages is missing: give the conversation as [{"role": "user", "content": ...}]', "messages"
        )
    req = ChatRequest(messages=_messages(body["messages"]))

    if "model" in body and body["model"] != model_id:
        raise RequestError(
            f"model {body['model']!r:.80} is not served here; this server serves {model_id!r}",
            "model",
            code="model_not_found",
        )
    if "user" in body and not isinstance(body["user"], str):
        raise RequestError(f"user must be a string, got {type(body['user']).__name__}", "user")

    for name in ("max_tokens", "max_completion_tokens"):
        if name in body:
            value = body[name]
            if not _is_int(value) or value < 1:
                raise RequestError(f"{name} must be an integer >= 1, got {value!r:.80}", name)
            if req.max_tokens is not None and value != req.max_tokens:
                raise RequestError(
                    f"max_tokens ({req.max_tokens}) and max_completion_tokens ({value}) differ; give one", name
                )
            req.max_tokens = int(value)

    ext = body.get("swiftspec", {})
    if not isinstance(ext, dict):
        raise RequestError(
            f"swiftspec must be an object with {', '.join(_SWIFTSPEC_FIELDS)}, got {type(ext).__name__}", "swiftspec"
        )
    ext = {k: v for k, v in ext.items() if v is not None}
    body["swiftspec"] = ext
    bad = sorted(set(ext) - set(_SWIFTSPEC_FIELDS))
    if bad:
        raise RequestError(
            f"unknown field swiftspec.{bad[0]}; swiftspec takes: {', '.join(_SWIFTSPEC_FIELDS)}", f"swiftspec.{bad[0]}"
        )
    if "mode" in ext:
        if ext["mode"] not in MODES:
            raise RequestError(
                f"swiftspec.mode must be one of {', '.join(MODES)}, got {ext['mode']!r:.80}", "swiftspec.mode"
            )
        req.mode = ext["mode"]
    if "tree_budget" in ext:
        if not _is_int(ext["tree_budget"]) or ext["tree_budget"] < 1:
            raise RequestError(
                f"swiftspec.tree_budget must be an integer >= 1, got {ext['tree_budget']!r:.80}",
                "swiftspec.tree_budget",
            )
        req.tree_budget = int(ext["tree_budget"])

    values = _sampling(body)
    req.temperature, req.top_p, req.top_k = values["temperature"], values["top_p"], values["top_k"]
    req.seed_given = "seed" in body
    req.seed = values["seed"] if req.seed_given else secrets.randbelow(2**31)

    if "stop" in body:
        stop = body["stop"]
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise RequestError(
                f"stop must be a non-empty string or a list of non-empty strings, got {stop!r:.80}", "stop"
            )
        if len(stops) > MAX_STOP_STRINGS:
            raise RequestError(f"stop has {len(stops)} strings; this server takes at most {MAX_STOP_STRINGS}", "stop")
        for j, s in enumerate(stops):
            if len(s) > MAX_STOP_CHARS:
                raise RequestError(
                    f"stop[{j}] has {len(s)} characters; this server takes at most {MAX_STOP_CHARS} per stop string",
                    "stop",
                )
            try:
                s.encode("utf-8")
            except UnicodeEncodeError as exc:  # a lone surrogate (JSON's "\\ud800"): no text can match it
                raise RequestError(
                    f"stop[{j}] is not valid text: {exc.reason} at position {exc.start}", "stop"
                ) from None
        req.stop = list(stops)

    if "stream" in body:
        if not isinstance(body["stream"], bool):
            raise RequestError(f"stream must be true or false, got {body['stream']!r:.80}", "stream")
        req.stream = body["stream"]
    if "stream_options" in body:
        opts = body["stream_options"]
        if not req.stream:
            raise RequestError("stream_options applies to stream=true only", "stream_options")
        if (
            not isinstance(opts, dict)
            or set(opts) - {"include_usage"}
            or not isinstance(opts.get("include_usage", False), bool)
        ):
            raise RequestError(
                f'stream_options must be {{"include_usage": true|false}}, got {opts!r:.80}', "stream_options"
            )
        req.include_usage = opts.get("include_usage", False)
    return req


# ------------------------------------------------------------------------------ responses
def new_completion_id() -> tuple[str, int]:
    """A response id (``chatcmpl-`` + 24 hex digits) and its creation time (Unix seconds)."""
    return f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())


def usage(result) -> dict:
    """OpenAI's ``usage``: prompt tokens, new tokens (all decoded, also those past a stop string or
    an EOS token that ended the reply), their sum."""
    prompt, completion = len(result.prompt_token_ids), len(result.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def swiftspec_stats(result, *, mode: str, tree_budget: int | None, seed: int | None, queue_s: float) -> dict:
    """What the engine reports about a reply (times in seconds, rates per second):

    mode, tree_budget (speculative modes; else null), seed (sampled replies; else null),
    queue_s (waiting for the engine behind other requests), ttft_s (prefill + first token),
    decode_s (first to last token), tokens_per_s (tokens after the first / decode_s), tpot_s,
    acceptance_length (mean tokens committed per target verification; null when no draft
    proposed tokens), verification_steps, draft_steps.
    """
    s = result.stats
    speculative = s.get("draft_steps", 0) > 0
    return {
        "mode": mode,
        "tree_budget": tree_budget,
        "seed": seed,
        "queue_s": queue_s,
        "ttft_s": result.ttft_s,
        "decode_s": result.decode_s,
        "tokens_per_s": result.tokens_per_s,
        "tpot_s": result.tpot_s,
        "acceptance_length": result.acceptance_length if speculative else None,
        "verification_steps": int(s.get("verification_steps", 0)),
        "draft_steps": int(s.get("draft_steps", 0)),
    }


def completion_body(cid: str, created: int, model: str, result, stats: dict) -> dict:
    """A whole (non-streamed) ``chat.completion``."""
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": None,
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": usage(result),
        "swiftspec": stats,
    }


def chunk_body(
    cid: str, created: int, model: str, delta: dict | None, finish_reason: str | None = None, **extra
) -> dict:
    """One ``chat.completion.chunk``; ``delta`` None: a chunk without choices (the usage chunk)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
        **extra,
    }
