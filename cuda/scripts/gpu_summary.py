#!/usr/bin/env python3
"""Summary of a tools/gpu_check.sh run: reads check.json, bench.json and
peer_*.json from the output folder, writes summary.json and prints a table."""

import json
import os
import sys

TARGETS_MS = {"llama3-8b": 4.3, "qwen2.5-1.5b": 0.9, "qwen2.5-0.5b": 0.35}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # missing or partial output of a failed stage
        return {"error": f"{path}: {e}"}


def main(out):
    check = load(os.path.join(out, "check.json"))
    bench = load(os.path.join(out, "bench.json"))
    peer = load(os.path.join(out, "peer.json")).get("shapes", {})
    checks = check.get("checks", [])
    failed = [c["name"] for c in checks if not c.get("pass")]
    rows = []
    for m in bench.get("models", []):
        s = m["shape"]
        pm = peer.get(s, {}).get("ms_per_token")
        rows.append(
            {
                "shape": s,
                "decode_ms": m["decode_ms"],
                "decode_no_pdl_ms": m.get("decode_no_pdl_ms"),
                "host_sync_ms": m.get("host_sync_decode_ms"),
                "limit_ms": m["limit_ms"],
                "frac_of_limit": m["frac_of_limit"],
                "torch_compile_ms": pm,
                "speedup_vs_torch": (pm / m["decode_ms"]) if pm else None,
                "target_ms": TARGETS_MS.get(s),
                "meets_target": m["decode_ms"] <= TARGETS_MS.get(s, 0),
                "tree32_ratio": (m["tree32_ms"] / m["decode_ms"]) if m.get("tree32_ms") else None,
                "tree64_ratio": (m["tree64_ms"] / m["decode_ms"]) if m.get("tree64_ms") else None,
            }
        )
    summary = {
        "checks_total": len(checks),
        "checks_failed": failed,
        "copy_bandwidth_tbs": bench.get("copy_bandwidth_tbs"),
        "models": rows,
        "bench_error": bench.get("error"),
        "check_error": check.get("error"),
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print("\n==== swiftspec CUDA backend: summary ====")
    print(f"checks: {len(checks)} run, {len(failed)} failed" + (f": {failed[:6]}" if failed else ""))
    print(f"copy bandwidth: {bench.get('copy_bandwidth_tbs')} TB/s")
    print(
        f"{'shape':14} {'ours ms':>9} {'noPDL ms':>9} {'limit ms':>9} {'%limit':>7} {'torch ms':>9} "
        f"{'x torch':>8} {'target':>7} {'tree32x':>8} {'tree64x':>8}"
    )

    def f(v, fmt):
        return (fmt % v) if isinstance(v, (int, float)) else "-"

    for r in rows:
        print(
            f"{r['shape']:14} {f(r['decode_ms'], '%9.4f')} {f(r['decode_no_pdl_ms'], '%9.4f')} "
            f"{f(r['limit_ms'], '%9.4f')} {f(100 * r['frac_of_limit'], '%6.1f%%')} "
            f"{f(r['torch_compile_ms'], '%9.4f')} {f(r['speedup_vs_torch'], '%8.2f')} "
            f"{f(r['target_ms'], '%7.2f')} {f(r['tree32_ratio'], '%8.3f')} {f(r['tree64_ratio'], '%8.3f')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")))
