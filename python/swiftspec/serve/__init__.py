"""``swiftspec serve``: a demo chat page and an OpenAI-compatible chat-completions API over one
loaded :class:`swiftspec.Engine`.

    app.py            the routes (Starlette): /, /health, /v1/models, /v1/chat/completions
    openai_schema.py  the request fields, their checks, and the response / chunk / error bodies
    guard.py          the API key of /v1 and the Host check against DNS rebinding (a middleware)
    runner.py         one request at a time on the engine, a bounded wait line, cancellation
    server.py         uvicorn, with Ctrl-C cancelling the running reply before shutting down
    page.html         the chat page (self-contained)

Needs the ``serve`` extra (``pip install 'swiftspec[serve]'``: Starlette and uvicorn); importing
a submodule without it raises ModuleNotFoundError (``swiftspec serve`` names the extra instead).
"""

#: The modules the server needs, and the extra that installs them.
REQUIRED_MODULES = ("starlette", "uvicorn")
EXTRA = "serve"

#: The largest request body the server takes by default, in bytes (1 MiB; ``swiftspec serve
#: --max-body-bytes``): a conversation filling a 32k-token context is about 130 KB of JSON (more
#: with escaped non-ASCII text). A larger body is refused with HTTP 413 before it is read.
DEFAULT_MAX_BODY_BYTES = 1 << 20

#: The environment variable ``swiftspec serve`` takes its API key from when --api-key is not given.
API_KEY_ENV = "SWIFTSPEC_API_KEY"
#: The Host names a server bound to a loopback address answers by default (``--allowed-hosts``).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def missing_modules() -> list[str]:
    """The modules of the ``serve`` extra that are not installed (none: the server can run)."""
    import importlib.util

    return [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
