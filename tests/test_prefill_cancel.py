"""A long prompt's prefill can be interrupted (Ctrl-C, a cancel check, a closed stream) in every
decode mode, and processing the prompt in chunks changes no result.

Before: the prompt went through the model in one forward pass, with no check inside it, so
Ctrl-C was seen only once the whole prompt was processed (a 1001-token prompt on the 0.5B model:
KeyboardInterrupt 11.6 s after SIGINT target-only, 22 s serial, 31 s async on this 2-core CPU).
Now the prompt is processed in chunks (64 tokens on the CPU backend) and the request's
cancellation check runs before each."""

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from swiftspec import InvalidRequestError
from swiftspec import swiftspec_core as core
from swiftspec.engine import Engine

NAME = "qwen2.5-coder-0.5b-instruct"
MODES = ["target", "serial", "async"]
LONG_PROMPT = "word " * 1000  # 1001 tokens: one-pass prefill 11-14 s here, draft + target 22-31 s
BOUND_S = 3.0  # a chunk of the 0.5B at this length takes 0.2-0.9 s (both models busy: async)


@pytest.fixture(scope="module")
def pair(checkpoint_dir):
    """The 0.5B model as both target and draft (one vocabulary; decode modes all available)."""
    ckpt = checkpoint_dir(NAME, "bfloat16")
    engine = Engine(ckpt, ckpt, max_context=2048)
    yield engine
    engine.close()


def short_ids(engine):
    return engine.encode_prompt('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n' * 4)


# ------------------------------------------------------------------ same numbers, chunked or not
def test_chunked_prefill_gives_the_logits_and_kv_of_one_pass(pair):
    """The CPU backend is batch-invariant and the committed KV is append-only: a prompt appended
    in chunks gets bit-identical K/V and logits (every row) to one forward pass over it."""
    model = pair.target_model
    ids = short_ids(pair)[:40]
    results = {}
    for chunk in (len(ids), 7):
        cache = core.spec.TreeKvCache(model)
        model.truncate_committed(0)
        logits = cache.prefill(ids, logits="all", chunk=chunk)
        k, v = model.read_committed_kv(model.config["num_layers"] - 1)
        results[chunk] = (logits, k, v)
        assert logits.shape == (40, model.config["vocab_size"]) and model.committed_len == 40
    for got, want in zip(results[7], results[len(ids)]):
        assert np.array_equal(got, want)
    one_pass = results[len(ids)]
    model.truncate_committed(0)
    last = core.spec.TreeKvCache(model).prefill(ids, logits="last", chunk=7)
    assert np.array_equal(last, one_pass[0][-1:])


@pytest.mark.parametrize("mode", MODES)
def test_generation_is_the_same_for_any_prefill_chunk(pair, mode):
    """Tokens (greedy, and sampled: those depend on every logit bit) and the KV cache after the
    prompt equal those of a one-pass prefill, whatever the chunk size, in every mode."""
    ids = short_ids(pair)[:40]
    target, draft = pair.target_model, pair.draft_model
    engine = core.Engine(target, draft)

    def run(chunk, **kw):
        if mode == "async":
            return core.generate_async(engine, ids, prefill_chunk=chunk, **kw)["tokens"]
        return engine.generate(ids, mode=mode, prefill_chunk=chunk, **kw)["tokens"]

    for kw in ({"max_new_tokens": 4}, {"max_new_tokens": 4, "temperature": 0.8, "seed": 5}):
        want = run(10**6, **kw)  # one pass
        assert len(want) == 4
        assert run(3, **kw) == want
    if mode == "target":  # the committed KV after the prompt alone
        kv = {}
        for chunk in (10**6, 3):
            engine.generate(ids, max_new_tokens=1, prefill_chunk=chunk)
            assert target.committed_len == len(ids)
            kv[chunk] = target.read_committed_kv(3)
        assert all(np.array_equal(a, b) for a, b in zip(kv[3], kv[10**6]))


# ----------------------------------------------------------- the cancellation check in a prefill
@pytest.mark.parametrize(
    "mode,cancel_at,target_len,draft_len",
    [
        ("target", 1, 0, None),  # before the first chunk
        ("target", 4, 12, None),  # after 3 of 6 chunks
        ("serial", 3, 8, None),  # in the target's prefill (polls 1..5)
        ("serial", 9, 20, 12),  # in the draft's prefill (polls 6..10)
    ],
)
def test_the_cancel_check_stops_each_prefill_between_chunks(pair, mode, cancel_at, target_len, draft_len):
    """Prompt of 20 tokens in chunks of 4: cancel_check is polled before each chunk, target then
    draft; returning True stops there with no token, and the engine is reusable."""
    ids = short_ids(pair)[:20]
    target, draft = pair.target_model, pair.draft_model
    engine = core.Engine(target, draft)
    want = engine.generate(ids, mode=mode, max_new_tokens=4, prefill_chunk=4)["tokens"]
    polls = []

    def check():
        polls.append(1)
        return len(polls) >= cancel_at

    out = engine.generate(ids, mode=mode, max_new_tokens=4, prefill_chunk=4, cancel_check=check)
    assert out["tokens"] == [] and out["stats"]["finish_reason"] == "cancelled"
    assert len(polls) == cancel_at
    assert target.committed_len == target_len
    if draft_len is not None:
        assert draft.committed_len == draft_len
    assert engine.generate(ids, mode=mode, max_new_tokens=4, prefill_chunk=4)["tokens"] == want


def test_async_prefill_stops_when_the_host_cancels(pair):
    """Async mode: both groups prefill on their own threads; the host polls the check while it
    waits and stops them, each at its next chunk, long before their prefills would end."""
    ids = pair.encode_prompt(LONG_PROMPT)
    engine = core.Engine(pair.target_model, pair.draft_model)
    t0 = time.perf_counter()
    out = core.generate_async(engine, ids, max_new_tokens=4, cancel_check=lambda: time.perf_counter() - t0 > 0.3)
    assert out["tokens"] == [] and out["stats"]["finish_reason"] == "cancelled"
    assert time.perf_counter() - t0 < 0.3 + BOUND_S
    assert pair.target_model.committed_len < len(ids) and pair.draft_model.committed_len < len(ids) - 1


def test_a_cancel_check_that_raises_cancels_and_reraises(pair):
    ids = short_ids(pair)[:20]
    engine = core.Engine(pair.target_model)

    def check():
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        engine.generate(ids, max_new_tokens=4, cancel_check=check)
    assert pair.target_model.committed_len == 0  # raised before the first chunk
    assert len(engine.generate(ids, max_new_tokens=4)["tokens"]) == 4


# ----------------------------------------------------------------------------------- Ctrl-C
def interrupt_after(delay_s):
    """Sends this process SIGINT (what Ctrl-C does) after delay_s; returns (timer, sent-at list)."""
    sent = []

    def fire():
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(delay_s, fire)
    timer.start()
    return timer, sent


@pytest.fixture
def sigint_raises_keyboard_interrupt():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach Python only on the main thread")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not raise KeyboardInterrupt here")


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_during_a_long_prefill_stops_within_a_chunk(pair, mode, sigint_raises_keyboard_interrupt):
    after = "def add(a, b):"
    want = pair.generate(after, max_new_tokens=6, mode=mode).text
    timer, sent = interrupt_after(0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            pair.generate(LONG_PROMPT, max_new_tokens=4, mode=mode)
        latency = time.perf_counter() - sent[0]
    finally:
        timer.join()
    assert latency < BOUND_S, f"{mode}: KeyboardInterrupt {latency:.2f} s after SIGINT"
    # The engine is usable and unharmed: the next request gives what a fresh engine gives.
    assert pair.generate(after, max_new_tokens=6, mode=mode).text == want


def test_ctrl_c_while_a_stream_waits_for_its_first_piece(pair, sigint_raises_keyboard_interrupt):
    """stream() runs the request on a worker thread (no signals there): the consumer's
    KeyboardInterrupt closes the stream, whose cancel event the prefill polls."""
    timer, sent = interrupt_after(0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in pair.stream(LONG_PROMPT, max_new_tokens=4, mode="target"):
                pass
        latency = time.perf_counter() - sent[0]
    finally:
        timer.join()
    assert latency < BOUND_S, f"stream: KeyboardInterrupt {latency:.2f} s after SIGINT"
    assert pair.generate("def add(a, b):", max_new_tokens=3, mode="target").finish_reason == "length"


# ----------------------------------------- hooks, close() and the interpreter's exit (2026-12-01)
SMALL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def small_ckpt(checkpoint_dir):
    return checkpoint_dir(SMALL, "bfloat16")


def test_hooks_that_are_not_callable_are_refused_by_name(small_ckpt):
    """Before: "'int' object is not callable" from the first poll, and for on_tokens / on_text only
    once the whole prompt was prefilled. Now refused when the request starts, naming the parameter."""
    with Engine(small_ckpt, small_ckpt, max_context=256) as engine:
        ids = engine.encode_prompt("def f(x):")
        calls = {
            "generate": lambda **kw: engine._engine.generate(ids, max_new_tokens=2, mode="serial", **kw),
            "generate_async": lambda **kw: core.generate_async(engine._engine, ids, max_new_tokens=2, **kw),
            "generate_serial": lambda **kw: core.spec.generate_serial(
                engine.target_model, engine.draft_model, ids, max_new_tokens=2, **kw
            ),
        }
        for name, call in calls.items():
            with pytest.raises(InvalidRequestError, match="cancel_check must be callable or None, got int"):
                call(cancel_check=5)
            with pytest.raises(InvalidRequestError, match="on_tokens must be callable or None, got str"):
                call(on_tokens="x")
            assert len(call(cancel_check=None, on_tokens=None)["tokens"]) == 2, name
        with pytest.raises(InvalidRequestError, match="on_text must be callable or None, got int"):
            engine.generate("def f(x):", max_new_tokens=2, on_text=3)


def test_close_from_a_callback_of_the_running_request_is_refused(small_ckpt):
    """Before: close() inside on_text waited for the engine's lock, which its own request held: the
    process hung for ever. Now it is refused by name (as generate() from a callback is): the request
    is cancelled with that error, and the engine stays open and usable."""
    engine = Engine(small_ckpt, small_ckpt, max_context=256)
    outcome = []

    def run():
        try:
            engine.generate("def f(x):", max_new_tokens=4, on_text=lambda delta: engine.close())
        except BaseException as exc:  # checked below
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)  # a regression hangs this thread, not the suite
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "close() called from on_text hung"
    assert len(outcome) == 1 and isinstance(outcome[0], InvalidRequestError), outcome
    assert "close() was called from a callback of a request running on this engine" in str(outcome[0])
    assert len(engine.generate("def f(x):", max_new_tokens=3, mode="target").token_ids) == 3
    engine.close()
    with pytest.raises(InvalidRequestError, match="the engine is closed"):
        engine.generate("def f(x):", max_new_tokens=3)


def test_a_stream_collected_on_its_own_thread_does_not_wait_for_itself(small_ckpt, monkeypatch):
    """An abandoned stream in a reference cycle is closed by the thread the cyclic GC runs on, which
    may be the stream's own worker, inside its request. Before: the stream's cleanup joined that very
    thread ('Exception ignored ... RuntimeError: cannot join current thread'). Now it cancels only."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    collect = threading.Event()

    class CollectingEngine(Engine):
        def generate(self, prompt, on_text=None, **kwargs):  # stream() runs it on its worker thread
            if on_text is None:
                return super().generate(prompt, **kwargs)

            def text(delta):
                keep = on_text(delta)
                if collect.is_set():
                    gc.collect()
                return keep

            return super().generate(prompt, on_text=text, **kwargs)

    engine = CollectingEngine(small_ckpt, small_ckpt, max_context=256)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # only the worker's gc.collect() may collect the cycle
    try:
        stream = engine.stream("def f(x):", max_new_tokens=60, mode="target")
        next(stream)
        cycle = [stream]
        cycle.append(cycle)
        del stream, cycle
        collect.set()
        for thread in threading.enumerate():
            if thread.name == "swiftspec-stream":
                thread.join(60)
                assert not thread.is_alive()
    finally:
        if gc_was_enabled:
            gc.enable()
    assert not unraisable, [u.exc_value for u in unraisable]
    assert len(engine.generate("def f(x):", max_new_tokens=3, mode="target").token_ids) == 3
    engine.close()


EXIT_SCRIPT = """
import sys
from swiftspec.engine import Engine
engine = Engine(sys.argv[1], sys.argv[1], max_context=512)
stream = engine.stream("def fibonacci(n):" * 20, max_new_tokens=300, mode=sys.argv[2])
print(repr(next(stream)), flush=True)
"""  # ends with the stream unfinished: its request still decoding on the stream's thread


@pytest.mark.parametrize("mode", MODES)
def test_the_interpreter_exits_cleanly_with_a_stream_left_unfinished(small_ckpt, mode):
    """Before: the stream's worker (a daemon thread) was still decoding when the interpreter
    finalized; Python ended that thread when its next callback took the GIL, in the middle of the
    C++ frames: the process aborted ('terminate called without an active exception', status 134;
    async every time, serial at times) or nanobind reported leaked objects (target). Now every
    running request is cancelled at exit and waited for (one decode step)."""
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(small_ckpt), mode], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr and "leaked" not in proc.stderr, proc.stderr[-3000:]


def test_a_prompt_one_pass_would_refuse_is_refused_before_the_first_chunk(small_ckpt):
    """Before: a prompt longer than the context (or with an id outside the vocabulary further on)
    was prefilled chunk by chunk until the chunk that did not fit (up to a whole context of work)
    and failed there, leaving that much committed ('256 committed + 44 new tokens exceed ...').
    One pass refused it with nothing computed; now the chunked prefill does too."""
    options = core.ModelOptions()
    options.max_context, options.max_tree = 256, 16
    model = core.load_model(str(small_ckpt), "cpu", options)
    too_long = [(i * 7919) % 30000 + 100 for i in range(300)]
    bad_id = too_long[:100] + [10**6]
    starts = {
        "TreeKvCache.prefill": lambda ids: core.spec.TreeKvCache(model).prefill(ids, logits="none", chunk=16),
        "DraftTree.start": lambda ids: core.spec.DraftTree(model, tree_budget=4).start(ids, 5),
        "TreeVerifier.start": lambda ids: core.spec.TreeVerifier(model).start(ids),
    }
    for name, start in starts.items():
        model.truncate_committed(0)
        with pytest.raises(
            InvalidRequestError,
            match=r"prefill: 0 committed \+ 300 new tokens exceed the context "
            r"of 256 tokens \(max_context\)",
        ):
            start(too_long)
        assert model.committed_len == 0, name
        with pytest.raises(InvalidRequestError, match=r"token id 1000000 at index 100 is outside the vocabulary"):
            start(bad_id)
        assert model.committed_len == 0, name
    assert core.spec.TreeKvCache(model).prefill(too_long[:256], chunk=16).shape == (1, model.config["vocab_size"])
    assert model.committed_len == 256  # a prompt that fits exactly
