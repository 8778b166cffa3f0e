"""Where swiftspec keeps downloaded models, converted checkpoints and data sets."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache root: ``$SWIFTSPEC_CACHE`` if set, else ``$XDG_CACHE_HOME/swiftspec``
    (``~/.cache/swiftspec`` by default). Created on first use."""
    root = os.environ.get("SWIFTSPEC_CACHE")
    if root:
        path = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = (Path(xdg) if xdg else Path.home() / ".cache") / "swiftspec"
    path.mkdir(parents=True, exist_ok=True)
    return path


def binary(name: str) -> Path:
    """Path of an executable installed with the package (``swiftspec/bin/NAME``),
    e.g. ``swiftspec-decode``, the C++ embedding example. Raises FileNotFoundError."""
    import swiftspec

    for root in swiftspec.__path__:
        candidate = Path(root) / "bin" / name
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{name} is not installed with swiftspec (looked in {list(swiftspec.__path__)})")
