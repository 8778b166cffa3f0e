"""The quantization settings of a Hugging Face folder quantized with AutoAWQ or GPTQ, checked.

Where they are: ``quantization_config`` in config.json (what transformers, AutoAWQ and GPTQModel
write), else ``quantize_config.json`` (AutoGPTQ) or ``quant_config.json`` (older AutoAWQ). A folder
with neither is a float folder (:func:`read_quant_config` returns None).

What is accepted (everything else is refused naming the file and the field, before any weight is
read):

* AutoAWQ (``quant_method: "awq"``): ``bits`` (or ``w_bit``) 4; ``group_size`` (or
  ``q_group_size``) a positive multiple of 8, or -1 (one group per row); ``zero_point`` true
  (asymmetric, the only layout with ``qzeros``); ``version`` ``"gemm"`` (AutoAWQ's GEMM packing;
  GEMV, GEMV-fast, Marlin and ExLlama packings differ); ``backend`` absent or ``"autoawq"``.
* GPTQ (``quant_method: "gptq"``, AutoGPTQ / GPTQModel / optimum): ``bits`` 4; ``group_size`` as
  above; ``desc_act`` false (with act-order the groups of input rows are permuted by ``g_idx``, which
  the int4 format's contiguous groups cannot express); ``sym`` true or false (either way the zero
  points are stored in ``qzeros``); ``checkpoint_format`` (or ``format``) ``"gptq"`` (the original
  layout: stored zero point = zero point - 1) or ``"gptq_v2"`` (stored as is); absent means
  ``"gptq"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError

#: quantization methods whose folders the converter reads
SUPPORTED_METHODS = ("awq", "gptq")
_SIDE_FILES = ("quantize_config.json", "quant_config.json")


@dataclass(frozen=True)
class QuantConfig:
    """The checked settings of a quantized folder.

    ``method``: ``"awq"`` or ``"gptq"``. ``group_size``: input rows per scale and zero point, or
    None for one group per row (``-1`` in the file). ``symmetric``: GPTQ's ``sym`` (AWQ: False).
    ``zero_offset``: added to every stored zero point (1 for GPTQ's original format, else 0).
    ``layout``: ``"autoawq-gemm"``, ``"gptq"`` or ``"gptq_v2"``. ``origin``: the file the settings
    came from, and ``key`` the path to them in it (``"quantization_config."`` or ``""``), for messages.
    ``raw``: the settings as found (kept in the converted folder's manifest).
    """

    method: str
    group_size: int | None
    symmetric: bool
    zero_offset: int
    layout: str
    origin: str
    key: str
    raw: dict = field(compare=False)

    def field_name(self, name: str) -> str:
        """``"<file>: field 'quantization_config.<name>'"``: how messages name a setting."""
        return f"{self.origin}: field '{self.key}{name}'"


def _find(hf_dir: Path, hf_config: dict) -> tuple[dict, str, str] | None:
    """(settings, file, key prefix) of the folder's quantization settings, or None."""
    config_path = hf_dir / "config.json"
    q = hf_config.get("quantization_config")
    if q is not None:
        if not isinstance(q, dict):
            raise CheckpointError(f"{config_path}: field 'quantization_config' is {q!r}, expected an object")
        return q, str(config_path), "quantization_config."
    for name in _SIDE_FILES:
        path = hf_dir / name
        if path.is_file():
            try:
                q = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise CheckpointError(f"{path} cannot be read as JSON: {exc}") from None
            if not isinstance(q, dict):
                raise CheckpointError(f"{path}: expected a JSON object")
            return q, str(path), ""
    return None


def _get(q: dict, *names, default=None):
    """The first of ``names`` present in ``q`` (name, value); (names[0], default) if none is."""
    for name in names:
        if name in q:
            return name, q[name]
    return names[0], default


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_quant_config(hf_dir: str | Path, hf_config: dict) -> QuantConfig | None:
    """The checked quantization settings of the HF folder ``hf_dir`` (its config.json parsed as
    ``hf_config``), or None when it has none (a float folder).

    Raises :class:`CheckpointError` naming the file and the field (``quantization_config.bits`` ...)
    for a method other than AutoAWQ / GPTQ, ``bits`` other than 4, a bad ``group_size``, GPTQ's
    ``desc_act`` true, AWQ's ``zero_point`` false or a packing ``version`` other than GEMM, an unknown
    GPTQ ``checkpoint_format``.
    """
    found = _find(Path(hf_dir), hf_config)
    if found is None:
        return None
    q, origin, key = found

    def bad(name, value, expected):
        return CheckpointError(f"{origin}: field '{key}{name}' is {json.dumps(value)}; {expected}")

    name, method = _get(q, "quant_method")
    if method is None and key == "":  # AutoGPTQ / old AutoAWQ side files may omit it
        method = "awq" if Path(origin).name == "quant_config.json" else "gptq"
    if isinstance(method, str):
        method = method.lower()
    if method not in SUPPORTED_METHODS:
        raise bad(name, method, 'swiftspec reads folders quantized with AutoAWQ ("awq") or GPTQ ("gptq")')
    name, bits = _get(q, "bits", "w_bit")
    if bits != 4:
        raise bad(name, bits, "swiftspec's int4 format holds 4-bit weights only (bits must be 4)")
    name, group = _get(q, "group_size", "q_group_size")
    if not _is_int(group) or not (group == -1 or (group >= 8 and group % 8 == 0)):
        raise bad(name, group, "expected a positive multiple of 8 (e.g. 32, 64, 128) or -1 (one group per row)")
    group_size = None if group == -1 else group

    if method == "awq":
        name, zero_point = _get(q, "zero_point", default=True)
        if zero_point is not True:
            raise bad(name, zero_point, "only asymmetric AWQ (zero_point true, with qzeros) is supported")
        name, version = _get(q, "version", default="gemm")
        if not isinstance(version, str) or version.lower() != "gemm":
            raise bad(
                name,
                version,
                'only AutoAWQ\'s GEMM packing (version "gemm") is supported; GEMV, '
                "GEMV-fast, Marlin and ExLlama folders pack their weights differently",
            )
        name, backend = _get(q, "backend", default="autoawq")
        if backend not in ("autoawq", None):
            raise bad(name, backend, 'only AutoAWQ\'s layout (backend "autoawq") is supported')
        return QuantConfig("awq", group_size, False, 0, "autoawq-gemm", origin, key, dict(q))

    name, desc_act = _get(q, "desc_act", default=False)
    if desc_act is not False:
        raise bad(
            name,
            desc_act,
            "GPTQ with act-order (desc_act true) permutes the input rows of every group "
            "(g_idx), which swiftspec's int4 format cannot hold; use a desc_act false folder",
        )
    name, sym = _get(q, "sym", default=True)
    if not isinstance(sym, bool):
        raise bad(name, sym, "expected true or false")
    name, fmt = _get(q, "checkpoint_format", "format", default="gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise bad(
            name,
            fmt,
            'supported GPTQ checkpoint formats: "gptq" (zero points stored minus 1) and "gptq_v2" (stored as they are)',
        )
    return QuantConfig("gptq", group_size, sym, 1 if fmt == "gptq" else 0, fmt, origin, key, dict(q))
