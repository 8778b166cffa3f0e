"""Concurrency and cancellation, attacked as a careless or hostile user would (an adversarial
pass, 2026-12-05): close() from another thread in the middle of a call, callbacks that raise,
streams moved between threads, many threads on one engine. Every test asserts values: the
outcome each call must have, and that the engine still answers as it did before."""

from __future__ import annotations

import threading

import pytest

from swiftspec import InvalidRequestError
from swiftspec.engine import Engine

SMALL = "smollm2-135m-instruct"
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def small_ckpt(checkpoint_dir):
    return checkpoint_dir(SMALL, "bfloat16")


def _on_another_thread(fn):
    """Runs fn() on a thread of its own and waits for it (what another thread of the program
    does at that moment); returns what it returned."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(60)
    assert not t.is_alive() and len(out) == 1
    return out[0]


@pytest.mark.parametrize("mode", [None, "target", "serial"])
def test_close_on_another_thread_while_a_request_is_checked_is_the_closed_error(small_ckpt, mode):
    """close() on another thread between the request's first check that the engine is open and its
    use of the models (here: while its stop strings are read, from a generator). Before: an
    AttributeError ("'NoneType' object has no attribute 'max_tree'"), also seen with plain threads
    (1 in 120 runs of a generate racing a close). Now the engine's own "the engine is closed"."""
    engine = Engine(small_ckpt, small_ckpt, max_context=128)

    def stops():  # read by generate() after it checked the engine open, before it takes the lock
        _on_another_thread(engine.close)
        yield "\n\n"

    with pytest.raises(InvalidRequestError, match="^the engine is closed$"):
        engine.generate(PROMPT, max_new_tokens=2, mode=mode, stop=stops())
    with pytest.raises(InvalidRequestError, match="^the engine is closed$"):
        engine.has_draft


@pytest.mark.parametrize("mode", ["target", "serial", "async"])
def test_a_stream_started_from_a_callback_of_its_engine_is_refused_not_hung(small_ckpt, mode):
    """on_text starting a stream() on the same engine: the stream's request runs on its own thread,
    so the re-entrancy check of generate() did not see it; it waited for the engine's lock, held by
    the request whose callback waited for the stream's first piece: both hung for ever. Now refused
    by name (as generate() and close() from a callback are); the request stops with that error and
    the engine stays usable."""
    engine = Engine(small_ckpt, small_ckpt, max_context=128)
    want = engine.generate(PROMPT, max_new_tokens=4, mode="target").token_ids
    outcome = []

    def run():
        try:
            engine.generate(PROMPT, max_new_tokens=4, mode=mode,
                            on_text=lambda delta: list(engine.stream("x", max_new_tokens=2)))
        except BaseException as exc:  # checked below
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)  # a regression hangs this thread, not the suite
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "stream() started from on_text hung"
    assert len(outcome) == 1 and isinstance(outcome[0], InvalidRequestError), outcome
    assert str(outcome[0]).startswith("stream() was started from a callback of a request running on this engine")
    assert engine.generate(PROMPT, max_new_tokens=4, mode=mode).token_ids == want
    # A stream made in a callback but started after its request returned is no re-entry.
    made = []
    engine.generate(PROMPT, max_new_tokens=2, mode=mode,
                    on_text=lambda delta: made.append(engine.stream(PROMPT, max_new_tokens=4, mode=mode)))
    assert "".join(made[0]) == engine.generate(PROMPT, max_new_tokens=4, mode=mode).text
    engine.close()
