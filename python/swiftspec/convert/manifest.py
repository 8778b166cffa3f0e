"""manifest.json: written last, it marks a checkpoint folder as complete (docs/checkpoint_format.md)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CheckpointError
from .dtypes import SUPPORTED_DTYPES

FORMAT = "swiftspec-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def make_manifest(dtype: str, files: list[str], source_kind: str, source_path: str,
                  source_sha256: str | None, tp_degree: int = 1) -> dict:
    """The manifest dict. ``source_kind`` is ``"gguf"`` or ``"hf"``; ``files`` are the weight files."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dtype": dtype,
        "files": list(files),
        "tp_degree": tp_degree,
        "source": {"kind": source_kind, "path": str(source_path), "sha256": source_sha256},
    }


def read_manifest(folder: str | Path) -> dict:
    """Read and check ``<folder>/manifest.json``; return it as a dict.

    Checks the format name and version, the dtype, ``tp_degree``, the ``source`` object, and
    that every listed weight file and config.json exist. Raises :class:`CheckpointError`
    naming the file and the offending field/value.
    """
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: {folder} is not a complete swiftspec checkpoint") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    expect = {"format": FORMAT, "format_version": FORMAT_VERSION}
    for key, value in expect.items():
        if manifest.get(key) != value:
            raise CheckpointError(f"{path}: field {key!r} is {manifest.get(key)!r}, expected {value!r}")
    if manifest.get("dtype") not in SUPPORTED_DTYPES:
        raise CheckpointError(f"{path}: field 'dtype' is {manifest.get('dtype')!r}, expected one of {SUPPORTED_DTYPES}")
    tp = manifest.get("tp_degree")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise CheckpointError(f"{path}: field 'tp_degree' is {tp!r}, expected a positive integer")
    source = manifest.get("source")
    if not isinstance(source, dict) or source.get("kind") not in ("gguf", "hf"):
        raise CheckpointError(f"{path}: field 'source' is {source!r}, expected an object with kind 'gguf' or 'hf'")
    files = manifest.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise CheckpointError(f"{path}: field 'files' is {files!r}, expected a non-empty list of file names")
    for name in files + ["config.json"]:
        if not (Path(folder) / name).is_file():
            raise CheckpointError(f"{path}: listed file {name!r} is missing from {folder}")
    return manifest
