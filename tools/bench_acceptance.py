#!/usr/bin/env python3
"""Acceptance length and CPU speed of serial speculative decoding (issue 3).

With the real pair (Qwen2.5-Coder 1.5B target, 0.5B draft) on the CPU backend, decodes
the first `--prompts` MT-Bench first turns and HumanEval problems greedily, target-only
and with serial tree generation for the chain and tree budgets 8, 16, 32, 64 (shapes in
--configs), and records per dataset and config:

  acceptance length   mean tokens committed per target verification
                      (GenerationStats.acceptance_length, averaged over prompts,
                      and the pooled ratio sum(new_tokens - 1) / sum(verifications))
  tokens/s            decode-phase throughput (new_tokens - 1) / decode_time, and
                      end-to-end new_tokens / (prefill + decode), pooled over prompts
  speedup             decode tokens/s over target-only's, same run, same prompts
  draft / target time split, draft steps per verification
  identical           outputs equal to target-only greedy (must be all)

Each config is name:tree_budget:max_depth:branching[:min_expand_prob]; without the last
field the serial default applies (SpeculativeOptions::kSerialMinExpandProb: nodes less
likely than that under the draft are not expanded), 0 grows every tree to its budget.

Writes <out>.json and <out>.md (default benchmarks/acceptance). CPU timings depend on
the machine and its load: the load average before and after is recorded, and every
config runs interleaved prompt by prompt so that load drifts hit all configs alike.

  python tools/bench_acceptance.py                          # 10 + 10 prompts, 128 tokens
  python tools/bench_acceptance.py --prompts 2 --max-new-tokens 32 --out /tmp/acc
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

from swiftspec.bench.machine import commit_label  # noqa: E402

DEFAULT_CONFIGS = "chain8:8:8:1,tree8:8:8:2,tree16:16:8:2,tree32:32:8:4,tree64:64:8:4"


def parse_configs(text: str) -> dict[str, tuple[int, int, int, float]]:
    """name:tree_budget:max_depth:branching[:min_expand_prob],... (min_expand_prob default -1:
    the serial default of speculative.h)."""
    out = {}
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) not in (4, 5):
            raise SystemExit(f"--configs item {item!r} must be name:tree_budget:max_depth:branching[:min_expand_prob]")
        out[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]), float(parts[4]) if len(parts) == 5 else -1.0)
    return out


def pooled(rows: list[dict], target_rows: list[dict]) -> dict:
    new = sum(r["new_tokens"] for r in rows)
    decode = sum(r["decode_s"] for r in rows)
    total = sum(r["prefill_s"] + r["decode_s"] for r in rows)
    ver = sum(r["verification_steps"] for r in rows)
    out = {
        "prompts": len(rows),
        "new_tokens": new,
        "acceptance_length_mean": sum(r["acceptance_length"] for r in rows) / max(len(rows), 1),
        "acceptance_length_pooled": sum(r["new_tokens"] - 1 for r in rows) / max(ver, 1),
        "decode_tokens_per_s": sum(r["new_tokens"] - 1 for r in rows) / max(decode, 1e-9),
        "end_to_end_tokens_per_s": new / max(total, 1e-9),
        "target_s": sum(r["target_s"] for r in rows),
        "draft_s": sum(r["draft_s"] for r in rows),
        "draft_steps_per_verification": sum(r["draft_steps"] for r in rows) / max(ver, 1),
        "identical": sum(r["identical"] for r in rows),
    }
    base = sum(r["new_tokens"] - 1 for r in target_rows) / max(sum(r["decode_s"] for r in target_rows), 1e-9)
    out["speedup_vs_target_only"] = out["decode_tokens_per_s"] / base if base > 0 else 0.0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=10, help="prompts per dataset (default 10)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"name:budget:depth:branching[:min_expand_prob],... ({DEFAULT_CONFIGS})",
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="CPU threads per model (0: all cores)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "acceptance"), help="output path without suffix")
    args = ap.parse_args(argv)

    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.swiftspec_core import Engine, spec
    from swiftspec.tokenizer import Tokenizer

    configs = parse_configs(args.configs)
    tok = Tokenizer.from_checkpoint(ensure_checkpoint(TARGET, args.dtype, progress=False))
    prompts = load_prompts(tok, args.prompts, args.prompts)
    target, draft = load_reference_pair(
        prompts, args.dtype, args.max_new_tokens, max(c[0] for c in configs.values()) + 2, args.threads
    )
    engine = Engine(target, draft)

    load_before = os.getloadavg()
    t0 = time.time()
    rows: dict[str, list[dict]] = {"target-only": [], **{name: [] for name in configs}}
    for n, (dataset, index, pid, ids) in enumerate(prompts):
        ref = engine.generate(ids, max_new_tokens=args.max_new_tokens, mode="target")

        def row(res, name):
            st = res["stats"]
            return {
                "dataset": dataset,
                "index": index,
                "config": name,
                "new_tokens": st["new_tokens"],
                "prefill_s": st["prefill_time"],
                "decode_s": st["decode_time"],
                "target_s": st["target_time"],
                "draft_s": st["draft_time"],
                "verification_steps": st["verification_steps"],
                "draft_steps": st["draft_steps"],
                "acceptance_length": st["acceptance_length"],
                "identical": res["tokens"] == ref["tokens"],
            }

        rows["target-only"].append(row(ref, "target-only"))
        line = []
        for name, (budget, depth, branching, min_p) in configs.items():
            # the function Engine.generate(mode="serial") calls, with explicit options
            res = spec.generate_serial(
                target,
                draft,
                ids,
                max_new_tokens=args.max_new_tokens,
                tree_budget=budget,
                max_depth=depth,
                branching=branching,
                min_expand_prob=min_p,
            )
            rows[name].append(row(res, name))
            rows[name][-1]["report"] = {
                k: res["report"][k]
                for k in (
                    "growth",
                    "verification",
                    "expand_width",
                    "min_expand_prob",
                    "verified_per_step",
                    "accepted_per_step",
                    "draft_batch_rows",
                )
            }
            line.append(f"{name} {res['stats']['acceptance_length']:.2f}")
        print(
            f"[{n + 1}/{len(prompts)}] {dataset}#{index}: " + ", ".join(line) + f" ({time.time() - t0:.0f}s)",
            flush=True,
        )
    load_after = os.getloadavg()

    results = {}
    for dataset in ("mtbench", "humaneval", "all"):
        sel = (lambda r: True) if dataset == "all" else (lambda r, d=dataset: r["dataset"] == d)
        tgt = [r for r in rows["target-only"] if sel(r)]
        results[dataset] = {name: pooled([r for r in rs if sel(r)], tgt) for name, rs in rows.items()}

    record = {
        "what": "acceptance length and CPU decode speed of serial speculative decoding vs target-only",
        "target": TARGET,
        "draft": DRAFT,
        "dtype": args.dtype,
        "backend": "cpu",
        "threads_per_model": args.threads,
        "max_new_tokens": args.max_new_tokens,
        "prompts_per_dataset": args.prompts,
        "configs": {
            name: {"tree_budget": b, "max_depth": d, "branching": k, "min_expand_prob": p}
            for name, (b, d, k, p) in configs.items()
        },
        "git_commit": commit_label(REPO),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "wall_s": time.time() - t0,
        "results": results,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))

    lines = [
        "# Acceptance length and CPU speed of serial speculative decoding",
        "",
        f"Target {TARGET}, draft {DRAFT}, {args.dtype}, CPU backend ({os.cpu_count()} cores, "
        f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after), greedy, "
        f"{args.max_new_tokens} new tokens, first {args.prompts} MT-Bench first turns and first {args.prompts} "
        f"HumanEval prompts. Commit {record['git_commit']}, {record['date']}. Produced by "
        "`tools/bench_acceptance.py`. Acceptance length = tokens committed per target verification "
        "(pooled); tok/s = decode phase; speedup against target-only in the same run.",
        "",
    ]
    for dataset in ("mtbench", "humaneval", "all"):
        lines += [
            f"## {dataset}",
            "",
            "| config | budget | depth | branching | min_expand_prob | acceptance length | "
            "draft steps / verification | decode tok/s | speedup | draft share of decode | identical |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, s in results[dataset].items():
            b, d, k, p = configs.get(name, ("-", "-", "-", None))
            eff = rows[name][0]["report"]["min_expand_prob"] if name in configs and rows[name] else None
            pcol = "-" if eff is None else f"{eff:g}"
            share = s["draft_s"] / max(s["draft_s"] + s["target_s"], 1e-9)
            lines.append(
                f"| {name} | {b} | {d} | {k} | {pcol} | {s['acceptance_length_pooled']:.2f} | "
                f"{s['draft_steps_per_verification']:.2f} | {s['decode_tokens_per_s']:.2f} | "
                f"{s['speedup_vs_target_only']:.2f}x | {share:.0%} | {s['identical']}/{s['prompts']} |"
            )
        lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
