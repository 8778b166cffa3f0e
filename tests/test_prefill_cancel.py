"""A long prompt's prefill can be interrupted (Ctrl-C, a cancel check, a closed stream) in every
decode mode, and processing the prompt in chunks changes no result.

Before: the prompt went through the model in one forward pass, with no check inside it, so
Ctrl-C was seen only once the whole prompt was processed (a 1001-token prompt on the 0.5B model:
KeyboardInterrupt 11.6 s after SIGINT target-only, 22 s serial, 31 s async on this 2-core CPU).
Now the prompt is processed in chunks (64 tokens on the CPU backend) and the request's
cancellation check runs before each."""

import os
import signal
import threading
import time

import numpy as np
import pytest

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
    return engine.encode_prompt("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 4)


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
@pytest.mark.parametrize("mode,cancel_at,target_len,draft_len", [
    ("target", 1, 0, None),   # before the first chunk
    ("target", 4, 12, None),  # after 3 of 6 chunks
    ("serial", 3, 8, None),   # in the target's prefill (polls 1..5)
    ("serial", 9, 20, 12),    # in the draft's prefill (polls 6..10)
])
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
