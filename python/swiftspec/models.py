"""Resolving what a user names as a model into a checkpoint folder.

A model can be named by a reference name (``swiftspec.fetch.REFERENCE_MODELS``),
a converted checkpoint folder, a GGUF file, or a Hugging Face model folder
(config.json + safetensors). GGUF files and HF folders are converted once
into the cache and reused while the source is unchanged.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from swiftspec.errors import CheckpointError
from swiftspec.paths import build_folder_atomically, cache_dir


def _source_key(path: Path) -> str:
    """A cache key that changes when the source file or folder changes."""
    h = hashlib.sha256(str(path.resolve()).encode())
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    for f in files:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _convert_into_cache(source: Path, dtype: str, convert) -> Path:
    final = cache_dir() / "checkpoints" / f"{source.stem}-{_source_key(source)}-{dtype}"
    if (final / "manifest.json").is_file():
        return final
    return build_folder_atomically(final, lambda tmp: convert(source, tmp, dtype=dtype))


def _swiftspec_config(folder: Path) -> bool:
    """Whether ``folder/config.json`` holds the "swiftspec" object that the converter adds."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("swiftspec"), dict)


def resolve_checkpoint(model: str | os.PathLike, dtype: str = "bfloat16") -> Path:
    """The checkpoint folder for ``model``, fetching or converting it if needed.

    Args:
        model: a reference model name, a checkpoint folder (has manifest.json),
            a ``.gguf`` file, or an HF folder (config.json + *.safetensors).
        dtype: "bfloat16", "float32" or "int4", for conversions.

    Raises:
        CheckpointError: the path does not exist or is none of the above.
        FetchError: a reference model could not be downloaded.
    """
    from swiftspec.fetch import REFERENCE_MODELS, ensure_checkpoint

    if isinstance(model, str) and model in REFERENCE_MODELS:
        return ensure_checkpoint(model, dtype=dtype)
    path = Path(model).expanduser()
    if not path.exists():
        known = ", ".join(sorted(REFERENCE_MODELS))
        raise CheckpointError(f"{path}: no such file or folder (and not a reference model name: {known})")
    if path.is_dir():
        if (path / "manifest.json").is_file():
            return path
        if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
            from swiftspec.convert import convert_hf

            try:
                return _convert_into_cache(path, dtype, convert_hf)
            except CheckpointError as exc:
                if _swiftspec_config(path):  # an interrupted conversion, not an HF folder
                    raise CheckpointError(
                        f"{path} looks like an incomplete swiftspec checkpoint: its config.json is one the converter "
                        "writes, but manifest.json, written last, is missing (the conversion was interrupted or "
                        f"failed; convert it again). Read as a Hugging Face folder it fails: {exc}") from None
                raise
        raise CheckpointError(
            f"{path}: not a model folder (expected a swiftspec checkpoint with manifest.json, "
            "or a Hugging Face folder with config.json and *.safetensors)"
        )
    if path.suffix.lower() == ".gguf":
        from swiftspec.convert import convert_gguf

        return _convert_into_cache(path, dtype, convert_gguf)
    raise CheckpointError(f"{path}: unsupported model file (expected a .gguf file or a checkpoint folder)")
