"""`swiftspec serve`: load the engine once and serve a chat page and an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from swiftspec.cli.engine_options import add_decode_options, add_model_options, check_engine_options, load_engine
from swiftspec.serve import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES, LOOPBACK_HOSTS, REQUEST_TIMEOUT_S


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a chat page and an OpenAI-compatible API",
        description="Load the models once and serve, on http://HOST:PORT/, a chat page (GET /) and an "
        "OpenAI-compatible API (POST /v1/chat/completions, GET /v1/models, GET /health). One request "
        "decodes at a time; up to --max-waiting more wait, later ones get HTTP 503. With no "
        "--target/--draft it serves the reference pair (Starlette and uvicorn, which pip install swiftspec "
        "installs, run it).",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface, "
        "with a warning: no TLS, and without --api-key no authentication)",
    )
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument(
        "--max-waiting",
        type=int,
        default=4,
        help="requests that may wait while one decodes (default 4); more are answered 503 at once",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest request body taken, in bytes (default {DEFAULT_MAX_BODY_BYTES}: 1 MiB); a larger "
        "one gets HTTP 413 before it is read",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help=f"seconds a request's headers and body may take to arrive (default {REQUEST_TIMEOUT_S:g}); "
        "a slower client is disconnected",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help="require the header 'Authorization: Bearer KEY' on every /v1 request (else HTTP 401; /health "
        f"and the chat page stay open, the page asks for the key). Default: ${API_KEY_ENV} when set and "
        "not empty; better than this option, which other users of the machine can read (ps)",
    )
    p.add_argument(
        "--allowed-hosts",
        metavar="HOSTS",
        help="comma-separated host names the server answers, in the requests' Host header (any port; "
        "'*': any host); other requests get HTTP 421 (against DNS rebinding: a web page whose name "
        f"points at this machine). Default: with a loopback --host, {','.join(LOOPBACK_HOSTS)} and the "
        "--host itself; with any other --host, any host",
    )
    add_model_options(p)
    add_decode_options(p)
    p.set_defaults(run=run)


def _model_id(model) -> str:
    """How the API names a model given as a reference name, a folder or a GGUF file: its name
    without the folder (and without .gguf); given as a Hugging Face id: the repository id
    (``org/name``, as other OpenAI-compatible servers name hub models)."""
    from swiftspec.models import parse_hub_id

    hub = parse_hub_id(str(model))
    if hub is not None:
        return hub[0]
    name = Path(model).name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


def _is_loopback(host: str) -> bool:
    """Whether ``host`` reaches this machine only: 127.0.0.0/8, ::1 or "localhost"."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def run(args: argparse.Namespace) -> int:
    from swiftspec.errors import InvalidRequestError, SwiftspecError
    from swiftspec.serve import install_command, missing_modules

    if not 1 <= args.port <= 65535:
        raise InvalidRequestError(f"--port must be in [1, 65535], got {args.port}")
    if args.max_waiting < 0:
        raise InvalidRequestError(f"--max-waiting must be >= 0, got {args.max_waiting}")
    if args.max_body_bytes < 1:
        raise InvalidRequestError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not args.request_timeout > 0:
        raise InvalidRequestError(f"--request-timeout must be > 0 seconds, got {args.request_timeout:g}")
    api_key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    check_engine_options(args)
    if args.mode in ("serial", "async") and (args.no_draft or (args.target is not None and args.draft is None)):
        raise InvalidRequestError(f"--mode {args.mode} needs a draft model: give --draft (or drop --no-draft)")
    missing = missing_modules()
    if missing:  # before the models load: a minute lost otherwise
        # (swiftspec depends on them: they are missing after an install with --no-deps, or uninstalled since)
        raise SwiftspecError(
            f"the server needs {' and '.join(missing)}, which swiftspec depends on but which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {install_command(missing)}"
        )
    from swiftspec.serve.guard import check_api_key, parse_allowed_hosts

    if api_key is not None:
        try:
            check_api_key(api_key)
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"{'--api-key' if args.api_key is not None else API_KEY_ENV}: {exc}") from None
    allowed_hosts = args.allowed_hosts
    if allowed_hosts is None and _is_loopback(args.host):
        allowed_hosts = [*LOOPBACK_HOSTS, args.host]
    try:
        allowed_hosts = parse_allowed_hosts(allowed_hosts)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"--allowed-hosts: {exc}") from None
    from swiftspec.fetch import DEFAULT_PAIR
    from swiftspec.serve.app import create_app
    from swiftspec.serve.server import serve

    engine = load_engine(args)
    model_id = _model_id(args.target or DEFAULT_PAIR["target"])
    draft_id = _model_id(args.draft or DEFAULT_PAIR["draft"]) if engine.has_draft else None
    app = create_app(
        engine,
        model_id=model_id,
        draft_id=draft_id,
        default_mode=args.mode,
        tree_budget=args.tree_budget,
        max_depth=args.max_depth,
        branching=args.branching,
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
        api_key=api_key,
        allowed_hosts=allowed_hosts,
    )
    shown = f"[{args.host}]" if ":" in args.host else args.host

    def started():
        print(
            f"[swiftspec] serving {model_id}: chat page http://{shown}:{args.port}/ , OpenAI API "
            f"http://{shown}:{args.port}/v1 (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        if api_key is not None:
            print("[swiftspec] the API needs the header 'Authorization: Bearer <key>'", file=sys.stderr, flush=True)
        if not _is_loopback(args.host):
            risk = (
                "the API has no authentication and no TLS; anyone who can reach this port can use the models and "
                "read the replies"
                if api_key is None
                else "no TLS: the API key and the replies cross the network unencrypted"
            )
            print(
                f"[swiftspec] warning: listening on {shown}, beyond this machine: {risk}", file=sys.stderr, flush=True
            )

    try:
        serve(app, args.host, args.port, on_started=started, request_timeout=args.request_timeout)
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled, once it has shut down
        pass
    except SystemExit:  # uvicorn could not listen, and logged why
        raise SwiftspecError(f"cannot listen on {shown}:{args.port} (see the error above)") from None
    finally:
        engine.close()
    print("[swiftspec] server stopped", file=sys.stderr)
    return 0
