"""`swiftspec bench`: run prompt sets through decode configurations and peers, and report.

    swiftspec bench --datasets mtbench,humaneval --num-prompts 20 --max-new-tokens 64 \\
        --configs target,serial:chain,serial:tree16 --peers hf --out benchmarks/2026-11-29-cpu

Writes bench.json (schema: ``swiftspec bench --print-schema``), bench.md, requests.jsonl and
PNG plots into --out. Exit status: 0 on success; 1 if a speculative configuration's greedy
output differs from target-only decoding (the correctness promise is broken; the result is
still written); 2 for bad input (one line naming the bad value); 130 if interrupted (partial
results are written).

    swiftspec bench --temperature 0.7 --top-p 0.95 --seed 1 --configs target,serial:tree16

measures sampled decoding instead (the request of prompt index i with seed 1 + i). Outputs are
then not compared per request (speculative sampling is lossless in distribution, not per seed),
so exit status 1 does not occur.

    swiftspec bench --prompts my_prompts.jsonl --configs target,serial:tree16

measures the user's own prompts instead: one request per line, an OpenAI chat record
{"messages": [...]}, {"prompt": "..."} or a ShareGPT record {"conversations": [...]} (its first
human turn), all of the file's records unless --num-prompts says fewer
(swiftspec.bench.prompt_file; a malformed line is named with its field, exit 2).

    swiftspec bench --context-tokens 512,4096,16384,32768 --max-new-tokens 4096 --num-prompts 5 \\
        --configs target,serial:tree16,async:tree16

measures long-context workloads instead of the prompt sets: for each N, prompts of exactly N tokens
of real code (swiftspec.bench.long_context), reporting TTFT, prefill tokens/s and decode tokens/s per
N (add --datasets to measure the prompt sets as well).

    swiftspec bench --merge benchmarks/x/bench,benchmarks/x/peers-humaneval,benchmarks/x/peers-mtbench \
        --out benchmarks/x/merged

combines finished runs of one machine (same prompts, token budget, models, dtype, decoding, warm-up,
threads, HF peer settings) into one
result as if they were one run: speedups, output checks and aggregates across the parts
(:func:`swiftspec.bench.api.merge_bench`). It takes no run options (exit 2 if given); exit
status 1 and 2 as above.
"""

from __future__ import annotations

import argparse
import json
import sys

from swiftspec.bench.config import BenchConfigError

_DEFAULT_CONFIGS = "target,serial:chain,serial:tree16,auto:tree16"
#: Options that set up a measuring run; --merge takes none of them (the parts' settings count).
_RUN_ONLY = (
    "datasets",
    "num_prompts",
    "max_new_tokens",
    "configs",
    "peers",
    "backend",
    "target",
    "draft",
    "dtype",
    "threads",
    "hf_threads",
    "warmup",
    "max_context",
    "skip_unavailable",
    "resume",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "context_tokens",
    "prompts",
)
#: --datasets without --context-tokens or --prompts.
_DEFAULT_DATASETS = "mtbench,humaneval"
#: The sampling options' flags, as messages name them.
_SAMPLING_FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "seed": "--seed"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark decode configurations on MT-Bench / HumanEval prompts and long contexts",
        description="Run prompt sets through decode configurations (target-only, serial and async "
        "speculation, tree budgets, backends) and peers; report TTFT, TPOT, tokens/s, acceptance length, "
        "speedups and output checks as JSON, Markdown and PNG plots.",
        epilog="Configuration grammar: MODE[:chain[N]|:tree[N]][:bN][:dN][:tpN][:dtpN][:smN][:dgN][:dmma][:dmk][:hp]"
        "[@cpu|@cuda], MODE = target (options: tpN, mk)|serial|async, or hf:target|hf:assisted "
        "(--peers hf adds both) or llamacpp:target|llamacpp:assisted (--peers llamacpp adds both). cuda only: smN (draft on N SMs of one GPU), dgN (draft on GPU N), dmma (draft "
        "GEMMs on mma.sync), dmk (the draft's single-token steps as the decode megakernel), mk (target-only "
        "decoding with the decode megakernel; its outputs are checked against plain target), hp (target "
        "stream priority). Examples: target, serial:chain, serial:chain6, serial:tree16, serial:tree32:b4:d6, "
        "async:tree64@cuda, target:tp2, async:tree16:tp2:dg1@cuda, target:mk@cuda, async:tree16:dmk@cuda. "
        "Full grammar: python/swiftspec/bench/config.py.",
    )
    # Values are taken as strings and checked in run(), so a bad value gives one line and exit 2.
    p.add_argument(
        "--datasets",
        default=None,
        help=f"comma-separated: mtbench, humaneval (default {_DEFAULT_DATASETS}; "
        "none with --context-tokens or --prompts)",
    )
    p.add_argument(
        "--prompts",
        default=None,
        metavar="FILE.jsonl",
        help='your own prompts, one request per line: {"messages": [...]} (OpenAI chat), {"prompt": '
        '"..."} or {"conversations": [...]} (ShareGPT, first human turn); measured as data set '
        "file:<name>, all its records unless --num-prompts says fewer",
    )
    p.add_argument(
        "--context-tokens",
        default=None,
        metavar="N,N,...",
        help="long-context workloads: for each N, --num-prompts prompts of exactly N tokens (HumanEval "
        "problems as the files of a project, then a request for a long review), reported per N as "
        "data set ctxN (TTFT, prefill and decode tokens/s); the KV capacity is raised to hold the "
        "longest prompt plus --max-new-tokens unless --max-context is given",
    )
    p.add_argument(
        "--num-prompts",
        default=None,
        help="first N prompts of each data set (default 20; with --prompts alone, all of the file's records)",
    )
    p.add_argument("--max-new-tokens", default="64", help="new tokens per request (default 64)")
    p.add_argument(
        "--configs", default=_DEFAULT_CONFIGS, help=f"comma-separated configurations (default {_DEFAULT_CONFIGS})"
    )
    p.add_argument(
        "--peers",
        default="none",
        help="comma-separated: hf adds HF transformers target-only and "
        "assisted generation; llamacpp adds llama.cpp target-only (llama-completion) and speculative "
        "(llama-speculative-simple with the draft) generation on the GGUF files' quantized weights, "
        "greedy only (llama.cpp is built once on first use, minutes; a local llama-cpp-python 0.3.36 sdist "
        "in $SWIFTSPEC_LLAMACPP_SDIST when there is no network); none (default)",
    )
    p.add_argument("--backend", default="cpu", help="cpu (default) or cuda, for configurations without @backend")
    p.add_argument("--target", help="target model (default: the reference 1.5B)")
    p.add_argument("--draft", help="draft model (default: the reference 0.5B with the default target)")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        help="bfloat16 (default), float32 or int4 (W4A16, group size 32 from a GGUF, 128 from an HF folder: swiftspec on the cpu backend "
        "only; no HF peers, which cannot load int4 checkpoints). GGUF files and reference models are "
        "converted to it; a checkpoint folder as --target must hold it",
    )
    p.add_argument("--threads", default="0", help="CPU threads per swiftspec model (0: all cores)")
    p.add_argument("--hf-threads", default="0", help="torch threads of the HF peer (0: torch default)")
    p.add_argument("--warmup", default="1", help="untimed warm-up requests per configuration (default 1)")
    p.add_argument(
        "--max-context",
        default=None,
        help="KV capacity in tokens (default: the model's default, its max_position_embeddings capped to "
        "what the free memory holds, or what the longest prompt plus --max-new-tokens needs when "
        "that is more)",
    )
    p.add_argument(
        "--temperature",
        default=None,
        help="sampling temperature (default 0: greedy decoding, outputs checked token for token "
        "against target-only decoding); > 0: every configuration samples, outputs are not "
        "compared per request",
    )
    p.add_argument(
        "--top-p",
        default=None,
        help="nucleus sampling: keep the smallest set of tokens reaching this "
        "probability, in (0, 1] (default 1: off); needs --temperature > 0",
    )
    p.add_argument(
        "--top-k", default=None, help="keep the K most likely tokens (default 0: off); needs --temperature > 0"
    )
    p.add_argument(
        "--seed",
        default=None,
        help="sampling seed (default 0): the request of prompt index i samples "
        "with seed S + i, so runs are reproducible; needs --temperature > 0",
    )
    p.add_argument("--out", help="output folder (default: bench-results/<UTC time>)")
    p.add_argument(
        "--skip-unavailable",
        action="store_true",
        help="record configurations the runtime rejects (e.g. async in a build without it) "
        "as unavailable instead of stopping",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run in --out (same settings): keep its measured requests",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--print-schema", action="store_true", help="print the result JSON schema and exit")
    p.add_argument(
        "--merge",
        metavar="DIR,DIR,...",
        help="combine the results of finished runs (their --out folders; same prompts, token budget, "
        "models, dtype, decoding, warm-up, threads and HF peer settings, one machine) into one result in --out, as if they were one run; "
        "takes no run options",
    )
    p.set_defaults(run=run, _run_defaults={d: p.get_default(d) for d in _RUN_ONLY})


def _int(name: str, text: str, low: int) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise BenchConfigError(f"{name} must be an integer, got {text!r}") from None
    if value < low:
        raise BenchConfigError(f"{name} must be >= {low}, got {value}")
    return value


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise BenchConfigError(f"{name} must be a number, got {text!r}") from None


def _sampling(args: argparse.Namespace, num_prompts: int) -> dict:
    """run_bench's temperature, top_p, top_k and seed from the command line (checked: one line
    naming the flag and the value; top-p / top-k / seed given with temperature 0 is an error)."""
    from swiftspec.bench.config import SAMPLING_DEFAULTS, check_sampling

    values = dict(SAMPLING_DEFAULTS)
    for key, flag in _SAMPLING_FLAGS.items():
        text = getattr(args, key)
        if text is None:
            continue
        if key in ("top_k", "seed"):
            try:
                values[key] = int(text)
            except (TypeError, ValueError):
                raise BenchConfigError(f"{flag} must be an integer, got {text!r}") from None
        else:
            values[key] = _number(flag, text)
    given = [k for k in _SAMPLING_FLAGS if getattr(args, k) is not None]
    check_sampling(**values, num_prompts=num_prompts, names=_SAMPLING_FLAGS, given=given)
    return values


def run(args: argparse.Namespace) -> int:
    if args.print_schema:
        from swiftspec.bench.schema import schema

        print(json.dumps(schema(), indent=1))
        return 0
    from pathlib import Path

    from swiftspec.bench import machine
    from swiftspec.bench.api import run_bench
    from swiftspec.bench.config import check_dtype, parse_config_list

    if args.merge is not None:
        return _merge(args)
    from swiftspec.bench.long_context import parse_context_tokens

    contexts = None if args.context_tokens is None else parse_context_tokens(args.context_tokens, "--context-tokens")
    prompt_file = None
    if args.prompts is not None:
        from swiftspec.bench.prompt_file import read_prompt_file

        prompt_file = read_prompt_file(args.prompts)
    text = args.datasets if args.datasets is not None else "" if contexts or prompt_file else _DEFAULT_DATASETS
    datasets = [d.strip() for d in text.split(",")] if text else []
    for d in datasets:
        if d not in ("mtbench", "humaneval"):
            raise BenchConfigError(f"--datasets: unknown data set {d!r} (expected mtbench, humaneval)")
    if len(set(datasets)) != len(datasets):
        raise BenchConfigError(f"--datasets {args.datasets!r} names a data set twice")
    if not datasets and not contexts and prompt_file is None:
        raise BenchConfigError("--datasets is empty: give mtbench and/or humaneval, --prompts or --context-tokens")
    if args.num_prompts is None and prompt_file is not None and not datasets and not contexts:
        num_prompts = len(prompt_file.records)
    else:
        num_prompts = _int("--num-prompts", "20" if args.num_prompts is None else args.num_prompts, 1)
    max_new = _int("--max-new-tokens", args.max_new_tokens, 1)
    threads = _int("--threads", args.threads, 0)
    hf_threads = _int("--hf-threads", args.hf_threads, 0)
    warmup = _int("--warmup", args.warmup, 0)
    max_context = None if args.max_context is None else _int("--max-context", args.max_context, 2)
    sampling = _sampling(args, num_prompts)
    if args.backend not in ("cpu", "cuda"):
        raise BenchConfigError(f"--backend must be cpu or cuda, got {args.backend!r}")
    # fail fast, before loading anything
    check_dtype(args.dtype, parse_config_list(args.configs, args.backend, args.peers), flag="--dtype")
    if args.resume and not args.out:
        raise BenchConfigError("--resume needs --out (the folder of the run to continue)")
    out = Path(args.out) if args.out else Path("bench-results") / machine.now_utc().replace(":", "")
    print(f"[bench] writing into {out}", file=sys.stderr)
    try:
        doc = run_bench(
            datasets=datasets,
            num_prompts=num_prompts,
            max_new_tokens=max_new,
            configs=args.configs,
            peers=args.peers,
            backend=args.backend,
            target=args.target,
            draft=args.draft,
            dtype=args.dtype,
            threads=threads,
            hf_threads=hf_threads,
            warmup=warmup,
            max_context=max_context,
            out_dir=out,
            progress=not args.no_progress,
            skip_unavailable=args.skip_unavailable,
            plots=not args.no_plots,
            resume=args.resume,
            context_tokens=contexts,
            prompts=args.prompts,
            **sampling,
        )
    except KeyboardInterrupt:
        print(f"[bench] interrupted; partial results in {out}", file=sys.stderr)
        return 130
    print((out / "bench.md").read_text())
    return _exit_status(doc)


def _exit_status(doc: dict) -> int:
    """1 (with one line on stderr) if a speculative output differs from target-only decoding, else 0
    (always 0 under sampled decoding, where outputs are not compared per request)."""
    lossless = [d for d in doc["divergences"] if d["kind"] == "lossless"]
    if lossless:
        d = lossless[0]
        print(
            f"swiftspec bench: {len(lossless)} speculative output(s) differ from target-only decoding; first: "
            f"{d['dataset']} {d['prompt_id']} {d['config']} at token {d['position']} "
            f"({d['token']} vs {d['reference_token']})",
            file=sys.stderr,
        )
        return 1
    return 0


def _merge(args: argparse.Namespace) -> int:
    """``--merge DIR,DIR,... --out DIR``: see :func:`swiftspec.bench.api.merge_bench`."""
    from pathlib import Path

    from swiftspec.bench.api import merge_bench

    defaults = getattr(args, "_run_defaults", {})
    given = ["--" + d.replace("_", "-") for d in _RUN_ONLY if d in defaults and getattr(args, d) != defaults[d]]
    if given:
        raise BenchConfigError(
            f"--merge combines finished runs with their own settings; it takes no run options (got {', '.join(given)})"
        )
    folders = [f.strip() for f in args.merge.split(",")]
    if any(not f for f in folders):
        raise BenchConfigError(f"--merge {args.merge!r} has an empty entry (expected DIR,DIR,...)")
    if len(folders) < 2:
        raise BenchConfigError(f"--merge needs at least two folders (DIR,DIR,...), got {args.merge!r}")
    if not args.out:
        raise BenchConfigError("--merge needs --out (a new folder for the merged result)")
    out = Path(args.out)
    print(f"[bench] merging {len(folders)} runs into {out}", file=sys.stderr)
    doc = merge_bench(folders, out, plots=not args.no_plots)
    print((out / "bench.md").read_text())
    return _exit_status(doc)
