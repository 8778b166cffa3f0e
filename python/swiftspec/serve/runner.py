"""One request at a time on one Engine, in arrival order, behind a bounded wait line.

The Engine decodes one request at a time. The server must not interleave two requests, must not
let waiting ones pile up without bound, and must stop a request whose client went away at once
(one that still waits too), so the next one is not held up by a reply no one reads.

    runner = EngineRunner(engine, max_waiting=4)
    job = runner.submit(loop, prompt_ids, max_new_tokens=64, ...)   # Busy when the line is full
    async for kind, value in job.events(): ...
    job.cancel()                                                     # from any thread, any time

Each job runs ``Engine.generate`` on a thread of its own (the runtime releases the GIL), which
waits for its turn first; its events reach the event loop through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import AsyncIterator


class Busy(Exception):
    """The wait line is full (or the runner is closing): the request was not queued."""


class ShuttingDown(Busy):
    """The runner is closed (the server is shutting down): the request was not queued."""


class Job:
    """One submitted request. Its events, in order (``kind, value``):

    ``("text", str)`` new final text, any number of times; then exactly one of
    ``("done", GenerationResult)`` (finish_reason "stop" or "length"),
    ``("cancelled", GenerationResult | None)`` (cancelled: by :meth:`cancel`, or by the runner's
    :meth:`EngineRunner.close`; None when it never started), or ``("error", exception)`` (what
    ``Engine.generate`` raised).

    Attributes:
        queue_s: seconds it waited for the engine (set when it starts).
    """

    def __init__(self, runner: "EngineRunner", loop: asyncio.AbstractEventLoop):
        self._runner = runner
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self.cancel_event = threading.Event()  # polled by the runtime between prefill chunks and decode steps
        self.submitted = time.monotonic()
        self.queue_s = 0.0

    def cancel(self) -> None:
        """Stops the request: within one prefill chunk or decode step if it runs, at once if it
        waits. Idempotent; safe from any thread (not from a signal handler: it takes locks)."""
        self.cancel_event.set()
        self._runner._wake()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def _emit(self, kind: str, value) -> None:  # on the job's thread
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed: no one reads this job any more
            self.cancel_event.set()

    async def events(self) -> AsyncIterator[tuple[str, object]]:
        """The job's events (see the class docstring), ending with its last one."""
        while True:
            kind, value = await self._events.get()
            yield kind, value
            if kind != "text":
                return


class EngineRunner:
    """Runs jobs on ``engine`` one at a time in arrival order; at most ``max_waiting`` more wait.

    Args:
        engine: a :class:`swiftspec.Engine`.
        max_waiting: requests that may wait behind the running one (>= 0); a request beyond
            them is refused with :class:`Busy`.
    """

    def __init__(self, engine, max_waiting: int = 4):
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        self.engine = engine
        self.max_waiting = max_waiting
        self._cond = threading.Condition()  # guards _line; notified whenever it changes or a job is cancelled
        self._line: deque[Job] = deque()  # _line[0] runs (or is about to); the rest wait, in order
        self._closed = False
        self._ended = {"done": 0, "cancelled": 0, "error": 0}  # jobs by how they ended

    def status(self) -> dict:
        """``{"running": 0|1, "waiting": int, "max_waiting": int, "ended": {"done": int,
        "cancelled": int, "error": int}}`` (``ended``: the jobs so far, by their last event)."""
        with self._cond:
            n = len(self._line)
            ended = dict(self._ended)
        return {"running": min(n, 1), "waiting": max(n - 1, 0), "max_waiting": self.max_waiting, "ended": ended}

    def submit(self, loop: asyncio.AbstractEventLoop, prompt_ids: list[int], **generate_kwargs) -> Job:
        """Queues ``Engine.generate(prompt_ids, **generate_kwargs)``; events go to ``loop``.

        Raises:
            Busy: one request runs and ``max_waiting`` wait already, or the runner is closed.
        """
        with self._cond:
            if self._closed:
                raise ShuttingDown("the server is shutting down")
            # Jobs cancelled already (their client left or pressed Stop) do not count: they end within
            # one decode step (a running one) or at once (a waiting one), and a client that stops
            # its reply and asks again at once must not be refused because of it.
            live = sum(not j.cancelled for j in self._line)
            if live > self.max_waiting:
                raise Busy(
                    f"the engine is busy: 1 request is running and {live - 1} "
                    f"{'is' if live == 2 else 'are'} waiting (at most {self.max_waiting} may wait)"
                )
            job = Job(self, loop)
            self._line.append(job)
        threading.Thread(
            target=self._run, args=(job, prompt_ids, generate_kwargs), daemon=True, name="swiftspec-serve-request"
        ).start()
        return job

    def close(self) -> None:
        """Refuses new jobs and cancels every queued or running one (server shutdown)."""
        with self._cond:
            self._closed = True
            jobs = list(self._line)
        for job in jobs:
            job.cancel()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _run(self, job: Job, prompt_ids: list[int], kwargs: dict) -> None:
        with self._cond:
            while self._line[0] is not job and not job.cancelled:
                self._cond.wait()
            if job.cancelled:  # gone before its turn: it never touches the engine
                self._line.remove(job)
                self._ended["cancelled"] += 1
                self._cond.notify_all()
                job._emit("cancelled", None)
                return
        job.queue_s = time.monotonic() - job.submitted

        def on_text(delta: str) -> bool:
            job._emit("text", delta)
            return not job.cancelled

        outcome, payload = "error", None
        try:
            # cancel is polled also during the prompt's prefill, where no text arrives for on_text to refuse.
            result = self.engine.generate(prompt_ids, on_text=on_text, cancel=job.cancel_event, **kwargs)
        except BaseException as exc:  # handed to the request's handler, which answers with it
            payload = exc
        else:
            outcome = "cancelled" if result.finish_reason == "cancelled" else "done"
            payload = result
        finally:
            with self._cond:
                self._line.remove(job)
                self._ended[outcome] += 1
                self._cond.notify_all()
        # Counted before the handler hears of it: a client that has its reply sees it in /health.
        job._emit(outcome, payload)
