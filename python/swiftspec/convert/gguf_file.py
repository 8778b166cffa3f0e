"""Opening a GGUF file and reading its metadata, with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CheckpointError

_GGUF_MAGIC = b"GGUF"
_MISSING = object()


class GGUFModelFile:
    """A parsed GGUF file (``gguf.GGUFReader`` over a read-only memory map).

    ``path``: the file. ``architecture``: the ``general.architecture`` value (e.g. ``"qwen2"``).
    ``tensors``: GGUF tensor name -> ``gguf.ReaderTensor`` in file order.

    Raises :class:`CheckpointError` if the file is missing, does not start with the GGUF magic,
    or cannot be parsed (e.g. truncated).
    """

    def __init__(self, path: str | Path):
        import gguf

        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(f"GGUF file {self.path} does not exist")
        if not self.path.is_file():
            raise CheckpointError(f"GGUF path {self.path} is not a regular file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != _GGUF_MAGIC:
            raise CheckpointError(
                f"{self.path} is not a GGUF file: it starts with {magic!r}, a GGUF file starts with {_GGUF_MAGIC!r}"
            )
        # The runtime's bounds check first (cpp/src/runtime/gguf_check.h): the reader trusts every count in
        # the file, and one array item type changed from STRING to ARRAY made it grow until the
        # machine's memory was gone.
        from ..swiftspec_core import check_gguf_file

        check_gguf_file(str(self.path))
        try:
            self.reader = gguf.GGUFReader(self.path, "r")
        except Exception as exc:  # the reader raises ValueError, IndexError, struct errors ... on bad files
            raise CheckpointError(f"{self.path} cannot be parsed as GGUF (truncated or corrupted?): {exc}") from exc
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.architecture = self.require("general.architecture", str)

    def has(self, key: str) -> bool:
        """Whether metadata field ``key`` is present."""
        return key in self.reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        """The Python value of metadata field ``key`` (str, int, float, bool or list), or ``default``."""
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as exc:
            raise CheckpointError(f"{self.path}: metadata field {key!r} cannot be decoded: {exc}") from exc

    def require(self, key: str, kind: type | tuple[type, ...] | None = None) -> Any:
        """Like :meth:`get`, but a missing field, or one not of type ``kind``, raises :class:`CheckpointError`."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise CheckpointError(f"{self.path}: required metadata field {key!r} is missing")
        if kind is not None:
            ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _as_tuple(kind))
            if not ok:
                raise CheckpointError(
                    f"{self.path}: metadata field {key!r} has value {value!r}, expected {_kind_name(kind)}"
                )
        return value

    def arch_get(self, key: str, default: Any = None) -> Any:
        """:meth:`get` of ``"<architecture>.<key>"``."""
        return self.get(f"{self.architecture}.{key}", default)

    def arch_require(self, key: str, kind: type | tuple[type, ...] | None = None) -> Any:
        """:meth:`require` of ``"<architecture>.<key>"``."""
        return self.require(f"{self.architecture}.{key}", kind)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _as_tuple(kind))
