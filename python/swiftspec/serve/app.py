"""The ASGI app of ``swiftspec serve`` (Starlette): the chat page and an OpenAI-compatible API
over one loaded :class:`swiftspec.Engine`.

    GET  /                      the chat page (page.html: self-contained, no external resources)
    GET  /favicon.svg           the page's icon (favicon.svg); /favicon.ico redirects to it
    GET  /health                {"status": "ok", "model", "running", "waiting", "max_waiting",
                                "ended": {"done", "cancelled", "error"}} (replies so far, by outcome)
    GET  /v1/models             OpenAI's model list: the served model, with a "swiftspec" object
                                (draft, modes, default_mode, max_context, tree_budget, max_tree,
                                defaults: the max_tokens, temperature and top_p a request gets
                                when it leaves them out)
    POST /v1/chat/completions   OpenAI chat completions (openai_schema.py: fields, extras, stats)

One request decodes at a time (runner.py); up to ``max_waiting`` more wait in arrival order, and
one beyond them is answered at once with 503 and a ``Retry-After`` header. A client that
disconnects, streamed or not, cancels its request within one decode step (or prefill chunk), also
while it waits. Every error is OpenAI's JSON error object: 400 naming the field for a bad request,
401 for a missing or wrong API key (``api_key``; /v1 only), 413 for a body over ``max_body_bytes``,
415 for a body not sent as application/json, 421 for a Host not in ``allowed_hosts`` (guard.py),
404/405 for a wrong path or method, 503 when busy or shutting down, 500 (no traceback; logged
here) for a failure of the engine itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from importlib import resources
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from swiftspec.errors import InvalidRequestError, SwiftspecError
from swiftspec.serve import DEFAULT_MAX_BODY_BYTES
from swiftspec.serve.guard import Guard, check_api_key, parse_allowed_hosts
from swiftspec.serve.openai_schema import (
    API_DEFAULTS,
    DEFAULT_MAX_TOKENS,
    MODES,
    ChatRequest,
    RequestError,
    chunk_body,
    completion_body,
    decode_body,
    error_body,
    new_completion_id,
    parse_chat_request,
    swiftspec_stats,
    usage,
)
from swiftspec.serve.runner import Busy, EngineRunner, ShuttingDown

log = logging.getLogger("swiftspec.serve")

RETRY_AFTER_S = 5  # the Retry-After of a 503: a short reply on the CPU takes seconds


def _error(exc: RequestError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 503 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _sse(obj) -> str:
    """One Server-Sent Event carrying ``obj`` as JSON (or the literal ``[DONE]``)."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


def _generation_error(exc: BaseException) -> RequestError:
    """An exception of Engine.generate as the client sees it: the engine's own refusals of the
    request are 400s; anything else a 500 whose traceback stays in this server's log."""
    if isinstance(exc, InvalidRequestError):
        return RequestError(str(exc))
    if isinstance(exc, SwiftspecError):
        return RequestError(str(exc), status=500, type="server_error")
    log.error("generation failed", exc_info=(type(exc), exc, exc.__traceback__))
    return RequestError(f"the engine failed: {type(exc).__name__}: {exc}", status=500, type="server_error")


_SHUTTING_DOWN = RequestError(
    "the server is shutting down; the reply was cut short", status=503, type="server_error", code="shutting_down"
)


class ChatServer:
    """The app's state and handlers: the engine, its runner and the served model's settings.

    Args:
        engine: a loaded :class:`swiftspec.Engine` (the server does not close it).
        model_id: the id clients name in ``model`` (default: the target checkpoint's folder name).
        draft_id: how /v1/models names the draft (default: its checkpoint's folder name).
        default_mode: requests without ``swiftspec.mode`` (default: serial with a draft, else target).
        tree_budget, max_depth, branching: the token tree of speculative requests (a request may
            set ``swiftspec.tree_budget``).
        max_waiting: requests that may wait behind the running one; more get 503.
        max_body_bytes: the largest request body taken, in bytes (>= 1); a larger one gets 413
            before it is read (default :data:`DEFAULT_MAX_BODY_BYTES`).
        api_key: the key /v1 requests must send as ``Authorization: Bearer <key>`` (else 401);
            None: no key (the default).
        allowed_hosts: the Host names answered (a list, or a comma-separated string; ports aside),
            others get 421; None or "*": any (the default; ``swiftspec serve`` bound to a loopback
            address passes the loopback names).

    Raises:
        InvalidRequestError: ``default_mode`` needs a draft the engine lacks; ``max_body_bytes`` < 1;
            an empty ``api_key`` or one not of visible ASCII; an ``allowed_hosts`` entry not a host;
            ``tree_budget`` beyond the models' tree KV (with a draft: else every speculative request
            that does not set its own would be refused, naming a field it did not send).
    """

    def __init__(
        self,
        engine,
        *,
        model_id: str | None = None,
        draft_id: str | None = None,
        default_mode: str | None = None,
        tree_budget: int = 16,
        max_depth: int = 8,
        branching: int = 2,
        max_waiting: int = 4,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        api_key: str | None = None,
        allowed_hosts=None,
    ):
        if max_body_bytes < 1:
            raise InvalidRequestError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.max_body_bytes = max_body_bytes
        self.api_key = None if api_key is None else check_api_key(api_key)
        self.allowed_hosts = parse_allowed_hosts(allowed_hosts)  # (None: any)
        self.engine = engine
        self.runner = EngineRunner(engine, max_waiting=max_waiting)
        self.model_id = model_id or engine.target_dir.name
        self.draft_id = draft_id or (engine.draft_dir.name if engine.draft_dir else None)
        self.modes = list(MODES) if engine.has_draft else ["target"]  # (a request for auto: target then)
        if default_mode is None:
            default_mode = "auto" if engine.has_draft else "target"
        if default_mode not in self.modes:
            raise InvalidRequestError(f"mode {default_mode!r} needs a draft model; this engine has none")
        self.default_mode = default_mode
        self.tree_budget, self.max_depth, self.branching = tree_budget, max_depth, branching
        if engine.has_draft and tree_budget > self._max_tree_budget():
            raise InvalidRequestError(
                f"tree_budget {tree_budget} exceeds the tree KV capacity of the models: at most "
                f"{self._max_tree_budget()}"
            )
        self.created = int(time.time())
        files = resources.files("swiftspec.serve")
        self.page = files.joinpath("page.html").read_text(encoding="utf-8")
        self.favicon = files.joinpath("favicon.svg").read_bytes()

    # ------------------------------------------------------------------ routes
    async def page_route(self, request: Request) -> HTMLResponse:
        return HTMLResponse(self.page)

    async def favicon_route(self, request: Request) -> Response:
        return Response(self.favicon, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    async def favicon_ico(self, request: Request) -> RedirectResponse:
        # Browsers and tools that ask for /favicon.ico without reading the page's <link rel="icon">.
        return RedirectResponse("/favicon.svg", status_code=301)

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": self.model_id, **self.runner.status()})

    async def models(self, request: Request) -> JSONResponse:
        # The context of a speculative request when a draft is loaded (the smaller of the two).
        context = self.engine.context_length("auto")
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_id,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "swiftspec",
                        "swiftspec": {
                            "draft": self.draft_id,
                            "modes": self.modes,
                            "default_mode": self.default_mode,
                            "max_context": context,
                            "tree_budget": self.tree_budget,
                            "max_tree": self._max_tree_budget(),
                            "defaults": dict(API_DEFAULTS),
                        },
                    }
                ],
            }
        )

    async def chat_completions(self, request: Request):
        try:
            self._check_content_type(request)
            body = decode_body(await self._read_body(request))
            req = parse_chat_request(body, self.model_id)
            # Rendering and tokenizing a long conversation (megabytes) takes seconds: off the event
            # loop, which meanwhile streams other replies and answers /health (see _prompt_ids).
            prompt_ids, kwargs, mode = await anyio.to_thread.run_sync(self._resolve, req)
        except RequestError as exc:
            return _error(exc)
        try:
            job = self.runner.submit(asyncio.get_running_loop(), prompt_ids, **kwargs)
        except Busy as exc:  # a request that arrived during shutdown is told so, as the ones it cut short are
            code = "shutting_down" if isinstance(exc, ShuttingDown) else "busy"
            return _error(RequestError(str(exc), status=503, type="server_error", code=code))
        cid, created = new_completion_id()
        meta = dict(
            mode=mode,
            tree_budget=kwargs["tree_budget"] if mode != "target" else None,
            seed=kwargs["seed"] if req.temperature > 0 else None,
        )
        if req.stream:
            return _JobStream(job, self._stream(job, req, cid, created, meta))
        return await self._whole(request, job, cid, created, meta)

    # --------------------------------------------------------------- requests
    @staticmethod
    def _check_content_type(request: Request) -> None:
        """Only ``application/json`` bodies: a web page on any other site may POST text/plain (or
        no type) to this server from its visitor's browser without asking (no CORS preflight),
        spending the engine on the page's behalf; a JSON body makes the browser ask first, and
        this server grants no cross-origin access."""
        given = request.headers.get("content-type", "")
        if given.split(";")[0].strip().lower() != "application/json":
            raise RequestError(
                f"the request body must be JSON with the header 'Content-Type: application/json', "
                f"got {repr(given) if given else 'no Content-Type'}",
                status=415,
                code="unsupported_media_type",
            )

    async def _read_body(self, request: Request) -> bytes:
        """The request body, refused (413) as soon as it is known to exceed ``max_body_bytes``:
        from its Content-Length before reading any of it, else while it arrives (chunked)."""
        limit = self.max_body_bytes

        def too_large(size: str) -> RequestError:
            return RequestError(
                f"the request body is {size} bytes; this server takes at most {limit} "
                "(swiftspec serve --max-body-bytes)",
                status=413,
                code="request_too_large",
            )

        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:  # (the HTTP server checked that it is a number)
            raise too_large(declared)
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(f"more than {limit}")
                chunks.append(chunk)
        except ClientDisconnect:  # (uvicorn drops the answer: no one is there to read it)
            raise RequestError(f"the client disconnected after {size} bytes of the request body") from None
        return b"".join(chunks)

    def _max_tree_budget(self) -> int:
        """The largest tree budget the models' tree KV holds (the runtime needs 2 slots more)."""
        models = [m for m in (self.engine.target_model, self.engine.draft_model) if m is not None]
        return min(m.max_tree for m in models) - 2

    def _resolve(self, req: ChatRequest) -> tuple[list[int], dict, str]:
        """The prompt's token ids, Engine.generate's keyword arguments and the mode; checks what
        depends on the loaded models (messages against the chat template, the context, the mode,
        the tree KV). Raises RequestError naming the field."""
        mode = req.mode or self.default_mode
        if mode == "auto" and not self.engine.has_draft:
            mode = "target"  # what the auto mode does without a draft
        if mode not in self.modes:
            raise RequestError(
                f"swiftspec.mode {mode!r} needs a draft model; this server has none (modes: {', '.join(self.modes)})",
                "swiftspec.mode",
            )
        tree_budget = self.tree_budget
        if req.tree_budget is not None:
            if mode == "target":
                raise RequestError(
                    "swiftspec.tree_budget has no effect in mode 'target' (no token tree is "
                    "verified); drop it or pick a speculative mode",
                    "swiftspec.tree_budget",
                )
            tree_budget = req.tree_budget
        if mode != "target" and tree_budget > self._max_tree_budget():
            raise RequestError(
                f"swiftspec.tree_budget must be at most {self._max_tree_budget()} (the tree KV "
                f"capacity), got {tree_budget}",
                "swiftspec.tree_budget",
            )
        try:
            prompt_ids = self._prompt_ids(req.messages)
        except InvalidRequestError as exc:  # named by the model's id, not by a path on this machine
            raise RequestError(str(exc).replace(str(self.engine.tokenizer.source), self.model_id), "messages") from None
        context = self.engine.context_length(mode)  # the runtime's rule (Engine::context_length)
        room = context - len(prompt_ids)
        if room < 1:
            raise RequestError(
                f"the messages take {len(prompt_ids)} tokens, which leaves no room for a reply in "
                f"the context of {context} tokens",
                "messages",
                code="context_length_exceeded",
            )
        max_tokens = req.max_tokens if req.max_tokens is not None else min(DEFAULT_MAX_TOKENS, room)
        if max_tokens > room:
            raise RequestError(
                f"max_tokens {max_tokens} does not fit: the messages take {len(prompt_ids)} of the "
                f"context's {context} tokens, leaving {room}",
                "max_tokens",
                code="context_length_exceeded",
            )
        kwargs = dict(
            max_new_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=req.seed,
            stop=req.stop,
            mode=mode,
            tree_budget=tree_budget,
            max_depth=self.max_depth,
            branching=self.branching,
        )
        return prompt_ids, kwargs, mode

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        """The token ids of ``messages`` rendered by the chat template, as ``Engine.encode_prompt``
        gives them (openai_schema checked the contents are valid text). ``Tokenizer.encode``
        releases the GIL while it tokenizes, so a huge prompt does not stall the event loop."""
        tokenizer = self.engine.tokenizer
        return tokenizer.encode(tokenizer.apply_chat_template(messages))

    async def _whole(self, request: Request, job, cid: str, created: int, meta: dict) -> JSONResponse:
        """A non-streamed reply; a client that disconnects meanwhile cancels the job."""

        async def cancel_on_disconnect():
            while (await request.receive())["type"] != "http.disconnect":
                pass
            job.cancel()

        text_done: tuple[str, Any] | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_on_disconnect)
                async for kind, value in job.events():
                    if kind != "text":
                        text_done = (kind, value)
                tg.cancel_scope.cancel()
        finally:
            job.cancel()  # (a no-op once it finished) the handler itself was cancelled: server shutdown
        assert text_done is not None  # job.events() ends with its last (non-text) event
        kind, value = text_done
        if kind == "error":
            return _error(_generation_error(value))
        if kind == "cancelled":  # by the server's shutdown (a client that left reads nothing)
            return _error(_SHUTTING_DOWN)
        return JSONResponse(
            completion_body(cid, created, self.model_id, value, swiftspec_stats(value, queue_s=job.queue_s, **meta))
        )

    async def _stream(self, job, req: ChatRequest, cid: str, created: int, meta: dict):
        """The SSE body: a first chunk with the role, one chunk per text piece, a last chunk with
        finish_reason and the ``swiftspec`` stats (``usage`` too), then a usage-only chunk if
        asked for (stream_options.include_usage), then ``[DONE]``. An error after the start is an
        ``{"error": ...}`` event before ``[DONE]``. (The job is cancelled by :class:`_JobStream`
        when the response ends, whether or not this generator ever ran.)"""
        yield _sse(chunk_body(cid, created, self.model_id, {"role": "assistant", "content": ""}))
        async for kind, value in job.events():
            if kind == "text":
                yield _sse(chunk_body(cid, created, self.model_id, {"content": value}))
            elif kind == "done":
                stats = swiftspec_stats(value, queue_s=job.queue_s, **meta)
                yield _sse(
                    chunk_body(
                        cid, created, self.model_id, {}, value.finish_reason, swiftspec=stats, usage=usage(value)
                    )
                )
                if req.include_usage:
                    yield _sse(chunk_body(cid, created, self.model_id, None, usage=usage(value)))
            else:
                yield _sse((_generation_error(value) if kind == "error" else _SHUTTING_DOWN).body())
        yield _sse("[DONE]")


class _JobStream(StreamingResponse):
    """The SSE response of a streamed request: it cancels the request's job however the response
    ends (no-op once the job finished). A client that disconnects makes Starlette stop the
    response (it cancels it, or `send` raises); the job must stop then too, within one step. Not
    from a `finally` in the body generator: when the client is gone before the first chunk (it left
    while the prompt was being rendered) Starlette never starts the generator, so its `finally`
    never runs, and the engine would decode the whole reply for no one."""

    def __init__(self, job, content):
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self._job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._job.cancel()


def create_app(engine, **options) -> Starlette:
    """The Starlette app serving ``engine``; ``options`` as :class:`ChatServer` takes them.
    ``app.state.server`` is the :class:`ChatServer` (its ``runner`` tells the engine's load)."""
    server = ChatServer(engine, **options)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)  # (registered for HTTPException only)
        return JSONResponse(
            error_body(
                f"{request.method} {request.url.path}: {exc.detail}",
                "invalid_request_error" if exc.status_code < 500 else "server_error",
            ),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.runner.close()  # (the server has stopped taking requests)

    app = Starlette(
        middleware=[Middleware(Guard, api_key=server.api_key, allowed_hosts=server.allowed_hosts)],
        routes=[
            Route("/", server.page_route, methods=["GET"]),
            Route("/favicon.svg", server.favicon_route, methods=["GET"]),
            Route("/favicon.ico", server.favicon_ico, methods=["GET"]),
            Route("/health", server.health, methods=["GET"]),
            Route("/v1/models", server.models, methods=["GET"]),
            Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )
    app.state.server = server
    return app
