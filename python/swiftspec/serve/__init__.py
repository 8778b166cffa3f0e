"""``swiftspec serve``: a demo chat page and an OpenAI-compatible chat-completions API over one
loaded :class:`swiftspec.Engine`.

    app.py            the routes (Starlette): /, /health, /v1/models, /v1/chat/completions
    openai_schema.py  the request fields, their checks, and the response / chunk / error bodies
    guard.py          the API key of /v1 and the Host check against DNS rebinding (a middleware)
    runner.py         one request at a time on the engine, a bounded wait line, cancellation
    server.py         uvicorn, with Ctrl-C cancelling the running reply before shutting down
    page.html         the chat page (self-contained)

Needs Starlette and uvicorn, which ``pip install swiftspec`` installs (they are base dependencies;
the ``serve`` extra is kept, empty, for older instructions). Importing a submodule without them
raises ModuleNotFoundError; ``swiftspec serve`` names them instead (:func:`install_command`).
"""

#: The modules the server needs (base dependencies of swiftspec).
REQUIRED_MODULES = ("starlette", "uvicorn")

#: The largest request body the server takes by default, in bytes (1 MiB; ``swiftspec serve
#: --max-body-bytes``): a conversation filling a 32k-token context is about 130 KB of JSON (more
#: with escaped non-ASCII text). A larger body is refused with HTTP 413 before it is read.
DEFAULT_MAX_BODY_BYTES = 1 << 20

#: Seconds a request may take to arrive, headers and body, from its first byte (or the
#: connection's opening) before the server closes the connection (``swiftspec serve
#: --request-timeout``; server.py): a 1 MiB body needs 35 KB/s.
REQUEST_TIMEOUT_S = 30.0

#: The environment variable ``swiftspec serve`` takes its API key from when --api-key is not given.
API_KEY_ENV = "SWIFTSPEC_API_KEY"
#: The Host names a server bound to a loopback address answers by default (``--allowed-hosts``).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def missing_modules() -> list[str]:
    """The modules of the ``serve`` extra that are not installed (none: the server can run)."""
    import importlib.util

    return [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]


def install_command(modules) -> str:
    """The pip command that installs ``modules`` at the versions swiftspec pins, e.g.
    ``pip install 'starlette==1.7.0'`` (the pins read from the installed package's metadata, so
    pyproject.toml stays their one source; bare names when swiftspec's metadata is not there, as in
    a source checkout on ``PYTHONPATH``)."""
    import re
    from importlib import metadata

    try:
        requires = metadata.requires("swiftspec") or []
    except metadata.PackageNotFoundError:
        requires = []
    pinned = {}
    for req in requires:
        if "extra ==" in req:
            continue
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]
        pinned[name.lower().replace("_", "-")] = req.split(";")[0].strip()
    return "pip install " + " ".join(f"'{pinned.get(m, m)}'" for m in modules)
