#!/usr/bin/env python3
"""Weight error of GGUF projections converted to int4, by route, against the GGUF's own values.

    python tools/check_gguf_int4_error.py MODEL.gguf [MODEL.gguf ...] --out errors.json

For every linear projection of each GGUF file (q/k/v/o, gate/up/down), the relative error
``|int4 - gguf| / |gguf|`` of its int4 weights against gguf-py's dequantized values, for:

* ``gguf32``: the default GGUF -> int4 route (``swiftspec.convert.gguf_int4``, group 32): per
  group the GGUF's own 4-bit values or the requantization search, whichever is closer;
* ``kept32`` (Q4_0 / Q4_1 / Q4_K only): every group keeps the GGUF's 4-bit values (integer zero
  point, least-squares scale), no requantization (except groups that cannot: a zero sub-block
  scale; their fraction is reported);
* ``search32``: every group requantized by the search, the GGUF's 4-bit values never kept;
* ``rtn32``, ``rtn128``: round-to-nearest from the dequantized values (``--int4-method rtn``; group
  128 was the only route before 2026-12-07).

Per GGUF type it reports the error of the type's tensors together (``sqrt(sum err^2 / sum w^2)``)
and the mean and largest per-tensor error, plus the fraction of ``gguf32`` groups that keep the
GGUF's values. Writes JSON ``{created, commit, command, files: {name: {type: {route: ...}}}}`` and
prints one line per file, type and route. Slow (minutes per billion weights on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import import_swiftspec, run  # noqa: E402

import_swiftspec()

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
ROUTES = ("gguf32", "kept32", "search32", "rtn32", "rtn128")


def route_errors(w, type_name: str, raw) -> dict[str, tuple]:
    """Route -> (sum of squared errors, sum of squared weights[, fraction of groups]) for one tensor
    ``w`` [N, K] of GGUF type ``type_name`` with blocks ``raw``. ``gguf32`` also gives the fraction of
    groups keeping the GGUF's values; ``kept32`` the fraction of groups that cannot keep them (a zero
    sub-block scale: those take the search's values)."""
    import numpy as np

    from swiftspec.convert import gguf_int4 as gi
    from swiftspec.convert.int4 import dequantize, quantize_rtn

    norm2 = float(np.square(w, dtype=np.float64).sum())
    wg = w.reshape(-1, 32)
    _, _, _, search = gi.requantize(wg)
    out = {"search32": (float(search.astype(np.float64).sum()), norm2)}
    if type_name in gi.KEPT_TYPES:
        q, a, b = gi.four_bit_blocks(raw, type_name, *w.shape)
        _, _, _, kept = gi.keep_values(q.reshape(-1, 32).astype(np.float32), a.reshape(-1), b.reshape(-1), wg)
        impossible = ~np.isfinite(kept)
        out["kept32"] = (
            float(np.where(impossible, search, kept).astype(np.float64).sum()),
            norm2,
            float(impossible.mean()),
        )
        keep = kept <= search
        out["gguf32"] = (float(np.where(keep, kept, search).astype(np.float64).sum()), norm2, float(keep.mean()))
    else:
        out["gguf32"] = (out["search32"][0], norm2, 0.0)
    for g in (32, 128):
        if w.shape[1] % g == 0:
            ours = dequantize(*quantize_rtn(w, g), g)
            out[f"rtn{g}"] = (float(np.square(ours - w, dtype=np.float64).sum()), norm2)
    return out


def main() -> int:
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    from swiftspec.bench.machine import commit_label

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="+", type=Path, help="GGUF model files")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit_label(),
        "command": " ".join(sys.argv),
        "files": {},
    }
    for path in args.gguf:
        acc: dict[str, dict] = {}
        for t in gguf.GGUFReader(path).tensors:
            parts = t.name.split(".")
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in PROJECTIONS or parts[3] != "weight":
                continue
            k, rows = (int(d) for d in t.shape)
            raw = np.array(t.data)
            w = dequantize(raw, t.tensor_type).astype(np.float32).reshape(rows, k)
            per_type = acc.setdefault(t.tensor_type.name, {})
            for route, (err2, norm2, *kept) in route_errors(w, t.tensor_type.name, raw).items():
                a = per_type.setdefault(route, {"tensors": 0, "err2": 0.0, "norm2": 0.0, "per_tensor": [], "kept": []})
                a["tensors"] += 1
                a["err2"] += err2
                a["norm2"] += norm2
                a["per_tensor"].append((err2 / norm2) ** 0.5)
                a["kept"] += kept
        summary = {}
        for type_name, routes in sorted(acc.items()):
            summary[type_name] = {}
            for route in ROUTES:
                if route not in routes:
                    continue
                a = routes[route]
                row = {
                    "tensors": a["tensors"],
                    "relative_error": (a["err2"] / a["norm2"]) ** 0.5,
                    "per_tensor_mean": float(np.mean(a["per_tensor"])),
                    "per_tensor_max": max(a["per_tensor"]),
                }
                if a["kept"]:  # gguf32: groups keeping the GGUF's values; kept32: groups that cannot
                    row["kept_groups_mean" if route == "gguf32" else "cannot_keep_mean"] = float(np.mean(a["kept"]))
                summary[type_name][route] = row
                print(path.name, type_name, route, json.dumps(row), flush=True)
        doc["files"][path.name] = summary
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    run(main)
