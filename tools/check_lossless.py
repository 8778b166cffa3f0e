#!/usr/bin/env python3
"""Full greedy losslessness check of serial (issue 3) or async (issue 4) speculative decoding.

For every prompt (default: the 80 MT-Bench first turns and the first 40 HumanEval
problems, chat template applied), decodes `--max-new-tokens` tokens (default 128) with
the target alone, greedy, then with serial tree generation for each `--configs` shape,
and compares token for token. Writes

  <out>.json   every prompt: reference length, per config equal / first difference /
               acceptance length / verification and draft steps / times
  <out>.md     a summary table (equal / total per config, mean acceptance length)

Progress is appended to <out>.jsonl as each prompt finishes, so an interrupted run
resumes where it stopped (--resume). Exit status 1 if any output differs.

  python tools/check_lossless.py                       # full run, float32 pair
  python tools/check_lossless.py --limit 4 --max-new-tokens 32 --out /tmp/quick
  python tools/check_lossless.py --mode async --dtype bfloat16 --placement auto          # issue 4
  python tools/check_lossless.py --mode async --target-tp 2 --placement auto             # TP-2 target

--mode async checks parallel tree generation (draft and target groups running concurrently);
--target-tp N loads the target as a tensor-parallel model over N ranks (the reference is then
target-only decoding with that same TP-N target: TP changes the reduction order); --placement
puts the groups on cores ("auto": draft on core 0, target on the rest; or JSON, see
swiftspec.placement).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
# name -> (tree_budget, max_depth, branching)
DEFAULT_CONFIGS = "chain:6:6:1,tree16:16:8:2"


def parse_configs(text: str) -> dict[str, tuple[int, int, int]]:
    out = {}
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 4:
            raise SystemExit(f"--configs item {item!r} must be name:tree_budget:max_depth:branching")
        out[parts[0]] = tuple(int(x) for x in parts[1:])
    return out


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load_prompts(tok, n_mtbench: int, n_humaneval: int):
    from swiftspec.datasets import load_humaneval, load_mtbench, prompt_messages

    out = []
    for i, rec in enumerate(load_mtbench(progress=False)[:n_mtbench]):
        out.append(("mtbench", i, str(rec.get("question_id")), tok.encode_chat(prompt_messages("mtbench", rec))))
    for i, rec in enumerate(load_humaneval(progress=False)[:n_humaneval]):
        out.append(("humaneval", i, rec["task_id"], tok.encode_chat(prompt_messages("humaneval", rec))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtbench", type=int, default=80, help="MT-Bench first turns to check (default 80)")
    ap.add_argument("--humaneval", type=int, default=40, help="HumanEval problems to check (default 40)")
    ap.add_argument("--limit", type=int, default=0, help="check only the first N prompts of the list (0: all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"name:budget:depth:branching,... ({DEFAULT_CONFIGS})")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="CPU threads per model (0: all cores)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "lossless_greedy"), help="output path without suffix")
    ap.add_argument("--resume", action="store_true", help="skip prompts already in <out>.jsonl")
    ap.add_argument("--mode", choices=["serial", "async"], default="serial", help="speculative mode to check")
    ap.add_argument("--target-tp", type=int, default=1, help="TP degree of the target group (default 1)")
    ap.add_argument("--placement", default=None, help="'auto' or JSON placement of the draft and target groups")
    args = ap.parse_args(argv)

    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.swiftspec_core import Engine, ModelOptions, load_model
    from swiftspec.tokenizer import Tokenizer

    configs = parse_configs(args.configs)
    tdir = ensure_checkpoint(TARGET, args.dtype, progress=False)
    ddir = ensure_checkpoint(DRAFT, args.dtype, progress=False)
    tok = Tokenizer.from_checkpoint(tdir)
    prompts = load_prompts(tok, args.mtbench, args.humaneval)
    if args.limit:
        prompts = prompts[: args.limit]
    longest = max(len(p[3]) for p in prompts)
    opts = ModelOptions()
    opts.max_context = longest + args.max_new_tokens + 8
    opts.max_tree = max(b for b, _, _ in configs.values()) + 2
    opts.num_threads = args.threads
    if args.placement or args.target_tp != 1:
        from swiftspec.placement import load_models, normalize

        placement = normalize(args.placement or {"target": {"tp": args.target_tp}}, target_tp=args.target_tp)
        engine = Engine(*load_models(tdir, ddir, placement, max_context=opts.max_context, max_tree=opts.max_tree,
                                     num_threads=args.threads))
    else:
        placement = None
        engine = Engine(load_model(str(tdir), "cpu", opts), load_model(str(ddir), "cpu", opts))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    progress_path = out.with_suffix(".jsonl")
    done = {}
    if args.resume and progress_path.exists():
        for line in progress_path.read_text().splitlines():
            rec = json.loads(line)
            done[(rec["dataset"], rec["index"])] = rec
    elif progress_path.exists():
        progress_path.unlink()

    records = []
    t_start = time.time()
    for n, (dataset, index, pid, ids) in enumerate(prompts):
        if (dataset, index) in done:
            records.append(done[(dataset, index)])
            continue
        ref = engine.generate(ids, max_new_tokens=args.max_new_tokens, mode="target")
        rec = {"dataset": dataset, "index": index, "id": pid, "prompt_tokens": len(ids),
               "reference_tokens": len(ref["tokens"]), "reference_finish": ref["stats"]["finish_reason"],
               "target_only_decode_s": ref["stats"]["decode_time"], "configs": {}}
        for name, (budget, depth, branching) in configs.items():
            res = engine.generate(ids, max_new_tokens=args.max_new_tokens, mode=args.mode, tree_budget=budget,
                                  max_depth=depth, branching=branching)
            a, b = res["tokens"], ref["tokens"]
            diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if diff is None and len(a) != len(b):
                diff = min(len(a), len(b))
            st = res["stats"]
            rec["configs"][name] = {
                "equal": a == b, "first_difference": diff, "new_tokens": len(a),
                "acceptance_length": st["acceptance_length"], "verification_steps": st["verification_steps"],
                "draft_steps": st["draft_steps"], "decode_s": st["decode_time"], "target_s": st["target_time"],
                "draft_s": st["draft_time"],
            }
        records.append(rec)
        with progress_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        status = " ".join(f"{k}={'ok' if v['equal'] else 'DIFF@' + str(v['first_difference'])}"
                          f"({v['acceptance_length']:.2f})" for k, v in rec["configs"].items())
        print(f"[{n + 1}/{len(prompts)}] {dataset}#{index}: {status}  ({time.time() - t_start:.0f}s)", flush=True)

    summary = {}
    for name in configs:
        rows = [r["configs"][name] for r in records]
        summary[name] = {
            "tree_budget": configs[name][0], "max_depth": configs[name][1], "branching": configs[name][2],
            "equal": sum(r["equal"] for r in rows), "total": len(rows),
            "mean_acceptance_length": sum(r["acceptance_length"] for r in rows) / max(len(rows), 1),
            "differing": [f"{rec['dataset']}#{rec['index']}@{rec['configs'][name]['first_difference']}"
                          for rec in records if not rec["configs"][name]["equal"]],
        }
    result = {
        "what": f"greedy {args.mode} speculative decoding vs target-only greedy decoding, token for token",
        "mode": args.mode, "target_tp": args.target_tp, "placement": placement,
        "target": TARGET, "draft": DRAFT, "dtype": args.dtype, "backend": "cpu",
        "max_new_tokens": args.max_new_tokens, "prompts": {"mtbench_first_turns": sum(r["dataset"] == "mtbench" for r in records),
                                                           "humaneval": sum(r["dataset"] == "humaneval" for r in records)},
        "git_commit": git_commit(), "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "wall_s": time.time() - t_start,
        "summary": summary, "records": records,
    }
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# Greedy losslessness of {args.mode} speculative decoding"
        + (f" (target TP {args.target_tp})" if args.target_tp != 1 else ""),
        "",
        f"Target {TARGET}, draft {DRAFT}, {args.dtype}, CPU backend, {args.max_new_tokens} new tokens, "
        f"{result['prompts']['mtbench_first_turns']} MT-Bench first turns + {result['prompts']['humaneval']} HumanEval "
        f"prompts (chat template). Commit {result['git_commit']}, {result['date']}. Produced by "
        "`tools/check_lossless.py`.",
        "",
        "| config | tree_budget | max_depth | branching | identical to target-only | mean acceptance length |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['tree_budget']} | {s['max_depth']} | {s['branching']} | "
                     f"{s['equal']}/{s['total']} | {s['mean_acceptance_length']:.2f} |")
    bad = [d for s in summary.values() for d in s["differing"]]
    lines += ["", "Differing outputs (dataset#index@first differing token): " + (", ".join(bad) if bad else "none"), ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
