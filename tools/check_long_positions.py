#!/usr/bin/env python3
"""Logits of a real model at positions past 8K: the CPU backend against HF transformers fp32.

    python tools/check_long_positions.py --out benchmarks/<date>-long-positions/long_positions.json

Issue 27 ("Must show": long-position correctness). The prompt is real text: the HumanEval
problems' prompts and canonical solutions concatenated (raw text, no chat template), tokenized and
cut to ``--tokens`` tokens. The CPU backend runs the reference model's float32 checkpoint (the
GGUF dequantized by the converter) over it with a context of ``--tokens``; HF transformers loads
the GGUF itself (its own dequantization and Qwen2 implementation, fp32, as tests/
test_forward_vs_hf.py) and runs the same tokens in one pass. Logits are compared at ``--positions``
positions spread evenly over [``--from``, tokens - 1] (default 16 from 8192): per position the
relative L2 error ``|ours - hf| / |hf|`` over the vocabulary and whether the arg-max agrees.

One model is in memory at a time (the 1.5B in fp32 is 6 GB for each side); HF computes logits only
at the compared positions (``logits_to_keep``). The CPU backend prefills in chunks
(``--chunk`` tokens; a chunked prefill gives the same logits as one pass).

Writes the JSON file (``{created, commit, command, machine, model, tokens, positions: [{position,
relative_error, top1_ours, top1_hf}], relative_error_max, top1_agreement, seconds}``), prints one
line per position, and exits with status 1 if the maximum relative error reaches ``--tol``
(default 1e-3) or any arg-max differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import import_swiftspec, run  # noqa: E402

import_swiftspec()

MODEL = "qwen2.5-coder-1.5b-instruct"


def humaneval_text(records: list[dict]) -> str:
    """Every HumanEval problem's prompt followed by its canonical solution, in order."""
    return "\n\n".join(r["prompt"] + r["canonical_solution"] for r in records)


def positions_to_compare(first: int, tokens: int, count: int) -> list[int]:
    """`count` positions spread evenly over [first, tokens - 1], both ends included."""
    import numpy as np

    if not 0 <= first < tokens:
        raise SystemExit(f"--from {first} must be in [0, --tokens {tokens})")
    return sorted({int(round(p)) for p in np.linspace(first, tokens - 1, count)})


def our_logits(ckpt: Path, ids: list[int], positions: list[int], chunk: int) -> dict[int, "np.ndarray"]:
    """CPU backend logits at `positions` (each after the prefix before it, prefilled in chunks)."""
    from swiftspec import swiftspec_core as core

    opts = core.ModelOptions()
    opts.max_context = len(ids)
    model = core.load_model(str(ckpt), "cpu", opts)
    out, done, t0 = {}, 0, time.perf_counter()
    for p in positions:
        while done < p:
            step = min(chunk, p - done)
            model.forward(ids[done : done + step], logits="none")
            done += step
            print(f"  ours: {done} tokens in {time.perf_counter() - t0:.0f} s", flush=True)
        out[p] = model.forward([ids[p]], logits="last")[0]
        done += 1
    return out


def hf_logits(gguf: Path, ids: list[int], positions: list[int]) -> dict[int, "np.ndarray"]:
    """HF transformers fp32 logits at `positions` of one forward pass over `ids`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids]), logits_to_keep=torch.tensor(positions)).logits[0].float().numpy()
    return dict(zip(positions, logits))


def main() -> int:
    import numpy as np

    from swiftspec.bench.machine import commit_label, cpu_info, software_versions
    from swiftspec.datasets import load_humaneval
    from swiftspec.fetch import ensure_checkpoint, fetch_model
    from swiftspec.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--model", default=MODEL, help=f"reference model (default {MODEL})")
    ap.add_argument("--tokens", type=int, default=9216, help="prompt length in tokens (default 9216)")
    ap.add_argument("--from", dest="first", type=int, default=8192, help="first compared position (default 8192)")
    ap.add_argument("--positions", type=int, default=16, help="positions compared (default 16)")
    ap.add_argument("--chunk", type=int, default=512, help="CPU prefill chunk in tokens (default 512)")
    ap.add_argument("--tol", type=float, default=1e-3, help="largest relative error that passes (default 1e-3)")
    args = ap.parse_args()

    ckpt = ensure_checkpoint(args.model, "float32", progress=False)
    tok = Tokenizer.from_checkpoint(ckpt)
    ids = tok.encode(humaneval_text(load_humaneval(progress=False)))
    if len(ids) < args.tokens:
        raise SystemExit(f"HumanEval holds {len(ids)} tokens, fewer than --tokens {args.tokens}")
    ids = ids[: args.tokens]
    positions = positions_to_compare(args.first, args.tokens, args.positions)
    print(f"{args.model}: {len(ids)} tokens of HumanEval, positions {positions}", flush=True)

    t0 = time.perf_counter()
    ours = our_logits(ckpt, ids, positions, args.chunk)
    t1 = time.perf_counter()
    ref = hf_logits(fetch_model(args.model, progress=False), ids, positions)
    t2 = time.perf_counter()

    rows = []
    for p in positions:
        rel = float(np.linalg.norm(ours[p] - ref[p]) / np.linalg.norm(ref[p]))
        rows.append(
            {"position": p, "relative_error": rel, "top1_ours": int(ours[p].argmax()), "top1_hf": int(ref[p].argmax())}
        )
        print(f"position {p}: relative error {rel:.2e}, top-1 {rows[-1]['top1_ours']} vs HF {rows[-1]['top1_hf']}")
    worst = max(r["relative_error"] for r in rows)
    agree = sum(r["top1_ours"] == r["top1_hf"] for r in rows) / len(rows)
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit_label(),
        "command": " ".join(sys.argv),
        "machine": {"cpu": cpu_info(), "software": software_versions()},
        "model": args.model,
        "checkpoint_dtype": "float32",
        "hf": "transformers fp32 from the GGUF file",
        "text": "HumanEval prompts + canonical solutions, concatenated",
        "tokens": len(ids),
        "positions": rows,
        "relative_error_max": worst,
        "top1_agreement": agree,
        "tol": args.tol,
        "seconds": {"ours": round(t1 - t0, 1), "hf": round(t2 - t1, 1)},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"max relative error {worst:.2e}, top-1 agreement {agree:.3f} "
        f"(ours {t1 - t0:.0f} s, HF {t2 - t1:.0f} s) -> {out}"
    )
    return 0 if worst < args.tol and agree == 1.0 else 1


if __name__ == "__main__":
    run(main)
