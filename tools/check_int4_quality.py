#!/usr/bin/env python3
"""Logits of the int4 reference models against the bf16 models they were quantized from (CPU).

    python tools/check_int4_quality.py --out benchmarks/<date>-int4-quality/int4_quality.json

For each reference Qwen2.5-Coder model (0.5B, 1.5B), converts it to int4 if needed
(``ensure_checkpoint(name, "int4")``: group size 128, round-to-nearest, from the GGUF) and runs
the int4 and the bf16 checkpoint over the same three real prompts (HumanEval 0 and 10, MT-Bench
0, through the chat template), every position's logits. Per prompt it records: top-1 agreement
(the int4 arg-max equals the bf16 arg-max), the fraction of positions whose int4 arg-max is in
the bf16 top-5, the relative L2 error of a logits row ``|int4 - bf16| / |bf16|`` (mean and max
over positions) and the mean KL(bf16 || int4) of the next-token distributions, in nats.
These are the quantities tests/test_int4_model.py bounds for the 0.5B.

Writes the JSON file (``{created, commit, command, models: {name: [per prompt]}}``) and prints
one line per prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import import_swiftspec, run  # noqa: E402

import_swiftspec()

MODELS = ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")


def log_softmax(x):
    import numpy as np

    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def compare(ours, ref) -> dict:
    """Agreement and error of int4 logits `ours` against bf16 logits `ref` (both [positions, vocab])."""
    import numpy as np

    rel = np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)
    top5 = np.argsort(-ref, axis=1)[:, :5]
    lq, lp = log_softmax(ours), log_softmax(ref)
    return {"positions": int(ours.shape[0]),
            "top1_agreement": float((ours.argmax(axis=1) == ref.argmax(axis=1)).mean()),
            "in_bf16_top5": float((top5 == ours.argmax(axis=1)[:, None]).any(axis=1).mean()),
            "relative_error_mean": float(rel.mean()), "relative_error_max": float(rel.max()),
            "kl_mean_nats": float((np.exp(lp) * (lp - lq)).sum(axis=1).mean())}


def main() -> int:
    from swiftspec import swiftspec_core as core
    from swiftspec.bench.machine import commit_label
    from swiftspec.datasets import load_humaneval, load_mtbench, prompt_messages
    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()
    he, mt = load_humaneval(progress=False), load_mtbench(progress=False)
    records = [("humaneval", he[0]), ("humaneval", he[10]), ("mtbench", mt[0])]
    doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit_label(),
           "command": " ".join(sys.argv), "models": {}}
    for name in MODELS:
        dirs = {d: ensure_checkpoint(name, d, progress=False) for d in ("int4", "bfloat16")}
        tok = Tokenizer.from_checkpoint(dirs["bfloat16"])
        prompts = [tok.encode_chat(prompt_messages(ds, rec)) for ds, rec in records]
        opts = core.ModelOptions()
        opts.max_context = max(len(p) for p in prompts) + 8
        logits = {}
        for dtype, folder in dirs.items():  # one model in memory at a time
            model = core.load_model(str(folder), "cpu", opts)
            logits[dtype] = []
            for ids in prompts:
                model.truncate_committed(0)
                logits[dtype].append(model.forward(ids, logits="all"))
            del model
        rows = []
        for (ds, rec), ours, ref in zip(records, logits["int4"], logits["bfloat16"]):
            rows.append({"dataset": ds, "id": rec.get("task_id", rec.get("question_id")), **compare(ours, ref)})
            print(name, json.dumps(rows[-1]), flush=True)
        doc["models"][name] = rows
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    run(main)
