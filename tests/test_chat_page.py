"""The chat page of `swiftspec serve` in a real browser: Debian's chromium, driven by Playwright.

Against the real CLI (`swiftspec serve` on 127.0.0.1 with SmolLM2-135M, greedy, so its replies
are known): a message is sent, the reply streams into the page and is rendered (its code fence
becomes a code block holding exactly the code the API returns for the same request), Stop ends a
reply mid-stream (the server cancels it), and New chat starts a conversation of its own.

Against the same app over an echo engine (its reply is the user's message, streamed piece by piece
through the runner and the SSE stream like a model's): Markdown and hostile HTML in a reply, since
no real model can be made to write them on request. Nothing in a reply becomes an element the
renderer did not make: no <script>, <img>, event handler or javascript: link reaches the DOM.

Needs chromium (`apt-get install chromium`; .ci/run installs it) and Playwright (the test extra).
Where chromium cannot be installed at all, .ci/run sets SWIFTSPEC_NO_BROWSER to the reason and
these tests are skipped with it; otherwise a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from swiftspec.engine import GenerationResult
from swiftspec.serve.app import create_app

pytestmark = pytest.mark.browser

SMOL = "smollm2-135m-instruct"
TIMEOUT_MS = 120_000  # a reply of SmolLM2 on two busy cores takes seconds; loading it, more


# ---------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def browser():
    reason = os.environ.get("SWIFTSPEC_NO_BROWSER")
    if reason:
        pytest.skip(f"no browser on this platform: {reason}")
    chromium = shutil.which("chromium")
    assert chromium, (
        "Debian's chromium is not installed: apt-get install -y chromium (.ci/run does), or leave these "
        "tests out with -m 'not browser'"
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Playwright's own browser builds cannot be downloaded here: the system's chromium.
        browser = playwright.chromium.launch(executable_path=chromium)
        yield browser
        browser.close()


class ChatPage:
    """One browser tab on the chat page, recording what could go wrong unseen: HTTP errors (a
    missing favicon among them), console errors, uncaught exceptions; and the chat requests'
    bodies as the page sent them."""

    def __init__(self, browser, url: str):
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.sent: list[dict] = []
        page = self.page
        page.on("console", lambda m: self.problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))
        page.on("response", lambda r: self.problems.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
        page.on(
            "request",
            lambda r: self.sent.append(json.loads(r.post_data)) if r.url.endswith("/v1/chat/completions") else None,
        )
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        # the model line once GET /v1/models answered (the settings are the API's defaults from then on)
        # (the server is up before the page loads, so this is quick; a page that never gets there,
        # e.g. a failing GET /v1/models, says so with the problems seen instead of waiting out TIMEOUT_MS)
        try:
            page.wait_for_function("document.getElementById('model').textContent.includes('context')", timeout=30_000)
        except Exception as exc:
            raise AssertionError(f"the page never showed the model line: {self.problems}") from exc

    def send(self, text: str) -> None:
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def reply(self, n: int = -1):
        return self.page.locator(".msg.assistant").nth(n)

    def wait_for_reply_end(self) -> str:
        """Waits until the last reply has ended (its stats note or "stopped"); returns that note."""
        note = self.reply().locator(".stats, .error")
        note.wait_for()
        return note.text_content()

    def close(self) -> None:
        self.context.close()


@contextlib.contextmanager
def _chat_page(browser, url: str):
    page = ChatPage(browser, url)
    try:
        yield page
    finally:
        page.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# ------------------------------------------------------------ the real server, a real model
@pytest.fixture(scope="module")
def served(checkpoint_dir):
    """`swiftspec serve --target <SmolLM2-135M>` on a free loopback port: its base URL."""
    ckpt = checkpoint_dir(SMOL, "bfloat16")
    port = _free_port()
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
            "1024",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "SWIFTSPEC_API_KEY"},
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        assert proc.poll() is None, proc.communicate()[1]
        try:
            return httpx.get(f"{url}/health", timeout=2).json()["status"] == "ok"
        except httpx.TransportError:
            return False

    try:
        _wait_for(up, 120, "swiftspec serve to listen")
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_a_reply_streams_and_its_code_fence_is_a_code_block(browser, served):
    with _chat_page(browser, f"{served}/") as chat:
        page = chat.page
        page.fill("#temperature", "0")  # greedy: the reply is the model's one answer, asked again below
        page.fill("#max-tokens", "160")
        chat.send("Write a Python function that returns the sum of two numbers.")
        # streamed: text is in the page while the reply is still pending
        page.wait_for_function(
            "(() => { const m = document.querySelector('.msg.assistant.pending');"
            " return m !== null && m.querySelector('.body').textContent.length > 0; })()"
        )
        note = chat.wait_for_reply_end()
        assert re.fullmatch(r"\d+ tokens · TTFT \d+ ms · [\d.]+ tok/s · target( · stopped at max new tokens)?", note)
        body = chat.sent[0]
        assert body["messages"] == [
            {"role": "user", "content": "Write a Python function that returns the sum of two numbers."}
        ]
        assert body["temperature"] == 0 and body["max_tokens"] == 160 and "top_p" not in body
        # the same request without streaming: the text the page rendered
        answer = httpx.post(
            f"{served}/v1/chat/completions",
            timeout=120,
            json={k: v for k, v in body.items() if k not in ("stream", "stream_options")},
        ).json()
        text = answer["choices"][0]["message"]["content"]
        fences = re.findall(r"^```(\w*)\n(.*?)\n```$", text, flags=re.S | re.M)
        assert fences, f"SmolLM2's greedy reply has no code fence any more: {text!r}"
        blocks = chat.reply().locator("pre code")
        assert blocks.count() == len(fences)
        for i, (lang, code) in enumerate(fences):
            assert blocks.nth(i).text_content() == code
            assert blocks.nth(i).get_attribute("class") == (f"language-{lang}" if lang else None)
        # no fence markers left as text; the prose after the code is there (its `code` spans as code)
        shown = chat.reply().locator(".body").inner_text()
        prose = [
            line for line in re.sub(r"^```\w*\n.*?\n```$", "", text, flags=re.S | re.M).splitlines() if line.strip()
        ]
        assert "```" not in shown and prose and prose[0].replace("`", "") in shown
        assert chat.problems == []


def test_stop_ends_a_reply_mid_stream_and_new_chat_starts_over(browser, served):
    ended_before = httpx.get(f"{served}/health").json()["ended"]
    with _chat_page(browser, f"{served}/") as chat:
        page = chat.page
        page.fill("#max-tokens", "400")  # a minute of decoding here: Stop comes long before
        chat.send("Write a long story about a dragon.")
        page.wait_for_function(
            "(() => { const m = document.querySelector('.msg.assistant.pending');"
            " return m !== null && m.querySelector('.body').textContent.length >= 20; })()"
        )
        assert page.is_disabled("#send") and page.is_enabled("#stop") and page.is_disabled("#clear")
        page.click("#stop")
        assert chat.wait_for_reply_end() == "stopped"
        assert "pending" not in chat.reply().get_attribute("class")
        assert page.is_enabled("#send") and page.is_disabled("#stop") and page.is_enabled("#clear")
        stopped_text = chat.reply().locator(".body").inner_text()
        assert len(stopped_text) >= 20
        # the server cancelled it (within a decode step) and is free again
        _wait_for(lambda: httpx.get(f"{served}/health").json()["running"] == 0, 15, "the reply to be cancelled")
        ended = httpx.get(f"{served}/health").json()["ended"]
        assert ended["cancelled"] == ended_before["cancelled"] + 1 and ended["error"] == ended_before["error"]
        # the reply so far stays on the page until New chat, which clears it and the conversation
        page.click("#clear")
        assert page.locator("#messages > *").count() == 1 and page.locator("#messages > #empty").count() == 1
        page.fill("#max-tokens", "8")
        chat.send("Say hello.")
        note = chat.wait_for_reply_end()
        assert re.match(r"\d+ tokens · ", note), note
        assert page.locator(".msg").count() == 2
        # the new conversation is sent without the old one
        assert chat.sent[-1]["messages"] == [{"role": "user", "content": "Say hello."}]
        assert chat.sent[0]["messages"] == [{"role": "user", "content": "Write a long story about a dragon."}]
        assert chat.problems == []


# ---------------------------------------------------------------- hostile and Markdown replies
class EchoTokenizer:
    """Token ids are the characters' code points; the "chat template" is the last message."""

    source = "echo"

    def apply_chat_template(self, messages):
        return messages[-1]["content"]

    def encode(self, text):
        return [ord(c) for c in text]


class EchoEngine:
    """Stands in for :class:`swiftspec.Engine` where the server uses one: its reply to a
    conversation is the last message, given to ``on_text`` in pieces of 5 characters 40 ms apart,
    as a model's text is (the runner, the SSE stream and the page do the rest)."""

    target_dir = Path("echo")
    draft_dir = None
    has_draft = False
    draft_model = None
    target_model = type("Model", (), {"max_context": 1 << 16, "max_tree": 256})()
    tokenizer = EchoTokenizer()

    def context_length(self, mode="target"):
        return self.target_model.max_context

    def generate(self, prompt_ids, on_text=None, cancel=None, **kwargs):
        text = "".join(map(chr, prompt_ids))
        start = time.monotonic()
        finish = "stop"
        for i in range(0, len(text), 5):
            time.sleep(0.04)
            if (cancel is not None and cancel.is_set()) or on_text(text[i : i + 5]) is False:
                finish = "cancelled"
                break
        return GenerationResult(
            text=text,
            token_ids=list(prompt_ids),
            prompt_token_ids=list(prompt_ids),
            finish_reason=finish,
            ttft_s=0.02,
            decode_s=time.monotonic() - start,
        )


@pytest.fixture(scope="module")
def echo_url():
    """The app over an :class:`EchoEngine`, served by uvicorn on a free loopback port."""
    import uvicorn

    from swiftspec.serve.server import Server

    app = create_app(EchoEngine(), model_id="echo")
    port = _free_port()
    server = Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"), app.state.server.runner)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait_for(lambda: server.started, 30, "the server to start")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


HOSTILE = """<script>window.pwned = "script";</script>
<img src="/no-such-image" onerror="window.pwned = 'img'">
Some **bold**, *italic*, `inline <b>code</b>` and a [link](https://example.com/docs?a=1&b=2).
[bad](javascript:window.pwned='link') [data](data:text/html,<script>alert(1)</script>) [local](/v1/models)

```python
def f(x):
    return "<img src=x onerror=alert(1)>" * 2
```

1. first <iframe src="https://example.com"></iframe>
2. second
   - nested <svg onload="window.pwned='svg'"></svg>
"""


def test_markdown_in_a_reply_is_rendered_and_html_is_only_text(browser, echo_url):
    with _chat_page(browser, f"{echo_url}/") as chat:
        page = chat.page
        chat.send(HOSTILE)
        # while the reply streams, its fence, still open (part of the code to come), is already a code block
        page.wait_for_function(
            "(() => { const code = document.querySelector('.msg.assistant.pending pre code');"
            " return code !== null && code.textContent.startsWith('def f(x):') &&"
            " !code.textContent.endsWith(' * 2'); })()"
        )
        assert " · target · seed " in chat.wait_for_reply_end()  # (temperature 1: sampled, so a seed)
        body = chat.reply().locator(".body")
        # nothing of the reply became an element of its own, nothing ran
        injected = page.evaluate("""() => {
            const bad = document.querySelectorAll('#messages script, #messages img, #messages iframe, #messages svg');
            const handlers = [...document.querySelectorAll('#messages *')].filter(
                (e) => [...e.attributes].some((a) => a.name.startsWith('on')));
            return {elements: bad.length, handlers: handlers.length, pwned: window.pwned === undefined ? null : window.pwned};
        }""")
        assert injected == {"elements": 0, "handlers": 0, "pwned": None}
        # every element in the reply is one the renderer makes
        tags = set(page.evaluate("[...document.querySelectorAll('.msg.assistant .body *')].map((e) => e.tagName)"))
        assert tags == {"P", "STRONG", "EM", "CODE", "A", "DIV", "SPAN", "BUTTON", "PRE", "OL", "UL", "LI"}
        # the HTML is shown as the text it is
        text = body.inner_text()
        assert '<script>window.pwned = "script";</script>' in text and "<iframe src=" in text
        assert "<svg onload=" in text
        # Markdown: emphasis, inline code, one safe link; the others stay text
        assert body.locator("strong").first.text_content() == "bold"
        assert body.locator("em").first.text_content() == "italic"
        assert body.locator("p code").first.text_content() == "inline <b>code</b>"
        links = body.locator("a")
        assert links.count() == 1
        assert links.first.get_attribute("href") == "https://example.com/docs?a=1&b=2"
        assert links.first.get_attribute("rel") == "noopener noreferrer" and links.first.text_content() == "link"
        assert "[bad](javascript:window.pwned='link')" in text and "[local](/v1/models)" in text
        code = body.locator("pre code")
        assert code.count() == 1 and code.get_attribute("class") == "language-python"
        assert code.text_content() == 'def f(x):\n    return "<img src=x onerror=alert(1)>" * 2'
        assert body.locator(".code-head span").text_content() == "python"
        items = body.locator("ol > li")
        assert items.count() == 2 and items.nth(1).locator("ul > li").count() == 1
        # the user's own message is plain text too
        assert chat.page.locator(".msg.user .body").text_content() == HOSTILE
        # the request used the API's defaults, which the page showed
        sent = chat.sent[0]
        assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (1, 1, 256)
        assert page.input_value("#temperature") == "1" and "API's defaults" in page.text_content("#sampling-hint")
        # the icon: the page's own and /favicon.ico, which browsers ask for by themselves
        icon = page.evaluate("""async () => {
            const r = await fetch('/favicon.ico');
            return [r.status, r.redirected, r.headers.get('content-type'),
                    document.querySelector('link[rel=icon]').href];
        }""")
        assert icon == [200, True, "image/svg+xml", f"{echo_url}/favicon.svg"]
        assert chat.problems == []


@pytest.fixture(scope="module")
def renderer(browser, echo_url):
    """One chat page, for calling its renderer."""
    with _chat_page(browser, f"{echo_url}/") as chat:
        yield chat


@pytest.mark.parametrize(
    "markdown, html",
    [
        (
            "a *b* **c** `d` _e_ __f__ ***g***",
            "<p>a <em>b</em> <strong>c</strong> <code>d</code> <em>e</em> <strong>f</strong> <strong><em>g</em></strong></p>",
        ),
        ("snake_case_name, 2 * 3 * 4, a*b, **unclosed", "<p>snake_case_name, 2 * 3 * 4, a*b, **unclosed</p>"),
        ("**a *b* c** and *a **b** c*", "<p><strong>a <em>b</em> c</strong> and <em>a <strong>b</strong> c</em></p>"),
        ("\\*not\\* \\`code\\`", "<p>*not* `code`</p>"),
        ("``a ` b`` and `<&>`", "<p><code>a ` b</code> and <code>&lt;&amp;&gt;</code></p>"),
        ("line one\nline two\n\nnext", "<p>line one\nline two</p><p>next</p>"),
        ("# Title\n### Sub ###\n---", "<h1>Title</h1><h3>Sub</h3><hr>"),
        ("- a\n- b\n  - c\n- d", "<ul><li>a</li><li><p>b</p><ul><li>c</li></ul></li><li>d</li></ul>"),
        ("3. x\n4. y", '<ol start="3"><li>x</li><li>y</li></ol>'),
        (
            "~~~\n<b>\n~~~",
            '<div class="code"><div class="code-head"><span>code</span><button type="button">Copy</button>'
            "</div><pre><code>&lt;b&gt;</code></pre></div>",
        ),
        (
            "```c++ extra\nint x;",
            '<div class="code"><div class="code-head"><span>c++</span><button type="button">Copy'
            '</button></div><pre><code class="language-c++">int x;</code></pre></div>',
        ),
        (
            '```py"><img src=x onerror=alert(1)>\nx\n```',
            '<div class="code"><div class="code-head"><span>py</span><button '
            'type="button">Copy</button></div><pre><code class="language-py">x'
            "</code></pre></div>",
        ),
        (
            "[a](https://x.org/p(1)) [b](HTTPS://x.org) [c](ftp://x.org) [d]( javascript:alert(1) )",
            '<p>[a](https://x.org/p(1)) <a href="https://x.org/" rel="noopener noreferrer" target="_blank">b</a> '
            "[c](ftp://x.org) [d]( javascript:alert(1) )</p>",
        ),
        ("[**x** `y`](https://x.org/a b)", "<p>[<strong>x</strong> <code>y</code>](https://x.org/a b)</p>"),
        ("<b onmouseover=alert(1)>hi</b>", "<p>&lt;b onmouseover=alert(1)&gt;hi&lt;/b&gt;</p>"),
    ],
)
def test_the_markdown_subset(renderer, markdown, html):
    """renderMarkdown, the page's renderer, on each construct it takes and on what it must leave as
    text: the DOM it builds, serialized."""
    got = renderer.page.evaluate(
        "(text) => { const d = document.createElement('div');"
        " d.appendChild(renderMarkdown(text)); return d.innerHTML; }",
        markdown,
    )
    assert got == html
    assert renderer.problems == []
