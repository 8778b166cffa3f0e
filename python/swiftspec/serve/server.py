"""Runs the app under uvicorn until Ctrl-C (SIGINT) or SIGTERM; either shuts it down gracefully.

uvicorn's graceful shutdown waits for open responses to end; a reply being streamed would keep
it waiting for the whole reply. So the signal first cancels every queued and running request
(each streamed reply ends with an error event "the server is shutting down" and ``[DONE]``), then
uvicorn shuts down as usual.
"""

from __future__ import annotations

import contextlib
import signal
import threading

import uvicorn

#: Seconds uvicorn waits for open connections after the signal before it cuts them.
GRACEFUL_SHUTDOWN_S = 10


class Server(uvicorn.Server):
    """uvicorn's server; on the exit signal it also cancels the requests of ``runner``."""

    def __init__(self, config: uvicorn.Config, runner, on_started=None):
        super().__init__(config)
        self._runner = runner
        self._on_started = on_started

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)  # (exits with SystemExit when it cannot listen)
        if self._on_started is not None and not self.should_exit:
            self._on_started()

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            # uvicorn re-raises the signals it handled once it has shut down. SIGINT becomes
            # KeyboardInterrupt, which the CLI catches; SIGTERM would kill the process by the
            # signal (status -15) before the engine is closed and "server stopped" printed, though
            # the shutdown it asks for is done: it is dropped, and run() returns normally.
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

    def handle_exit(self, sig, frame) -> None:
        # A signal handler must not take locks the interrupted code may hold (the runner's, an
        # Event's): cancel from a thread of its own.
        threading.Thread(target=self._runner.close, name="swiftspec-serve-shutdown", daemon=True).start()
        super().handle_exit(sig, frame)


def serve(app, host: str, port: int, *, on_started=None, log_level: str = "info") -> None:
    """Serves ``app`` (from :func:`swiftspec.serve.app.create_app`) on ``host:port``; returns after
    a clean shutdown (on SIGTERM; on SIGINT uvicorn then re-raises it: KeyboardInterrupt).
    ``on_started()`` is called once it listens.

    Raises:
        SystemExit: it cannot listen (the port is taken, the address is not this machine's);
            uvicorn has logged why.
    """
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    Server(config, app.state.server.runner, on_started).run()
