#!/usr/bin/env python3
"""Per-CTA handoff gaps of one decode-megakernel step, from its trace CSV.

Input: a file written by `swiftspec-cuda-bench --megakernel-trace-csv DIR`
(`mk_trace_<shape>.csv`, plain or gzipped): one row per (layer, op, CTA) with
the CTA's arrival at the op's wait, its start (the wait over) and its end, in
ns after the step's first start; -1 where the CTA has no such stamp (no rows
in that op).

For each op kind, over layers 2 .. L-2 and every CTA with rows in both ops,
prints the quantiles (median, p90, max, in us) of
  * "end -> arrive": from the CTA's own end of the previous op to its arrival
    at this op's wait (the CTA still busy: its counter release, whatever runs
    between the ops), and
  * "arrive -> start": the time it then waits for the other CTAs.
The previous op of QKV is the previous layer's down op; of the attention, QKV;
of O, the attention; of gate/up, O; of down, gate/up. The stamps come from
%globaltimer, which on the H200 advances in steps of ~0.256 us: the
quantiles are multiples of that step.

Usage: mk_trace_gaps.py TRACE.csv[.gz] [...]
Errors: exits with status 1 and a message naming the file for a missing file
or a CSV without the columns above; 2 (argparse) without a file.
"""

import argparse
import csv
import gzip
import sys

PREVIOUS = {"qkv": "down", "attn_units": "qkv", "o_proj": "attn_units", "gate_up": "o_proj", "down": "gate_up"}
COLUMNS = {"layer", "op", "cta", "arrive_ns", "start_ns", "end_ns"}


def read(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or not COLUMNS.issubset(reader.fieldnames):
                sys.exit(f"{path}: not a megakernel trace CSV (needs columns {sorted(COLUMNS)})")
            return {
                (int(r["layer"]), r["op"], int(r["cta"])): (int(r["arrive_ns"]), int(r["start_ns"]), int(r["end_ns"]))
                for r in reader
            }
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")


def quantile(values: list, q: float) -> float:
    s = sorted(values)
    return s[int(q * (len(s) - 1))]


def report(path: str) -> None:
    stamps = read(path)
    layers = max(k[0] for k in stamps)  # the LM head's row has layer == num_layers
    ctas = max(k[2] for k in stamps) + 1
    print(f"{path}: {layers} layers, {ctas} CTAs (us: median / p90 / max)")
    for op, prev in PREVIOUS.items():
        busy, waiting = [], []
        for layer in range(2, layers - 1):
            prev_layer = layer - 1 if op == "qkv" else layer
            for c in range(ctas):
                arrive, start, _ = stamps[(layer, op, c)]
                _, _, prev_end = stamps[(prev_layer, prev, c)]
                if arrive < 0 or prev_end < 0:
                    continue
                busy.append((arrive - prev_end) / 1e3)
                waiting.append((start - arrive) / 1e3)
        if not busy:
            print(f"  {op:10s} no CTA with rows in both ops")
            continue
        print(
            f"  {op:10s} end -> arrive {quantile(busy, 0.5):5.2f} / {quantile(busy, 0.9):5.2f} / {max(busy):5.2f}"
            f"   arrive -> start {quantile(waiting, 0.5):5.2f} / {quantile(waiting, 0.9):5.2f} / {max(waiting):5.2f}"
            f"   (n={len(busy)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="mk_trace_<shape>.csv or .csv.gz files")
    for path in parser.parse_args().traces:
        report(path)


if __name__ == "__main__":
    main()
