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
