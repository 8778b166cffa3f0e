#!/usr/bin/env python3
"""Logits of the int4 reference models against the bf16 models they were quantized from (CPU).

    python tools/check_int4_quality.py --out benchmarks/<date>-int4-quality/int4_quality.json
    python tools/check_int4_quality.py --out ... --variants gguf:32,rtn:128,rtn:32 --work /tmp/int4-variants

For each reference Qwen2.5-Coder model (0.5B, 1.5B), converts it to int4 if needed and runs the
int4 and the bf16 checkpoint over the same three real prompts (HumanEval 0 and 10, MT-Bench 0,
through the chat template), every position's logits. Without ``--variants`` the int4 model is
``ensure_checkpoint(name, "int4")`` (``convert_gguf``'s default: method ``gguf``, group size 32).
With ``--variants METHOD:G,...`` each variant is converted from the GGUF with
``convert_gguf(..., int4_method=METHOD, group_size=G)`` into ``--work`` (reused when complete):
``gguf`` keeps the GGUF's 4-bit values or requantizes each group by an error search
(``swiftspec.convert.gguf_int4``), ``rtn`` is round-to-nearest from the dequantized values.

Per variant and prompt it records: top-1 agreement (the int4 arg-max equals the bf16 arg-max),
the fraction of positions whose int4 arg-max is in the bf16 top-5, the relative L2 error of a
logits row ``|int4 - bf16| / |bf16|`` (mean and max over positions) and the mean KL(bf16 || int4)
of the next-token distributions, in nats. These are the quantities tests/test_int4_model.py
bounds for the 0.5B. Per variant it also records the weight error of the projections against the
GGUF's own dequantized values (the float32 checkpoint, read from the files): per GGUF type the
relative error ``sqrt(sum (int4 - gguf)^2 / sum gguf^2)`` and the mean and largest per-tensor
relative error ``|int4 - gguf| / |gguf|``.

``--folders LABEL=PATH,...`` (one model in ``--models``) compares int4 folders as they are, e.g.
``rtn128=...,awq128=...`` from ``tools/convert_weights.py CKPT --dtype int4 [--awq]`` (no weight
errors then: an AWQ folder's projections are scaled, not comparable to the GGUF's values).
``--prompts N`` uses the first N HumanEval and the first N MT-Bench prompts instead of the three
above (held out from ``--awq``'s default calibration set, the last 16 of each, for N <= 64).

Writes the JSON file (``{created, commit, command, models: {name: {variant: {weights, prompts}}}}``)
and prints one line per variant and type, and per prompt.
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
    return {
        "positions": int(ours.shape[0]),
        "top1_agreement": float((ours.argmax(axis=1) == ref.argmax(axis=1)).mean()),
        "in_bf16_top5": float((top5 == ours.argmax(axis=1)[:, None]).any(axis=1).mean()),
        "relative_error_mean": float(rel.mean()),
        "relative_error_max": float(rel.max()),
        "kl_mean_nats": float((np.exp(lp) * (lp - lq)).sum(axis=1).mean()),
    }


def parse_variants(text: str) -> list[tuple[str, int]]:
    """``"gguf:32,rtn:128"`` -> ``[("gguf", 32), ("rtn", 128)]``."""
    from swiftspec.convert.gguf_to_checkpoint import INT4_METHODS
    from swiftspec.errors import CheckpointError

    out = []
    for item in text.split(","):
        method, _, group = item.strip().partition(":")
        if method not in INT4_METHODS or not group.isdigit():
            raise CheckpointError(f"--variants: {item!r} is not METHOD:G with METHOD one of {', '.join(INT4_METHODS)}")
        out.append((method, int(group)))
    return out


def weight_errors(int4_dir: Path, float32_dir: Path, gguf_file: Path) -> dict:
    """Per GGUF type of the projections: tensors, relative error of the type's weights together, mean
    and largest per-tensor relative error, of the int4 folder's dequantized projections against the
    float32 folder's (the GGUF's dequantized values)."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    from swiftspec.convert.gguf_names import hf_tensor_name
    from swiftspec.convert.int4 import dequantize, projection_prefix

    manifest = json.loads((int4_dir / "manifest.json").read_text())
    group = manifest["quantization"]["group_size"]
    types = {hf_tensor_name(t.name): t.tensor_type.name for t in gguf.GGUFReader(gguf_file).tensors}
    acc: dict[str, dict] = {}
    with (
        safe_open(str(int4_dir / "model.safetensors"), "np") as q4,
        safe_open(str(float32_dir / "model.safetensors"), "np") as f32,
    ):
        for name in f32.keys():
            prefix = projection_prefix(name)
            if prefix is None:
                continue
            ref = f32.get_tensor(name)
            ours = dequantize(
                q4.get_tensor(prefix + ".qweight"),
                q4.get_tensor(prefix + ".scales"),
                q4.get_tensor(prefix + ".zeros"),
                group,
            )
            err2 = float(np.square(ours - ref, dtype=np.float64).sum())
            norm2 = float(np.square(ref, dtype=np.float64).sum())
            a = acc.setdefault(types[name], {"tensors": 0, "err2": 0.0, "norm2": 0.0, "per_tensor": []})
            a["tensors"] += 1
            a["err2"] += err2
            a["norm2"] += norm2
            a["per_tensor"].append((err2 / norm2) ** 0.5)
    out = {}
    for type_name, a in sorted(acc.items()):
        out[type_name] = {
            "tensors": a["tensors"],
            "relative_error": (a["err2"] / a["norm2"]) ** 0.5,
            "per_tensor_mean": float(np.mean(a["per_tensor"])),
            "per_tensor_max": max(a["per_tensor"]),
        }
    total2 = sum(a["err2"] for a in acc.values())
    norm2 = sum(a["norm2"] for a in acc.values())
    out["all"] = {"tensors": sum(a["tensors"] for a in acc.values()), "relative_error": (total2 / norm2) ** 0.5}
    return out


def variant_folder(name: str, method: str, group: int, work: Path) -> Path:
    """The int4 folder of reference model ``name`` converted with ``method`` and ``group`` under ``work``."""
    from swiftspec.convert import convert_gguf
    from swiftspec.fetch import REFERENCE_MODELS, fetch_model
    from swiftspec.paths import build_folder_atomically

    final = work / f"{name}-int4-{method}{group}"
    if (final / "manifest.json").is_file():
        return final
    gguf_file = fetch_model(name, progress=False)
    start, cpu = time.perf_counter(), time.process_time()
    out = build_folder_atomically(
        final,
        lambda tmp: convert_gguf(
            gguf_file,
            tmp,
            dtype="int4",
            group_size=group,
            int4_method=method,
            source_sha256=REFERENCE_MODELS[name].sha256,
            progress=False,
        ),
    )
    seconds = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(time.process_time() - cpu, 1)}
    (final / "conversion_time.json").write_text(json.dumps(seconds) + "\n")
    print(f"{name} {method}:{group}: converted in {seconds['wall_s']} s ({seconds['cpu_s']} s of CPU)", flush=True)
    return out


def main() -> int:
    from swiftspec import swiftspec_core as core
    from swiftspec.bench.machine import commit_label
    from swiftspec.datasets import load_humaneval, load_mtbench, prompt_messages
    from swiftspec.fetch import ensure_checkpoint, fetch_model
    from swiftspec.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument(
        "--variants",
        default=None,
        metavar="METHOD:G,...",
        help="int4 conversions to compare (e.g. gguf:32,rtn:128); needs --work",
    )
    ap.add_argument("--work", type=Path, default=None, help="folder for the --variants conversions (reused)")
    ap.add_argument(
        "--folders",
        default=None,
        metavar="LABEL=PATH,...",
        help="int4 folders of the one model in --models to compare as they are (no weight errors)",
    )
    ap.add_argument(
        "--prompts",
        type=int,
        default=None,
        metavar="N",
        help="the first N HumanEval and first N MT-Bench prompts (default: HumanEval 0 and 10, MT-Bench 0)",
    )
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default {','.join(MODELS)})")
    args = ap.parse_args()
    variants = parse_variants(args.variants) if args.variants else None
    if variants and args.work is None:
        ap.error("--variants needs --work")
    folders = None
    if args.folders:
        if variants or "," in args.models:
            ap.error("--folders needs one model in --models and no --variants")
        folders = {}
        for item in args.folders.split(","):
            label, _, path = item.partition("=")
            if not label or not path:
                ap.error(f"--folders: {item!r} is not LABEL=PATH")
            folders[label] = Path(path)
    he, mt = load_humaneval(progress=False), load_mtbench(progress=False)
    if args.prompts:
        records = [("humaneval", r) for r in he[: args.prompts]] + [("mtbench", r) for r in mt[: args.prompts]]
    else:
        records = [("humaneval", he[0]), ("humaneval", he[10]), ("mtbench", mt[0])]
    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit_label(),
        "command": " ".join(sys.argv),
        "models": {},
    }
    for name in args.models.split(","):
        bf16 = ensure_checkpoint(name, "bfloat16", progress=False)
        if folders:
            int4_dirs = folders
        elif variants:
            int4_dirs = {f"{m}:{g}": variant_folder(name, m, g, args.work) for m, g in variants}
        else:
            int4_dirs = {"default": ensure_checkpoint(name, "int4", progress=False)}
        tok = Tokenizer.from_checkpoint(bf16)
        prompts = [tok.encode_chat(prompt_messages(ds, rec)) for ds, rec in records]
        opts = core.ModelOptions()
        opts.max_context = max(len(p) for p in prompts) + 8
        logits = {}
        for label, folder in {"bfloat16": bf16, **int4_dirs}.items():  # one model in memory at a time
            model = core.load_model(str(folder), "cpu", opts)
            logits[label] = []
            for ids in prompts:
                model.truncate_committed(0)
                logits[label].append(model.forward(ids, logits="all"))
            del model
        float32 = None if folders else ensure_checkpoint(name, "float32", progress=False)
        doc["models"][name] = {}
        for label, folder in int4_dirs.items():
            weights = weight_errors(folder, float32, fetch_model(name, progress=False)) if float32 else {}
            for type_name, row in weights.items():
                print(name, label, "weights", type_name, json.dumps(row), flush=True)
            rows = []
            for (ds, rec), ours, ref in zip(records, logits[label], logits["bfloat16"]):
                rows.append({"dataset": ds, "id": rec.get("task_id", rec.get("question_id")), **compare(ours, ref)})
                print(name, label, json.dumps(rows[-1]), flush=True)
            manifest = json.loads((folder / "manifest.json").read_text())
            timing = folder / "conversion_time.json"
            n = sum(r["positions"] for r in rows)  # pooled over every position of every prompt
            pooled: dict = {"positions": n}
            pooled.update({k: sum(r[k] * r["positions"] for r in rows) / n for k in ("top1_agreement", "kl_mean_nats")})
            print(name, label, "pooled", json.dumps(pooled), flush=True)
            doc["models"][name][label] = {
                "folder": str(folder),
                "quantization": manifest["quantization"],
                "conversion": json.loads(timing.read_text()) if timing.is_file() else None,
                "weights": weights,
                "prompts": rows,
                "pooled": pooled,
            }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    run(main)
