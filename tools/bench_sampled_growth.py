#!/usr/bin/env python3
"""Acceptance length of sampled serial speculation: Sampled growth (SpecInfer's recursive
rejection sampling) against TopK growth (verification by target sampling).

With the real pair (Qwen2.5-Coder 1.5B target, 0.5B draft) on the CPU backend, decodes the first
`--prompts` MT-Bench first turns and HumanEval problems with serial tree generation
(spec.generate_serial, what Engine.generate(mode="serial") calls) at one sampling setting, once per
growth rule, prompt i under seed `--seed` + i (both rules get the same seed), and reports per
dataset the acceptance length (tokens committed per target verification, pooled: sum(new_tokens - 1)
/ sum(verifications); the first token comes from the prefill) and the mean of the per-request
values. Writes <out>.json (default /tmp/sampled_growth). Both rules are lossless (the output follows
the target's sampling distribution); only how many tokens one verification commits differs.

  python tools/bench_sampled_growth.py                       # 5 + 5 prompts, 128 tokens, T 0.7, top-p 0.8
  python tools/bench_sampled_growth.py --prompts 1 --max-new-tokens 16 --out /tmp/g
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_lossless import DRAFT, REPO, TARGET, load_prompts, load_reference_pair  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=5, help="prompts per dataset (default 5)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=1, help="prompt i samples under seed + i (default 1)")
    ap.add_argument("--tree-budget", type=int, default=16)
    ap.add_argument("--max-depth", type=int, default=8)
    ap.add_argument("--branching", type=int, default=2)
    ap.add_argument("--growths", default="sampled,top_k")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--out", default="/tmp/sampled_growth", help="output path without suffix")
    args = ap.parse_args(argv)

    from swiftspec.bench.machine import commit_label
    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.swiftspec_core import spec
    from swiftspec.tokenizer import Tokenizer

    growths = args.growths.split(",")
    tok = Tokenizer.from_checkpoint(ensure_checkpoint(TARGET, args.dtype, progress=False))
    prompts = load_prompts(tok, args.prompts, args.prompts)
    target, draft = load_reference_pair(prompts, args.dtype, args.max_new_tokens, args.tree_budget + 2)

    t0 = time.time()
    rows = []
    for n, (dataset, index, pid, ids) in enumerate(prompts):
        line = []
        for g in growths:
            res = spec.generate_serial(
                target,
                draft,
                ids,
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                top_p=args.top_p,
                seed=args.seed + n,
                tree_budget=args.tree_budget,
                max_depth=args.max_depth,
                branching=args.branching,
                growth=g,
            )
            st, rep = res["stats"], res["report"]
            rows.append(
                {
                    "dataset": dataset,
                    "index": index,
                    "growth": g,
                    "seed": args.seed + n,
                    "new_tokens": st["new_tokens"],
                    "verification_steps": st["verification_steps"],
                    "acceptance_length": st["acceptance_length"],
                    "draft_steps": st["draft_steps"],
                    "verification": rep["verification"],
                    "accepted_per_step": rep["accepted_per_step"],
                }
            )
            line.append(f"{g} {st['acceptance_length']:.2f}")
        print(
            f"[{n + 1}/{len(prompts)}] {dataset}#{index}: " + ", ".join(line) + f" ({time.time() - t0:.0f}s)",
            flush=True,
        )

    results = {}
    for dataset in ("mtbench", "humaneval", "all"):
        results[dataset] = {}
        for g in growths:
            rs = [r for r in rows if r["growth"] == g and dataset in ("all", r["dataset"])]
            ver = sum(r["verification_steps"] for r in rs)
            results[dataset][g] = {
                "requests": len(rs),
                "acceptance_length_pooled": sum(r["new_tokens"] - 1 for r in rs) / max(ver, 1),
                "acceptance_length_mean": sum(r["acceptance_length"] for r in rs) / max(len(rs), 1),
                "draft_steps_per_verification": sum(r["draft_steps"] for r in rs) / max(ver, 1),
            }
    record = {
        "what": "acceptance length of sampled serial speculation, Sampled vs TopK growth",
        "target": TARGET,
        "draft": DRAFT,
        "dtype": args.dtype,
        "backend": "cpu",
        "sampling": {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed},
        "tree": {"tree_budget": args.tree_budget, "max_depth": args.max_depth, "branching": args.branching},
        "max_new_tokens": args.max_new_tokens,
        "prompts_per_dataset": args.prompts,
        "git_commit": commit_label(REPO),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "wall_s": time.time() - t0,
        "results": results,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    print(f"| data set | {' | '.join(growths)} |")
    for dataset, by in results.items():
        print(
            f"| {dataset} | "
            + " | ".join(
                f"{by[g]['acceptance_length_pooled']:.2f} (mean {by[g]['acceptance_length_mean']:.2f})" for g in growths
            )
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
