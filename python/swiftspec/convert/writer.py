"""Writing a checkpoint folder: weights via the ``safetensors`` package, JSON files, manifest last.

Tensor-parallel folders (format version 2) are written by :mod:`.tp_shard` through
:meth:`CheckpointWriter.write_weights` once per ``model-tp{r}-of-{N}.safetensors`` file. Int4
folders (format version 3, ``dtype="int4"``) quantize every linear projection as it is added
(:mod:`.int4`: ``P.weight`` becomes ``P.qweight``/``P.scales``/``P.zeros``) and store the other
tensors as bfloat16.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .dtypes import check_dtype, to_storage
from .int4 import DEFAULT_GROUP_SIZE, check_group_size, projection_prefix, quantize_rtn
from .manifest import MANIFEST

WEIGHTS_FILE = "model.safetensors"

# numpy storage dtype -> safetensors TensorSpec dtype name (uint16 arrays carry bfloat16 bits)
_SPEC_DTYPE = {
    np.dtype(np.float32): "float32",
    np.dtype(np.uint16): "bfloat16",
    np.dtype(np.float16): "float16",
    np.dtype(np.uint8): "uint8",
}


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_folder(out_dir: str | Path, overwrite: bool = False, overwrite_option: str = "overwrite=True") -> bool:
    """Checks that ``out_dir`` can take a new checkpoint: it does not exist, is an empty folder, or
    (``overwrite``) a non-empty one. Cheap: callers check before any conversion work. Returns
    whether it is a non-empty folder (to be overwritten).

    Raises :class:`CheckpointError`: ``out_dir`` exists and is not a folder; it is a non-empty
    folder and ``overwrite`` is false (the message names ``overwrite_option``, how the caller's
    user allows it: ``overwrite=True``, or ``--overwrite`` on a command line).
    """
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return False
    if not out_dir.is_dir():
        raise CheckpointError(f"output path {out_dir} exists and is not a folder")
    try:
        empty = not any(out_dir.iterdir())
    except OSError as exc:
        raise CheckpointError(f"output folder {out_dir} cannot be listed: {exc.strerror or exc}") from None
    if empty:
        return False
    if not overwrite:
        raise CheckpointError(
            f"output folder {out_dir} is not empty; choose a new folder or pass {overwrite_option} to write into it"
        )
    return True


def check_not_source(source: str | Path, out_dir: str | Path) -> None:
    """Raise :class:`CheckpointError` if ``out_dir`` is the folder ``source`` (the input of a conversion):
    writing there (with ``overwrite``) deleted the input's manifest and replaced its weights while they
    were being read, then failed copying its files onto themselves, losing the input."""
    source, out_dir = Path(source), Path(out_dir)
    try:
        same = source.is_dir() and out_dir.is_dir() and os.path.samefile(source, out_dir)
    except OSError:
        same = False
    if same:
        raise CheckpointError(
            f"output folder {out_dir} is the input folder {source}; write the converted checkpoint to another folder"
        )


class _OutputErrors:
    """Context manager: an OSError (no permission, no space, a path that cannot be created) becomes a
    :class:`CheckpointError` naming what was being written (it was a traceback)."""

    def __init__(self, what: str | Path):
        self.what = str(what)

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None and isinstance(exc, OSError):
            raise CheckpointError(f"cannot write {self.what}: {exc.strerror or exc}") from None
        return False


class CheckpointWriter:
    """Collects tensors, then writes a checkpoint folder.

    ``out_dir`` must not exist or be empty, unless ``overwrite`` is true: then an existing
    manifest.json is deleted first (so the folder stops looking complete) and the files
    written here replace their old versions; other files are left alone.
    ``dtype`` is the storage dtype of every tensor (``"bfloat16"`` or ``"float32"``), or
    ``"int4"``: linear projections quantized with ``group_size`` (:func:`.int4.quantize_rtn`),
    every other tensor bfloat16.
    """

    def __init__(self, out_dir: str | Path, dtype: str, overwrite: bool = False, group_size: int = DEFAULT_GROUP_SIZE):
        self.out_dir = Path(out_dir)
        self.dtype = check_dtype(dtype)
        #: storage dtype of the tensors that are not quantized
        self.float_dtype = "bfloat16" if self.dtype == "int4" else self.dtype
        self.group_size = check_group_size(group_size) if self.dtype == "int4" else None
        if check_output_folder(self.out_dir, overwrite):
            with _OutputErrors(self.out_dir / MANIFEST):
                (self.out_dir / MANIFEST).unlink(missing_ok=True)
        with _OutputErrors(f"the output folder {self.out_dir}"):
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self._tensors: dict[str, np.ndarray] = {}

    def add(self, name: str, value: np.ndarray) -> None:
        """Add a float tensor (any float dtype, HF shape); it is stored converted to the checkpoint dtype.

        In an int4 writer a projection ``P.weight`` is quantized and stored as ``P.qweight``,
        ``P.scales`` and ``P.zeros`` (raises :class:`CheckpointError` naming it if its input
        features are not a multiple of the group size or it holds non-finite values).
        """
        prefix = projection_prefix(name) if self.dtype == "int4" else None
        if prefix is None:
            self._put(name, to_storage(np.asarray(value, dtype=np.float32), self.float_dtype))
            return
        assert self.group_size is not None  # (an int4 writer)
        qweight, scales, zeros = quantize_rtn(np.asarray(value), self.group_size, name)
        self._put(prefix + ".qweight", qweight)
        self._put(prefix + ".scales", scales)
        self._put(prefix + ".zeros", zeros)

    def add_int4(self, prefix: str, qweight: np.ndarray, scales: np.ndarray, zeros: np.ndarray) -> None:
        """Add an already quantized projection ``prefix`` (an AWQ / GPTQ folder's, re-packed) to an int4
        writer: ``qweight`` uint8 [N, K/2], ``scales`` float16 and ``zeros`` uint8 [N, K/G] with G the
        writer's group size and every zero point 0..15 (:mod:`.int4`). Raises :class:`CheckpointError`
        naming the projection if a dtype, shape or zero point is not that."""
        if self.dtype != "int4":
            raise CheckpointError(f"{prefix}: int4 values added to a {self.dtype} writer")
        n, half = qweight.shape
        groups = (2 * half) // self.group_size
        want = ((qweight, np.uint8, (n, half)), (scales, np.float16, (n, groups)), (zeros, np.uint8, (n, groups)))
        for a, dtype, shape in want:
            if a.dtype != dtype or a.shape != shape or (2 * half) % self.group_size:
                raise CheckpointError(
                    f"{prefix}: int4 tensors {qweight.dtype}{list(qweight.shape)}, "
                    f"{scales.dtype}{list(scales.shape)}, {zeros.dtype}{list(zeros.shape)} do not "
                    f"fit group size {self.group_size}"
                )
        if zeros.size and zeros.max() > 15:
            raise CheckpointError(f"{prefix}: a zero point is {int(zeros.max())}; 4-bit zero points are 0..15")
        self._put(prefix + ".qweight", np.ascontiguousarray(qweight))
        self._put(prefix + ".scales", np.ascontiguousarray(scales))
        self._put(prefix + ".zeros", np.ascontiguousarray(zeros))

    def _put(self, name: str, storage: np.ndarray) -> None:
        if name in self._tensors:
            raise CheckpointError(f"tensor {name!r} added twice")
        self._tensors[name] = storage

    def add_raw(self, name: str, storage: np.ndarray) -> None:
        """Add a float tensor already in storage form (float32, or uint16 bfloat16 bits)."""
        want = np.float32 if self.float_dtype == "float32" else np.uint16
        if storage.dtype != want:
            raise CheckpointError(f"tensor {name!r}: storage dtype {storage.dtype}, expected {np.dtype(want)}")
        self._tensors[name] = np.ascontiguousarray(storage)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of the tensors added so far."""
        return {n: tuple(a.shape) for n, a in self._tensors.items()}

    def write_weights(self, filename: str = WEIGHTS_FILE, names: list[str] | None = None) -> str:
        """Write the tensors (all, or ``names``) to ``filename`` with ``safetensors.serialize_file``.

        Tensors are written in name order with header metadata ``{"format": "pt"}`` (so PyTorch
        and HF load the file directly). Returns ``filename``.
        """
        from safetensors import TensorSpec, serialize_file

        names = sorted(self._tensors) if names is None else list(names)
        specs = {}
        for n in names:
            a = self._tensors[n]
            specs[n] = TensorSpec(
                dtype=_SPEC_DTYPE[a.dtype], shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes
            )
        # self._tensors keeps every buffer alive for the duration of the call, as serialize_file requires.
        path = self.out_dir / filename
        try:
            serialize_file(specs, str(path), metadata={"format": "pt"})
            os.chmod(path, 0o666 & ~_umask())  # serialize_file creates the file 0600; use the usual mode
        except Exception as exc:  # OSError, or safetensors' own error for a failed write (no space left ...)
            raise CheckpointError(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}") from None
        return filename

    def release(self) -> None:
        """Drop the tensors (after writing) to free memory."""
        self._tensors.clear()

    def write_json(self, filename: str, obj: dict) -> None:
        """Write ``obj`` as indented UTF-8 JSON (non-ASCII kept) to ``filename`` in the folder."""
        text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        self.write_text(filename, text)

    def write_text(self, filename: str, text: str) -> None:
        """Write ``text`` (UTF-8) to ``filename`` in the folder."""
        with _OutputErrors(self.out_dir / filename):
            (self.out_dir / filename).write_text(text, encoding="utf-8")

    def copy_in(self, source: Path) -> None:
        """Copy the file ``source`` into the folder under its own name (metadata kept)."""
        with _OutputErrors(self.out_dir / source.name):
            shutil.copy2(source, self.out_dir / source.name)

    def finish(self, manifest: dict) -> Path:
        """Write manifest.json, the last file: its presence marks the checkpoint complete. Returns the folder."""
        self.write_json(MANIFEST, manifest)
        return self.out_dir
