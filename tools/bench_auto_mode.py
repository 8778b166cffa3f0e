#!/usr/bin/env python3
"""The auto decode mode against every fixed choice, per data set (issue 32).

Runs ``swiftspec bench`` with target-only decoding, serial speculation at several tree shapes and
the auto mode (whose largest tree is the largest fixed one) on the same prompts, in one run, then
prints per data set each configuration's mean decode tokens/s, auto's ratio to it, and the two
checks of issue 32: auto >= THRESHOLD x the best fixed choice, and auto >= THRESHOLD x target-only.
Exit status 1 when a check fails (2: bad arguments or a failed run).

  python tools/bench_auto_mode.py --out /tmp/auto-short --datasets mtbench,humaneval --num-prompts 8
  python tools/bench_auto_mode.py --out /tmp/auto-long --context-tokens 2048 --num-prompts 2
  python tools/bench_auto_mode.py --from /tmp/auto-short          # the table of a finished run

Other arguments after ``--`` go to ``swiftspec bench`` (e.g. ``-- --backend cuda``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DEFAULT_CONFIGS = "target,serial:chain2,serial:chain4,serial:tree8,serial:tree16,auto:tree16"


def table(doc: dict, threshold: float) -> tuple[str, bool]:
    """The per-data-set table of a bench document and whether every check passed."""
    rates: dict[str, dict[str, float]] = {}
    for a in doc["aggregates"]:
        tps = a.get("tokens_per_s") or {}
        if tps.get("mean") is not None:
            rates.setdefault(a["dataset"], {})[a["config"]] = float(tps["mean"])
    lines, ok = [], True
    for dataset, by_config in rates.items():
        autos = [c for c in by_config if c.startswith("auto")]
        if not autos or "target" not in by_config:
            continue
        auto = by_config[autos[0]]
        fixed = {c: r for c, r in by_config.items() if not c.startswith("auto")}
        best_name = max(fixed, key=lambda c: fixed[c])
        lines.append(f"\n{dataset}:")
        lines.append("| config | tok/s | auto / config |")
        lines.append("|---|---|---|")
        for c, r in by_config.items():
            lines.append(f"| {c} | {r:.2f} | {auto / r:.3f} |")
        vs_best, vs_target = auto / fixed[best_name], auto / fixed["target"]
        passed = vs_best >= threshold and vs_target >= threshold
        ok &= passed
        lines.append(
            f"auto = {vs_best:.3f} x the best fixed choice ({best_name}), {vs_target:.3f} x target-only: "
            + ("pass" if passed else f"FAIL (threshold {threshold})")
        )
    if not lines:
        return "no data set has both an auto and a target configuration", False
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder of the bench run")
    ap.add_argument("--from", dest="from_dir", help="print the table of a finished run's folder instead")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"bench configurations ({DEFAULT_CONFIGS})")
    ap.add_argument("--datasets", help="bench --datasets (default: the bench's)")
    ap.add_argument("--context-tokens", help="bench --context-tokens (long-context prompts)")
    ap.add_argument("--num-prompts", default="8")
    ap.add_argument("--max-new-tokens", default="128")
    ap.add_argument("--threshold", type=float, default=0.97, help="the checks' ratio (default 0.97)")
    args = ap.parse_args(argv)
    if args.from_dir:
        out = Path(args.from_dir)
    else:
        if not args.out:
            ap.error("give --out (a folder for the run) or --from (a finished run)")
        out = Path(args.out)
        cmd = [sys.executable, "-m", "swiftspec.cli", "bench", "--configs", args.configs, "--out", str(out)]
        cmd += ["--num-prompts", args.num_prompts, "--max-new-tokens", args.max_new_tokens, "--no-plots"]
        if args.datasets:
            cmd += ["--datasets", args.datasets]
        if args.context_tokens:
            cmd += ["--context-tokens", args.context_tokens]
        cmd += passthrough
        print("+ " + " ".join(cmd), file=sys.stderr)
        if subprocess.run(cmd).returncode != 0:
            return 2
    path = out / "bench.json"
    if not path.is_file():
        print(f"{path}: no bench.json (not a finished swiftspec bench run)", file=sys.stderr)
        return 2
    text, ok = table(json.loads(path.read_text()), args.threshold)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
