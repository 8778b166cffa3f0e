"""``Engine.stream``: a request run on a thread of its own, its text yielded as it is final."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator


def stream_text(generate: Callable, prompt, kwargs: dict) -> Iterator[str]:
    """Runs ``generate(prompt, on_text=..., cancel=..., **kwargs)`` on a daemon thread and yields
    its text pieces. Closing the iterator early (or Ctrl-C while waiting for a piece) sets the
    request's cancel and waits for its thread (it stops within one prefill chunk or decode step);
    an error of the request is raised here, in the consumer's thread."""
    pieces: queue.Queue = queue.Queue()
    cancel = threading.Event()
    done = object()
    error: list[BaseException] = []

    def on_text(delta: str):
        pieces.put(delta)
        return not cancel.is_set()

    def run():
        try:
            generate(prompt, on_text=on_text, cancel=cancel, **kwargs)
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
