#!/usr/bin/env python3
"""Markdown tables from the multi-GPU results (tools/gpu_multi.sh).

Reads check.json, bench.json and tp_bench.json from DIR (any may be missing)
and prints the tables the benchmark record (benchmarks/*-multigpu/README.md)
quotes: check pass/fail counts, all-reduce latency per size and TP degree
(NCCL vs peer), the row-parallel GEMM variants, and the decode-step latency
per shape / TP degree / mode against the physical limit.

Usage: python3 cuda/scripts/multigpu_summary.py DIR
"""

import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"({os.path.basename(path)}: {e})")
        return None


def fmt(v, nd=2):
    return "-" if v is None or v < 0 else f"{v:.{nd}f}"


def main(d):
    chk = load(os.path.join(d, "check.json"))
    if chk:
        checks = chk.get("checks", [])
        fails = [c for c in checks if not c.get("pass")]
        print(f"checks: {len(checks)} on {chk.get('gpus')} GPU(s), {len(fails)} failed")
        for c in fails:
            print(f"  FAIL {c['name']}: err={c['err']} {c.get('detail', '')}")
        print()
    b = load(os.path.join(d, "bench.json"))
    if b:
        print(
            f"device {b.get('device')} x{b.get('gpus')}, NCCL {b.get('nccl_version')}, "
            f"NCCL_NVLS_ENABLE={b.get('nvls_enable')!r}, copy bandwidth {b.get('copy_bandwidth_tbs'):.3f} TB/s"
        )
        print()
        print(
            "| TP | bytes | ncclAllReduce (µs) | peer all-reduce (µs) | NCCL / peer | peer at 4 / 16 / 64 CTAs (µs) |"
        )
        print("|---|---|---|---|---|---|")
        for r in b.get("allreduce", []):
            sp = r["nccl_us"] / r["peer_us"] if r["nccl_us"] > 0 and r["peer_us"] > 0 else None
            sw = r.get("peer_us_by_ctas", {})
            sws = " / ".join(fmt(sw.get(k)) for k in ("4", "16", "64"))
            print(f"| {r['tp']} | {r['bytes']} | {fmt(r['nccl_us'])} | {fmt(r['peer_us'])} | {fmt(sp)} | {sws} |")
        print()
        print(
            "| TP | shape | M | GEMM alone | GEMM + ncclAllReduce | GEMM + peer AR | fused GEMM+AR | "
            "GEMM→sym + AR/residual | weight limit | plan |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in b.get("row_parallel_gemm", []):
            print(
                f"| {r['tp']} | {r['shape']} N={r['N']} K={r['K_total']}/{r['tp']} | {r['M']} | {fmt(r['gemm_us'])} | "
                f"{fmt(r['gemm_nccl_us'])} | {fmt(r['gemm_peer_us'])} | {fmt(r['fused_us'])} | "
                f"{fmt(r.get('two_kernel_residual_us'))} | "
                f"{fmt(r['weight_limit_us'])} | {r.get('plan', '')} |"
            )
        if b.get("p2p_one_way"):
            print("| message bytes | ncclSend/ncclRecv one-way (µs) | peer-memory one-way (µs) |")
            print("|---|---|---|")
            for r in b["p2p_one_way"]:
                print(f"| {r['bytes']} | {fmt(r['nccl_us'])} | {fmt(r['peer_us'])} |")
            print()
        for n in b.get("notes", []):
            print(f"note: {n}")
        if b.get("error"):
            print(f"error: {b['error']}")
        print()
    t = load(os.path.join(d, "tp_bench.json"))
    if t:
        print(
            f"decode step, batch 1, context {t.get('context')}, copy bandwidth {t.get('copy_bandwidth_tbs'):.3f} TB/s"
        )
        print()
        print("| shape | TP | mode | step (ms) | limit (ms) | of limit | weights / rank (GB) | note |")
        print("|---|---|---|---|---|---|---|---|")
        for r in t.get("rows", []):
            ofl = f"{100 * r['limit_ms'] / r['step_ms']:.0f}%" if r["step_ms"] > 0 else "-"
            print(
                f"| {r['shape']} | {r['tp']} | {r['mode']} | {fmt(r['step_ms'], 3)} | {fmt(r['limit_ms'], 3)} | {ofl} | "
                f"{fmt(r['weight_gb_per_rank'])} | {r.get('note', '')} |"
            )
        if t.get("error"):
            print(f"error: {t['error']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: multigpu_summary.py DIR")
    main(sys.argv[1])
