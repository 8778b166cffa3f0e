#!/usr/bin/env python3
"""Per-kernel device time of model steps from an ncu CSV.

Input: `ncu --csv --metrics gpu__time_duration.sum` of
`swiftspec-cuda-bench --profile SHAPE [--profile-tree N]` (kernels serialized
by the profiler, so PDL overlap is not counted). Steps are split at each
embedding kernel (the first kernel of every step). Prints, for the first step
(decode) and the last one (a tree replay, if any), the time per kernel kind
summed over layers, and the step total.
Usage: ncu_steps.py NCU.csv
"""

import csv
import re
import sys
from collections import OrderedDict


def kind(name: str) -> str:
    m = re.search(r"(gemm_\w+_kernel)<([^>]*)>", name)
    if m:
        epi = m.group(2).split(",")[-1].strip().replace("Epi", "")
        return f"gemm {epi}"
    m = re.search(r"(\w+_kernel)", name)
    return m.group(1) if m else name[:40]


def main() -> None:
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1e3 if unit == "ns" else (v if unit == "us" else v * 1e3)
        rows.append((r["Kernel Name"], us))
    steps, cur = [], None
    for name, us in rows:
        if "embedding_kernel" in name:
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append((name, us))
    if not steps:
        print("no steps found")
        return
    picks = [("decode (step 1)", steps[0])]
    if len(steps) > 1:
        picks.append((f"tree (step {len(steps)})", steps[-1]))
    for label, st in picks:
        agg = OrderedDict()
        for name, us in st:
            k = kind(name)
            c, t = agg.get(k, (0, 0.0))
            agg[k] = (c + 1, t + us)
        total = sum(us for _, us in st)
        print(f"== {label}: {len(st)} kernels, {total:.1f} us (serialized)")
        for k, (c, t) in agg.items():
            print(f"   {k:28s} x{c:4d}  total {t:9.1f} us  mean {t / c:7.2f} us  {100 * t / total:5.1f}%")


if __name__ == "__main__":
    main()
