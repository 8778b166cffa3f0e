#!/usr/bin/env python3
"""Full greedy losslessness check of serial (issue 3) or async (issue 4) speculative decoding.

For every prompt (default: the 80 MT-Bench first turns and the first 40 HumanEval
problems, chat template applied), decodes `--max-new-tokens` tokens (default 128) with
the target alone, greedy, then with each `--mode` (serial and/or async tree generation)
for each `--configs` shape, and compares token for token. At each divergence it records
the target's logits there (the target run over the prompt and the reference tokens before
the divergence): its top-2 gap and the logit difference between the reference token and
the speculative one, so near-ties can be told from bugs. Writes

  <out>.json   every prompt: reference length, per config equal / first difference (with the
               target's top-2 logit gap there) / acceptance length / verification and draft
               steps / times
  <out>.md     a summary table (equal / total per config, mean acceptance length) and the
               divergences with their logit gaps

Progress is appended to <out>.jsonl as each prompt finishes, so an interrupted run
resumes where it stopped (--resume). Exit status 1 if any output differs.

  python tools/check_lossless.py                       # full run, float32 pair
  python tools/check_lossless.py --limit 4 --max-new-tokens 32 --out /tmp/quick
  python tools/check_lossless.py --mode async --dtype bfloat16 --placement auto          # issue 4
  python tools/check_lossless.py --mode async --target-tp 2 --placement auto             # TP-2 target
  python tools/check_lossless.py --mtbench 0 --humaneval 0 --context-tokens 8192 --context-prompts 3 \
      --mode serial,async --dtype bfloat16 --out /tmp/long8k                         # long contexts (issue 27)
  python tools/check_lossless.py --backend cuda --dtype bfloat16 --mode serial,async \
      --configs tree16:16:8:2                                                          # the GPU (issue 5)

--mode async checks parallel tree generation (draft and target groups running concurrently);
--mode serial,async checks both against one target-only reference per prompt (config keys are
then mode:name); --mode megakernel (cuda) checks target-only decoding with the decode megakernel
(a second target model, ModelOptions.megakernel) against the layered target (key
target:megakernel; the megakernel sums in another order, so divergences are expected only at
near-ties: their top-2 gaps tell); --backend cuda runs both models on the GPU (CUDA builds; a --placement may
give each group an sm_partition, docs/green_contexts.md);
--reference prefill makes the target-only reference from one teacher-forced target pass over the
first speculative output (exact on the batch-invariant CPU backend; one batched pass instead of
--max-new-tokens decode steps), decoding only where a position disagrees; --reference both does both and stops
if they ever differ (the check of that equivalence).
--shard K/N checks every N-th prompt from the K-th of those not yet recorded in the --skip-done
files, so N processes on disjoint cores share one run (each with its own --out); --merge
FILE.jsonl ... then writes one report from their records (and earlier ones) without loading
a model:

  python tools/check_lossless.py --mode async --shard 0/2 --skip-done old.jsonl --out /tmp/s0 &
  python tools/check_lossless.py --mode async --shard 1/2 --skip-done old.jsonl --out /tmp/s1 &
  wait; python tools/check_lossless.py --mode async --merge old.jsonl /tmp/s0.jsonl /tmp/s1.jsonl --out all
--target-tp N loads the target as a tensor-parallel model over N ranks (the reference is then
target-only decoding with that same TP-N target: TP changes the reduction order); --placement
puts the groups on cores ("auto": draft on core 0, target on the rest; or JSON, see
swiftspec.placement).
"""

from __future__ import annotations

import argparse
import json
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


def load_prompts(tok, n_mtbench: int, n_humaneval: int, context_tokens: int = 0, n_context: int = 0):
    """(dataset, index, id, prompt token ids) of the first `n_mtbench` MT-Bench first turns, the
    first `n_humaneval` HumanEval problems and, with `context_tokens`, `n_context` long-context
    prompts of exactly that many tokens (swiftspec.bench.long_context, data set "ctxN")."""
    from swiftspec.datasets import load_humaneval, load_mtbench, prompt_messages

    out = []
    for i, rec in enumerate(load_mtbench(progress=False)[:n_mtbench]):
        out.append(("mtbench", i, str(rec.get("question_id")), tok.encode_chat(prompt_messages("mtbench", rec))))
    for i, rec in enumerate(load_humaneval(progress=False)[:n_humaneval]):
        out.append(("humaneval", i, rec["task_id"], tok.encode_chat(prompt_messages("humaneval", rec))))
    if context_tokens and n_context:
        from swiftspec.bench.long_context import ContextPrompts, workload_name

        builder = ContextPrompts(tok, load_humaneval(progress=False))
        for i in range(n_context):
            out.append(
                (
                    workload_name(context_tokens),
                    i,
                    f"{workload_name(context_tokens)}/{i}",
                    builder.prompt(context_tokens, i)[1],
                )
            )
    return out


def load_reference_pair(prompts, dtype: str, max_new_tokens: int, max_tree: int, threads: int = 0):
    """The reference target and draft on the CPU backend, sized for `prompts`.

    `prompts`: load_prompts' tuples (dataset, index, id, token ids); the models' max_context is
    the longest prompt + max_new_tokens + 8 and max_tree `max_tree`; `threads` 0 = the default.
    Returns (target, draft). Raises what ensure_checkpoint / load_model raise (missing or bad
    checkpoints).
    """
    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.swiftspec_core import ModelOptions, load_model

    tdir = ensure_checkpoint(TARGET, dtype, progress=False)
    ddir = ensure_checkpoint(DRAFT, dtype, progress=False)
    opts = ModelOptions()
    opts.max_context = max(len(p[3]) for p in prompts) + max_new_tokens + 8
    opts.max_tree = max_tree
    if threads:
        opts.num_threads = threads
    return load_model(str(tdir), "cpu", opts), load_model(str(ddir), "cpu", opts)


def target_logit_gap(model, prompt_ids, reference, speculative, position: int) -> dict:
    """The target's logits where a speculative output first differs from the reference.

    Runs `model` (the target, fresh committed KV) over prompt + reference[:position] and reads
    the logits of the last row: the distribution the target sampled reference[position] from
    (bit-identical to the decode step's on batch-invariant backends, model.h). Returns
    {top1, top2 (token ids), top2_gap (top-1 minus top-2 logit), reference_token,
    speculative_token, reference_minus_speculative (logit difference; None past an end)}.
    Leaves the model's committed KV empty.
    """
    import numpy as np

    model.truncate_committed(0)
    logits = np.asarray(
        model.forward(list(prompt_ids) + list(reference[:position]), logits="last")[0], dtype=np.float64
    )
    model.truncate_committed(0)
    top = np.argsort(-logits, kind="stable")[:2]
    ref_tok = reference[position] if position < len(reference) else None
    spec_tok = speculative[position] if position < len(speculative) else None
    return {
        "top1": int(top[0]),
        "top2": int(top[1]),
        "top2_gap": float(logits[top[0]] - logits[top[1]]),
        "reference_token": ref_tok,
        "speculative_token": spec_tok,
        "reference_minus_speculative": (
            float(logits[ref_tok] - logits[spec_tok]) if ref_tok is not None and spec_tok is not None else None
        ),
    }


def with_ext(out: Path, ext: str) -> Path:
    """<out><ext>: appended, not replacing a suffix, so --out run.s0 writes run.s0.jsonl."""
    return out.with_name(out.name + ext)


def parse_shard(text: str | None) -> tuple[int, int]:
    """'K/N' -> (K, N) with 0 <= K < N; None -> (0, 1). Raises SystemExit naming the value."""
    if text is None:
        return 0, 1
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"--shard {text!r} must be K/N (e.g. 0/3)") from None
    if n < 1 or not 0 <= k < n:
        raise SystemExit(f"--shard {text!r}: need 0 <= K < N")
    return k, n


def select_prompts(prompts: list, skip: dict, shard_k: int, shard_n: int) -> list:
    """The prompts (dataset, index, ...) of shard K of N: every N-th, from the K-th, of those
    whose (dataset, index) is not in `skip`. The shard is taken over what the --skip-done files
    lack, not over a run's own progress, so a resumed shard keeps its prompts and the N shards
    differ in size by at most one."""
    return [p for p in prompts if (p[0], p[1]) not in skip][shard_k::shard_n]


def read_records(paths) -> dict:
    """{(dataset, index): record} from progress files (<out>.jsonl), the first record of a prompt
    winning. Raises SystemExit naming a file that is missing or not JSON lines."""
    done = {}
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise SystemExit(f"records file {path} does not exist")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                rec = json.loads(line)
                key = (rec["dataset"], rec["index"])
            except (ValueError, KeyError, TypeError):
                raise SystemExit(f"{path}:{n} is not a check_lossless record") from None
            done.setdefault(key, rec)
    return done


def run_settings(args) -> dict:
    """What a record's outputs depend on besides its prompt; --merge refuses records whose
    settings differ from its command line."""
    return {
        "mode": args.mode,
        "configs": args.configs,
        "backend": args.backend,
        "dtype": args.dtype,
        "target_tp": args.target_tp,
        "max_new_tokens": args.max_new_tokens,
    }


def check_settings(records: list, args) -> None:
    """Raises SystemExit naming the first record made with other settings than `args`
    (records written before settings were stored pass)."""
    want = run_settings(args)
    for rec in records:
        got = rec.get("settings")
        if got is None:
            continue
        for key, value in want.items():
            if key == "configs":  # the same shapes may be spelt in another order
                same = set(str(got.get(key)).split(",")) == set(str(value).split(","))
            else:
                same = got.get(key) == value
            if not same:
                raise SystemExit(
                    f"{rec['dataset']}#{rec['index']} was checked with {key}={got.get(key)!r}, "
                    f"this --merge says {value!r}: merge records of one run's settings"
                )


def check_one(engine, target_model, args, checks, configs, dataset, index, pid, ids, mk_engine=None) -> dict:
    """One prompt: every (mode, config) speculative output against the target-only reference
    (mode "megakernel": target-only decoding by `mk_engine`, the target with the decode megakernel)."""
    from swiftspec.bench.greedy_reference import teacher_forced_reference

    results = {}
    for mode, name, key in checks:
        if mode == "megakernel":
            results[key] = mk_engine.generate(ids, max_new_tokens=args.max_new_tokens, mode="target")
            continue
        budget, depth, branching = configs[name]
        results[key] = engine.generate(
            ids, max_new_tokens=args.max_new_tokens, mode=mode, tree_budget=budget, max_depth=depth, branching=branching
        )
    ref_tokens, ref_finish, ref_how, decode_s = None, None, "decode", None
    if args.reference in ("prefill", "both"):
        first = next(iter(results.values()))
        # No stop tokens in these requests: every output runs to --max-new-tokens.
        ref_tokens = teacher_forced_reference(target_model, ids, first["tokens"], args.max_new_tokens)
        if ref_tokens is not None:
            ref_finish, ref_how = ("length" if len(ref_tokens) == args.max_new_tokens else "stop"), "prefill"
    if ref_tokens is None or args.reference == "both":
        ref = engine.generate(ids, max_new_tokens=args.max_new_tokens, mode="target")
        decode_s = ref["stats"]["decode_time"]
        if ref_tokens is not None and ref_tokens != ref["tokens"]:
            raise SystemExit(
                f"{dataset}#{index}: the teacher-forced reference differs from target-only "
                "decoding: the backend is not batch-invariant, use --reference decode"
            )
        ref_how = "prefill+decode (equal)" if ref_tokens is not None else "decode"
        ref_tokens, ref_finish = ref["tokens"], ref["stats"]["finish_reason"]
    rec = {
        "dataset": dataset,
        "index": index,
        "id": pid,
        "settings": run_settings(args),
        "prompt_tokens": len(ids),
        "reference_tokens": len(ref_tokens),
        "reference_finish": ref_finish,
        "reference_from": ref_how,
        "target_only_decode_s": decode_s,
        "configs": {},
    }
    for mode, name, key in checks:
        res = results[key]
        a, b = res["tokens"], ref_tokens
        diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if diff is None and len(a) != len(b):
            diff = min(len(a), len(b))
        st = res["stats"]
        rec["configs"][key] = {
            "equal": a == b,
            "first_difference": diff,
            "new_tokens": len(a),
            "acceptance_length": st.get("acceptance_length", 1.0),
            "verification_steps": st.get("verification_steps"),
            "draft_steps": st.get("draft_steps"),
            "decode_s": st["decode_time"],
            "target_s": st.get("target_time"),
            "draft_s": st.get("draft_time"),
            "divergence": None if diff is None else target_logit_gap(target_model, ids, b, a, diff),
        }
    return rec


def write_report(out: Path, args, checks, configs, records: list, placement, wall_s: float) -> list:
    """Writes <out>.json and <out>.md for `records`; returns the differing outputs."""
    from swiftspec.bench.machine import commit_label, machine_info

    summary = {}
    for mode, name, key in checks:
        missing = [f"{r['dataset']}#{r['index']}" for r in records if key not in r["configs"]]
        if missing:
            raise SystemExit(
                f"records of {', '.join(missing[:5])} have no result for {key!r}: were they made "
                f"with another --mode/--configs? (their keys: {sorted(records[0]['configs'])})"
            )
        rows = [r["configs"][key] for r in records]
        summary[key] = {
            "mode": mode,
            "tree_budget": configs[name][0] if name else None,
            "max_depth": configs[name][1] if name else None,
            "branching": configs[name][2] if name else None,
            "equal": sum(r["equal"] for r in rows),
            "total": len(rows),
            "mean_acceptance_length": sum(r["acceptance_length"] for r in rows) / max(len(rows), 1),
            "differing": [
                f"{rec['dataset']}#{rec['index']}@{rec['configs'][key]['first_difference']}"
                for rec in records
                if not rec["configs"][key]["equal"]
            ],
            "divergences": [
                dict(
                    dataset=rec["dataset"],
                    index=rec["index"],
                    id=rec["id"],
                    position=rec["configs"][key]["first_difference"],
                    **(rec["configs"][key].get("divergence") or {}),
                )
                for rec in records
                if not rec["configs"][key]["equal"]
            ],
        }
    result = {
        "what": f"greedy {args.mode} speculative decoding vs target-only greedy decoding, token for token",
        "mode": args.mode,
        "target_tp": args.target_tp,
        "reference": args.reference,
        "placement": placement,
        "target": TARGET,
        "draft": DRAFT,
        "dtype": args.dtype,
        "backend": args.backend,
        "max_new_tokens": args.max_new_tokens,
        "prompts": {
            "mtbench_first_turns": sum(r["dataset"] == "mtbench" for r in records),
            "humaneval": sum(r["dataset"] == "humaneval" for r in records),
        },
        "git_commit": commit_label(REPO),
        "machine": machine_info(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "wall_s": wall_s,
        "merged_from": [str(p) for p in args.merge] if args.merge else None,
        "summary": summary,
        "records": records,
    }
    with_ext(out, ".json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# Greedy losslessness of {args.mode} speculative decoding"
        + (f" (target TP {args.target_tp})" if args.target_tp != 1 else ""),
        "",
        f"Target {TARGET}, draft {DRAFT}, {args.dtype}, {args.backend.upper()} backend, {args.max_new_tokens} new tokens, "
        f"{result['prompts']['mtbench_first_turns']} MT-Bench first turns + {result['prompts']['humaneval']} HumanEval "
        f"prompts (chat template). Target-only reference: {args.reference} (see the tool's help). "
        f"Commit {result['git_commit']}, {result['date']}. Produced by "
        "`tools/check_lossless.py`" + (f" --merge of {len(args.merge)} record files." if args.merge else "."),
        "",
        "| config | tree_budget | max_depth | branching | identical to target-only | mean acceptance length |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, s in summary.items():
        lines.append(
            f"| {key} | {s['tree_budget']} | {s['max_depth']} | {s['branching']} | "
            f"{s['equal']}/{s['total']} | {s['mean_acceptance_length']:.2f} |"
        )
    bad = [d for s in summary.values() for d in s["differing"]]
    lines += ["", "Differing outputs (dataset#index@first differing token): " + (", ".join(bad) if bad else "none"), ""]
    divs = [(key, d) for key, s in summary.items() for d in s["divergences"]]
    if divs:
        lines += [
            "Target logits at each divergence (target run over the prompt + the reference tokens before it):",
            "",
            "| config | prompt | position | reference token | speculative token | top-1 - top-2 logit | "
            "reference - speculative logit |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for key, d in divs:

            def fmt(v):
                return "-" if v is None else f"{v:.4g}"

            lines.append(
                f"| {key} | {d['dataset']}#{d['index']} | {d['position']} | {d.get('reference_token', '-')} | "
                f"{d.get('speculative_token', '-')} | {fmt(d.get('top2_gap'))} | "
                f"{fmt(d.get('reference_minus_speculative'))} |"
            )
        lines.append("")
    with_ext(out, ".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtbench", type=int, default=80, help="MT-Bench first turns to check (default 80)")
    ap.add_argument("--humaneval", type=int, default=40, help="HumanEval problems to check (default 40)")
    ap.add_argument(
        "--context-tokens",
        type=int,
        default=0,
        help="also check --context-prompts long-context prompts of exactly this many tokens (HumanEval "
        "files and a review instruction, swiftspec.bench.long_context; 0: none)",
    )
    ap.add_argument("--context-prompts", type=int, default=3, help="long-context prompts with --context-tokens (3)")
    ap.add_argument("--limit", type=int, default=0, help="check only the first N prompts of the list (0: all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"name:budget:depth:branching,... ({DEFAULT_CONFIGS})")
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "int4"],
        help="weights of both models (int4: converted from the GGUFs, group size 32; on cuda the layered step)",
    )
    ap.add_argument("--threads", type=int, default=0, help="CPU threads per model (0: all cores)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "lossless_greedy"), help="output path without suffix")
    ap.add_argument("--resume", action="store_true", help="skip prompts already in <out>.jsonl")
    ap.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="check only every N-th prompt, from the K-th, of those not in the --skip-done files",
    )
    ap.add_argument(
        "--skip-done",
        nargs="+",
        default=[],
        metavar="JSONL",
        help="progress files of earlier runs: their prompts are not checked (nor reported) here",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSONL",
        help="write one report from these progress files (same --mode/--configs) and exit; loads no model",
    )
    ap.add_argument(
        "--mode",
        default="serial",
        help="mode(s) to check: serial, async, auto (the per-round choice; the config's budget is its "
        "largest tree), megakernel (target-only with the CUDA decode megakernel), or a comma list "
        "(serial,async)",
    )
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu", help="backend of both models (default cpu)")
    ap.add_argument("--target-tp", type=int, default=1, help="TP degree of the target group (default 1)")
    ap.add_argument("--placement", default=None, help="'auto' or JSON placement of the draft and target groups")
    ap.add_argument(
        "--reference",
        choices=["decode", "prefill", "both"],
        default="decode",
        help="how the target-only reference is made: decode (target-only greedy decoding), prefill "
        "(confirm the first speculative output with one teacher-forced target pass; exact on "
        "batch-invariant backends, falls back to decoding where it disagrees), both (prefill "
        "and decode, and fail unless they agree)",
    )
    args = ap.parse_args(argv)
    if args.reference != "decode" and args.backend != "cpu":
        ap.error("--reference prefill/both needs the batch-invariant CPU backend")
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if (
        not modes
        or any(m not in ("serial", "async", "auto", "megakernel") for m in modes)
        or len(set(modes)) != len(modes)
    ):
        ap.error(f"--mode {args.mode!r}: give serial, async, auto, megakernel, or a comma list of them")
    if "megakernel" in modes and args.backend != "cuda":
        ap.error("--mode megakernel runs the CUDA decode megakernel: it needs --backend cuda")
    shard_k, shard_n = parse_shard(args.shard)
    configs = parse_configs(args.configs)
    # (mode, config name) -> record key: the bare name when one mode is checked (as before).
    spec_modes = [m for m in modes if m != "megakernel"]
    checks = [(m, name, f"{m}:{name}" if len(modes) > 1 else name) for m in spec_modes for name in configs]
    if "megakernel" in modes:  # target-only decoding by a second target made with the megakernel
        checks.append(("megakernel", None, "target:megakernel"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    if args.merge:
        merged = read_records(args.merge)
        order = {"mtbench": 0, "humaneval": 1}
        records = [merged[k] for k in sorted(merged, key=lambda k: (order.get(k[0], 2), k[0], k[1]))]
        if not records:
            raise SystemExit("--merge: the files hold no records")
        check_settings(records, args)
        return 1 if write_report(out, args, checks, configs, records, None, 0.0) else 0

    from swiftspec.fetch import ensure_checkpoint
    from swiftspec.swiftspec_core import Engine, ModelOptions, load_model
    from swiftspec.tokenizer import Tokenizer

    skip = read_records(args.skip_done)
    tdir = ensure_checkpoint(TARGET, args.dtype, progress=False)
    ddir = ensure_checkpoint(DRAFT, args.dtype, progress=False)
    tok = Tokenizer.from_checkpoint(tdir)
    prompts = load_prompts(tok, args.mtbench, args.humaneval, args.context_tokens, args.context_prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    prompts = select_prompts(prompts, skip, shard_k, shard_n)
    if not prompts:
        print("nothing to check: every prompt is in the --skip-done files (or this shard is empty)")
        return 0
    longest = max(len(p[3]) for p in prompts)
    opts = ModelOptions()
    opts.max_context = longest + args.max_new_tokens + 8
    opts.max_tree = max(b for b, _, _ in configs.values()) + 2
    opts.num_threads = args.threads
    if args.placement or args.target_tp != 1:
        from swiftspec.placement import load_models, normalize

        placement = normalize(args.placement or {"target": {"tp": args.target_tp}}, target_tp=args.target_tp)
        target_model, draft_model = load_models(
            tdir,
            ddir,
            placement,
            backend=args.backend,
            max_context=opts.max_context,
            max_tree=opts.max_tree,
            num_threads=args.threads,
        )
    else:
        placement = None
        target_model, draft_model = load_model(str(tdir), args.backend, opts), load_model(str(ddir), args.backend, opts)
    engine = Engine(target_model, draft_model)
    mk_engine = None
    if "megakernel" in modes:
        mk_opts = ModelOptions()
        mk_opts.max_context, mk_opts.max_tree, mk_opts.num_threads = opts.max_context, opts.max_tree, args.threads
        mk_opts.megakernel = True
        mk_engine = Engine(load_model(str(tdir), args.backend, mk_opts), None)

    progress_path = with_ext(out, ".jsonl")
    done = {}
    if args.resume and progress_path.exists():
        done = read_records([progress_path])
    elif progress_path.exists():
        progress_path.unlink()

    records = []
    t_start = time.time()
    for n, (dataset, index, pid, ids) in enumerate(prompts):
        if (dataset, index) in done:
            records.append(done[(dataset, index)])
            continue
        rec = check_one(engine, target_model, args, checks, configs, dataset, index, pid, ids, mk_engine)
        records.append(rec)
        with progress_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        status = " ".join(
            f"{k}={'ok' if v['equal'] else 'DIFF@' + str(v['first_difference'])}({v['acceptance_length']:.2f})"
            for k, v in rec["configs"].items()
        )
        print(f"[{n + 1}/{len(prompts)}] {dataset}#{index}: {status}  ({time.time() - t_start:.0f}s)", flush=True)

    return 1 if write_report(out, args, checks, configs, records, placement, time.time() - t_start) else 0


if __name__ == "__main__":
    sys.exit(main())
