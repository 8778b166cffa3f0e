"""The `swiftspec` command line.

    swiftspec generate "Write quicksort in Python."      # reference pair, speculative
    swiftspec generate --target my.gguf --draft small.gguf --mode serial "..."

Each subcommand lives in its own module and registers itself through
``add_parser(subparsers)``; user errors exit with status 2 and a one-line
message, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from swiftspec.errors import SwiftspecError

_COMMANDS = ("generate", "bench")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="swiftspec", description="Low-latency speculative LLM inference.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"swiftspec.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"swiftspec.cli.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except SwiftspecError as exc:
        print(f"swiftspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"swiftspec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
