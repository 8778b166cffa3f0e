"""`swiftspec serve` on the real 0.5B model (target alone; the 0.5B as its own draft for the
serial test): the OpenAI-compatible API answers what Engine.generate answers, SSE framed as
OpenAI's; the page has what its script uses; one request decodes at a time, one more waits
(max_waiting=1) and a third gets 503; a client that leaves cancels its reply; every bad request
is a 400 naming its field; and the real CLI serves and stops cleanly on SIGINT.

Through the ASGI app (Starlette's TestClient) where a whole response is enough; through a real
uvicorn server on 127.0.0.1 where the test needs a client that waits on a stream or leaves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from swiftspec.datasets import prompt_messages
from swiftspec.engine import Engine
from swiftspec.serve.app import create_app

NAME = "qwen2.5-coder-0.5b-instruct"
CONTEXT = 512
MODEL_ID = "served-0.5b"


@pytest.fixture(scope="module")
def engine(checkpoint_dir):
    with Engine(checkpoint_dir(NAME, "bfloat16"), max_context=CONTEXT) as engine:
        yield engine


@pytest.fixture(scope="module")
def messages(mtbench):
    """A real prompt (MT-Bench, writing) the 0.5B answers at length: 16 tokens end by "length"."""
    return prompt_messages("mtbench", mtbench[6])


@pytest.fixture(scope="module")
def reference(engine, messages):
    """Engine.generate's greedy reply to ``messages``, 16 tokens: what the API must answer."""
    return engine.generate(messages, max_new_tokens=16)


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine, model_id=MODEL_ID, max_waiting=1)) as client:
        yield client


def _chat(client, body, **kw):
    return client.post("/v1/chat/completions", json=body, **kw)


def _sse_events(text: str) -> list[str]:
    """The data of each event, checking the framing: every event is one `data: ` line ended by a
    blank line, and nothing else is in the body."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
    return [e[len("data: ") :] for e in events]


@contextlib.contextmanager
def _running_server(app):
    """`app` served by uvicorn (swiftspec's Server) on a free loopback port, in a thread."""
    import uvicorn

    from swiftspec.serve.server import Server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"), app.state.server.runner)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# ------------------------------------------------------------------------ page, health, models
def test_page_has_the_elements_its_script_uses(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    used = set(re.findall(r'\$\("([\w-]+)"\)', page))
    ids = set(re.findall(r'\bid="([\w-]+)"', page))
    assert {"messages", "prompt", "send", "stop", "max-tokens", "temperature", "top-p", "mode", "api-key"} <= used
    assert used <= ids, f"the script uses ids the page lacks: {sorted(used - ids)}"
    # self-contained: no script, style or image fetched from elsewhere; the one resource is the icon
    assert re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="([^"]*)"', page) == ["/favicon.svg"]
    assert "/v1/chat/completions" in page and "/v1/models" in page and "AbortController" in page
    # both API calls send the key when one is entered (a server with --api-key refuses them without)
    assert '{"Authorization": "Bearer " + key}' in page and page.count("headers: headers(") == 2


def test_favicon_is_served(client):
    """The page's icon is the server's own (no 404 in the browser's console): /favicon.svg, and
    /favicon.ico, which browsers ask for by themselves, redirects to it."""
    from importlib import resources

    icon = client.get("/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.content == resources.files("swiftspec.serve").joinpath("favicon.svg").read_bytes()
    assert icon.content.startswith(b"<svg ") and b"<script" not in icon.content
    moved = client.get("/favicon.ico", follow_redirects=False)
    assert moved.status_code == 301 and moved.headers["location"] == "/favicon.svg"
    assert client.get("/favicon.ico").content == icon.content


def test_health_and_models(client, engine):
    assert client.get("/health").json() == {
        "status": "ok",
        "model": MODEL_ID,
        "running": 0,
        "waiting": 0,
        "max_waiting": 1,
        "ended": {"done": 0, "cancelled": 0, "error": 0},
    }
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and len(models["data"]) == 1
    m = models["data"][0]
    assert m["id"] == MODEL_ID and m["object"] == "model" and m["owned_by"] == "swiftspec"
    assert m["swiftspec"] == {
        "draft": None,
        "modes": ["target"],
        "default_mode": "target",
        "max_context": CONTEXT,
        "tree_budget": 16,
        "max_tree": 254,
        "defaults": {"max_tokens": 256, "temperature": 1.0, "top_p": 1.0},
    }


# --------------------------------------------------------------------------- completions
def test_completion_equals_engine_generate(client, engine, messages, reference):
    r = _chat(client, {"model": MODEL_ID, "messages": messages, "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL_ID
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", body["id"]) and abs(body["created"] - time.time()) < 60
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": reference.text},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    n_prompt = len(engine.encode_prompt(messages))
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 16, "total_tokens": n_prompt + 16}
    stats = body["swiftspec"]
    assert stats["mode"] == "target" and stats["tree_budget"] is None and stats["seed"] is None
    assert stats["acceptance_length"] is None and stats["draft_steps"] == 0 and stats["verification_steps"] == 15
    assert 0 < stats["ttft_s"] < 60 and stats["tokens_per_s"] > 0
    assert stats["tokens_per_s"] == pytest.approx(15 / stats["decode_s"])


def test_stream_equals_engine_generate_with_openai_framing(client, messages, reference):
    r = _chat(
        client,
        {
            "messages": messages,
            "max_tokens": 16,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [c["choices"][0]["delta"]["content"] for c in chunks[1:-2]]
    assert len(pieces) > 3 and all(pieces) and "".join(pieces) == reference.text
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    last, usage_chunk = chunks[-2], chunks[-1]
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert last["swiftspec"]["mode"] == "target" and last["swiftspec"]["ttft_s"] > 0
    n_prompt = len(reference.prompt_token_ids)
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == {
        "prompt_tokens": n_prompt,
        "completion_tokens": 16,
        "total_tokens": n_prompt + 16,
    }
    # without include_usage there is no usage-only chunk
    plain = [
        json.loads(e)
        for e in _sse_events(
            _chat(client, {"messages": messages, "max_tokens": 2, "temperature": 0, "stream": True}).text
        )[:-1]
    ]
    assert all(c["choices"] for c in plain)


def test_stop_strings(client, engine, messages, reference):
    """The reply ends before the first stop string, streamed or not; usage counts the tokens
    decoded up to the one that completed it."""
    stop = reference.text[30:34]  # inside the reply, past its first tokens
    cut_text = reference.text[: reference.text.find(stop)]
    decoded = [engine.tokenizer.decode(reference.token_ids[:n], skip_special_tokens=True) for n in range(17)]
    needed = next(n for n in range(17) if stop in decoded[n])
    body = {"messages": messages, "max_tokens": 16, "temperature": 0, "stop": [stop, "never appears"]}
    r = _chat(client, body).json()
    assert r["choices"][0]["message"]["content"] == cut_text and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == needed < 16
    chunks = [json.loads(e) for e in _sse_events(_chat(client, {**body, "stop": stop, "stream": True}).text)[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == cut_text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_sampling_with_a_seed_is_reproducible(client, engine, mtbench):
    messages = prompt_messages("mtbench", mtbench[5])
    reference = engine.generate(messages, max_new_tokens=6, temperature=0.8, top_p=0.9, seed=7)
    body = {"messages": messages, "max_tokens": 6, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    r = _chat(client, body).json()
    assert r["choices"][0]["message"]["content"] == reference.text and r["swiftspec"]["seed"] == 7
    # without a seed each request draws one, and reports it
    seeded = _chat(client, {**body, "seed": None, "max_tokens": 1}).json()["swiftspec"]["seed"]
    assert isinstance(seeded, int) and seeded >= 0


def test_a_default_tree_budget_beyond_the_tree_kv_is_refused_at_start():
    """Before: the server started, then refused every speculative request that did not set its own
    tree_budget, naming swiftspec.tree_budget, a field the client had not sent."""
    from pathlib import Path
    from types import SimpleNamespace

    from swiftspec.errors import InvalidRequestError

    fake = SimpleNamespace(
        target_dir=Path("t"),
        draft_dir=Path("d"),
        has_draft=True,
        target_model=SimpleNamespace(max_tree=18),
        draft_model=SimpleNamespace(max_tree=20),
    )
    assert create_app(fake, tree_budget=16).state.server.tree_budget == 16
    with pytest.raises(
        InvalidRequestError,
        match=r"^tree_budget 17 exceeds the tree KV capacity of the models: at "
        r"most 16$",
    ):
        create_app(fake, tree_budget=17)
    no_draft = SimpleNamespace(**{**vars(fake), "has_draft": False, "draft_dir": None, "draft_model": None})
    create_app(no_draft, tree_budget=17)  # no draft: no tree is ever verified


def test_serial_speculation_with_a_draft(checkpoint_dir, messages, reference):
    """The 0.5B as its own draft: serial speculation answers the target-only greedy text, and
    reports its acceptance length and tree budget."""
    ckpt = checkpoint_dir(NAME, "bfloat16")
    with Engine(ckpt, ckpt, max_context=CONTEXT) as pair, TestClient(create_app(pair)) as client:
        models = client.get("/v1/models").json()["data"][0]
        assert models["swiftspec"]["modes"] == ["auto", "target", "serial", "async"]
        assert models["swiftspec"]["default_mode"] == "auto"
        r = _chat(
            client,
            {
                "messages": messages,
                "max_tokens": 16,
                "temperature": 0,
                "swiftspec": {"mode": "serial", "tree_budget": 4},
            },
        ).json()
    assert r["choices"][0]["message"]["content"] == reference.text
    stats = r["swiftspec"]
    assert stats["mode"] == "serial" and stats["tree_budget"] == 4 and stats["draft_steps"] > 0
    assert stats["acceptance_length"] > 1.5  # the draft is the target: most proposals are accepted
    assert stats["verification_steps"] < 15


# ------------------------------------------------------------------------------ bad input
_MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "body,param,message",
    [
        (b"{not json", None, "the request body is not JSON"),
        (b"\xff\xfe", None, "the request body is not JSON"),
        ([1, 2], None, "the request body must be a JSON object, got list"),
        ({}, "messages", "messages is missing"),
        ({"messages": []}, "messages", "messages must be a non-empty list"),
        ({"messages": "hi"}, "messages", "messages must be a non-empty list"),
        (
            {"messages": [{"role": "bot", "content": "x"}]},
            "messages",
            f"messages[0] has the role 'bot', which the chat template of {MODEL_ID} does not take",
        ),
        ({"messages": [{"role": "user"}]}, "messages", "messages[0] has no 'content'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages",
            "messages[0].content[0] must be a text part",
        ),
        ({"messages": _MSG, "temperature": -1}, "temperature", "temperature must be a finite number >= 0, got -1"),
        ({"messages": _MSG, "temperature": "hot"}, "temperature", "temperature must be a number, got 'hot'"),
        ({"messages": _MSG, "temperature": 0.5, "top_p": 1.5}, "top_p", "top_p must be in (0, 1], got 1.5"),
        ({"messages": _MSG, "temperature": 0, "top_p": 0.5}, "top_p", "top_p=0.5 has no effect under greedy decoding"),
        ({"messages": _MSG, "seed": -3}, "seed", "seed must be an integer >= 0, got -3"),
        ({"messages": _MSG, "max_tokens": 0}, "max_tokens", "max_tokens must be an integer >= 1, got 0"),
        ({"messages": _MSG, "max_tokens": 8.5}, "max_tokens", "max_tokens must be an integer >= 1, got 8.5"),
        (
            {"messages": _MSG, "max_tokens": 4096},
            "max_tokens",
            f"max_tokens 4096 does not fit: the messages take 30 of "
            f"the context's {CONTEXT} tokens, leaving {CONTEXT - 30}",
        ),
        ({"messages": _MSG, "max_tokens": 8, "max_completion_tokens": 9}, "max_completion_tokens", "differ"),
        ({"messages": _MSG, "stop": ""}, "stop", "stop must be a non-empty string or a list of non-empty strings"),
        ({"messages": _MSG, "stop": ["a", 3]}, "stop", "stop must be a non-empty string or a list"),
        ({"messages": _MSG, "stream": "yes"}, "stream", "stream must be true or false"),
        (
            {"messages": _MSG, "stream_options": {"include_usage": True}},
            "stream_options",
            "applies to stream=true only",
        ),
        (
            {"messages": _MSG, "swiftspec": {"mode": "fast"}},
            "swiftspec.mode",
            "swiftspec.mode must be one of auto, target, serial, async, got 'fast'",
        ),
        (
            {"messages": _MSG, "swiftspec": {"mode": "serial"}},
            "swiftspec.mode",
            "swiftspec.mode 'serial' needs a draft model; this server has none",
        ),
        (
            {"messages": _MSG, "swiftspec": {"tree_budget": 8}},
            "swiftspec.tree_budget",
            "has no effect in mode 'target'",
        ),
        ({"messages": _MSG, "swiftspec": {"depth": 3}}, "swiftspec.depth", "unknown field swiftspec.depth"),
        (
            {"messages": _MSG, "temperature": 0, "swiftspec": {"top_k": 5}},
            "swiftspec.top_k",
            "swiftspec.top_k=5 has no effect under greedy",
        ),
        ({"messages": _MSG, "n": 2}, "n", "n=2 is not supported by this server"),
        ({"messages": _MSG, "logprobs": True}, "logprobs", "logprobs=True is not supported"),
        ({"messages": _MSG, "frequency_penalty": 0.5}, "frequency_penalty", "is not supported"),
        ({"messages": _MSG, "temprature": 0}, "temprature", "unknown field 'temprature'"),
        (
            {"messages": _MSG, "model": "gpt-4o"},
            "model",
            f"model 'gpt-4o' is not served here; this server serves '{MODEL_ID}'",
        ),
        # found by an adversarial pass: each was a 200 (silently dropped or ignored) or a 500
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "max_tokens": 2}',
            "max_tokens",
            "the request body has the key 'max_tokens' twice in one object; give it once",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "temperature": 1}',
            "temperature",
            "has the key 'temperature' twice",
        ),
        pytest.param(
            b"[" * 100_000 + b"]" * 100_000,
            None,
            "the request body nests lists and objects deeper than 32 levels",
            id="nested-100000-deep",
        ),
        pytest.param(
            b'{"messages": [{"role": "user", "content": "hi"}], "model": ' + b"[" * 900 + b"]" * 900 + b"}",
            None,
            "nests lists and objects deeper than 32 levels",
            id="model-nested-900-deep",
        ),
        (
            {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
            "messages",
            "messages[0].name is not supported by this server (a message takes role and content)",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}, *_MSG]},
            "messages",
            "messages[0].tool_calls is not supported",
        ),
        (
            {"messages": _MSG, "stop": [f"s{i}" for i in range(17)]},
            "stop",
            "stop has 17 strings; this server takes at most 16",
        ),
        (
            {"messages": _MSG, "stop": ["ok", "x" * 100_000]},
            "stop",
            "stop[1] has 100000 characters; this server takes at most 256 per stop string",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["ok", "\\udc00"]}',
            "stop",
            "stop[1] is not valid text: surrogates not allowed at position 0",
        ),
        (
            b'{"messages": [{"role": "user", "content": "caf\\udce9"}]}',
            "messages",
            "messages[0].content is not valid text: surrogates not allowed at position 3",
        ),
        (
            {"messages": [{"role": "user", "content": "word " * 600}]},
            "messages",
            f"which leaves no room for a reply in the context of {CONTEXT} tokens",
        ),
    ],
)
def test_bad_requests_are_400_naming_the_field(client, body, param, message):
    content = body if isinstance(body, bytes) else json.dumps(body)
    r = client.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert message in error["message"], error["message"]
    assert "Traceback" not in r.text and "/root" not in r.text and "/home" not in r.text


def test_openai_options_at_their_no_effect_values_are_accepted(client):
    """What OpenAI clients send by default passes: n 1, zero penalties, nulls, a user id, the
    developer role, text parts, max_completion_tokens."""
    r = _chat(
        client,
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]},
            ],
            "max_completion_tokens": 1,
            "temperature": 0,
            "n": 1,
            "presence_penalty": 0,
            "frequency_penalty": 0.0,
            "logprobs": False,
            "tools": None,
            "top_p": None,
            "user": "u1",
            "seed": 3,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1


def test_wrong_path_and_method_are_json_errors(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"] == "GET /v1/nothing: Not Found"
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and "Method Not Allowed" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "headers", [{"Content-Type": "text/plain"}, {}, {"Content-Type": "application/x-www-form-urlencoded"}]
)
def test_a_body_not_sent_as_json_is_415(client, headers):
    """text/plain or no type at all is what a page on another site can POST here without the
    browser asking first (no CORS preflight): refused, so no site spends the engine unasked."""
    body = json.dumps({"messages": _MSG, "max_tokens": 1, "temperature": 0})
    r = client.post("/v1/chat/completions", content=body, headers=headers)
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert error["message"] == (
        "the request body must be JSON with the header 'Content-Type: application/json', got "
        + (repr(headers["Content-Type"]) if headers else "no Content-Type")
    )
    r = client.post("/v1/chat/completions", content=body, headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1


def test_oversized_bodies_are_413_before_they_are_read(engine):
    """A body over --max-body-bytes is refused from its Content-Length alone (50 MB announced, a
    few bytes sent: the answer comes at once), or while a chunked one arrives; 100k messages
    (3 MB) are refused too. The server then answers normally."""
    with _running_server(create_app(engine, max_body_bytes=1 << 20)) as url:
        host, port = url.rsplit("/", 1)[1].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 50000000\r\n\r\n{"messages": ['
            )
            reply = b""
            while b"}}" not in reply:
                chunk = sock.recv(65536)
                assert chunk, reply
                reply += chunk
        head, body = reply.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert json.loads(body)["error"] == {
            "message": "the request body is 50000000 bytes; this server takes at most 1048576 (swiftspec serve "
            "--max-body-bytes)",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
        many = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            json={"messages": [{"role": "user", "content": ""}] * 100_000, "max_tokens": 1},
        )
        assert many.status_code == 413 and many.json()["error"]["code"] == "request_too_large"
        r = httpx.post(
            f"{url}/v1/chat/completions", timeout=60, json={"messages": _MSG, "max_tokens": 2, "temperature": 0}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    with TestClient(create_app(engine, max_body_bytes=1000)) as small:  # chunked: no Content-Length
        r = small.post(
            "/v1/chat/completions",
            headers={"Content-Type": "application/json"},
            content=iter([b'{"messages": [{"role": "user", "content": "', b"x" * 2000, b'"}]}']),
        )
        assert r.status_code == 413
        assert r.json()["error"]["message"] == (
            "the request body is more than 1000 bytes; this server takes at most "
            "1000 (swiftspec serve --max-body-bytes)"
        )


def test_a_client_that_leaves_before_its_whole_body_is_no_server_error(engine, caplog):
    """Before: starlette's ClientDisconnect reached the app's 500 handler and uvicorn, two
    tracebacks in the server's log for a client that merely went away."""
    with _running_server(create_app(engine)) as url:
        host, port = url.rsplit("/", 1)[1].split(":")
        with caplog.at_level(logging.INFO), socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 500\r\n\r\n{"messages": ['
            )
            time.sleep(0.3)
        time.sleep(0.5)  # the server notices the disconnect
        assert httpx.get(f"{url}/health", timeout=10).json()["ended"] == {"done": 0, "cancelled": 0, "error": 0}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_long_conversation_is_rendered_off_the_event_loop(engine, monkeypatch):
    """Rendering 30k messages (just under 1 MB) through the chat template takes seconds; meanwhile
    the server answers /health (before: its event loop was blocked until the prompt was refused).
    The rendering is held until /health has answered, so the test does not depend on the machine's
    speed: rendered on the event loop, /health would time out."""
    entered, release = threading.Event(), threading.Event()
    render = engine.tokenizer.apply_chat_template

    def held(messages, *args, **kwargs):
        entered.set()
        release.wait(60)
        return render(messages, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "apply_chat_template", held)
    with _running_server(create_app(engine)) as url:
        done = {}

        def big():
            done["big"] = httpx.post(
                f"{url}/v1/chat/completions", timeout=120, json={"messages": [{"role": "user", "content": ""}] * 30_000}
            )

        thread = threading.Thread(target=big)
        thread.start()
        try:
            assert entered.wait(60), "the request never reached the rendering"
            assert httpx.get(f"{url}/health", timeout=10).json()["running"] == 0
        finally:
            release.set()
            thread.join(120)
        r = done["big"]
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_tokenizing_a_huge_message_leaves_the_event_loop_free(engine, monkeypatch):
    """One 4 MB message takes seconds to tokenize (2.5 s here); /health answers meanwhile. Before:
    though the prompt was tokenized on a worker thread, the tokenizers library held the GIL for
    the whole text, and /health waited until it was done. /health is asked once the chat template
    has rendered, i.e. while the text is being tokenized; timed from then (the test's own thread
    may get the GIL back only when the tokenizer lets go of it)."""
    rendered, rendered_at = threading.Event(), []
    render = engine.tokenizer.apply_chat_template

    def signalled(messages, *args, **kwargs):
        text = render(messages, *args, **kwargs)
        rendered_at.append(time.monotonic())
        rendered.set()
        return text

    monkeypatch.setattr(engine.tokenizer, "apply_chat_template", signalled)
    with _running_server(create_app(engine, max_body_bytes=8 << 20)) as url:
        done = {}

        def big():
            done["big"] = httpx.post(
                f"{url}/v1/chat/completions",
                timeout=120,
                json={"messages": [{"role": "user", "content": "word " * 800_000}]},
            )

        thread = threading.Thread(target=big)
        thread.start()
        try:
            assert rendered.wait(60), "the request never reached the tokenizer"
            health = httpx.get(f"{url}/health", timeout=30)
            took = time.monotonic() - rendered_at[0]
            tokenizing = "big" not in done
        finally:
            thread.join(120)
    assert health.status_code == 200 and health.json()["running"] == 0
    assert took < 1.0 and tokenizing, f"/health answered {took:.2f} s after the rendering; the big request " + (
        "was still being tokenized" if tokenizing else "was answered first"
    )
    r = done["big"]
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        f"the messages take 800030 tokens, which leaves no room for a reply in the context of {CONTEXT} tokens"
    )


# ------------------------------------------------------------------------- API key, Host check
KEY = "sk-Test_key.123"
_LOOPBACK = ["localhost", "127.0.0.1", "::1"]


@pytest.fixture(scope="module")
def keyed(engine):
    with TestClient(create_app(engine, model_id=MODEL_ID, api_key=KEY)) as client:
        yield client


def _refusal(code: str, message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


_MISSING = "this server needs an API key: send the header 'Authorization: Bearer <key>'"
_WRONG = "the API key is not this server's (Authorization: Bearer <key>)"
_MALFORMED = "the Authorization header must be 'Bearer <key>' (one header)"


@pytest.mark.parametrize(
    "authorization,code,message",
    [
        (None, "missing_api_key", _MISSING),
        (f"Bearer {KEY}x", "invalid_api_key", _WRONG),
        (f"Bearer {KEY[:-1]}", "invalid_api_key", _WRONG),
        (f"Bearer {KEY.lower()}", "invalid_api_key", _WRONG),
        ("Bearer ключ".encode(), "invalid_api_key", _WRONG),
        (KEY, "invalid_authorization", _MALFORMED),
        (f"Basic {KEY}", "invalid_authorization", _MALFORMED),
        ("Bearer ", "invalid_authorization", _MALFORMED),
        ("", "invalid_authorization", _MALFORMED),
    ],
)
def test_v1_without_the_api_key_is_401(keyed, authorization, code, message):
    """Every /v1 path, before the body is read (this one would be answered): 401, OpenAI's error
    object telling a missing header from a wrong key, and WWW-Authenticate: Bearer."""
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/v1/nothing")]:
        r = keyed.request(method, path, headers=headers, json={"messages": _MSG, "max_tokens": 1, "temperature": 0})
        assert r.status_code == 401 and r.json() == _refusal(code, message), (path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert KEY not in r.text


def test_the_api_key_opens_v1_and_health_and_the_page_stay_open(keyed):
    for auth in (f"Bearer {KEY}", f"bearer  {KEY} "):  # the scheme is case-insensitive (RFC 7235)
        r = _chat(keyed, {"messages": _MSG, "max_tokens": 1, "temperature": 0}, headers={"Authorization": auth})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
        r = keyed.get("/v1/models", headers={"Authorization": auth})
        assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL_ID
    assert keyed.get("/health").json()["status"] == "ok"
    assert keyed.get("/").status_code == 200


def test_api_keys_are_compared_in_constant_time(keyed, monkeypatch):
    import hmac

    compare, calls = hmac.compare_digest, []

    def spy(a, b):
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert keyed.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert keyed.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert calls == [(b"wrong", KEY.encode()), (KEY.encode(), KEY.encode())]


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8000",
        "LocalHost:8000",
        "127.0.0.1",
        "127.0.0.1:8000",
        "[::1]",
        "[::1]:8000",
        "[0:0::1]:80",
    ],
)
def test_loopback_hosts_are_answered(engine, host):
    with TestClient(create_app(engine, model_id=MODEL_ID, allowed_hosts=_LOOPBACK)) as client:
        assert client.get("/health", headers={"Host": host}).status_code == 200
        assert client.get("/v1/models", headers={"Host": host}).json()["data"][0]["id"] == MODEL_ID


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8000",
        "localhost.evil.example",
        "127.0.0.1.nip.io:8000",
        "127.0.0.2",
        "[::2]:8000",
        "localhost:99999",
        "localhost:x",
        "",
        "local host",
    ],
)
def test_other_hosts_are_421_against_dns_rebinding(engine, host):
    """A page whose name was rebound to 127.0.0.1 reaches the server with its own name as Host:
    refused on every path, before the API key is looked at, with a JSON error naming the Host."""
    with TestClient(create_app(engine, model_id=MODEL_ID, allowed_hosts=_LOOPBACK, api_key=KEY)) as client:
        for method, path in [("GET", "/"), ("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")]:
            r = client.request(
                method,
                path,
                headers={"Host": host, "Authorization": f"Bearer {KEY}"},
                json={"messages": _MSG, "max_tokens": 1},
            )
            assert r.status_code == 421, (path, r.text)
            assert r.json() == _refusal(
                "invalid_host",
                f"this server does not answer requests for the Host "
                f"{host!r}; it answers 127.0.0.1, ::1, localhost (swiftspec serve "
                "--allowed-hosts)",
            )


@pytest.mark.parametrize(
    "headers,status,message",
    [
        ([], 421, "this server does not answer requests without a Host header; it answers localhost"),
        (
            [(b"host", b"localhost"), (b"host", b"evil.example")],
            421,
            "this server does not answer requests with 2 Host headers; it answers localhost",
        ),
        (
            [(b"host", b"localhost"), (b"authorization", b"Bearer k"), (b"authorization", b"Bearer k")],
            401,
            "the Authorization header must be 'Bearer <key>' (one header)",
        ),
        ([(b"host", b"localhost:8000"), (b"authorization", b"Bearer k")], None, None),
    ],
)
def test_no_host_or_repeated_headers_are_refused(headers, status, message):
    """Headers an HTTP client can send but TestClient cannot (none, or twice), as ASGI hands them over."""
    from swiftspec.serve.guard import Guard

    refusal = Guard(None, api_key="k", allowed_hosts=["localhost"]).refusal(
        {"type": "http", "path": "/v1/models", "headers": headers}
    )
    assert (refusal and (refusal.status, refusal.message.split(" (swiftspec")[0])) == (status and (status, message))


def test_any_host_without_allowed_hosts_or_with_a_star(client, engine):
    assert client.get("/health", headers={"Host": "evil.example:8000"}).status_code == 200
    with TestClient(create_app(engine, allowed_hosts="localhost, *")) as star:
        assert star.get("/health", headers={"Host": "evil.example"}).status_code == 200


@pytest.mark.parametrize(
    "options,message",
    [
        ({"api_key": ""}, "the API key must not be empty"),
        (
            {"api_key": "two words"},
            "the API key may hold visible ASCII characters only (no spaces); character 4 of 9 is not one",
        ),
        ({"api_key": "clé"}, "character 3 of 3 is not one"),
        ({"allowed_hosts": "localhost,"}, "the allowed host '' is not a host name or IP address without a port"),
        (
            {"allowed_hosts": ["localhost:8000"]},
            "the allowed host 'localhost:8000' is not a host name or IP address "
            "without a port (give names such as localhost,my-host.lan; '*' for any)",
        ),
        ({"allowed_hosts": ["[::1]:80"]}, "the allowed host '[::1]:80' is not"),
    ],
)
def test_bad_api_key_or_allowed_hosts_are_refused_when_the_app_is_made(engine, options, message):
    from swiftspec.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as exc:
        create_app(engine, **options)
    assert message in str(exc.value)


# ------------------------------------------------------------- one at a time, cancellation
def test_runner_counts_a_job_before_its_last_event(monkeypatch):
    """The runner updates /health's counts before the request's handler hears the job's outcome, so
    a client holding its reply sees the job in ``ended`` and not ``running`` (the other way round,
    a clean-clone CI run saw ``done: 0`` right after a 200). Checked at the moment of the event,
    not by timing: deterministic."""
    import asyncio

    from swiftspec.serve.runner import EngineRunner, Job

    class Finished:
        finish_reason = "stop"

    class OneWordEngine:  # the runner's only use of an engine
        def generate(self, prompt_ids, on_text=None, cancel=None, **kwargs):
            on_text("word")
            return Finished()

    runner = EngineRunner(OneWordEngine(), max_waiting=0)
    at_last_event = []
    emit = Job._emit

    def recording_emit(job, kind, value):
        if kind != "text":
            at_last_event.append(runner.status())
        emit(job, kind, value)

    monkeypatch.setattr(Job, "_emit", recording_emit)

    async def one_job():
        job = runner.submit(asyncio.get_running_loop(), [1, 2, 3])
        return [kind async for kind, _ in job.events()]

    assert asyncio.run(one_job()) == ["text", "done"]
    assert at_last_event == [
        {"running": 0, "waiting": 0, "max_waiting": 0, "ended": {"done": 1, "cancelled": 0, "error": 0}}
    ]


def test_one_runs_one_waits_a_third_gets_503_and_leaving_cancels(engine, mtbench, messages, reference):
    """max_waiting=1: while a long stream runs, a second request waits and a third is refused
    with 503 and Retry-After; the streaming client leaves (as the page's Stop does), its reply is
    cancelled at once and the waiting request runs and answers correctly."""
    long_messages = prompt_messages("mtbench", mtbench[0])  # a travel blog post: hundreds of tokens
    short_messages = messages
    expected = engine.tokenizer.decode(reference.token_ids[:4], skip_special_tokens=True)
    with _running_server(create_app(engine, max_waiting=1)) as url, httpx.Client(base_url=url, timeout=120) as http:
        waiting_reply = {}

        def second():
            waiting_reply["r"] = httpx.post(
                f"{url}/v1/chat/completions",
                timeout=120,
                json={"messages": short_messages, "max_tokens": 4, "temperature": 0},
            )
            waiting_reply["at"] = time.monotonic()

        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            timeout=120,
            json={"messages": long_messages, "max_tokens": 460, "temperature": 0, "stream": True},
        ) as stream:
            lines = stream.iter_lines()
            for line in lines:  # until the first text: the long request is decoding
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    break
            thread = threading.Thread(target=second)
            thread.start()
            _wait_for(lambda: http.get("/health").json()["waiting"] == 1, 30, "the second request to wait")
            assert http.get("/health").json() == {
                "status": "ok",
                "model": engine.target_dir.name,
                "running": 1,
                "waiting": 1,
                "max_waiting": 1,
                "ended": {"done": 0, "cancelled": 0, "error": 0},
            }
            busy = http.post("/v1/chat/completions", json={"messages": short_messages, "max_tokens": 4})
            assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
            assert busy.json()["error"]["code"] == "busy"
            assert "1 request is running and 1 is waiting (at most 1 may wait)" in busy.json()["error"]["message"]
            left = time.monotonic()
        thread.join(60)
        # 460 tokens would take a minute and more here: the second request started at once
        assert waiting_reply["at"] - left < 15
        r = waiting_reply["r"]
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == expected
        assert r.json()["swiftspec"]["queue_s"] > 0  # it waited (health showed it waiting); how long is the machine's
        assert http.get("/health").json()["ended"] == {"done": 1, "cancelled": 1, "error": 0}
        assert http.get("/health").json()["running"] == 0


def test_a_non_streamed_client_that_leaves_cancels(engine, mtbench):
    long_messages = prompt_messages("mtbench", mtbench[0])
    with _running_server(create_app(engine, max_waiting=0)) as url, httpx.Client(base_url=url, timeout=120) as http:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            http.post(
                "/v1/chat/completions",
                json={"messages": long_messages, "max_tokens": 460, "temperature": 0},
                timeout=httpx.Timeout(120, read=3),
            )
        left = time.monotonic()
        _wait_for(lambda: http.get("/health").json()["running"] == 0, 10, "the reply to be cancelled")
        assert http.get("/health").json()["ended"] == {"done": 0, "cancelled": 1, "error": 0}
        r = http.post("/v1/chat/completions", json={"messages": _MSG, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert time.monotonic() - left < 15


def test_a_streamed_client_that_left_before_its_reply_started_cancels(engine, mtbench):
    """The client is gone by the time the streamed reply starts (it left while its prompt was being
    rendered off the event loop). Under an ASGI server of spec 2.4, `send` then raises OSError for
    the response's first message and Starlette never iterates the body generator, so a `finally`
    inside it never runs. Before: the job was not cancelled and the engine decoded the whole reply
    for no one, holding up every request behind it. Through the ASGI interface, with the event
    loop kept running while the job is watched (a closed loop would cancel the job by itself)."""
    import asyncio

    app = create_app(engine, max_waiting=0)
    runner = app.state.server.runner
    body = json.dumps(
        {"messages": prompt_messages("mtbench", mtbench[0]), "max_tokens": 460, "temperature": 0, "stream": True}
    ).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"x"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }

    async def client_that_left():
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():  # the body, then: the client has disconnected
            return pending.pop(0) if pending else {"type": "http.disconnect"}

        async def send(message):  # ASGI 2.4: sending on a closed connection raises an OSError
            raise ConnectionResetError("the client disconnected")

        with contextlib.suppress(Exception):  # (starlette's ClientDisconnect)
            await app(scope, receive, send)
        deadline = time.monotonic() + 15  # 460 tokens take a minute and more here
        while runner.status()["running"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return runner.status()

    status = asyncio.run(client_that_left())
    assert status["running"] == 0 and status["ended"] == {"done": 0, "cancelled": 1, "error": 0}, status


# ------------------------------------------------------------------------------------ CLI
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_serve_answers_and_stops_on_sigint_or_sigterm(checkpoint_dir, sig):
    """SIGINT (Ctrl-C) or SIGTERM while one reply streams and another waits: both clients are
    told the server is shutting down, and it exits with status 0 and no traceback (before, on
    SIGTERM: killed by the signal, -15, without closing the engine or saying it stopped)."""
    ckpt = checkpoint_dir(NAME, "bfloat16")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swiftspec.cli",
            "serve",
            "--target",
            str(ckpt),
            "--port",
            str(port),
            "--max-context",
            str(CONTEXT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "SWIFTSPEC_API_KEY"},
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            assert proc.poll() is None, proc.communicate()[1]
            try:
                return httpx.get(f"{url}/health", timeout=2).json()["status"] == "ok"
            except httpx.TransportError:
                return False

        _wait_for(up, 120, "swiftspec serve to listen")
        # bound to 127.0.0.1: another name for it (DNS rebinding) is refused
        rebound = httpx.get(f"{url}/health", timeout=10, headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 421 and rebound.json()["error"]["code"] == "invalid_host"
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=120,
            json={"model": ckpt.name, "messages": _MSG, "max_tokens": 3, "temperature": 0},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        replies = {}

        def waiting():
            replies["waiting"] = httpx.post(
                f"{url}/v1/chat/completions", timeout=60, json={"messages": _MSG, "max_tokens": 4, "temperature": 0}
            )

        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            timeout=60,
            json={
                "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
                "max_tokens": 400,
                "temperature": 0,
                "stream": True,
            },
        ) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")  # streaming
            thread = threading.Thread(target=waiting)
            thread.start()
            _wait_for(lambda: httpx.get(f"{url}/health", timeout=5).json()["waiting"] == 1, 30, "a waiting request")
            proc.send_signal(sig)
            events = [line[len("data: ") :] for line in lines if line]
        thread.join(30)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    shutting_down = {
        "message": "the server is shutting down; the reply was cut short",
        "type": "server_error",
        "param": None,
        "code": "shutting_down",
    }
    assert events[-1] == "[DONE]" and json.loads(events[-2]) == {"error": shutting_down}
    assert replies["waiting"].status_code == 503 and replies["waiting"].json() == {"error": shutting_down}
    assert proc.returncode == 0, err
    assert f"[swiftspec] serving {ckpt.name}: chat page http://127.0.0.1:{port}/" in err
    assert err.rstrip().endswith("[swiftspec] server stopped") and "Traceback" not in err


def test_cli_serve_names_a_missing_extra_before_loading(monkeypatch, capsys, tmp_path):
    import swiftspec.serve
    from swiftspec.cli import main

    monkeypatch.setattr(swiftspec.serve, "missing_modules", lambda: ["uvicorn"])
    assert main(["serve", "--target", str(tmp_path / "never-loaded")]) == 2
    err = capsys.readouterr().err
    # the pin the command names is pyproject's (read from the installed package's metadata)
    pin = next(d for d in _pyproject()["project"]["dependencies"] if d.startswith("uvicorn=="))
    assert err == (
        "swiftspec serve: error: the server needs uvicorn, which swiftspec depends on but which is not "
        f"installed: pip install '{pin}'\n"
    )


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))


def _cli_app(monkeypatch, engine, argv: list[str]):
    """The app ``swiftspec serve --target served ARGV`` serves (over the module's engine, which it
    must not close; nothing listens: the started callback is called at once)."""
    import swiftspec.cli.serve
    import swiftspec.serve.server
    from swiftspec.cli import main

    class Unclosable:
        def __getattr__(self, name):
            return getattr(engine, name)

        def close(self):
            pass

    apps = []

    def serve(app, host, port, on_started, request_timeout):
        app.state.request_timeout = request_timeout  # (its effect: tests/test_serve_timeouts.py)
        apps.append(app)
        on_started()

    monkeypatch.setattr(swiftspec.cli.serve, "load_engine", lambda args: Unclosable())
    monkeypatch.setattr(swiftspec.serve.server, "serve", serve)
    assert main(["serve", "--target", "served", *argv]) == 0
    return apps[0]


@pytest.mark.parametrize(
    "host,warned",
    [
        ("0.0.0.0", True),
        ("::", True),
        ("192.168.1.5", True),
        ("my-host.example", True),
        ("127.0.0.1", False),
        ("localhost", False),
        ("::1", False),
    ],
)
def test_cli_serve_warns_when_it_listens_beyond_this_machine(monkeypatch, capsys, engine, host, warned):
    """Beyond loopback anyone who reaches the port can use the API: no authentication, no TLS."""
    monkeypatch.delenv("SWIFTSPEC_API_KEY", raising=False)
    _cli_app(monkeypatch, engine, ["--host", host])
    err = capsys.readouterr().err
    shown = f"[{host}]" if ":" in host else host
    warning = (
        f"[swiftspec] warning: listening on {shown}, beyond this machine: the API has no authentication and "
        "no TLS; anyone who can reach this port can use the models and read the replies\n"
    )
    assert f"[swiftspec] serving served: chat page http://{shown}:8000/" in err
    assert (warning in err) == warned, err
    _cli_app(monkeypatch, engine, ["--host", host, "--api-key", KEY])
    err = capsys.readouterr().err
    warning = (
        f"[swiftspec] warning: listening on {shown}, beyond this machine: no TLS: the API key and the replies "
        "cross the network unencrypted\n"
    )
    assert "[swiftspec] the API needs the header 'Authorization: Bearer <key>'\n" in err and KEY not in err
    assert (warning in err) == warned and "no authentication" not in err, err


@pytest.mark.parametrize(
    "argv,env,key",
    [
        (["--api-key", "k1"], None, "k1"),
        ([], "k2", "k2"),
        (["--api-key", "k1"], "k2", "k1"),
        ([], "", None),  # set but empty: no key
        ([], None, None),
    ],
)
def test_cli_serve_takes_the_api_key_from_the_option_or_the_environment(monkeypatch, capsys, engine, argv, env, key):
    if env is None:
        monkeypatch.delenv("SWIFTSPEC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("SWIFTSPEC_API_KEY", env)
    with TestClient(_cli_app(monkeypatch, engine, argv), base_url="http://localhost:8000") as client:
        assert client.get("/v1/models").status_code == (200 if key is None else 401)
        for k in ("k1", "k2"):
            r = client.get("/v1/models", headers={"Authorization": f"Bearer {k}"})
            assert r.status_code == (200 if key in (None, k) else 401), k
    assert ("Authorization: Bearer <key>" in capsys.readouterr().err) == (key is not None)


@pytest.mark.parametrize(
    "argv,answered,refused",
    [
        ([], ["localhost:8000", "127.0.0.1:8000", "[::1]:8000"], ["evil.example:8000", "192.168.1.5:8000"]),
        (["--host", "127.0.0.2"], ["127.0.0.2:8000", "localhost:8000"], ["evil.example"]),
        (["--host", "::1"], ["[::1]:8000", "localhost"], ["evil.example"]),
        (["--allowed-hosts", "*"], ["localhost:8000", "evil.example:8000"], []),
        (["--host", "0.0.0.0"], ["evil.example:8000", "192.168.1.5"], []),
        (
            ["--host", "0.0.0.0", "--allowed-hosts", "My-Box.lan, 192.168.1.5"],
            ["my-box.lan:8000", "192.168.1.5"],
            ["localhost:8000", "evil.example"],
        ),
    ],
)
def test_cli_serve_checks_the_host_header(monkeypatch, engine, argv, answered, refused):
    """Bound to a loopback address: the loopback names (and the address bound) only; beyond it:
    any Host, unless --allowed-hosts names them."""
    with TestClient(_cli_app(monkeypatch, engine, argv)) as client:
        for host in answered:
            assert client.get("/health", headers={"Host": host}).status_code == 200, host
        for host in refused:
            r = client.get("/health", headers={"Host": host})
            assert r.status_code == 421 and r.json()["error"]["code"] == "invalid_host", host


def test_cli_serve_passes_its_request_timeout_to_the_server(monkeypatch, capsys, engine):
    from swiftspec.cli import main
    from swiftspec.serve import REQUEST_TIMEOUT_S

    assert _cli_app(monkeypatch, engine, []).state.request_timeout == REQUEST_TIMEOUT_S == 30
    assert _cli_app(monkeypatch, engine, ["--request-timeout", "2.5"]).state.request_timeout == 2.5
    capsys.readouterr()
    assert main(["serve", "--target", "never-loaded", "--request-timeout", "0"]) == 2
    assert capsys.readouterr().err == "swiftspec serve: error: --request-timeout must be > 0 seconds, got 0\n"


def test_cli_serve_names_a_bad_api_key_from_the_environment(monkeypatch, capsys, tmp_path):
    from swiftspec.cli import main

    monkeypatch.setenv("SWIFTSPEC_API_KEY", "my key")
    assert main(["serve", "--target", str(tmp_path / "never-loaded")]) == 2
    assert capsys.readouterr().err == (
        "swiftspec serve: error: SWIFTSPEC_API_KEY: the API key may hold visible ASCII "
        "characters only (no spaces); character 3 of 6 is not one\n"
    )


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--max-body-bytes", "0"], "--max-body-bytes must be >= 1, got 0"),
        (["--port", "0"], "--port must be in [1, 65535], got 0"),
        (["--max-waiting", "-1"], "--max-waiting must be >= 0, got -1"),
        (["--tree-budget", "0"], "--tree-budget must be >= 1, got 0"),
        (["--mode", "serial"], "--mode serial needs a draft model: give --draft (or drop --no-draft)"),
        (
            ["--draft", "d", "--no-draft", "--mode", "serial"],
            "--no-draft and --draft contradict each other: give one of them",
        ),
        (["--api-key", ""], "--api-key: the API key must not be empty"),
        (
            ["--api-key", "a key"],
            "--api-key: the API key may hold visible ASCII characters only (no spaces); character 2 of 5 is not one",
        ),
        (
            ["--allowed-hosts", "localhost:8000"],
            "--allowed-hosts: the allowed host 'localhost:8000' is not a host name "
            "or IP address without a port (give names such as localhost,my-host.lan; "
            "'*' for any)",
        ),
        (
            ["--allowed-hosts", "a,,b"],
            "--allowed-hosts: the allowed host '' is not a host name or IP address without a "
            "port (give names such as localhost,my-host.lan; '*' for any)",
        ),
    ],
)
def test_cli_serve_names_bad_options_before_loading(monkeypatch, capsys, tmp_path, extra, message):
    from swiftspec.cli import main

    monkeypatch.delenv("SWIFTSPEC_API_KEY", raising=False)
    assert main(["serve", "--target", str(tmp_path / "never-loaded"), *extra]) == 2
    assert capsys.readouterr().err == f"swiftspec serve: error: {message}\n"
