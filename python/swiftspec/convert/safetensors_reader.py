"""Reading safetensors files into float32 numpy arrays, bfloat16 included, without torch.

``safetensors.numpy`` has no bfloat16 dtype, so this reads the (simple) file format directly:
an 8-byte little-endian header length, a JSON header mapping each tensor name to its
``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), then the data.
Tensors are memory-mapped; only the one being converted is widened to float32.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import numpy as np

from .._json_file import limit, loads
from ..errors import CheckpointError
from .dtypes import bfloat16_bits_to_float32

_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}
# Integer tensors of quantized folders (AutoAWQ / GPTQ ``qweight``, ``qzeros``, ``g_idx``): read as stored.
_INTEGER = {"I32": np.int32, "U32": np.uint32, "I64": np.int64, "U8": np.uint8, "I8": np.int8, "I16": np.int16}
# The safetensors library's own cap (100 MB), as the runtime's (json_read.h).
_MAX_HEADER = limit("max_safetensors_header_bytes")


class SafetensorsFile:
    """One safetensors file: ``entries`` (name -> header entry) and :meth:`float32`.

    Raises :class:`CheckpointError` naming the file if the header is malformed or a tensor's
    byte range lies outside the file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            # O_NONBLOCK and fstat before reading: open() of a FIFO blocked for ever.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            with open(fd, "rb") as f:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise CheckpointError(f"safetensors file {self.path} is not a regular file")
                size = st.st_size
                head = f.read(8)
                if len(head) < 8:
                    raise CheckpointError(f"{self.path} is too short to be a safetensors file")
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or 8 + n > size:
                    raise CheckpointError(f"{self.path}: header length {n} is invalid for a {size}-byte file")
                raw = f.read(n)
        except FileNotFoundError:
            raise CheckpointError(f"safetensors file {self.path} does not exist") from None
        except OSError as exc:  # a folder, no permission ...
            raise CheckpointError(f"safetensors file {self.path} cannot be read: {exc.strerror or exc}") from None
        # The runtime's limits first (depth, number range): json.loads recursed past the
        # interpreter's limit on deep nesting.
        header = loads(raw, self.path, f"{self.path}: safetensors header is not valid JSON")
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: safetensors header is not a JSON object")
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        self.entries: dict[str, dict] = header
        data_len = size - self.data_start

        def is_count(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        for name, e in header.items():
            # A malformed entry (not an object, a missing or mistyped field) was an AttributeError,
            # KeyError, TypeError or ValueError traceback.
            if not isinstance(e, dict):
                raise CheckpointError(f"{self.path}: tensor {name!r}: header entry {e!r} is not an object")
            if not isinstance(e.get("dtype"), str):
                raise CheckpointError(
                    f"{self.path}: tensor {name!r}: field 'dtype' is {e.get('dtype')!r}, expected a string"
                )
            shape = e.get("shape")
            if not isinstance(shape, list) or not all(is_count(d) for d in shape):
                raise CheckpointError(
                    f"{self.path}: tensor {name!r}: field 'shape' is {shape!r}, expected a list of integers >= 0"
                )
            offsets = e.get("data_offsets")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_count(o) for o in offsets)):
                raise CheckpointError(
                    f"{self.path}: tensor {name!r}: field 'data_offsets' is {offsets!r}, expected "
                    "[begin, end], two integers >= 0"
                )
            start, end = offsets
            if not start <= end <= data_len:
                raise CheckpointError(
                    f"{self.path}: tensor {name!r} has data_offsets {offsets!r} "
                    f"outside the {data_len} data bytes (truncated file?)"
                )

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` as stored."""
        return tuple(self.entries[name]["shape"])

    def dtype(self, name: str) -> str:
        """safetensors dtype name of tensor ``name`` as stored (``"I32"``, ``"F16"``, ...)."""
        return self.entries[name]["dtype"]

    def _map(self, name: str, kinds: dict) -> np.ndarray:
        """Tensor ``name`` memory-mapped as stored (flat), if its dtype is one of ``kinds``."""
        e = self.entries[name]
        kind = e["dtype"]
        if kind not in kinds:
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {kind}; supported: {', '.join(kinds)}")
        start, end = e["data_offsets"]
        dt = np.dtype(kinds[kind]).newbyteorder("<")
        count = int(np.prod(e["shape"])) if e["shape"] else 1
        if (end - start) != count * dt.itemsize:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} holds {end - start} bytes, shape {e['shape']} "
                f"of {kind} needs {count * dt.itemsize}"
            )
        return (
            np.memmap(self.path, dtype=dt, mode="r", offset=self.data_start + start, shape=(count,))
            if count
            else np.zeros(0, dt)
        )

    def integers(self, name: str) -> np.ndarray:
        """Integer tensor ``name`` (I32, U32, I64, I16, I8 or U8) as stored, native byte order, in its shape.

        Raises :class:`CheckpointError` for other dtypes or a size that does not match the shape.
        """
        raw = self._map(name, _INTEGER)
        return np.asarray(raw, dtype=raw.dtype.newbyteorder("=")).reshape(self.entries[name]["shape"])

    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` widened exactly to float32 (F32, F16, BF16 or F64 input, F64 rounded).

        Raises :class:`CheckpointError` for other dtypes or a size that does not match the shape.
        """
        e = self.entries[name]
        kind = e["dtype"]
        raw = self._map(name, _NUMPY)
        if kind == "BF16":
            values = bfloat16_bits_to_float32(raw)
        else:
            values = np.asarray(raw, dtype=np.float32)
        return values.reshape(e["shape"])
