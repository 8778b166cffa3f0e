"""The Python face of the engine: load a target (and optionally a draft) model,
tokenize, apply chat templates, and drive generation in the C++ runtime.

Decoding itself (target-only, serial speculation, asynchronous speculation) runs in C++
with the GIL released, and so do the rules of a request: its checks, one request at a
time per engine (a request from another thread waits for its turn, cancellable while it
waits; one from a callback of the running request is refused), and close() waiting for
it (``swiftspec::Engine``, cpp/include/swiftspec/engine.h). This module turns text into
token ids and back (:mod:`swiftspec.prompt`, :mod:`swiftspec.request`), handles stop
strings and streaming, and cancels running requests when the interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from pathlib import Path
from typing import Iterator, Sequence

from swiftspec.engine_loading import load_engine_models
from swiftspec.errors import InvalidRequestError
from swiftspec.prompt import encode_prompt
from swiftspec.request import RequestText, int32_args
from swiftspec.result import GenerationResult
from swiftspec.sampling_params import SAMPLING_DEFAULTS, check_sampling_params, check_unused_under_greedy
from swiftspec.streaming import stream_text

__all__ = ["Engine", "GenerationResult"]

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


@contextlib.contextmanager
def _counted_request():
    """Counts a request in _running while it is in the runtime (waiting for its turn too)."""
    global _running
    with _running_changed:
        _running += 1
    try:
        yield
    finally:
        with _running_changed:
            _running -= 1
            _running_changed.notify_all()


class Engine:
    """A target model, an optional draft model, and their tokenizer.

    Args:
        target: a converted checkpoint folder, a GGUF file or a Hugging Face
            folder (converted on first use into the cache), a reference model
            name (see ``swiftspec.fetch.REFERENCE_MODELS``), or a Hugging Face
            model id, ``"org/name"`` or ``"org/name@revision"`` (fetched through
            huggingface_hub's cache, then converted; ``swiftspec.models``).
        draft: the same kinds of value, or None for target-only decoding. The
            draft must share the target's vocabulary.
        backend: "cpu" or "cuda" (CUDA builds only).
        dtype: weight dtype used when a GGUF file or reference name must be
            converted: "bfloat16" (default), "float32" or "int4" (the linear
            projections in 4 bits: group size 32 from a GGUF file, 128 from an
            HF folder; on the cuda backend without the decode megakernel and
            with tp 1). A
            checkpoint folder is used as it is, whatever its dtype.
        max_context: KV capacity in tokens (prompt + new tokens), per model; at
            most the model's ``max_position_embeddings`` (config.json). None:
            what each model was trained for (``max_position_embeddings``; 4096
            when config.json gives none: 32768 for the reference pair), capped
            when the memory free (RAM on the cpu backend, the GPU's on cuda) does
            not hold both models' weights, KV caches and workspaces at that length;
            ``context_note`` then says what was chosen and why. The KV cache is
            allocated for all of it at load (on the cpu backend, pages cost memory
            only once a request writes them).
        max_tree: tree KV capacity in nodes (>= the largest tree budget used).
        num_threads: CPU threads per model (0: all cores).
        placement: where the draft group and the target group run and their
            tensor-parallel degrees ("auto", a dict, JSON text or a .json
            path; see ``swiftspec.placement``). None: both models use
            ``num_threads`` unpinned threads, TP 1.

    Raises:
        CheckpointError: a path is missing or not a valid model, naming it; a
            Hugging Face id the hub does not have, or without safetensors weights.
        FetchError: a reference model or a Hugging Face id could not be
            downloaded (offline, no network), naming it.
        InvalidRequestError: an option is out of range, naming it (a max_context
            beyond a model's max_position_embeddings names both numbers; one that
            does not fit in the free memory gives the bytes needed, the bytes free
            and the largest context that fits, before anything is allocated); dtype
            "int4" on the cuda backend with a placement asking for the decode
            megakernel or tp > 1, or on another backend than cpu and cuda (before
            anything is converted or loaded).

    Attributes:
        context_note: one line when free memory capped the default context (what
            the models got and why; the CLI prints it on stderr), else "".
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

        models = load_engine_models(
            target,
            draft,
            backend=backend,
            dtype=dtype,
            max_context=max_context,
            max_tree=max_tree,
            num_threads=num_threads,
            placement=placement,
        )
        self.target_dir, self.draft_dir, self.tokenizer = models.target_dir, models.draft_dir, models.tokenizer
        self.placement, self.context_note = models.placement, models.context_note
        self._target, self._draft = models.target, models.draft
        self._engine = core.Engine(self._target, self._draft)
        self.backend = backend

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
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()  # the runtime marks it closed before it releases the models: see _open_models
        self._target = self._draft = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open_models(self):
        """(target, draft) of an open engine, read together: close() on another thread may release
        them at any moment, so they are read first and the engine checked open after (close() marks
        it closed before it releases them). InvalidRequestError once the engine is closed, or in a
        fork()ed child of the process that made it."""
        target, draft = self._target, self._draft
        self._engine.check_open()
        return target, draft

    @property
    def has_draft(self) -> bool:
        return self._open_models()[1] is not None

    def context_length(self, mode: str = "auto") -> int:
        """Tokens of context a request in ``mode`` ("auto", "target", "serial", "async") has: the target's
        max_context, or the smaller of the target's and the draft's when the draft may speculate (the
        runtime's rule, ``Engine::context_length``). A prompt plus max_new_tokens must fit in it.
        InvalidRequestError once the engine is closed."""
        return self._engine.context_length(mode)

    @property
    def target_model(self):
        """The C++ target model (``swiftspec_core.Model``)."""
        return self._target

    @property
    def draft_model(self):
        """The C++ draft model, or None."""
        return self._draft

    def encode_prompt(self, prompt) -> list[int]:
        """Token ids for a prompt: a string (encoded as is), a list of chat messages
        (``[{"role": ..., "content": ...}]``, rendered with the model's chat template and a
        generation prompt), or a list of token ids (:func:`swiftspec.prompt.encode_prompt`)."""
        return encode_prompt(self.tokenizer, prompt)

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

        Greedy when ``temperature`` is 0; otherwise samples with top-k / top-p under ``seed``. ``mode``
        is "auto" (the default: per round, target-only decoding or a token tree of the budget, at most
        ``tree_budget``, that the request's measured pass times and acceptance favour; target-only
        without a draft; cpp/include/swiftspec/speculation_policy.h), "target" (plain decoding), "serial"
        or "async" (speculative; need a draft). Speculative modes return the target model's own output
        (greedy: token for token; sampling: the same distribution). Generation ends at max_new_tokens,
        an EOS token, or a ``stop`` string (the text is cut before it). ``on_text(delta: str) -> bool |
        None`` is called with new text as it is final; returning False cancels. ``async_options``
        (async mode): growth_depth, min_send_nodes, expand_width, min_expand_prob, cost_aware_send,
        record_timeline (swiftspec_core.generate_async).

        ``cancel`` (a ``threading.Event``, or any object with ``is_set()``) cancels from another thread:
        once it is set, the request stops within one prefill chunk or decode step, also during a long
        prompt's prefill where no text reaches ``on_text`` (one waiting for its turn behind another
        request returns at once, without waiting), and returns what it has with finish_reason
        "cancelled" (set before the call: no new tokens). Ctrl-C (SIGINT, when called from the main
        thread) stops the request the same way (a long prompt is prefilled in chunks of the backend's
        size: 64 tokens on the CPU, with the same result as one pass) and raises KeyboardInterrupt; the
        engine stays usable.

        Raises:
            InvalidRequestError: bad prompt or parameter, named in the message (the sampling parameters:
                :func:`swiftspec.sampling_params.check_sampling_params`, and top_p or top_k with
                temperature 0, where they would have no effect; chat messages:
                :meth:`swiftspec.tokenizer.Tokenizer.apply_chat_template`), a prompt plus max_new_tokens
                longer than the context (:meth:`context_length`), or a call from a callback of a
                request running on this engine (it would wait for itself).
            KeyboardInterrupt: Ctrl-C during the request.
        """
        # Refused at once when closed; close() on another thread may still release the models
        # meanwhile (the runtime then refuses the request, "the engine is closed").
        self._open_models()
        text = RequestText(self.tokenizer, stop, on_text, cancel, exiting=lambda: _exiting.is_set())
        counts = int32_args(
            max_new_tokens=max_new_tokens, tree_budget=tree_budget, max_depth=max_depth, branching=branching
        )
        sampling = check_sampling_params(temperature, top_p, top_k, seed)
        # top_p / top_k under greedy decoding would be ignored silently (as the CLI and the server refuse
        # them); a seed is harmless there (greedy output is reproducible anyway).
        check_unused_under_greedy(sampling, [k for k in ("top_p", "top_k") if sampling[k] != SAMPLING_DEFAULTS[k]])
        prompt_ids = self.encode_prompt(prompt)
        mode = "auto" if mode is None else str(mode)
        with _counted_request():  # also while it waits for its turn: see _cancel_requests_at_exit
            out = self._engine.generate(
                prompt_ids,
                mode=mode,
                stop_token_ids=self.tokenizer.eos_token_ids,
                on_tokens=text.on_tokens,
                cancel_check=text.cancelled,
                async_options=async_options,
                **counts,
                **sampling,
            )
        return text.result(out, prompt_ids)

    def stream(self, prompt, **kwargs) -> Iterator[str]:
        """Like :meth:`generate`, but yields text pieces as they are final.
        Closing the iterator early (or Ctrl-C while waiting for a piece) cancels
        the request, also during the prompt's prefill; so does the interpreter's
        exit with the stream unfinished (the request runs on a daemon thread)."""
        if "on_text" in kwargs:
            raise InvalidRequestError("stream() yields the text itself; do not pass on_text")
        if "cancel" in kwargs:
            raise InvalidRequestError(
                "stream() is cancelled by closing the iterator (close() or leaving the loop); do not pass cancel"
            )
        # (Checked when the stream starts, at its first piece: a generator's body runs then.) Its request
        # runs on a thread of its own: from a callback of a request on this engine it would wait for that
        # request, which waits for its pieces: both hung for ever.
        if self._engine.running_on_this_thread():
            raise InvalidRequestError(
                "stream() was started from a callback of a request running on this engine (it "
                "would wait for that request, which waits for it); start it after that request "
                "returns"
            )
        yield from stream_text(self.generate, prompt, kwargs)
