#!/usr/bin/env python3
"""CPU decode benchmark of the reference models, target-only, against this machine's memory
bandwidth (issue 2's "CPU benchmark in tools/").

    python tools/bench_cpu_decode.py                       # both Qwen models, bf16 and fp32
    python tools/bench_cpu_decode.py --models qwen2.5-coder-0.5b-instruct --dtypes bfloat16 \\
        --new-tokens 32 --repeats 2 --out /tmp/decode.json
    python tools/bench_cpu_decode.py --checkpoints g32=DIR_A,g128=DIR_B --out /tmp/decode.json

For each model and weight dtype it loads the converted checkpoint, runs one untimed warm-up
request, then ``--repeats`` greedy target-only requests of ``--new-tokens`` tokens on one
prompt (MT-Bench question 81, first turn, through the chat template: a long answer, so EOS does
not end it early) and reports the median TTFT and decode tokens/s.

The physical limit: a decode step reads every weight matrix once (the embedding table only one
row, unless it is tied to the LM head), so tokens/s can be no more than
``memory bandwidth / weight bytes per token``. The bandwidth is measured in the same run, before
and after the models, with large numpy copies (arrays of ``--bandwidth-mib`` each, far larger
than the last-level cache; 1 thread and one per usable CPU, each copying its own slice), counting
bytes read + bytes written; the best of the runs is "the" bandwidth. KV-cache bytes read per
step (float32, grows with the context) are reported beside it but not added to the limit.

Output: a JSON file (default ``benchmarks/<UTC date>-cpu-decode/cpu_decode.json``) and a
Markdown table on stdout. Fields (times in s, rates in tokens/s, bytes in bytes, GB = 1e9 B):
``created, command, commit, machine, settings, bandwidth{runs[{threads, gb_per_s, phase}],
best_gb_per_s}, results[{model, dtype, checkpoint, weight_bytes_per_token, kv_bytes_per_token,
prompt_tokens, new_tokens[], ttft_s[], tokens_per_s[], median_ttft_s, median_tokens_per_s,
median_tpot_s, limit_tokens_per_s, fraction_of_limit, finish_reasons[]}]``.
Bad arguments exit with status 2 and one line naming the value.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import import_swiftspec, run  # noqa: E402

import_swiftspec()

from swiftspec.errors import InvalidRequestError  # noqa: E402

MODELS = ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")
DTYPES = ("bfloat16", "float32")
PROMPT_QUESTION_ID = 81  # MT-Bench: "Compose an engaging travel blog post about a recent trip to Hawaii..."


# ------------------------------------------------------------------ bandwidth
def measure_copy_bandwidth(mib: int, threads: int, repeats: int = 5) -> float:
    """Best copy bandwidth in GB/s (1e9 bytes/s) over ``repeats`` copies of a ``mib`` MiB
    float32 array into another, split over ``threads`` threads (numpy releases the GIL while
    copying); bytes read + bytes written are counted."""
    import numpy as np

    n = mib * 1024 * 1024 // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)  # both touched: no page faults in the timed copies
    bounds = [n * i // threads for i in range(threads + 1)]

    def copy(i: int) -> None:
        np.copyto(dst[bounds[i] : bounds[i + 1]], src[bounds[i] : bounds[i + 1]])

    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=copy, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return 2 * n * 4 / best / 1e9


def bandwidth_runs(mib: int, phase: str) -> list[dict]:
    from swiftspec.bench.machine import cpu_info

    usable = cpu_info()["usable_cpus"] or 1
    counts = sorted({1, usable})
    return [
        {"phase": phase, "threads": t, "array_mib": mib, "gb_per_s": round(measure_copy_bandwidth(mib, t), 3)}
        for t in counts
    ]


# -------------------------------------------------------------- bytes per token
def safetensors_tensors(folder: Path) -> dict[str, dict]:
    """``{name: {"dtype", "shape", "bytes"}}`` of every tensor in the folder's safetensors files
    (read from the headers only)."""
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            tensors[name] = {"dtype": info["dtype"], "shape": info["shape"], "bytes": end - start}
    return tensors


def bytes_per_token(folder: Path) -> tuple[int, int, dict]:
    """Weight bytes a decode step reads, and float32 KV bytes per context token it reads
    (keys + values, all layers). Returns (weight_bytes, kv_bytes_per_context_token, config)."""
    config = json.loads((folder / "config.json").read_text())
    tensors = safetensors_tensors(folder)
    total = sum(t["bytes"] for t in tensors.values())
    embed = tensors.get("model.embed_tokens.weight")
    tied = config.get("tie_word_embeddings", False) or "lm_head.weight" not in tensors
    if embed is not None and not tied:  # only one row of the table is gathered per token
        total -= embed["bytes"] - embed["bytes"] // embed["shape"][0]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    return total, kv, config


# ------------------------------------------------------------------ the run
def measure_model(
    name: str, dtype: str, new_tokens: int, repeats: int, threads: int, prompt, folder: Path | None = None
) -> dict:
    from swiftspec.engine import Engine
    from swiftspec.fetch import ensure_checkpoint

    folder = ensure_checkpoint(name, dtype) if folder is None else folder
    weight_bytes, kv_per_ctx, _ = bytes_per_token(folder)
    engine = Engine(folder, None, dtype=dtype, max_context=2048, num_threads=threads)
    engine.generate(prompt, max_new_tokens=8, mode="target")  # warm-up: page in the weights
    rows = []
    for _ in range(repeats):
        r = engine.generate(prompt, max_new_tokens=new_tokens, mode="target")
        rows.append(r)
    prompt_tokens = len(rows[0].prompt_token_ids)
    tps = [r.tokens_per_s for r in rows]
    med_tps = statistics.median(tps)
    mean_ctx = prompt_tokens + new_tokens / 2
    del engine
    return {
        "model": name,
        "dtype": dtype,
        "checkpoint": str(folder),
        "weight_bytes_per_token": weight_bytes,
        "kv_bytes_per_token": int(kv_per_ctx * mean_ctx),
        "prompt_tokens": prompt_tokens,
        "new_tokens": [len(r.token_ids) for r in rows],
        "finish_reasons": [r.finish_reason for r in rows],
        "ttft_s": [r.ttft_s for r in rows],
        "tokens_per_s": tps,
        "median_ttft_s": statistics.median(r.ttft_s for r in rows),
        "median_tokens_per_s": med_tps,
        "median_tpot_s": 1.0 / med_tps if med_tps else None,
    }


def markdown(doc: dict) -> str:
    bw = doc["bandwidth"]["best_gb_per_s"]
    lines = [
        f"Memory copy bandwidth (read + write), best of runs: **{bw:.1f} GB/s** "
        "("
        + ", ".join(f"{r['phase']} {r['threads']} thread(s): {r['gb_per_s']:.1f}" for r in doc["bandwidth"]["runs"])
        + ")",
        "",
        "| model | dtype | weight MB/token | TTFT median (s) | decode tok/s median (runs) | TPOT (ms) | "
        "limit tok/s (bandwidth ÷ bytes) | fraction of limit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        runs = ", ".join(f"{x:.2f}" for x in r["tokens_per_s"])
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['weight_bytes_per_token'] / 1e6:.0f} | {r['median_ttft_s']:.2f} | "
            f"**{r['median_tokens_per_s']:.2f}** ({runs}) | {r['median_tpot_s'] * 1000:.0f} | "
            f"{r['limit_tokens_per_s']:.2f} | {r['fraction_of_limit']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated reference model names")
    p.add_argument(
        "--dtypes",
        default=",".join(DTYPES),
        help="comma-separated: bfloat16, float32, int4 (int4: converted from the GGUF, group size 32)",
    )
    p.add_argument("--new-tokens", default="64", help="new tokens per timed request (default 64)")
    p.add_argument("--repeats", default="3", help="timed requests per model and dtype (default 3)")
    p.add_argument("--threads", default="0", help="CPU threads (0: all cores)")
    p.add_argument("--bandwidth-mib", default="1024", help="size of each copy array, MiB (default 1024)")
    p.add_argument(
        "--checkpoints",
        default=None,
        metavar="LABEL=DIR,...",
        help="measure these checkpoint folders instead of --models x --dtypes (e.g. two int4 conversions "
        "of one model); LABEL names each in the table",
    )
    p.add_argument("--out", help="output JSON (default benchmarks/<UTC date>-cpu-decode/cpu_decode.json)")
    args = p.parse_args()

    from swiftspec.bench import machine as mach
    from swiftspec.datasets import load_mtbench, prompt_messages
    from swiftspec.fetch import REFERENCE_MODELS

    def integer(flag, text, low):
        try:
            v = int(text)
        except ValueError:
            raise InvalidRequestError(f"{flag} must be an integer, got {text!r}") from None
        if v < low:
            raise InvalidRequestError(f"{flag} must be >= {low}, got {v}")
        return v

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in REFERENCE_MODELS:
            raise InvalidRequestError(f"--models: unknown reference model {m!r} (known: {', '.join(REFERENCE_MODELS)})")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in DTYPES + ("int4",):
            raise InvalidRequestError(f"--dtypes: unknown dtype {d!r} (expected bfloat16, float32 or int4)")
    new_tokens = integer("--new-tokens", args.new_tokens, 2)
    repeats = integer("--repeats", args.repeats, 1)
    threads = integer("--threads", args.threads, 0)
    mib = integer("--bandwidth-mib", args.bandwidth_mib, 64)
    created = mach.now_utc()
    out = (
        Path(args.out)
        if args.out
        else (Path(__file__).resolve().parents[1] / "benchmarks" / f"{created[:10]}-cpu-decode" / "cpu_decode.json")
    )
    if out.exists() and out.is_dir():
        raise InvalidRequestError(f"--out {out} is a folder; give a file name")

    record = next(r for r in load_mtbench(progress=False) if r["question_id"] == PROMPT_QUESTION_ID)
    prompt = prompt_messages("mtbench", record, 0)
    machine = mach.machine_info()
    print(f"[decode] measuring copy bandwidth ({mib} MiB arrays)", file=sys.stderr, flush=True)
    runs = bandwidth_runs(mib, "before")
    results = []
    jobs = [(name, dtype, None) for name in models for dtype in dtypes]
    if args.checkpoints:
        jobs = []
        for item in args.checkpoints.split(","):
            label, sep, folder = item.partition("=")
            if not sep or not (Path(folder) / "manifest.json").is_file():
                raise InvalidRequestError(f"--checkpoints: {item!r} is not LABEL=DIR of a checkpoint folder")
            dtype = json.loads((Path(folder) / "manifest.json").read_text())["dtype"]
            jobs.append((label, dtype, Path(folder)))
    for name, dtype, folder in jobs:
        print(f"[decode] {name} {dtype}", file=sys.stderr, flush=True)
        results.append(measure_model(name, dtype, new_tokens, repeats, threads, prompt, folder))
        print(f"[decode]   {results[-1]['median_tokens_per_s']:.2f} tok/s", file=sys.stderr, flush=True)
    runs += bandwidth_runs(mib, "after")
    best = max(r["gb_per_s"] for r in runs)
    for r in results:
        r["limit_tokens_per_s"] = best * 1e9 / r["weight_bytes_per_token"]
        r["fraction_of_limit"] = r["median_tokens_per_s"] / r["limit_tokens_per_s"]
    machine["busy_processes_end"] = mach.busy_processes()
    doc = {
        "kind": "swiftspec-cpu-decode",
        "created": created,
        "command": mach.command_line(),
        "commit": mach.commit_info(),
        "machine": machine,
        "settings": {
            "models": models,
            "dtypes": dtypes,
            "checkpoints": args.checkpoints,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "threads": threads,
            "mode": "target",
            "decoding": "greedy",
            "prompt": f"MT-Bench question {PROMPT_QUESTION_ID}, turn 1, chat template",
        },
        "bandwidth": {
            "runs": runs,
            "best_gb_per_s": best,
            "method": "numpy float32 copy, bytes read + written, best of 5 per thread count",
        },
        "results": results,
        "load_average_end": mach.load_average(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    md = markdown(doc)
    out.with_suffix(".md").write_text(md)
    print(md)
    print(f"[decode] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run(main)
