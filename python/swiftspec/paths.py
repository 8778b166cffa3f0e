"""Where swiftspec keeps downloaded models, converted checkpoints and data sets."""

import os
import shutil
from pathlib import Path
from typing import Callable


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


def build_folder_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """Makes folder ``final`` by ``build(tmp)`` into a sibling temporary folder, then renames it
    into place (replacing an older ``final``), so that an interrupted or failed build (Ctrl-C,
    a full disk, a bad input) never leaves a partial ``final`` that a later run would take
    for a finished one. The temporary folder is removed on any exception, which propagates.
    Returns ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
