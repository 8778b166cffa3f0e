"""manifest.json: written last, it marks a checkpoint folder as complete (docs/checkpoint_format.md)."""

from __future__ import annotations

from pathlib import Path

from .._json_file import read_json
from ..errors import CheckpointError
from .dtypes import SUPPORTED_DTYPES

FORMAT = "swiftspec-checkpoint"
FORMAT_VERSION = 1
#: Format version of int4 checkpoints (docs/checkpoint_format.md, "int4 weights").
INT4_FORMAT_VERSION = 3
MANIFEST = "manifest.json"


def make_manifest(
    dtype: str,
    files: list[str],
    source_kind: str,
    source_path: str,
    source_sha256: str | None,
    tp_degree: int = 1,
    group_size: int | None = None,
    quantization: dict | None = None,
) -> dict:
    """The manifest dict. ``source_kind`` is ``"gguf"`` or ``"hf"``; ``files`` are the weight files.

    ``dtype`` ``"int4"`` (needs ``group_size``) makes a format version 3 manifest with the
    ``quantization`` object (:func:`quantization_entry`, updated with ``quantization``: the method and
    origin of an AWQ / GPTQ folder's values); float dtypes make version 1.
    """
    manifest = {
        "format": FORMAT,
        "format_version": INT4_FORMAT_VERSION if dtype == "int4" else FORMAT_VERSION,
        "dtype": dtype,
        "files": list(files),
        "tp_degree": tp_degree,
        "source": {"kind": source_kind, "path": str(source_path), "sha256": source_sha256},
    }
    if dtype == "int4":
        if group_size is None:
            raise CheckpointError("an int4 manifest needs the group size")
        manifest["quantization"] = {**quantization_entry(group_size), **(quantization or {})}
    return manifest


def quantization_entry(group_size: int) -> dict:
    """manifest["quantization"] of an int4 checkpoint (the fields are documented in
    docs/checkpoint_format.md; the runtime reads ``bits`` and ``group_size``)."""
    return {
        "method": "rtn",
        "bits": 4,
        "group_size": int(group_size),
        "symmetric": False,
        "scale_dtype": "float16",
        "zero_dtype": "uint8",
        "packing": "uint8, element 2j low nibble, 2j+1 high",
        "float_dtype": "bfloat16",
    }


def read_manifest(folder: str | Path) -> dict:
    """Read and check ``<folder>/manifest.json``; return it as a dict.

    Checks the format name and version (1 for float dtypes, 3 for dtype ``"int4"``, whose
    ``quantization`` object must say 4 bits and a valid group size), the dtype, ``tp_degree``,
    the ``source`` object, and
    that every listed weight file and config.json exist. Raises :class:`CheckpointError`
    naming the file and the offending field/value.
    """
    path = Path(folder) / MANIFEST
    try:
        manifest = read_json(path, "manifest")
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist: {folder} is not a complete swiftspec checkpoint") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: field 'format' is {manifest.get('format')!r}, expected {FORMAT!r}")
    int4 = manifest.get("dtype") == "int4"
    version = INT4_FORMAT_VERSION if int4 else FORMAT_VERSION
    if manifest.get("format_version") != version:
        raise CheckpointError(
            f"{path}: field 'format_version' is {manifest.get('format_version')!r}, expected "
            f"{version!r}{' (dtype int4)' if int4 else ''}"
        )
    if manifest.get("dtype") not in SUPPORTED_DTYPES:
        raise CheckpointError(f"{path}: field 'dtype' is {manifest.get('dtype')!r}, expected one of {SUPPORTED_DTYPES}")
    if int4:
        quant = manifest.get("quantization")
        if not isinstance(quant, dict) or quant.get("bits") != 4:
            raise CheckpointError(f"{path}: field 'quantization' is {quant!r}, expected an object with bits 4")
        from .int4 import check_group_size

        try:
            check_group_size(quant.get("group_size"))
        except CheckpointError as exc:
            raise CheckpointError(f"{path}: field 'quantization.group_size': {exc}") from None
    tp = manifest.get("tp_degree")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise CheckpointError(f"{path}: field 'tp_degree' is {tp!r}, expected a positive integer")
    source = manifest.get("source")
    if not isinstance(source, dict) or source.get("kind") not in ("gguf", "hf"):
        raise CheckpointError(f"{path}: field 'source' is {source!r}, expected an object with kind 'gguf' or 'hf'")
    files = manifest.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise CheckpointError(f"{path}: field 'files' is {files!r}, expected a non-empty list of file names")
    for name in files:
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            raise CheckpointError(f"{path}: listed file {name!r} must be a plain file name inside the folder")
    for name in files + ["config.json"]:
        if not (Path(folder) / name).is_file():
            raise CheckpointError(f"{path}: listed file {name!r} is missing from {folder}")
    return manifest
