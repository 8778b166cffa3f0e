#!/usr/bin/env python3
"""Convert a GGUF file or a Hugging Face model folder into a swiftspec checkpoint folder.

    python tools/convert_weights.py model.gguf --out ckpt/ [--dtype bfloat16|float32]
    python tools/convert_weights.py hf_model_dir/ --out ckpt/ --dtype float32

The folder format is docs/checkpoint_format.md. Exit status 2 with a one-line message on bad
input (missing file, not a GGUF, unsupported architecture or tokenizer, non-empty --out ...).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _cli import import_swiftspec, run

import_swiftspec()


def main() -> int:
    from swiftspec.convert import SUPPORTED_DTYPES, convert_gguf, convert_hf
    from swiftspec.convert.writer import check_output_folder
    from swiftspec.errors import CheckpointError

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", type=Path, help="a .gguf file or a Hugging Face model folder")
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to create (must be empty or new)")
    p.add_argument("--dtype", choices=SUPPORTED_DTYPES, default="bfloat16", help="weight storage dtype")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel degree: N > 1 writes one padded shard per rank (docs/checkpoint_format.md); "
                        "the input may then also be a TP-1 checkpoint folder")
    p.add_argument("--overwrite", action="store_true", help="allow writing into a non-empty --out folder")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args()

    if args.tp < 1:
        p.error(f"--tp {args.tp}: the tensor-parallel degree must be >= 1")
    if not args.input.exists():
        raise CheckpointError(f"input {args.input} does not exist")
    check_output_folder(args.out, args.overwrite, "--overwrite")  # before any work (reading, hashing the input)
    kwargs = dict(dtype=args.dtype, progress=not args.quiet, overwrite=args.overwrite)
    if args.tp > 1:  # pre-sharded, padded folder (swiftspec.convert.tp_shard; input may be a TP-1 folder)
        from swiftspec.convert.tp_shard import convert_sharded

        out = convert_sharded(args.input, args.out, args.tp, **kwargs)
    elif args.input.is_dir():
        out = convert_hf(args.input, args.out, **kwargs)
    else:
        out = convert_gguf(args.input, args.out, **kwargs)
    print(out)
    return 0


if __name__ == "__main__":
    run(main)
