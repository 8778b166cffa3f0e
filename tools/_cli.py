"""Shared glue for the tools/ scripts: import swiftspec from the checkout, report user errors."""

from __future__ import annotations

import sys
from pathlib import Path


def import_swiftspec() -> None:
    """Make ``import swiftspec`` work from a checkout that is not pip-installed."""
    try:
        import swiftspec  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def run(main) -> None:
    """Call ``main()``; a swiftspec error (a user error: bad input, failed download, ...) prints
    ``error: <message>`` to stderr and exits with status 2, without a traceback."""
    from swiftspec.errors import SwiftspecError

    try:
        code = main()
    except SwiftspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
