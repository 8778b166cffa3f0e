"""Runs the app under uvicorn until Ctrl-C (SIGINT) or SIGTERM; either shuts it down gracefully.

uvicorn's graceful shutdown waits for open responses to end; a reply being streamed would keep
it waiting for the whole reply. So the signal first cancels every queued and running request
(each streamed reply ends with an error event "the server is shutting down" and ``[DONE]``), then
uvicorn shuts down as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from . import REQUEST_TIMEOUT_S

#: Seconds uvicorn waits for open connections after the signal before it cuts them.
GRACEFUL_SHUTDOWN_S = 10


class _TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's arrival (issue 28): uvicorn times
    out only idle keep-alive connections, after a response, so a client that connected and sent
    nothing, or its headers a byte at a time, held its connection (a file descriptor, a slot of
    the open-file limit) for ever. The timer starts when the connection opens and again when the
    first byte of a later request on it arrives; it stops once the request's whole body is in.
    When it fires the connection is closed (no response can be framed for a request h11 has not
    parsed; the ASGI app, if it was reading the body, sees the client disconnect)."""

    request_timeout: float = REQUEST_TIMEOUT_S

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._request_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._request_timer = self.loop.call_later(self.request_timeout, self._request_timed_out)

    def _disarm(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _request_timed_out(self) -> None:
        self._request_timer = None
        if not self.transport.is_closing():
            self.logger.info(
                "%s: request not received within %gs, connection closed",
                "%s:%d" % self.client if self.client else "client",
                self.request_timeout,
            )
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._request_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # a later request on a kept-alive connection begins
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the whole request is in (DONE), or the connection is over

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


def make_config(
    app, host: str, port: int, *, log_level: str = "info", request_timeout: float = REQUEST_TIMEOUT_S
) -> uvicorn.Config:
    """The uvicorn configuration :func:`serve` runs ``app`` with: the h11 protocol with the request
    deadline ``request_timeout`` (seconds), the graceful-shutdown bound, and h11's own cap on
    incomplete request heads (16 KiB)."""
    protocol = type("TimedH11Protocol", (_TimedH11Protocol,), {"request_timeout": float(request_timeout)})
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, http=protocol, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S
    )


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


def serve(
    app, host: str, port: int, *, on_started=None, log_level: str = "info", request_timeout: float = REQUEST_TIMEOUT_S
) -> None:
    """Serves ``app`` (from :func:`swiftspec.serve.app.create_app`) on ``host:port``; returns after
    a clean shutdown (on SIGTERM; on SIGINT uvicorn then re-raises it: KeyboardInterrupt).
    ``on_started()`` is called once it listens. A request whose headers and body have not all
    arrived ``request_timeout`` seconds after its first byte (or the connection's opening) has its
    connection closed.

    Raises:
        SystemExit: it cannot listen (the port is taken, the address is not this machine's);
            uvicorn has logged why.
    """
    config = make_config(app, host, port, log_level=log_level, request_timeout=request_timeout)
    Server(config, app.state.server.runner, on_started).run()
