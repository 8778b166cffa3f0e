"""The Python face of the engine: load a target (and optionally a draft) model,
tokenize, apply chat templates, and drive generation in the C++ runtime.

Decoding itself (target-only, serial speculation, asynchronous speculation)
runs in C++ with the GIL released; this module turns text into token ids and
back, handles stop strings and streaming, and reports timing.
"""

from __future__ import annotations

import atexit
import numbers
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from swiftspec.errors import CheckpointError, InvalidRequestError
from swiftspec.models import resolve_checkpoint
from swiftspec.sampling_params import (FLOAT32_MIN_NORMAL, SAMPLING_DEFAULTS, check_sampling_params,
                                       check_unused_under_greedy)
from swiftspec.text_stream import TextStream
from swiftspec.tokenizer import Tokenizer

_MODES = ("target", "serial", "async")
_ASYNC_OPTIONS = frozenset({"expand_width", "growth_depth", "min_send_nodes", "cost_aware_send", "min_expand_prob",
                            "record_timeline"})
_INT32_MAX = 2**31 - 1

# Requests inside the runtime (the GIL released) on any thread, and the interpreter's exit. A thread
# still inside the runtime when the interpreter finalizes (a stream() left unfinished: its worker is
# a daemon thread) is killed by Python when its next callback takes the GIL, in the middle of the
# C++ frames, which aborts the process ("terminate called without an active exception"). So at exit
# every running request is cancelled (its cancel check sees _exiting) and waited for: it returns
# within one prefill chunk or decode step.
_exiting = threading.Event()
_running = 0
_running_changed = threading.Condition()
_EXIT_WAIT_S = 10.0
_WAIT_POLL_S = 0.02  # how often a request waiting for its engine polls its cancel (as the async host does)



def _cancel_requests_at_exit() -> None:
    _exiting.set()
    with _running_changed:
        _running_changed.wait_for(lambda: _running <= 0, timeout=_EXIT_WAIT_S)


def _forget_requests_in_child() -> None:
    """A fork()ed child has none of its parent's other threads, hence none of their requests."""
    global _running, _running_changed
    _running = 0
    _running_changed = threading.Condition()


atexit.register(_cancel_requests_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_requests_in_child)


def _check_int(name: str, value, low: int, high: int = _INT32_MAX) -> int:
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


def _check_text(what: str, text: str) -> None:
    """Text must encode to UTF-8 (lone surrogates, e.g. from undecodable bytes, do not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"{what} is not valid text: {exc.reason} at position {exc.start} "
                                  "(decode bytes with the right encoding first)") from None


@dataclass
class GenerationResult:
    """The outcome of one request.

    Attributes:
        text: the generated text (special tokens and any stop string removed).
        token_ids: the generated token ids (prompt excluded; an EOS token that
            ended generation is included).
        prompt_token_ids: the token ids the model was prompted with.
        finish_reason: "length" (max_new_tokens), "stop" (EOS or a stop
            string) or "cancelled".
        ttft_s: time to first token, seconds (prefill + first sample).
        decode_s: seconds from the first to the last new token.
        tokens_per_s: new tokens after the first, divided by decode_s.
        tpot_s: time per output token after the first, seconds.
        stats: the runtime's counters (verification_steps, draft_steps,
            acceptance_length, target_time, draft_time, ...).
        timeline: async mode only: the per-round timeline of the draft and
            target groups (``swiftspec_core.Timeline``: ``summary()``,
            ``save_chrome_trace(path)``); None otherwise.
    """

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    ttft_s: float
    decode_s: float
    stats: dict = field(default_factory=dict)
    timeline: object = None

    @property
    def tokens_per_s(self) -> float:
        n = len(self.token_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def tpot_s(self) -> float:
        n = len(self.token_ids) - 1
        return self.decode_s / n if n > 0 else 0.0

    @property
    def acceptance_length(self) -> float:
        return float(self.stats.get("acceptance_length", 0.0))


class Engine:
    """A target model, an optional draft model, and their tokenizer.

    Args:
        target: a converted checkpoint folder, a GGUF file (converted on first
            use into the cache), or a reference model name (see
            ``swiftspec.fetch.REFERENCE_MODELS``).
        draft: the same kinds of value, or None for target-only decoding. The
            draft must share the target's vocabulary.
        backend: "cpu" or "cuda" (CUDA builds only).
        dtype: weight dtype used when a GGUF file or reference name must be
            converted: "bfloat16" (default), "float32" or "int4" (the linear
            projections in 4 bits, group size 128; the cpu backend only). A
            checkpoint folder is used as it is, whatever its dtype.
        max_context: KV capacity in tokens (prompt + new tokens), per model; at
            most the model's ``max_position_embeddings`` (config.json). None:
            4096, or that limit when a model's is smaller.
        max_tree: tree KV capacity in nodes (>= the largest tree budget used).
        num_threads: CPU threads per model (0: all cores).
        placement: where the draft group and the target group run and their
            tensor-parallel degrees ("auto", a dict, JSON text or a .json
            path; see ``swiftspec.placement``). None: both models use
            ``num_threads`` unpinned threads, TP 1.

    Raises:
        CheckpointError: a path is missing or not a valid model, naming it.
        InvalidRequestError: an option is out of range, naming it (a max_context
            beyond a model's max_position_embeddings names both numbers); dtype
            "int4" with a backend other than "cpu" (before anything is converted
            or loaded).
    """

    def __init__(
        self,
        target: str | Path,
        draft: str | Path | None = None,
        *,
        backend: str = "cpu",
        dtype: str = "bfloat16",
        max_context: int | None = None,
        max_tree: int = 256,
        num_threads: int = 0,
        placement=None,
    ):
        from swiftspec import swiftspec_core as core

        # 0 asks the runtime for each model's default (4096, or its max_position_embeddings if smaller).
        max_context = 0 if max_context is None else _check_int("max_context", max_context, 1)
        max_tree = _check_int("max_tree", max_tree, 1)
        # Threads beyond a few per core only cost memory; far beyond, the system refuses them.
        num_threads = _check_int("num_threads", num_threads, 0, max(256, 8 * (os.cpu_count() or 1)))
        if dtype == "int4" and backend != "cpu":  # before a conversion (minutes) that the backend would refuse
            raise InvalidRequestError(f"dtype='int4' runs on the cpu backend only; the {backend} backend has no int4 "
                                      "kernels: use backend='cpu', or dtype='bfloat16'")
        self.target_dir = resolve_checkpoint(target, dtype=dtype)
        self.draft_dir = resolve_checkpoint(draft, dtype=dtype) if draft is not None else None
        self.tokenizer = Tokenizer.from_checkpoint(self.target_dir)
        if self.draft_dir is not None:
            draft_tok = Tokenizer.from_checkpoint(self.draft_dir)
            if draft_tok.vocab_size != self.tokenizer.vocab_size:
                raise CheckpointError(
                    f"{self.draft_dir}: the draft tokenizer has {draft_tok.vocab_size} tokens, the target's "
                    f"({self.target_dir}) has {self.tokenizer.vocab_size}; speculative decoding needs one tokenizer"
                )
        options = core.ModelOptions()
        options.max_context = max_context
        options.max_tree = max_tree
        options.num_threads = num_threads
        self.placement = None
        try:
            if placement is not None:
                from swiftspec.placement import load_models, normalize

                self.placement = normalize(placement)
                self._target, self._draft = load_models(self.target_dir, self.draft_dir, self.placement,
                                                        backend=backend, max_context=max_context, max_tree=max_tree,
                                                        num_threads=num_threads)
            else:
                self._target = core.load_model(str(self.target_dir), backend, options)
                self._draft = core.load_model(str(self.draft_dir), backend, options) if self.draft_dir else None
        except MemoryError:
            raise InvalidRequestError(
                f"not enough memory to load the model(s) with max_context={max_context or 'default'}, "
                f"max_tree={max_tree}: the KV cache is allocated for all of it at load time; lower them") from None
        self._engine = core.Engine(self._target, self._draft)
        self.backend = backend
        self._pid = os.getpid()  # the process the models' worker threads run in (see _check_open)
        # An RLock for its _is_owned() (see generate); a request never takes it twice (re-entry is refused).
        self._lock = threading.RLock()
        self._request_thread: int | None = None  # the thread running a request, while one runs

    @classmethod
    def from_pretrained(cls, target: str | Path | None = None, draft: str | Path | None = None, **kwargs) -> "Engine":
        """The reference pair (Qwen2.5-Coder 1.5B target, 0.5B draft) unless
        ``target``/``draft`` are given; fetched and converted on first use."""
        from swiftspec.fetch import DEFAULT_PAIR

        if target is None:
            target = DEFAULT_PAIR["target"]
            if draft is None:
                draft = DEFAULT_PAIR["draft"]
        return cls(target, draft, **kwargs)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Releases the models (weights, KV caches, worker threads) now rather than at garbage
        collection; waits for a running request to finish. Later calls raise InvalidRequestError.
        Idempotent; ``with Engine(...) as engine:`` closes at the end of the block.

        Raises:
            InvalidRequestError: called from a callback (``on_text``, a signal handler) of a request
                running on this engine, on that request's thread: it would wait for itself.
        """
        if self._forked():  # the parent's lock and request are not this process's: they could hold it for ever
            self._lock, self._request_thread = threading.RLock(), None
        if getattr(self, "_request_thread", None) == threading.get_ident():
            raise InvalidRequestError("close() was called from a callback of a request running on this engine (it "
                                      "would wait for itself); close the engine after that request returns")
        with self._lock:
            # _closed first: a reader outside the lock that snapshots the models and then finds the
            # engine open (_open_models) has snapshots taken before any of them was released.
            self._closed = True
            self._engine = self._target = self._draft = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _forked(self) -> bool:
        """Whether this process is a fork() of the one that made the engine."""
        return getattr(self, "_pid", None) not in (None, os.getpid())

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise InvalidRequestError("the engine is closed")
        if self._forked():  # (the runtime refuses too; here also before the lock a parent's request may hold)
            raise InvalidRequestError(
                f"this engine was made in process {self._pid}, and this process ({os.getpid()}) is a fork() of it: the "
                "models' worker threads did not survive the fork, so it cannot run here; make the engine in this "
                "process (multiprocessing: the 'spawn' or 'forkserver' start method, or make the engine in each "
                "worker)")

    def _open_models(self):
        """(target, draft) of an open engine, read together: close() on another thread may release
        them at any moment, so they are read first and the engine checked open after (close() marks
        it closed before it releases them). InvalidRequestError once the engine is closed."""
        target, draft = self._target, self._draft
        self._check_open()
        return target, draft

    @property
    def has_draft(self) -> bool:
        return self._open_models()[1] is not None

    @property
    def target_model(self):
        """The C++ target model (``swiftspec_core.Model``)."""
        return self._target

    @property
    def draft_model(self):
        """The C++ draft model, or None."""
        return self._draft

    # ------------------------------------------------------------------ prompts
    def encode_prompt(self, prompt) -> list[int]:
        """Token ids for a prompt: a string (encoded as is), a list of chat
        messages (``[{"role": ..., "content": ...}]``, rendered with the model's
        chat template and a generation prompt), or a list of token ids."""
        if hasattr(prompt, "tolist") and not isinstance(prompt, (str, bytes)):  # a numpy array of token ids
            prompt = prompt.tolist()
        if isinstance(prompt, (bytes, bytearray, memoryview)):
            raise InvalidRequestError("prompt is bytes: decode it to text first (e.g. prompt.decode('utf-8')), or "
                                      "pass token ids as a list of ints")
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is an empty string; give non-empty text, chat messages or token ids")
            _check_text("the prompt", prompt)
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, Sequence) and len(prompt) > 0 and all(isinstance(m, dict) for m in prompt):
            for i, m in enumerate(prompt):
                if isinstance(m.get("content"), str):
                    _check_text(f"the content of message {i}", m["content"])
            ids = self.tokenizer.encode_chat(list(prompt))
        elif isinstance(prompt, Sequence) and len(prompt) > 0 and all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt
        ):
            ids = [int(t) for t in prompt]
            vocab = self.tokenizer.vocab_size
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

    # --------------------------------------------------------------- generation
    def generate(
        self,
        prompt,
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        stop: Sequence[str] | str | None = None,
        mode: str | None = None,
        tree_budget: int = 16,
        max_depth: int = 8,
        branching: int = 2,
        on_text=None,
        async_options: dict | None = None,
        cancel: threading.Event | None = None,
    ) -> GenerationResult:
        """Generates a continuation of ``prompt`` (text, chat messages or token ids).

        Greedy when ``temperature`` is 0; otherwise samples with top-k / top-p
        under ``seed``. ``mode`` is "target" (plain decoding), "serial" or
        "async" (speculative; need a draft); by default "serial" with a draft,
        "target" without. Speculative modes return the target model's own
        output (greedy: token for token; sampling: the same distribution).
        Generation ends at max_new_tokens, an EOS token, or a ``stop`` string
        (the text is cut before it). ``on_text(delta: str) -> bool | None`` is
        called with new text as it is final; returning False cancels.
        ``async_options`` (async mode): growth_depth, min_send_nodes,
        expand_width, min_expand_prob, record_timeline (swiftspec_core.generate_async).

        ``cancel`` (a ``threading.Event``, or any object with ``is_set()``)
        cancels from another thread: once it is set, the request stops within
        one prefill chunk or decode step, also during a long prompt's prefill
        where no text reaches ``on_text`` (one waiting for its turn behind
        another request returns at once, without waiting), and returns what it
        has with finish_reason "cancelled" (set before the call: no new tokens).

        Ctrl-C (SIGINT, when called from the main thread) stops the request
        within about one prefill chunk or decode step, also during a long
        prompt's prefill (processed in chunks of the backend's size: 64 tokens
        on the CPU, with the same result as one pass), and raises
        KeyboardInterrupt; the engine stays usable.

        Raises:
            InvalidRequestError: bad prompt or parameter (named in the message; the
                sampling parameters' ranges: :func:`swiftspec.sampling_params.check_sampling_params`;
                top_p or top_k with temperature 0, where they would have no effect;
                chat messages: :meth:`swiftspec.tokenizer.Tokenizer.apply_chat_template`, e.g. a
                message without string 'content' or with a role the model's chat template does not
                take, named by its index), or a prompt plus max_new_tokens longer than the context.
            KeyboardInterrupt: Ctrl-C during the request.
        """
        # The models as of now; close() on another thread may release the engine's meanwhile (this
        # request then stops with "the engine is closed" once it has the lock, below).
        target, draft = self._open_models()
        if mode is None:
            mode = "serial" if draft is not None else "target"
        if mode not in _MODES:
            raise InvalidRequestError(f"mode must be one of {', '.join(_MODES)}; got {mode!r}")
        if mode != "target" and draft is None:
            raise InvalidRequestError(f"mode {mode!r} needs a draft model; this engine has none")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise InvalidRequestError("stop must be a non-empty string or a list of non-empty strings")
        for s_ in stops:
            _check_text("a stop string", s_)
        if on_text is not None and not callable(on_text):  # else a TypeError once the prompt is prefilled
            raise InvalidRequestError(f"on_text must be callable or None, got {type(on_text).__name__}")
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):  # else an error mid-prefill
            raise InvalidRequestError(f"cancel must be a threading.Event (an object with is_set()) or None, got "
                                      f"{type(cancel).__name__}")
        # Ranges the runtime can hold (int32 counts, a uint64 seed): beyond them the binding
        # would refuse the call without naming the parameter. The runtime checks the
        # meaningful ranges again (max_new_tokens >= 1, ...).
        max_new_tokens = _check_int("max_new_tokens", max_new_tokens, -_INT32_MAX)
        tree_budget = _check_int("tree_budget", tree_budget, -_INT32_MAX)
        max_depth = _check_int("max_depth", max_depth, -_INT32_MAX)
        branching = _check_int("branching", branching, -_INT32_MAX)
        # The sampling parameters as swiftspec bench checks them (numpy numbers too).
        sampling = check_sampling_params(temperature, top_p, top_k, seed)
        # top_p / top_k under greedy decoding would be ignored silently (as the CLI and the server
        # refuse them); a seed is harmless there (greedy output is reproducible anyway).
        check_unused_under_greedy(sampling, [k for k in ("top_p", "top_k") if sampling[k] != SAMPLING_DEFAULTS[k]])
        temperature, top_p, top_k, seed = (sampling[k] for k in ("temperature", "top_p", "top_k", "seed"))
        # The runtime samples in float32: a top_p below its smallest normal number keeps the same
        # nucleus (the most likely token alone) at that smallest number.
        if 0.0 < top_p < FLOAT32_MIN_NORMAL:
            top_p = FLOAT32_MIN_NORMAL
        if async_options is not None:
            if mode != "async":
                raise InvalidRequestError(f"async_options apply to mode='async' only (mode is {mode!r})")
            if not isinstance(async_options, dict):
                raise InvalidRequestError(f"async_options must be a dict, got {type(async_options).__name__}")
            unknown = sorted(set(async_options) - _ASYNC_OPTIONS)
            if unknown:
                raise InvalidRequestError(f"async_options: unknown option(s) {', '.join(map(repr, unknown))}; known: "
                                          f"{', '.join(sorted(_ASYNC_OPTIONS))}")
        if self._request_thread == threading.get_ident():
            raise InvalidRequestError("generate() was called from a callback of a request running on this engine "
                                      "(it would wait for itself); call it after that request returns")
        if tree_budget > target.max_tree:
            raise InvalidRequestError(
                f"tree_budget {tree_budget} exceeds the engine's tree KV capacity max_tree={target.max_tree}"
            )

        prompt_ids = self.encode_prompt(prompt)
        text_stream = TextStream(self.tokenizer, stops)
        cancelled_by_user = False

        def on_tokens(new_ids: list[int]) -> bool:
            nonlocal cancelled_by_user
            delta = text_stream.push(new_ids)
            if delta and on_text is not None and on_text(delta) is False:
                cancelled_by_user = True
                return False
            return not text_stream.stopped

        def cancel_check() -> bool:  # polled by the runtime between prefill chunks and decode steps
            return _exiting.is_set() or (cancel is not None and bool(cancel.is_set()))

        global _running
        with _running_changed:  # counted while it waits for the engine too: see _cancel_requests_at_exit
            _running += 1
        try:
            # One request at a time per engine. While this one waits for its turn, its cancel (and the
            # interpreter's exit) is polled too: once set it returns at once with no tokens, rather
            # than when the running request ends (minutes, for a long one).
            t_wait = time.perf_counter()
            try:
                acquired = self._lock.acquire(blocking=False)
                while not acquired and not cancel_check():
                    acquired = self._lock.acquire(timeout=_WAIT_POLL_S)
            except BaseException:  # Ctrl-C, or a cancel that raised: also if it came just after the lock was taken
                if self._lock._is_owned():
                    self._lock.release()
                raise
            if not acquired:
                from swiftspec import swiftspec_core as core

                out = {"tokens": [], "stats": core.cancelled_stats(len(prompt_ids))}
                wall = time.perf_counter() - t_wait
            else:
                try:
                    self._check_open()  # closed while this request waited for the lock
                    self._request_thread = threading.get_ident()
                    try:
                        t0 = time.perf_counter()
                        request = dict(
                            max_new_tokens=max_new_tokens,
                            temperature=float(temperature),
                            top_k=top_k,
                            top_p=float(top_p),
                            seed=seed,
                            stop_token_ids=self.tokenizer.eos_token_ids,
                            tree_budget=tree_budget,
                            max_depth=max_depth,
                            branching=branching,
                            on_tokens=on_tokens,
                            # Ctrl-C is polled by the runtime itself; a stream() closed early sets cancel,
                            # the interpreter's exit _exiting.
                            cancel_check=cancel_check,
                        )
                        if mode == "async":  # parallel tree generation, with its timeline
                            from swiftspec import swiftspec_core as core

                            out = core.generate_async(self._engine, prompt_ids, **request, **(async_options or {}))
                        else:
                            out = self._engine.generate(prompt_ids, mode=mode, **request)
                        wall = time.perf_counter() - t0
                    finally:
                        self._request_thread = None
                finally:
                    self._lock.release()
        finally:
            with _running_changed:
                _running -= 1
                _running_changed.notify_all()
        stats = dict(out["stats"])
        stats["wall_time"] = wall
        finish = stats["finish_reason"]
        if text_stream.stopped and not cancelled_by_user:
            finish = "stop"
        tail = text_stream.finish()
        if tail and on_text is not None and not cancelled_by_user:
            on_text(tail)
        return GenerationResult(
            text=text_stream.text,
            token_ids=list(out["tokens"]),
            prompt_token_ids=prompt_ids,
            finish_reason=finish,
            ttft_s=stats["prefill_time"],
            decode_s=stats["decode_time"],
            stats=stats,
            timeline=out.get("timeline"),
        )

    def stream(self, prompt, **kwargs) -> Iterator[str]:
        """Like :meth:`generate`, but yields text pieces as they are final.
        Closing the iterator early (or Ctrl-C while waiting for a piece) cancels
        the request, also during the prompt's prefill; so does the interpreter's
        exit with the stream unfinished (the request runs on a daemon thread)."""
        if "on_text" in kwargs:
            raise InvalidRequestError("stream() yields the text itself; do not pass on_text")
        if "cancel" in kwargs:
            raise InvalidRequestError("stream() is cancelled by closing the iterator (close() or leaving the loop); "
                                      "do not pass cancel")
        # (Checked when the stream starts, at its first piece: a generator's body runs then.) Its request
        # runs on a thread of its own: from a callback of a request on this engine it would wait for that
        # request, which waits for its pieces: both hung for ever.
        if getattr(self, "_request_thread", None) == threading.get_ident():
            raise InvalidRequestError("stream() was started from a callback of a request running on this engine (it "
                                      "would wait for that request, which waits for it); start it after that request "
                                      "returns")
        pieces: queue.Queue = queue.Queue()
        cancel = threading.Event()
        done = object()
        error: list[BaseException] = []

        def on_text(delta: str):
            pieces.put(delta)
            return not cancel.is_set()

        def run():
            try:
                self.generate(prompt, on_text=on_text, cancel=cancel, **kwargs)
            except BaseException as exc:  # surfaced in the consumer's thread
                error.append(exc)
            finally:
                pieces.put(done)

        worker = threading.Thread(target=run, name="swiftspec-stream", daemon=True)
        worker.start()
        try:
            while True:
                item = pieces.get()
                if item is done:
                    break
                yield item
            if error:
                raise error[0]
        finally:
            cancel.set()
            # An abandoned stream may be collected (cyclic GC) on its own worker thread, inside a
            # callback: that thread cannot wait for itself; its request sees the cancel and returns.
            if threading.current_thread() is not worker:
                worker.join()
