#!/usr/bin/env python3
"""Acceptance length of an int4 draft against the bf16 draft, with the same bf16 target (CPU).

With the reference pair (Qwen2.5-Coder 1.5B target in bf16; the 0.5B draft in bf16 and in int4,
``--dtype int4`` converted from the same GGUF: group size 32 since 2026-12-07, 128 before), decodes
the first ``--prompts`` MT-Bench first turns and HumanEval problems greedily: target-only, then
serial tree speculation (``--tree`` budget:max_depth:branching, default 16:8:2, the bench's tree16)
with each draft. Records per prompt and draft the acceptance length (tokens committed per target
verification), verification steps, decode tokens/s, and whether the output equals target-only (it
must: the target decides every token, whatever the draft). The drafts alternate prompt by prompt, so
machine load drifts hit both alike; the load average before and after is recorded.

    python tools/bench_int4_draft.py --prompts 4 --max-new-tokens 64 --out benchmarks/int4-draft

Writes <out>.json. Exit status 2 with one line on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import run  # noqa: E402
from check_lossless import DRAFT, TARGET, load_prompts  # noqa: E402


def main() -> int:
    from swiftspec.bench.machine import commit_label
    from swiftspec.errors import InvalidRequestError
    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.swiftspec_core import Engine, ModelOptions, load_model
    from swiftspec.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4, help="prompts per dataset (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tree", default="16:8:2", help="tree_budget:max_depth:branching (default 16:8:2)")
    ap.add_argument("--out", required=True, help="output path without suffix")
    args = ap.parse_args()
    try:
        budget, depth, branching = (int(v) for v in args.tree.split(":"))
    except ValueError:
        raise InvalidRequestError(f"--tree {args.tree!r}: expected tree_budget:max_depth:branching") from None
    if args.prompts < 1 or args.max_new_tokens < 2:
        raise InvalidRequestError("--prompts must be >= 1 and --max-new-tokens >= 2")

    load_before = os.getloadavg()
    tdir = ensure_checkpoint(TARGET, "bfloat16", progress=False)
    drafts = {
        "bfloat16": ensure_checkpoint(DRAFT, "bfloat16", progress=False),
        "int4": ensure_checkpoint(DRAFT, "int4", progress=False),
    }
    prompts = load_prompts(Tokenizer.from_checkpoint(tdir), args.prompts, args.prompts)
    opts = ModelOptions()
    opts.max_context = max(len(p[3]) for p in prompts) + args.max_new_tokens + 8
    opts.max_tree = max(64, budget + 2)  # the draft grows up to budget + 2 tree nodes per round
    target = load_model(str(tdir), "cpu", opts)
    engines = {name: Engine(target, load_model(str(d), "cpu", opts)) for name, d in drafts.items()}

    rows = []
    for dataset, index, pid, ids in prompts:
        ref = engines["bfloat16"].generate(ids, max_new_tokens=args.max_new_tokens, mode="target")
        for name, engine in engines.items():
            out = engine.generate(
                ids,
                max_new_tokens=args.max_new_tokens,
                mode="serial",
                tree_budget=budget,
                max_depth=depth,
                branching=branching,
            )
            st = out["stats"]
            rows.append(
                {
                    "dataset": dataset,
                    "index": index,
                    "id": pid,
                    "draft": name,
                    "new_tokens": st["new_tokens"],
                    "acceptance_length": st["acceptance_length"],
                    "verification_steps": st["verification_steps"],
                    "decode_tokens_per_s": (st["new_tokens"] - 1) / max(st["decode_time"], 1e-9),
                    "target_only_decode_tokens_per_s": (ref["stats"]["new_tokens"] - 1)
                    / max(ref["stats"]["decode_time"], 1e-9),
                    "identical": out["tokens"] == ref["tokens"],
                }
            )
            print(
                f"[int4-draft] {dataset} {index} {name}: acceptance {st['acceptance_length']:.2f}, "
                f"identical {rows[-1]['identical']}",
                file=sys.stderr,
                flush=True,
            )

    summary = {}
    for name in drafts:
        mine = [r for r in rows if r["draft"] == name]
        for dataset in ("mtbench", "humaneval", "all"):
            sel = [r for r in mine if dataset == "all" or r["dataset"] == dataset]
            ver = sum(r["verification_steps"] for r in sel)
            summary[f"{name}/{dataset}"] = {
                "prompts": len(sel),
                "acceptance_length_mean": sum(r["acceptance_length"] for r in sel) / len(sel),
                "acceptance_length_pooled": sum(r["new_tokens"] - 1 for r in sel) / max(ver, 1),
                "decode_tokens_per_s_mean": sum(r["decode_tokens_per_s"] for r in sel) / len(sel),
                "identical": sum(r["identical"] for r in sel),
            }
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "commit": commit_label(),
        "target": str(tdir),
        "drafts": {k: str(v) for k, v in drafts.items()},
        "settings": {
            "prompts_per_dataset": args.prompts,
            "max_new_tokens": args.max_new_tokens,
            "tree": [budget, depth, branching],
        },
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "summary": summary,
        "rows": rows,
    }
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for key, s in summary.items():
        print(
            f"{key}: acceptance {s['acceptance_length_mean']:.2f} (pooled {s['acceptance_length_pooled']:.2f}), "
            f"decode {s['decode_tokens_per_s_mean']:.2f} tok/s, identical {s['identical']}/{s['prompts']}"
        )
    print(out)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    run(main)
