"""The whole benchmark pipeline: prompts -> engines -> rows -> document -> JSON, Markdown, plots."""

from __future__ import annotations

import time
from pathlib import Path

from swiftspec.bench import machine as mach
from swiftspec.bench.config import BenchConfigError, parse_config_list
from swiftspec.bench.report import build_document, markdown, write_json
from swiftspec.bench.runner import BenchSettings, Runner, load_prompts
from swiftspec.bench.schema import consistency_problems, validate


class BenchResultError(BenchConfigError):
    """The measured document failed its schema or consistency checks (a harness bug)."""


def run_bench(*, datasets: list[str], num_prompts: int, max_new_tokens: int, configs: str,
              peers: str | None = None, backend: str = "cpu", target: str | None = None,
              draft: str | None = None, dtype: str = "bfloat16", threads: int = 0, hf_threads: int = 0,
              warmup: int = 1, max_context: int | None = None, out_dir: str | Path | None = None,
              progress: bool = True, skip_unavailable: bool = False, plots: bool = True,
              command: str | None = None, log=None, resume: bool = False) -> dict:
    """Runs a benchmark and returns its result document (see :mod:`swiftspec.bench.schema`).

    Args:
        datasets: "mtbench" (first turns) and/or "humaneval".
        num_prompts: the first N prompts of each data set (>= 1).
        max_new_tokens: new tokens per request (>= 1; fewer if EOS comes first).
        configs: comma-separated configurations (:mod:`swiftspec.bench.config`).
        peers: "hf" to add ``hf:target`` and ``hf:assisted``; None/"none" for no peer.
        backend: backend of configurations without ``@backend``.
        target, draft: model names/paths; default the reference pair (draft only if needed).
        dtype: "bfloat16" or "float32" weights (swiftspec and HF alike).
        threads: CPU threads per swiftspec model; hf_threads: torch threads (0: all cores).
        warmup: untimed warm-up requests per configuration (the first also probes availability).
        max_context: KV capacity in tokens; None: each model's default (4096, or its
            max_position_embeddings when smaller). bench.json records the target's resolved value.
        out_dir: if given, writes bench.json, bench.md, requests.jsonl and the PNG plots there.
        skip_unavailable: record configurations the runtime rejects instead of failing.
        plots: make the PNG plots (needs matplotlib) when ``out_dir`` is given.
        command: the command line to record (default: this process's argv).
        resume: continue an interrupted run in ``out_dir`` (same settings): its measured
            requests are kept, the missing ones measured.

    Raises:
        BenchConfigError: bad arguments (named in the message).
        ConfigUnavailable: a configuration the runtime rejects, unless ``skip_unavailable``.
        BenchResultError: the document fails validation (never expected; a harness bug).
        SwiftspecError: model or data set loading failures.
    """
    from swiftspec.fetch import DEFAULT_PAIR

    t0 = time.perf_counter()
    created = mach.now_utc()
    for name, value, low in (("num_prompts", num_prompts, 1), ("max_new_tokens", max_new_tokens, 1),
                             ("threads", threads, 0), ("hf_threads", hf_threads, 0), ("warmup", warmup, 0),
                             ("max_context", max_context, 2)):
        if name == "max_context" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise BenchConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    if dtype not in ("bfloat16", "float32"):
        raise BenchConfigError(f"dtype must be bfloat16 or float32, got {dtype!r}")
    if not datasets:
        raise BenchConfigError("no data sets given")
    config_list = parse_config_list(configs, backend, peers)
    if target is None:
        target = DEFAULT_PAIR["target"]
        if draft is None:
            draft = DEFAULT_PAIR["draft"]
    settings = BenchSettings(datasets=list(datasets), num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                             backend=backend, dtype=dtype, threads=threads, hf_threads=hf_threads,
                             warmup=warmup, target=str(target), draft=str(draft) if draft else None,
                             max_context=max_context)
    items = load_prompts(settings.datasets, num_prompts, progress=progress)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None and out.exists() and not out.is_dir():
        raise BenchConfigError(f"--out {out} exists and is not a folder")
    if out is not None and not resume:
        earlier = [n for n in ("bench.json", "requests.jsonl") if (out / n).exists()]
        if earlier:  # never replace measured results silently
            raise BenchConfigError(f"--out {out} holds the results of an earlier run ({', '.join(earlier)}): pass "
                                   "--resume to continue it, or give another folder")
    machine = mach.machine_info()
    # The code this process runs is the checkout as it is now: a commit made while a long run goes
    # on must not be recorded as the measured one.
    commit = mach.commit_info()
    runner = Runner(settings, config_list, out, progress=progress, skip_unavailable=skip_unavailable, log=log)
    runner.load()
    if resume and out is None:
        raise BenchConfigError("resume needs an output folder (--out) to resume from")
    runner.run(items, resume=resume)
    machine["busy_processes_end"] = mach.busy_processes()
    settings_block = {
        "datasets": settings.datasets, "num_prompts": num_prompts, "max_new_tokens": max_new_tokens,
        "backend": backend, "dtype": dtype, "threads": threads, "warmup": warmup,
        "target": settings.target, "draft": settings.draft,
        "target_checkpoint": runner.target_checkpoint, "draft_checkpoint": runner.draft_checkpoint,
        "max_context": runner.resolved_max_context(),
        "hf": ({b: peer.settings() for b, peer in runner.hf.items()} if runner.hf else None),
        "prompt_format": "chat template of the target; MT-Bench first turns; HumanEval wrapped by "
                         "swiftspec.datasets.prompt_messages",
        "decoding": "greedy",
    }
    tok = runner.tokenizer
    doc = build_document(
        created=created, command=command if command is not None else mach.command_line(),
        commit=commit, machine=machine, settings=settings_block, configs=runner.configs_block(),
        rows=runner.rows, wall_time_s=time.perf_counter() - t0, load_average_end=mach.load_average(),
        interrupted=runner.interrupted, decode=(lambda ids: tok.decode(ids)) if tok is not None else None)
    try:
        validate(doc)
    except Exception as exc:  # jsonschema.ValidationError; keep the data for inspection
        if out is not None:
            write_json(doc, out / "bench.invalid.json")
        raise BenchResultError(f"the bench result does not match its schema: {exc}") from None
    problems = consistency_problems(doc)
    if problems:
        doc.setdefault("settings", {})["consistency_problems"] = problems
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(doc, out / "bench.json")
        (out / "bench.invalid.json").unlink(missing_ok=True)  # an earlier failed attempt's data
        made = []
        if plots:
            from swiftspec.bench.plots import make_plots

            made = make_plots(doc, out)
        (out / "bench.md").write_text(markdown(doc, [str(p) for p in made]))
    if problems:
        raise BenchResultError(f"the bench result is inconsistent ({len(problems)} problem(s)): {problems[0]}")
    if runner.interrupted:
        raise KeyboardInterrupt
    return doc
