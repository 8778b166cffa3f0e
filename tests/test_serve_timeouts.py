"""`swiftspec serve` closes a connection whose request does not arrive in time (issue 28): a client
that sends its headers (or its body) a byte at a time, or nothing at all, held its connection for
ever; 200 such clients stayed connected for a whole test. Real uvicorn servers on 127.0.0.1, with
a 1 s bound; the other clients are answered meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("uvicorn")

from swiftspec.serve.server import Server, make_config  # noqa: E402

TIMEOUT = 1.0
#: Scheduling slack on a busy 2-core machine (the timer fires on the server's event loop).
SLACK = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(app, server_cls, *args):
    port = _free_port()
    server = server_cls(make_config(app, "127.0.0.1", port, log_level="warning", request_timeout=TIMEOUT), *args)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def tiny_app(tmp_path_factory):
    """swiftspec's app over a tiny engine (the checkpoint of test_bad_input_files)."""
    from test_bad_input_files import write_checkpoint

    import swiftspec
    from swiftspec.serve.app import create_app

    engine = swiftspec.Engine(str(write_checkpoint(tmp_path_factory.mktemp("serve") / "tiny")))
    app = create_app(engine, model_id="tiny")
    with _serving(app, Server, app.state.server.runner) as port:
        yield port
    engine.close()


class SlowClient(threading.Thread):
    """Connects, sends ``fast`` at once, then ``head`` a byte every ``every`` seconds (then
    nothing), and records when the server closed the connection (seconds after connecting), or None
    if it was still open after ``give_up`` seconds."""

    def __init__(self, port: int, head: bytes, every: float = 0.1, give_up: float = TIMEOUT + 10, fast: bytes = b""):
        super().__init__(daemon=True)
        self.port, self.head, self.every, self.give_up, self.fast = port, head, every, give_up, fast
        self.closed_after: float | None = None
        self.reply = b""

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            start = time.monotonic()
            s.sendall(self.fast)
            s.settimeout(self.every)
            i = 0
            while time.monotonic() - start < self.give_up:
                if i < len(self.head):
                    try:
                        s.sendall(self.head[i : i + 1])
                    except OSError:
                        self.closed_after = time.monotonic() - start
                        return
                    i += 1
                try:
                    data = s.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.closed_after = time.monotonic() - start
                    return
                self.reply += data


def test_slow_and_silent_clients_are_disconnected_while_others_are_served(tiny_app):
    port = tiny_app
    endless_head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000
    body_head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"messages": ['
    )
    clients = (
        [SlowClient(port, endless_head) for _ in range(20)]
        + [SlowClient(port, b"") for _ in range(5)]
        + [SlowClient(port, b'"' + b"a" * 1000, fast=body_head) for _ in range(5)]
    )
    for c in clients:
        c.start()
    served = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        while any(c.is_alive() for c in clients):
            start = time.monotonic()
            r = http.get("/health")
            served.append((r.status_code, time.monotonic() - start))
            time.sleep(0.05)
    for c in clients:
        c.join()
    assert all(c.closed_after is not None for c in clients), [c.closed_after for c in clients]
    # The bound counts from the connection's opening; the headers or body still trickled in.
    assert all(TIMEOUT - 0.1 <= c.closed_after <= TIMEOUT + SLACK for c in clients), [c.closed_after for c in clients]
    assert all(c.reply == b"" for c in clients[:25])  # nothing was answered to a half-sent request
    assert len(served) >= 5 and all(status == 200 for status, _ in served)
    assert max(t for _, t in served) < SLACK


def test_a_request_that_arrives_in_time_is_answered_however_long_its_reply_takes():
    """The bound covers the request's arrival, not the reply: a 2 s reply is sent whole."""

    async def slow_app(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await asyncio_sleep(2 * TIMEOUT)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    import asyncio

    asyncio_sleep = asyncio.sleep
    import uvicorn

    with _serving(slow_app, uvicorn.Server) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            start = time.monotonic()
            first = http.post("/", content=b"x" * 100)
            second = http.post("/", content=b"y" * 100)  # the same kept-alive connection
        assert first.text == second.text == "ok" and time.monotonic() - start >= 4 * TIMEOUT
        # A later request on a kept-alive connection gets the bound again from its first byte.
        client = SlowClient(
            port,
            b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 500,
            every=0.05,
            fast=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        client.run()
        assert client.reply.startswith(b"HTTP/1.1 200") and client.reply.count(b"HTTP/1.1 200") == 1
        # first reply after 2 s, then the second request's bound (1 s from its first byte)
        assert client.closed_after is not None and 2 * TIMEOUT + 0.9 <= client.closed_after <= 3 * TIMEOUT + SLACK
