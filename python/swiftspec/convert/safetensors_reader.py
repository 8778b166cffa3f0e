"""Reading safetensors files into float32 numpy arrays, bfloat16 included, without torch.

``safetensors.numpy`` has no bfloat16 dtype, so this reads the (simple) file format directly:
an 8-byte little-endian header length, a JSON header mapping each tensor name to its
``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), then the data.
Tensors are memory-mapped; only the one being converted is widened to float32.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .dtypes import bfloat16_bits_to_float32

_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}
_MAX_HEADER = 100 << 20


class SafetensorsFile:
    """One safetensors file: ``entries`` (name -> header entry) and :meth:`float32`.

    Raises :class:`CheckpointError` naming the file if the header is malformed or a tensor's
    byte range lies outside the file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise CheckpointError(f"{self.path} is too short to be a safetensors file")
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_HEADER or 8 + n > size:
                    raise CheckpointError(f"{self.path}: header length {n} is invalid for a {size}-byte file")
                header = json.loads(f.read(n))
        except FileNotFoundError:
            raise CheckpointError(f"safetensors file {self.path} does not exist") from None
        except OSError as exc:  # a folder, no permission ...
            raise CheckpointError(f"safetensors file {self.path} cannot be read: {exc.strerror or exc}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{self.path}: safetensors header is not valid JSON: {exc}") from None
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
                raise CheckpointError(f"{self.path}: tensor {name!r}: field 'dtype' is {e.get('dtype')!r}, "
                                      "expected a string")
            shape = e.get("shape")
            if not isinstance(shape, list) or not all(is_count(d) for d in shape):
                raise CheckpointError(f"{self.path}: tensor {name!r}: field 'shape' is {shape!r}, expected a list "
                                      "of integers >= 0")
            offsets = e.get("data_offsets")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_count(o) for o in offsets)):
                raise CheckpointError(f"{self.path}: tensor {name!r}: field 'data_offsets' is {offsets!r}, expected "
                                      "[begin, end], two integers >= 0")
            start, end = offsets
            if not start <= end <= data_len:
                raise CheckpointError(f"{self.path}: tensor {name!r} has data_offsets {offsets!r} "
                                      f"outside the {data_len} data bytes (truncated file?)")

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` as stored."""
        return tuple(self.entries[name]["shape"])

    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` widened exactly to float32 (F32, F16, BF16 or F64 input, F64 rounded).

        Raises :class:`CheckpointError` for other dtypes or a size that does not match the shape.
        """
        e = self.entries[name]
        kind = e["dtype"]
        if kind not in _NUMPY:
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {kind}; supported: {', '.join(_NUMPY)}")
        start, end = e["data_offsets"]
        dt = np.dtype(_NUMPY[kind]).newbyteorder("<")
        count = int(np.prod(e["shape"])) if e["shape"] else 1
        if (end - start) != count * dt.itemsize:
            raise CheckpointError(f"{self.path}: tensor {name!r} holds {end - start} bytes, shape {e['shape']} "
                                  f"of {kind} needs {count * dt.itemsize}")
        raw = np.memmap(self.path, dtype=dt, mode="r", offset=self.data_start + start, shape=(count,)) \
            if count else np.zeros(0, dt)
        if kind == "BF16":
            values = bfloat16_bits_to_float32(raw)
        else:
            values = np.asarray(raw, dtype=np.float32)
        return values.reshape(e["shape"])
