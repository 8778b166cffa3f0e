#!/usr/bin/env python3
"""Asynchronous vs serial speculative decoding on the CPU, draft and target on separate cores.

The claim measured (issue 4): with the draft group on its own cores and the target group on
others, parallel tree generation (``mode="async"``) spends less wall time per generated token
than serial tree generation, because the draft leaves the critical path; the per-round timeline
shows it (the target verifies back to back while the draft grows the tree).

Configurations, run interleaved on every prompt (the order rotates per prompt, so load drifts
on a shared machine hit every configuration alike):

  target      target-only decoding, target on --target-cores
  serial      serial tree generation, draft on --draft-cores, target on --target-cores
  async       parallel tree generation, same placement (cost-aware hand-off, the default)
  async-eager parallel tree generation handing the target a subtree as soon as it is idle
  serial-all  serial tree generation with both models on all the cores of both groups
              (serial's best use of the same machine; each model alternates on all cores)
  target-all  target-only decoding on all those cores

Every speculative output is checked token for token against target-only greedy decoding.
Writes <out>/async_cpu.json (every request, with the async timeline summaries), <out>/async_cpu.md
(summary table) and <out>/trace_<prompt>.json (a Chrome trace of the first async request;
open in chrome://tracing or ui.perfetto.dev).

  python tools/bench_async_cpu.py --num-prompts 6 --max-new-tokens 96 --out benchmarks/2026-11-29-async-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from swiftspec.bench.machine import commit_label

REPO = Path(__file__).resolve().parent.parent
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
ALL_CONFIGS = ("target", "serial", "async", "async-eager", "serial-all", "target-all")
DEFAULT_CONFIGS = ("target", "serial", "async", "serial-all")


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_prompts(tok, datasets: list[str], n: int):
    from swiftspec.datasets import load_humaneval, load_mtbench, prompt_messages

    sets = {"mtbench": load_mtbench(progress=False), "humaneval": load_humaneval(progress=False)}
    out = []
    for i in range(n):  # alternate data sets: humaneval 0, mtbench 0, humaneval 1, ...
        name = datasets[i % len(datasets)]
        rec = sets[name][i // len(datasets)]
        out.append((f"{name}{i // len(datasets)}", tok.encode_chat(prompt_messages(name, rec))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="humaneval,mtbench")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--tree-budget", type=int, default=16)
    ap.add_argument("--max-depth", type=int, default=8)
    ap.add_argument("--branching", type=int, default=2)
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"any of {', '.join(ALL_CONFIGS)}")
    ap.add_argument("--draft-cores", default="0", help="comma-separated cores of the draft group")
    ap.add_argument("--target-cores", default="1", help="comma-separated cores of the target group")
    ap.add_argument("--target-tp", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--async-options", default="{}", help="JSON dict passed to generate_async")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / f"{time.strftime('%Y-%m-%d')}-async-cpu"))
    args = ap.parse_args(argv)

    from swiftspec import Engine
    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.tokenizer import Tokenizer

    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in ALL_CONFIGS:
            raise SystemExit(f"--configs: unknown configuration {c!r} (known: {', '.join(ALL_CONFIGS)})")
    draft_cores = [int(c) for c in args.draft_cores.split(",")]
    target_cores = [int(c) for c in args.target_cores.split(",")]
    all_cores = sorted(set(draft_cores + target_cores))
    async_options = json.loads(args.async_options)
    tdir = ensure_checkpoint(TARGET, args.dtype, progress=False)
    ddir = ensure_checkpoint(DRAFT, args.dtype, progress=False)
    tok = Tokenizer.from_checkpoint(tdir)
    prompts = load_prompts(tok, args.datasets.split(","), args.num_prompts)
    max_context = max(len(p) for _, p in prompts) + args.max_new_tokens + 8
    kw = dict(max_context=max_context, max_tree=max(64, args.tree_budget + 2))
    placement = {"draft": {"tp": 1, "cores": draft_cores}, "target": {"tp": args.target_tp, "cores": target_cores}}
    placed = Engine(tdir, ddir, placement=placement, **kw)
    shared = None
    if any(c.endswith("-all") for c in configs):
        pall = {"draft": {"tp": 1, "cores": [all_cores]}, "target": {"tp": args.target_tp, "cores": all_cores}}
        shared = Engine(tdir, ddir, placement=pall, **kw)
    tree = dict(tree_budget=args.tree_budget, max_depth=args.max_depth, branching=args.branching)

    def run(config: str, ids):
        engine = shared if config.endswith("-all") else placed
        mode = config.split("-")[0]
        extra = tree if mode != "target" else {}
        if mode == "async":
            opts = dict(async_options, **({"cost_aware_send": False} if config == "async-eager" else {}))
            extra = dict(extra, async_options=opts)
        return engine.generate(ids, max_new_tokens=args.max_new_tokens, mode=mode, **extra)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = []
    load_start = os.getloadavg()
    t_start = time.time()
    for n, (name, ids) in enumerate(prompts):
        order = configs[n % len(configs) :] + configs[: n % len(configs)]
        results = {c: run(c, ids) for c in order}
        ref = results.get("target", results[order[0]]).token_ids
        rec = {"prompt": name, "prompt_tokens": len(ids), "configs": {}}
        for c in configs:
            r = results[c]
            st = r.stats
            row = {
                "equal_to_target": r.token_ids == ref,
                "new_tokens": len(r.token_ids),
                "ttft_s": r.ttft_s,
                "decode_s": r.decode_s,
                "tpot_s": r.tpot_s,
                "wall_s": st["wall_time"],
                "acceptance_length": st["acceptance_length"],
                "verification_steps": st["verification_steps"],
                "draft_steps": st["draft_steps"],
                "target_s": st["target_time"],
                "draft_s": st["draft_time"],
            }
            if r.timeline is not None:
                row["timeline"] = r.timeline.summary()
                if n == 0:
                    r.timeline.save_chrome_trace(str(out_dir / f"trace_{name}.json"))
            rec["configs"][c] = row
        records.append(rec)
        line = "  ".join(
            f"{c}: {1 / v['tpot_s'] if v['tpot_s'] else 0:.2f} tok/s{'' if v['equal_to_target'] else ' DIFF'}"
            for c, v in rec["configs"].items()
        )
        print(f"[{n + 1}/{len(prompts)}] {name}: {line}  ({time.time() - t_start:.0f}s)", flush=True)

    summary = {}
    for c in configs:
        rows = [r["configs"][c] for r in records]
        tokens = sum(r["new_tokens"] - 1 for r in rows)
        decode = sum(r["decode_s"] for r in rows)
        s = {
            "tpot_s": decode / tokens if tokens else 0.0,  # total decode time / tokens after the first
            "tokens_per_s": tokens / decode if decode else 0.0,
            "median_tpot_s": statistics.median(r["tpot_s"] for r in rows),
            "mean_ttft_s": statistics.mean(r["ttft_s"] for r in rows),
            "mean_acceptance_length": statistics.mean(r["acceptance_length"] for r in rows),
            "equal_to_target": sum(r["equal_to_target"] for r in rows),
            "prompts": len(rows),
            # share of the decode time the target spends in forward passes (1.0: never waits for the draft)
            "target_busy_share": sum(r["target_s"] for r in rows) / decode if decode else 0.0,
        }
        if c.startswith("async"):
            tl = [r["timeline"] for r in rows]
            span = sum(t["decode_span"] for t in tl)
            s["target_utilization"] = sum(t["target_verify"] for t in tl) / span if span else 0.0
            s["target_wait_per_round_s"] = sum(t["target_wait"] for t in tl) / max(1, sum(t["rounds"] for t in tl))
            s["draft_grow_share"] = sum(t["draft_grow"] for t in tl) / span if span else 0.0
        summary[c] = s
    result = {
        "what": "async vs serial speculative decoding on the CPU, draft and target groups on separate cores",
        "target": TARGET,
        "draft": DRAFT,
        "dtype": args.dtype,
        "placement": placed.placement,
        "tree": tree,
        "max_new_tokens": args.max_new_tokens,
        "async_options": async_options,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_1min_start_end": [load_start[0], os.getloadavg()[0]],
        },
        "git_commit": commit_label(REPO),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv),
        "wall_s": time.time() - t_start,
        "summary": summary,
        "records": records,
    }
    (out_dir / "async_cpu.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"Target {TARGET}, draft {DRAFT} ({args.dtype}), CPU backend; {len(prompts)} prompts "
        f"({args.datasets}), {args.max_new_tokens} new tokens, tree budget {args.tree_budget}, depth "
        f"{args.max_depth}, branching {args.branching}. Placement: draft cores {draft_cores}, target cores "
        f"{target_cores} (target TP {args.target_tp}); '-all' configurations: both models on cores {all_cores}. "
        f"Load average (1 min) {load_start[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end.",
        "",
        "| config | TPOT (ms) | tokens/s | median TPOT (ms) | TTFT (s) | acceptance length | target busy | "
        "= target-only |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, s in summary.items():
        lines.append(
            f"| {c} | {s['tpot_s'] * 1e3:.0f} | {s['tokens_per_s']:.2f} | {s['median_tpot_s'] * 1e3:.0f} | "
            f"{s['mean_ttft_s']:.2f} | {s['mean_acceptance_length']:.2f} | {s['target_busy_share']:.0%} | "
            f"{s['equal_to_target']}/{s['prompts']} |"
        )
    for name in ("async", "async-eager"):
        if name not in summary:
            continue
        a = summary[name]
        lines += [
            "",
            f"{name} timeline: the target verifies {a['target_utilization']:.0%} of the decode span "
            f"(waits {a['target_wait_per_round_s'] * 1e3:.0f} ms per round for the next subtree); the draft "
            f"grows the tree {a['draft_grow_share']:.0%} of it, concurrently.",
        ]
        for base in ("serial", "serial-all"):
            if base in summary and a["tpot_s"] > 0:
                lines.append(f"{name} TPOT vs {base}: {summary[base]['tpot_s'] / a['tpot_s']:.2f}x faster.")
    (out_dir / "async_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(s["equal_to_target"] == s["prompts"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
