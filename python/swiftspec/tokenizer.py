"""Tokenization for swiftspec checkpoints: ids, chat templates, streaming detokenization.

:class:`Tokenizer` wraps a Hugging Face ``tokenizers.Tokenizer`` (the checkpoint's
tokenizer.json) and tokenizer_config.json. Its chat templating follows HF transformers'
``apply_chat_template`` exactly: a sandboxed Jinja2 environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that does not escape HTML
(``json.dumps(ensure_ascii=False)``), ``raise_exception`` and ``strftime_now`` globals, and the
named special tokens (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``) passed to the
template as strings. Chat prompts are encoded without adding special tokens: the template
writes them.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from ._json_file import check_limits, limit, read_json, read_text
from .errors import CheckpointError, InvalidRequestError

_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")
# Names a message's reasoning may come under; like HF, the template sees it as both of the first two.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores a special token as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path, required: bool) -> dict:
    try:
        value = read_json(path, "JSON file")  # the runtime's limits: a FIFO, 1,000-deep nesting ...
    except FileNotFoundError:
        if required:
            raise CheckpointError(f"{path} does not exist") from None
        return {}
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def _eos_ids(value: Any, path: Path, vocab_size: int) -> list[int]:
    """The ``eos_token_id`` of ``path`` (absent or null: none) as a list; CheckpointError naming the
    file unless it is an id or a list of ids in [0, vocab_size): a bad one would only be noticed
    when a request stops on it."""
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    for e in ids:
        if not isinstance(e, int) or isinstance(e, bool):
            raise CheckpointError(
                f"{path}: eos_token_id must be an integer or a list of integers, got {json.dumps(value)}"
            )
        if not 0 <= e < vocab_size:
            raise CheckpointError(
                f"{path}: eos_token_id {e} is outside the vocabulary [0, {vocab_size}) (vocab_size of config.json)"
            )
    return list(ids)


@lru_cache(maxsize=16)
def _compile_template(template: str):
    """Compile a chat template in an environment equivalent to HF transformers' one."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


#: The roles every chat template takes; a template adds those it names (Qwen2.5's "tool", Llama 3.1's "ipython").
_STANDARD_ROLES = ("system", "user", "assistant")
_ROLE_COMPARED = re.compile(r"""\brole\s*['"]?\s*\]?\s*(?:==|!=)\s*(['"])([^'"]+)\1""")
_ROLE_COMPARED_REVERSED = re.compile(r"""(['"])([^'"]+)\1\s*(?:==|!=)\s*[\w.\[\]'"]*\brole\b""")
_ROLE_IN_LIST = re.compile(r"""\brole\s*['"]?\s*\]?\s+in\s*[\[(]([^\])]*)[\])]""")


@lru_cache(maxsize=16)
def _template_roles(template: str) -> tuple[str, ...]:
    """The message roles a chat template takes: the standard three and every role it compares a
    message's role with (``message.role == "tool"``, ``message['role'] in ['ipython', 'tool']``).
    A role outside them renders wrongly or not at all (Qwen2.5's template drops the message)."""
    found = [m.group(2) for m in _ROLE_COMPARED.finditer(template)]
    found += [m.group(2) for m in _ROLE_COMPARED_REVERSED.finditer(template)]
    for m in _ROLE_IN_LIST.finditer(template):
        found += re.findall(r"""['"]([^'"]+)['"]""", m.group(1))
    return _STANDARD_ROLES + tuple(sorted(set(found) - set(_STANDARD_ROLES)))


def _check_messages(messages: Any) -> list[dict]:
    """Validate chat messages; return copies as HF hands them to templates: None-valued keys
    dropped, reasoning text available as both ``reasoning_content`` and ``thinking``."""
    if not isinstance(messages, (list, tuple)):
        raise InvalidRequestError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise InvalidRequestError("messages is empty; a chat needs at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequestError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        if not isinstance(m.get("role"), str):
            raise InvalidRequestError(f"messages[{i}] needs a string 'role', got {m.get('role')!r}")
        if "content" not in m:
            raise InvalidRequestError(f"messages[{i}] has no 'content'; a message needs a string 'content'")
        if not isinstance(m.get("content"), str):
            raise InvalidRequestError(f"messages[{i}] needs a string 'content', got {type(m.get('content')).__name__}")
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING_FIELDS if k in m), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


class Tokenizer:
    """A checkpoint's tokenizer.

    Build it with :meth:`from_checkpoint`. Token ids are Python ints in ``[0, vocab_size)``
    (``vocab_size``: the tokenizer's tokens). A model's vocabulary may be padded beyond them
    (Qwen2.5: 151936 rows, 151665 tokens); :meth:`decode` takes ids up to ``model_vocab_size`` and
    renders the padding ids as nothing, as HF does, since a model can emit them.
    """

    def __init__(
        self,
        backend,
        config: dict,
        eos_token_ids: Sequence[int],
        source: str = "<memory>",
        model_vocab_size: int | None = None,
    ):
        self._tk = backend
        self.config = dict(config)
        self.source = source
        self.chat_template: str | None = (
            config.get("chat_template") if isinstance(config.get("chat_template"), str) else None
        )
        self.special_tokens = {k: t for k in _NAMED_SPECIAL if (t := _token_text(config.get(k))) is not None}
        ids = list(eos_token_ids)
        eos_text = self.special_tokens.get("eos_token")
        if eos_text is not None and self._tk.token_to_id(eos_text) is not None:
            ids.append(self._tk.token_to_id(eos_text))
        self._eos = list(dict.fromkeys(ids))
        self.vocab_size: int = self._tk.get_vocab_size(with_added_tokens=True)
        #: ids decode() takes: the model's vocabulary (config.json) when it is padded beyond the tokens
        self.model_vocab_size: int = max(self.vocab_size, model_vocab_size or 0)

    @classmethod
    def from_checkpoint(cls, folder: str | Path) -> "Tokenizer":
        """Load from a checkpoint folder: tokenizer.json (required), tokenizer_config.json,
        config.json and generation_config.json (for end-of-generation ids; optional).

        Raises :class:`CheckpointError` naming the file if tokenizer.json is missing or invalid, or
        if an ``eos_token_id`` (config.json, generation_config.json) or the eos_token of
        tokenizer_config.json is not an id in [0, vocab_size of config.json).
        """
        from tokenizers import Tokenizer as _Backend

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not os.path.lexists(path):
            raise CheckpointError(f"{path} does not exist")
        # Read under the runtime's limits (size, depth, regular file), then parsed from the text:
        # from_file would block on a FIFO swapped in after the check above.
        text = check_limits(read_text(path, "tokenizer file", limit("max_tokenizer_json_bytes")), path)
        try:
            backend = _Backend.from_str(text)
        except Exception as exc:
            raise CheckpointError(f"{path} is not a valid tokenizers file: {exc}") from None
        config = _read_json(folder / "tokenizer_config.json", required=False)
        model_config = _read_json(folder / "config.json", required=False)
        vocab = model_config.get("vocab_size")
        if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:  # (the model loader names it)
            vocab = backend.get_vocab_size(with_added_tokens=True)
        eos: list[int] = _eos_ids(model_config.get("eos_token_id"), folder / "config.json", vocab)
        eos += _eos_ids(
            _read_json(folder / "generation_config.json", required=False).get("eos_token_id"),
            folder / "generation_config.json",
            vocab,
        )
        tokenizer = cls(backend, config, eos, source=str(folder), model_vocab_size=vocab)
        bad = [e for e in tokenizer.eos_token_ids if e >= vocab]  # only tokenizer_config's eos_token is left
        if bad:
            raise CheckpointError(
                f"{folder / 'tokenizer_config.json'}: eos_token {tokenizer.special_tokens['eos_token']!r} is "
                f"token {bad[0]}, outside the vocabulary [0, {vocab}) (vocab_size of config.json)"
            )
        return tokenizer

    # ----------------------------------------------------------------- ids <-> text

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids that end generation, primary first (config.json, generation_config.json, then
        tokenizer_config's eos_token), without repeats."""
        return list(self._eos)

    @property
    def bos_token_id(self) -> int | None:
        """The id of ``bos_token``, or None."""
        text = self.special_tokens.get("bos_token")
        return self._tk.token_to_id(text) if text is not None else None

    def token_to_id(self, token: str) -> int | None:
        """The id of the vocabulary entry ``token`` (byte-level spelling for BPE), or None."""
        return self._tk.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of ``token_id``, or None."""
        return self._tk.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special-token text in ``text`` (e.g. ``<|im_end|>``) becomes
        that token, as in HF. ``add_special_tokens`` applies the tokenizer's post-processor
        (e.g. a BOS when ``add_bos_token``). Raises :class:`InvalidRequestError` if ``text`` is
        not a str."""
        if not isinstance(text, str):
            raise InvalidRequestError(f"text to encode must be a str, got {type(text).__name__}")
        # encode_batch, not encode: the tokenizers library's encode holds the GIL for the whole
        # text (a prompt of megabytes: seconds in which no other Python thread runs, e.g. the
        # server's event loop); encode_batch releases it and gives the same ids.
        return self._tk.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def _check_ids(self, ids: Any, limit: int | None = None) -> list[int]:
        limit = self.vocab_size if limit is None else limit
        if not isinstance(ids, (list, tuple)):
            try:
                ids = list(ids)
            except TypeError:
                raise InvalidRequestError(f"token ids must be a sequence of ints, got {type(ids).__name__}") from None
        out = []
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not hasattr(t, "__index__"):
                raise InvalidRequestError(f"token ids[{i}] is {t!r}, not an int")
            t = int(t)
            if not 0 <= t < limit:
                raise InvalidRequestError(f"token ids[{i}] is {t}, outside the vocabulary [0, {limit})")
            out.append(t)
        return out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of token ``ids``. Bytes that do not form complete UTF-8 become U+FFFD; ids of the
        model's padding rows (``vocab_size <= id < model_vocab_size``) become nothing.
        Raises :class:`InvalidRequestError` for non-int ids or ids outside ``[0, model_vocab_size)``."""
        return self._tk.decode(self._check_ids(ids, self.model_vocab_size), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------- chat

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render ``messages`` (``[{"role": str, "content": str}, ...]``) with the chat template.

        Same string as HF's ``apply_chat_template(messages, tokenize=False,
        add_generation_prompt=...)``. ``tools`` (JSON-schema dicts) and ``template_kwargs`` are
        passed to the template. Raises :class:`InvalidRequestError` for malformed messages (not a
        dict, no string 'role' or 'content', a role the template does not take: one of system,
        user, assistant or a role the template itself tests for, such as Qwen2.5's "tool"), a
        checkpoint without a chat template, or a template that rejects the conversation
        (``raise_exception``); :class:`CheckpointError` if the template itself does not compile.
        """
        import jinja2

        chat = _check_messages(messages)
        if self.chat_template is None:
            raise InvalidRequestError(f"the tokenizer of {self.source} has no chat_template")
        roles = _template_roles(self.chat_template)
        for i, m in enumerate(chat):
            if m["role"] not in roles:
                raise InvalidRequestError(
                    f"messages[{i}] has the role {m['role']!r}, which the chat template of "
                    f"{self.source} does not take (roles: {', '.join(roles)})"
                )
        try:
            template = _compile_template(self.chat_template)
        except jinja2.TemplateSyntaxError as exc:
            raise CheckpointError(f"chat_template of {self.source} does not compile: {exc}") from None
        variables = {**self.special_tokens, **template_kwargs}
        try:
            return template.render(
                messages=chat, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **variables
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"the chat template rejected the messages: {exc}") from None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        """Token ids of the rendered chat (:meth:`apply_chat_template`), no special tokens added."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs))

    def stream_decoder(self, skip_special_tokens: bool = False) -> "StreamDecoder":
        """A new :class:`StreamDecoder` over this tokenizer."""
        return StreamDecoder(self, skip_special_tokens)


class StreamDecoder:
    """Incremental detokenization for streaming output.

    Feed generated ids with :meth:`push`; each call returns the text that became final. Text is
    held back while the decoded tail ends in U+FFFD, i.e. while the last tokens hold an
    incomplete UTF-8 sequence (a multi-byte character split over tokens). :meth:`flush` returns
    whatever is left at the end (an incomplete sequence then appears as U+FFFD, as in
    :meth:`Tokenizer.decode`). The concatenation of everything returned equals
    ``tokenizer.decode(all_ids)``; at any time, :attr:`text` + :attr:`pending` equals it.

    Works by decoding a short window: the ids since the last emitted boundary, with the tokens
    before it as context (so decoders that strip a leading space see the same context). Each
    push decodes only that window, so the work per token does not grow with the output's length
    (a window grows only while its text keeps ending in U+FFFD, e.g. a run of invalid bytes).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # end of the text already emitted
        self._pieces: list[str] = []  # everything emitted, joined on demand (not per push: O(n) each)
        #: decoded text of the held-back ids (past :attr:`text`; "" or ending in U+FFFD): not final
        self.pending = ""

    @property
    def text(self) -> str:
        """All text emitted so far (str)."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def _delta(self, final: bool) -> str:
        done = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        full = self._tok.decode(self._ids[self._prefix :], self._skip)
        if not final and (len(full) <= len(done) or full.endswith("\ufffd")):
            self.pending = full[len(done) :]
            return ""
        delta = full[len(done) :]
        self._prefix, self._read = self._read, len(self._ids)
        self.pending = ""
        if delta:
            self._pieces.append(delta)
        return delta

    def push(self, ids: int | Sequence[int]) -> str:
        """Add one id or a sequence of ids; return the newly completed text (maybe "").
        Raises :class:`InvalidRequestError` for non-int ids or ids outside the model's vocabulary."""
        new: list = []
        try:
            new = list(ids)  # type: ignore[arg-type]  # (an int raises TypeError: handled below)
        except TypeError:  # a single id (int or numpy integer)
            new = [ids]
        self._ids.extend(self._tok._check_ids(new, self._tok.model_vocab_size))
        return self._delta(final=False)

    def flush(self) -> str:
        """Return all remaining text, complete or not."""
        return self._delta(final=True)
