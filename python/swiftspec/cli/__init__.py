"""The `swiftspec` command line.

    swiftspec generate "Write quicksort in Python."      # reference pair, speculative
    swiftspec generate --target my.gguf --draft small.gguf --mode serial "..."
    swiftspec serve                                      # chat page + OpenAI API on 127.0.0.1:8000

Each subcommand lives in its own module and registers itself through
``add_parser(subparsers)``; user errors exit with status 2 and a one-line
message, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from swiftspec.errors import SwiftspecError

_COMMANDS = ("generate", "bench", "serve")


class _NoAbbrevParser(argparse.ArgumentParser):
    """A subcommand's parser: an ArgumentParser that takes no abbreviations (see build_parser)."""

    def __init__(self, **kwargs) -> None:  # add_parser passes keywords only
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(**kwargs)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    # No abbreviations: argparse would take "--temp" as --temperature and "--max" as whichever option
    # starts so, and a later option could change what an old command line means. An abbreviation is
    # an unknown option, named with the closest one (_unrecognized).
    parser = argparse.ArgumentParser(
        prog="swiftspec", description="Low-latency speculative LLM inference.", allow_abbrev=False
    )
    from swiftspec import __version__

    parser.add_argument("--version", action="version", version=f"swiftspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_NoAbbrevParser)
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


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


def _unrecognized(sub: argparse.ArgumentParser, extras: list[str]) -> str:
    """The error for arguments a subcommand did not take: its unknown options (an option's value
    taken as the prompt is not named), each with the closest option of the subcommand if one is
    close ("--max-tokens (did you mean --max-new-tokens?)"), or the options an abbreviation starts
    ("--temp (did you mean --temperature?)"); the extra arguments when none is an option."""
    import difflib

    options = [s for action in sub._actions for s in action.option_strings if s.startswith("--")]
    unknown = [
        a for a in extras if a.startswith("-") and a not in ("-", "--") and not sub._negative_number_matcher.match(a)
    ]
    named = []
    for arg in unknown or extras:
        name = arg.split("=", 1)[0]
        # An abbreviation ("--temp") names the options it starts; else the closest by spelling.
        close = sorted(o for o in options if o.startswith(name)) if arg in unknown else []
        if not close and arg in unknown:
            close = difflib.get_close_matches(name, options, n=1)
        if len(close) > 1:
            named.append(f"{arg} (did you mean one of {', '.join(close)}?)")
        else:
            named.append(f"{arg} (did you mean {close[0]}?)" if close else arg)
    return "unrecognized arguments: " + " ".join(named)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # the subcommand's parser names them, with its own usage (not swiftspec's)
        sub = _subparser(parser, args.command)
        sub.error(_unrecognized(sub, extras))
    try:
        return int(args.run(args) or 0)
    except SwiftspecError as exc:
        print(f"swiftspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"swiftspec {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`swiftspec bench --print-schema | head`): stop quietly, with
        # the status of a process SIGPIPE ended, and point stdout at /dev/null so that the
        # interpreter's flush at exit does not raise it again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
