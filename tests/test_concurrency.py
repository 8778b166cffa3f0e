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
            engine.generate(
                PROMPT, max_new_tokens=4, mode=mode, on_text=lambda delta: list(engine.stream("x", max_new_tokens=2))
            )
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
    engine.generate(
        PROMPT,
        max_new_tokens=2,
        mode=mode,
        on_text=lambda delta: made.append(engine.stream(PROMPT, max_new_tokens=4, mode=mode)),
    )
    assert "".join(made[0]) == engine.generate(PROMPT, max_new_tokens=4, mode=mode).text
    engine.close()


FORK_SCRIPT = r"""
import json, os, sys, threading
from swiftspec import InvalidRequestError
from swiftspec import swiftspec_core as core
from swiftspec.engine import Engine

ckpt, placement = sys.argv[1], json.loads(sys.argv[2])
engine = Engine(ckpt, ckpt, max_context=128, placement=placement)
want = {m: engine.generate("def f(x):", max_new_tokens=4, mode=m).token_ids for m in ("target", "serial", "async")}
# A request of the parent holds the engine while the process forks (its callback waits).
in_callback, release = threading.Event(), threading.Event()
parent_request = threading.Thread(target=lambda: engine.generate(
    "def f(x):", max_new_tokens=4, mode="target", on_text=lambda d: (in_callback.set(), release.wait())))
parent_request.start()
in_callback.wait()
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:  # the child: every way in is refused by name, none hangs; then it exits normally (models freed)
    import signal
    signal.alarm(60)  # a regression hangs here: the child must not outlive the test
    os.close(read_end)
    seen = {}
    def outcome(name, fn):
        try:
            fn()
            seen[name] = "ran"
        except InvalidRequestError as exc:
            seen[name] = str(exc)
    for mode in ("target", "serial", "async"):
        outcome(mode, lambda: engine.generate("def f(x):", max_new_tokens=4, mode=mode))
    ids = engine.encode_prompt("def f(x):")
    outcome("core.generate", lambda: core.Engine(engine.target_model, None).generate(ids, max_new_tokens=2))
    outcome("core.generate_async", lambda: core.generate_async(core.Engine(engine.target_model, engine.draft_model),
                                                               ids, max_new_tokens=2))
    outcome("forward", lambda: engine.target_model.forward(ids))
    os.write(write_end, json.dumps(seen).encode())
    os.close(write_end)
    sys.exit(0)
os.close(write_end)
child = b""
while chunk := os.read(read_end, 65536):
    child += chunk
_, status = os.waitpid(pid, 0)
release.set()
parent_request.join()
after = {m: engine.generate("def f(x):", max_new_tokens=4, mode=m).token_ids for m in ("target", "serial", "async")}
print(json.dumps({"child": json.loads(child or b"{}"), "status": status, "same": after == want}))
"""


@pytest.mark.parametrize("placement", [None, {"target": {"tp": 3}, "draft": {"tp": 1}}], ids=["tp1", "tp3"])
def test_an_engine_used_in_a_forked_child_is_refused_not_hung(small_ckpt, placement):
    """os.fork() (multiprocessing's default start method on Linux) after the engine was made. The
    child has none of the models' worker threads. Before: every generate() in the child hung for
    ever (waiting for workers that are not there, or for the engine lock a parent's request held at
    the fork), and close() or the child's exit aborted it ('terminate called after throwing an
    instance of std::system_error: Invalid argument', status 134). Now each call is refused by name,
    the child exits normally, and the parent's engine answers as before."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(small_ckpt), json.dumps(placement)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["status"] == 0 and report["same"] is True, (report, proc.stderr[-3000:])
    child = report["child"]
    assert sorted(child) == ["async", "core.generate", "core.generate_async", "forward", "serial", "target"]
    for mode in ("target", "serial", "async"):
        assert child[mode].startswith("this engine was made in process "), child[mode]
        assert "is a fork() of it: the models' worker threads did not survive the fork" in child[mode]
    for call in ("core.generate", "core.generate_async", "forward"):
        assert child[call].startswith("this model was loaded before this process was fork()ed from its parent: its "), (
            call,
            child[call],
        )
        assert "did not survive the fork, so it cannot run here" in child[call]
    assert "terminate called" not in proc.stderr


@pytest.fixture()
def held_engine(small_ckpt):
    """An engine and a request of another thread that holds it (its on_text waits) until
    ``release`` is set; a watchdog sets it after 60 s, so a regression fails instead of hanging.
    Yields (engine, release, finish): finish() releases the holder and returns its tokens."""
    engine = Engine(small_ckpt, small_ckpt, max_context=128)
    holding, release, held = threading.Event(), threading.Event(), []

    def hold(delta):
        holding.set()
        release.wait()

    holder = threading.Thread(
        target=lambda: held.append(engine.generate(PROMPT, max_new_tokens=4, mode="target", on_text=hold).token_ids)
    )
    holder.start()
    watchdog = threading.Timer(60, release.set)
    watchdog.start()
    assert holding.wait(60)

    def finish():
        release.set()
        holder.join(60)
        assert not holder.is_alive() and len(held) == 1
        return held[0]

    yield engine, release, finish
    finish()
    watchdog.cancel()
    engine.close()


@pytest.mark.parametrize("mode", ["target", "serial", "async"])
def test_a_request_waiting_for_the_engine_is_cancelled_at_once(held_engine, mode):
    """generate(cancel=event) behind another thread's request: before, it waited until that request
    ended (here: for ever) and only then returned "cancelled". Now it returns "cancelled" with no
    tokens while the other request still runs, whether the event was set before the call or while it
    waited; the other request and the engine are unaffected."""
    engine, release, finish = held_engine
    preset = threading.Event()
    preset.set()
    r = engine.generate(PROMPT, max_new_tokens=4, mode=mode, cancel=preset)
    assert not release.is_set(), "it waited for the running request"
    assert (r.finish_reason, r.token_ids, r.text) == ("cancelled", [], "")
    assert r.stats["new_tokens"] == 0 and r.stats["prompt_tokens"] == len(r.prompt_token_ids) > 0
    later, outcome = threading.Event(), []
    waiter = threading.Thread(
        target=lambda: outcome.append(engine.generate(PROMPT, max_new_tokens=4, mode=mode, cancel=later))
    )
    waiter.start()
    later.set()  # whether it is waiting yet or not: it must not wait for the running request
    waiter.join(30)
    assert not release.is_set() and not waiter.is_alive(), "it waited for the running request"
    assert (outcome[0].finish_reason, outcome[0].token_ids) == ("cancelled", [])
    held = finish()
    want = engine.generate(PROMPT, max_new_tokens=4, mode="target").token_ids
    assert held == want
    ran = engine.generate(PROMPT, max_new_tokens=4, mode=mode)
    assert ran.token_ids == want
    # the cancelled request's stats have the keys of a request that ran (the runtime's stats_dict)
    assert set(r.stats) == set(ran.stats) and r.stats["acceptance_length"] == 0.0 and r.stats["decode_time"] == 0.0


def test_ctrl_c_on_a_stream_waiting_for_the_engine_returns_at_once(held_engine, monkeypatch):
    """Ctrl-C while a stream() waits for its first piece behind another thread's request: the
    stream's cleanup cancels its request and joins its thread, which waited for the engine until
    the other request ended (here: for ever). Now the KeyboardInterrupt comes at once."""
    import os
    import signal

    import swiftspec.engine as engine_module

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C reaches the main thread only")
    engine, release, finish = held_engine
    polled = threading.Event()

    class Exiting(threading.Event):  # polled by every cancel check: the first poll is the waiting stream's
        def is_set(self):
            polled.set()
            return super().is_set()

    monkeypatch.setattr(engine_module, "_exiting", Exiting())  # (the holder polls nothing while it is held)

    def interrupt_once_the_stream_waits():
        if polled.wait(90):
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupter = threading.Thread(target=interrupt_once_the_stream_waits)
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            next(engine.stream(PROMPT, max_new_tokens=4, mode="serial"))
        assert not release.is_set(), "the stream waited for the running request"
        interrupter.join(60)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert finish() == engine.generate(PROMPT, max_new_tokens=4, mode="target").token_ids


def test_the_server_takes_a_new_request_once_the_running_one_is_cancelled():
    """swiftspec serve with --max-waiting 0: a client presses Stop (its job is cancelled; the engine
    stops within one decode step) and sends its next message at once. Before: that message got 503
    "the engine is busy: 1 request is running" for as long as the cancelled request took to notice;
    now it is taken, waits for that step, and runs. A second live request is still refused.
    Through the runner with an engine whose decode step ends when the test says: deterministic."""
    import asyncio

    from swiftspec.serve.runner import Busy, EngineRunner

    in_step, step_done = threading.Event(), threading.Event()

    class Finished:
        def __init__(self, reason):
            self.finish_reason = reason

    class SteppedEngine:  # the runner's only use of an engine: one decode step, then the cancel check
        def generate(self, prompt_ids, on_text=None, cancel=None, **kwargs):
            in_step.set()
            step_done.wait(60)
            return Finished("cancelled" if cancel.is_set() else "length")

    runner = EngineRunner(SteppedEngine(), max_waiting=0)

    async def stop_and_ask_again():
        loop = asyncio.get_running_loop()
        first = runner.submit(loop, [1, 2, 3])
        await asyncio.to_thread(in_step.wait, 60)  # the first request is decoding
        first.cancel()  # Stop: it ends once its step does
        second = runner.submit(loop, [4, 5, 6])  # asked again at once
        full = "the engine is busy: 1 request is running and 0 are waiting .at most 0 may wait."
        with pytest.raises(Busy, match=full):
            runner.submit(loop, [7, 8, 9])  # a third, live one: the line is full
        step_done.set()
        return [kind async for kind, _ in first.events()], [kind async for kind, _ in second.events()]

    assert asyncio.run(stop_and_ask_again()) == (["cancelled"], ["done"])
    assert runner.status() == {
        "running": 0,
        "waiting": 0,
        "max_waiting": 0,
        "ended": {"done": 1, "cancelled": 1, "error": 0},
    }


def test_a_request_arriving_during_shutdown_is_told_the_server_is_shutting_down(checkpoint_dir):
    """A request that reaches the handler after the shutdown began (it was being read or
    tokenized when SIGTERM came) was answered 503 with code "busy" (retry in 5 s: the engine is
    busy) though the server was going away; now its code is "shutting_down", as for the replies
    the shutdown cut short."""
    from starlette.testclient import TestClient

    from swiftspec.serve.app import create_app

    with Engine(checkpoint_dir(SMALL, "bfloat16"), max_context=128) as engine:
        app = create_app(engine, max_waiting=0)
        with TestClient(app) as client:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            app.state.server.runner.close()  # what the exit signal does first
            r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 503
    assert r.json() == {
        "error": {
            "message": "the server is shutting down",
            "type": "server_error",
            "param": None,
            "code": "shutting_down",
        }
    }
