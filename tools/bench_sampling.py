#!/usr/bin/env python3
"""Host cost of turning one logits row into a sampled token, per sampling setting.

    python tools/bench_sampling.py                      # a real row of the 0.5B model, 152k vocabulary
    python tools/bench_sampling.py --repeats 50 --out /tmp/sampling.json

A decode step of the 1.5B target takes ~1.8 ms on an H200 (benchmarks/README.md); whatever the
host spends per token on the logits row comes on top. This tool times, on one real next-token
logits row of Qwen2.5-Coder-0.5B (MT-Bench question 81 through the chat template; vocabulary
151936), for each (temperature, top_k, top_p):

- ``full_row_ms``: ``sampling_distribution`` of the whole row (what a sampled step pays when it
  reads the full [vocab] row: target-only decoding with top_k = 0, stochastic verification);
- ``top_k_ms``: the host selection of the row's top_k best (``top_k_indices``) plus
  ``sample_from_top_k`` (what a top_k >= 1 step pays when a backend returns the whole row; the
  CUDA backend selects k <= 16 on the GPU and hands over k entries, so only the draw remains).

Times are medians of ``--repeats`` calls (ms). Output: a Markdown table on stdout and a JSON
file (``--out``; fields ``created, command, commit, machine{cpu, logical_cpus}, vocab,
results[{temperature, top_k, top_p, full_row_ms, top_k_ms}]``). Bad arguments exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import import_swiftspec, run  # noqa: E402

import_swiftspec()

SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 0.9), (0.7, 0, 0.95), (0.7, 16, 1.0), (0.7, 50, 0.9), (1.0, 100, 0.95)]


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def real_row():
    import numpy as np

    from swiftspec.datasets import load_mtbench, prompt_messages
    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.swiftspec_core import ModelOptions, load_model
    from swiftspec.tokenizer import Tokenizer

    folder = ensure_checkpoint("qwen2.5-coder-0.5b-instruct", "bfloat16", progress=False)
    opts = ModelOptions()
    opts.max_context = 512
    model = load_model(str(folder), "cpu", opts)
    tok = Tokenizer.from_checkpoint(folder)
    ids = tok.encode_chat(prompt_messages("mtbench", load_mtbench(progress=False)[0]))
    return np.ascontiguousarray(model.forward(ids)[0], dtype=np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per setting (median reported)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output file")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    from swiftspec.swiftspec_core import spec

    row = real_row()
    results = []
    for t, k, p in SETTINGS:
        full = median_ms(lambda: spec.sampling_distribution(row, t, k, p), args.repeats)
        top = None
        if k >= 1:
            def draw(t=t, k=k, p=p):
                ids = spec.top_k_indices(row, k)
                spec.sample_from_top_k(ids, [float(row[i]) for i in ids], t, k, p)
            top = median_ms(draw, args.repeats)
        results.append({"temperature": t, "top_k": k, "top_p": p, "full_row_ms": round(full, 3),
                        "top_k_ms": None if top is None else round(top, 3)})
    print("| temperature | top_k | top_p | full row (ms) | top-k path (ms) |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        tk = "–" if r["top_k_ms"] is None else f"{r['top_k_ms']:.2f}"
        print(f"| {r['temperature']} | {r['top_k']} | {r['top_p']} | {r['full_row_ms']:.2f} | {tk} |")
    if args.out:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).resolve().parents[1]).stdout.strip() or None
        except OSError:
            commit = None
        doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
               "commit": commit, "machine": {"cpu": platform.processor() or platform.machine(),
                                             "logical_cpus": os.cpu_count()},
               "vocab": int(row.size), "results": results}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    run(main)
