#!/usr/bin/env python3
"""A random-weight twin of a swiftspec checkpoint: the same config, tokenizer, tensor names and
shapes, random bfloat16 weights. For GPU runs that need a real model's shapes and tokenizer but not
its weights (the auto mode's fallback with a draft that never agrees, issue 32), without carrying
the weights to the GPU machine.

    python tools/random_twin.py layout CHECKPOINT LAYOUT_DIR     # small: configs, tokenizer, shapes
    python tools/random_twin.py make LAYOUT_DIR OUT_DIR --seed 1  # the twin, where it is used

``layout`` copies the checkpoint's JSON files and tokenizer, and writes ``tensors.json`` (name ->
shape, dtype) from its safetensors header. ``make`` writes ``model.safetensors`` with N(0, 0.02)
weights, norms 1 and biases 0 (so a twin's logits are well scaled) under the same manifest. Exit
status 2 with one line for a bad folder or a layout that is not bfloat16.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

COPIED = ("config.json", "manifest.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def layout(checkpoint: Path, out: Path) -> None:
    from swiftspec.convert.safetensors_reader import SafetensorsFile

    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (checkpoint / name).exists():
            shutil.copy(checkpoint / name, out / name)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    tensors: dict[str, dict] = {}
    for f in manifest["files"]:
        st = SafetensorsFile(checkpoint / f)
        for name in st.entries:
            tensors[name] = {"shape": list(st.shape(name)), "dtype": st.dtype(name)}
    (out / "tensors.json").write_text(json.dumps(tensors))


def make(layout_dir: Path, out: Path, seed: int) -> None:
    from swiftspec.convert.dtypes import float32_to_bfloat16_bits
    from swiftspec.convert.writer import CheckpointWriter

    tensors = json.loads((layout_dir / "tensors.json").read_text())
    if any(t["dtype"] != "BF16" for t in tensors.values()):
        raise ValueError("the layout's tensors are not all BF16")
    rng = np.random.default_rng(seed)
    w = CheckpointWriter(out, "bfloat16")
    for name, t in tensors.items():
        shape = tuple(t["shape"])
        if name.endswith("norm.weight"):
            x = np.ones(shape, np.float32)
        elif name.endswith(".bias"):
            x = np.zeros(shape, np.float32)
        else:
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        w.add_raw(name, float32_to_bfloat16_bits(x))
    w.write_weights()
    # The manifest last: a folder with one is complete.
    for name in COPIED:
        if (layout_dir / name).exists():
            shutil.copy(layout_dir / name, out / name)


def main() -> int:
    from swiftspec.errors import SwiftspecError

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("layout")
    a.add_argument("checkpoint", type=Path)
    a.add_argument("out", type=Path)
    b = sub.add_parser("make")
    b.add_argument("layout", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    try:
        if args.cmd == "layout":
            layout(args.checkpoint, args.out)
        else:
            make(args.layout, args.out, args.seed)
    except (OSError, KeyError, ValueError, SwiftspecError) as e:
        print(f"error: random_twin {args.cmd}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
