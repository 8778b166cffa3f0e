#!/usr/bin/env python3
"""Host cost of turning one logits row into a sampled token, per sampling setting.

    python tools/bench_sampling.py                      # a real row of the 0.5B model, 152k vocabulary
    python tools/bench_sampling.py --repeats 50 --out /tmp/sampling.json

A decode step of the 1.5B target takes milliseconds on an H200 (benchmarks/README.md); whatever
the host spends per token on the logits row comes on top. This tool times, on one real next-token
logits row of Qwen2.5-Coder-0.5B (MT-Bench question 81 through the chat template; vocabulary
151936), for each (temperature, top_k, top_p):

- ``full_row_ms``: ``sampling_distribution`` of the whole row (what a sampled step pays when it
  reads the full [vocab] row: target-only decoding with top_k = 0, stochastic verification);
- ``top_k_ms``: the host selection of the row's top_k best (``top_k_indices``) plus
  ``sample_from_top_k`` (what a top_k >= 1 step pays when a backend returns the whole row; the
  CUDA backend selects k <= 64 on the GPU and hands over k entries, so only the draw remains).
- for top_k = 0 (temperature / top-p alone): ``head_ms``, the draw of ``sample_from_head`` from
  the row's 64 best and its normaliser at T (what such a step pays on the host now that the
  backend hands over the head, Model.forward_top_k(k=64, inv_temperature=1/T)); the row is read
  only when the head does not decide (``head_decides``: whether it decides on this row, for
  top-p; the share of u it decides, for temperature alone), and ``row_read_ms``: a draw that does
  read the whole row (u in the tail / the nucleus beyond the head; that is ``full_row_ms`` plus a
  row copy on the GPU).

Then, on real sampled trajectories (``--decode-tokens`` steps of the 0.5B model on each of
``--prompts`` MT-Bench prompts, every step drawn by sample_from_head), how often each top_k = 0
setting reads the whole row (``fallback_rate``).

Times are medians of ``--repeats`` calls (ms). Output: a Markdown table on stdout and a JSON
file (``--out``; fields ``created, command, commit, machine{cpu, logical_cpus}, vocab,
results[{temperature, top_k, top_p, full_row_ms, top_k_ms, head_ms, row_read_ms, head_decides}],
fallback[{temperature, top_p, steps, row_reads, fallback_rate}]``). Bad arguments exit with status 2.
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

SETTINGS = [
    (1.0, 0, 1.0),
    (0.7, 0, 0.8),
    (0.7, 0, 0.9),
    (0.7, 0, 0.95),
    (0.7, 16, 1.0),
    (0.7, 50, 0.9),
    (1.0, 100, 0.95),
]
HEAD_K = 64  # kSampleHeadK (sampling.h)


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def load():
    from swiftspec.datasets import load_mtbench, prompt_messages
    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.swiftspec_core import ModelOptions, load_model
    from swiftspec.tokenizer import Tokenizer

    folder = ensure_checkpoint("qwen2.5-coder-0.5b-instruct", "bfloat16", progress=False)
    opts = ModelOptions()
    opts.max_context = 1024
    model = load_model(str(folder), "cpu", opts)
    tok = Tokenizer.from_checkpoint(folder)
    prompts = [tok.encode_chat(prompt_messages("mtbench", rec)) for rec in load_mtbench(progress=False)]
    return model, prompts


def real_row(model, prompt):
    import numpy as np

    model.truncate_committed(0)
    return np.ascontiguousarray(model.forward(prompt)[0], dtype=np.float32)


def head(row, temperature):
    """The row's HEAD_K best (ids, values) and ln sum exp(row / T) in float64 (T as fp32, as the runtime)."""
    import numpy as np

    from swiftspec.swiftspec_core import spec

    ids = spec.top_k_indices(row, HEAD_K)
    inv_t = 1.0 / float(np.float32(temperature))
    x = row.astype(np.float64)
    m = x.max()
    lse = m * inv_t + float(np.log(np.exp((x - m) * inv_t).sum()))
    return ids, [float(row[i]) for i in ids], lse


def fallback_rates(model, prompts, settings, tokens: int, seed: int = 1):
    """Sampled decoding of `tokens` steps per prompt per setting, each step drawn by sample_from_head
    from Model.forward_top_k(k=HEAD_K, inv_temperature=1/T); counts the steps that read the row."""
    import numpy as np

    from swiftspec import InvalidRequestError
    from swiftspec.swiftspec_core import spec

    rng = np.random.default_rng(seed)
    vocab = model.config["vocab_size"]
    out = []
    for t, p in settings:
        inv_t = 1.0 / float(np.float32(t))
        steps = reads = 0
        for prompt in prompts:
            model.truncate_committed(0)
            ids, vals, lse = model.forward_top_k(prompt, HEAD_K, log_normalizer=True, inv_temperature=inv_t)
            for _ in range(tokens):
                row = None
                u = float(rng.random())
                try:
                    toks, read = spec.sample_from_head(
                        ids[0].tolist(), vals[0].tolist(), float(lse[0]), vocab, t, p, [u]
                    )
                except InvalidRequestError as exc:  # the head does not decide: the row is read (read_logits_row)
                    if "the whole row is needed" not in str(exc):
                        raise
                    row = model.read_logits_row(0)
                    toks, read = spec.sample_from_head(
                        ids[0].tolist(), vals[0].tolist(), float(lse[0]), vocab, t, p, [u], row
                    )
                steps += 1
                reads += int(read[0])
                ids, vals, lse = model.forward_top_k([toks[0]], HEAD_K, log_normalizer=True, inv_temperature=inv_t)
        out.append(
            {"temperature": t, "top_p": p, "steps": steps, "row_reads": reads, "fallback_rate": round(reads / steps, 4)}
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per setting (median reported)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output file")
    ap.add_argument(
        "--decode-tokens",
        type=int,
        default=48,
        help="sampled steps per prompt and setting for the fallback rates (0: skip them)",
    )
    ap.add_argument("--prompts", type=int, default=3, help="MT-Bench prompts for the fallback rates")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.decode_tokens < 0:
        ap.error(f"--decode-tokens must be >= 0, got {args.decode_tokens}")
    if not 1 <= args.prompts <= 80:
        ap.error(f"--prompts must be in [1, 80], got {args.prompts}")
    import numpy as np

    from swiftspec.swiftspec_core import spec

    model, prompts = load()
    row = real_row(model, prompts[0])
    vocab = int(row.size)
    results = []
    for t, k, p in SETTINGS:
        full = median_ms(lambda: spec.sampling_distribution(row, t, k, p), args.repeats)
        top = hd = row_read = decides = None
        if k >= 1:

            def draw(t=t, k=k, p=p):
                ids = spec.top_k_indices(row, k)
                spec.sample_from_top_k(ids, [float(row[i]) for i in ids], t, k, p)

            top = median_ms(draw, args.repeats)
        else:
            ids, vals, lse = head(row, t)
            us = np.random.default_rng(0).random(2000).tolist()
            _, read = spec.sample_from_head(ids, vals, lse, vocab, t, p, us, row)
            decides = round(1.0 - sum(read) / len(read), 4)
            # a draw the head decides (a u it decides; none for a top-p whose nucleus leaves the head)
            u_head = next((u for u, r in zip(us, read) if not r), None)
            if u_head is not None:
                hd = median_ms(lambda: spec.sample_from_head(ids, vals, lse, vocab, t, p, [u_head], row), args.repeats)
            u_row = next((u for u, r in zip(us, read) if r), None)
            if u_row is not None:
                row_read = median_ms(
                    lambda: spec.sample_from_head(ids, vals, lse, vocab, t, p, [u_row], row), args.repeats
                )
        results.append(
            {
                "temperature": t,
                "top_k": k,
                "top_p": p,
                "full_row_ms": round(full, 3),
                "top_k_ms": None if top is None else round(top, 3),
                "head_ms": None if hd is None else round(hd, 4),
                "row_read_ms": None if row_read is None else round(row_read, 3),
                "head_decides": decides,
            }
        )
    fmt = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
    print(
        "| temperature | top_k | top_p | full row (ms) | top-k path (ms) | head path (ms) | head path reading the row (ms) "
        "| head decides |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['temperature']} | {r['top_k']} | {r['top_p']} | {r['full_row_ms']:.2f} | {fmt(r['top_k_ms'], '.2f')} "
            f"| {fmt(r['head_ms'], '.3f')} | {fmt(r['row_read_ms'], '.2f')} | {fmt(r['head_decides'], '.3f')} |"
        )
    fallback = []
    if args.decode_tokens > 0:
        settings = [(t, p) for t, k, p in SETTINGS if k == 0]
        fallback = fallback_rates(model, prompts[: args.prompts], settings, args.decode_tokens)
        print()
        print("| temperature | top_p | sampled steps | whole-row reads | fallback rate |")
        print("|---:|---:|---:|---:|---:|")
        for f in fallback:
            print(f"| {f['temperature']} | {f['top_p']} | {f['steps']} | {f['row_reads']} | {f['fallback_rate']:.3f} |")
    if args.out:
        try:
            commit = (
                subprocess.run(
                    ["git", "rev-parse", "--short", "HEAD"],
                    capture_output=True,
                    text=True,
                    cwd=Path(__file__).resolve().parents[1],
                ).stdout.strip()
                or None
            )
        except OSError:
            commit = None
        doc = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv),
            "commit": commit,
            "machine": {"cpu": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count()},
            "vocab": vocab,
            "results": results,
            "fallback": fallback,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    run(main)
