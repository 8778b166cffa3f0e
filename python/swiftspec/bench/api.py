"""The whole benchmark pipeline: prompts -> engines -> rows -> document -> JSON, Markdown, plots."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from swiftspec.bench import machine as mach
from swiftspec.bench.config import (
    BenchConfigError,
    check_dtype,
    check_llamacpp_decoding,
    check_sampling,
    parse_config_list,
)
from swiftspec.bench.long_context import CONSTRUCTION, context_workloads, parse_context_tokens, workload_name
from swiftspec.bench.prompt_file import read_prompt_file
from swiftspec.bench.report import build_document, markdown, write_json
from swiftspec.bench.runner import BenchSettings, Runner, load_prompts
from swiftspec.bench.schema import MAX_MEASURED, consistency_problems, validate


class BenchResultError(BenchConfigError):
    """The measured document failed its schema or consistency checks (a harness bug)."""


def run_bench(
    *,
    datasets: list[str],
    num_prompts: int,
    max_new_tokens: int,
    configs: str,
    peers: str | None = None,
    backend: str = "cpu",
    target: str | None = None,
    draft: str | None = None,
    dtype: str = "bfloat16",
    threads: int = 0,
    hf_threads: int = 0,
    warmup: int = 1,
    max_context: int | None = None,
    out_dir: str | Path | None = None,
    progress: bool = True,
    skip_unavailable: bool = False,
    plots: bool = True,
    command: str | None = None,
    log=None,
    resume: bool = False,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    context_tokens=None,
    prompts: str | Path | None = None,
) -> dict:
    """Runs a benchmark and returns its result document (see :mod:`swiftspec.bench.schema`).

    Args:
        datasets: "mtbench" (first turns) and/or "humaneval" (may be empty with ``context_tokens``
            or ``prompts``).
        num_prompts: the first N prompts of each data set (>= 1), and of each long-context workload.
        prompts: the user's own prompts, a JSONL file (:mod:`swiftspec.bench.prompt_file`: OpenAI
            ``messages``, ``prompt`` or ShareGPT ``conversations`` records), measured as the data
            set ``file:<file name>`` after ``datasets``; its first ``num_prompts`` records.
        context_tokens: prompt lengths N (ints >= 1, or "512,4096") of long-context workloads, each
            measured as a data set ``ctxN`` after ``datasets``, in ascending N
            (:mod:`swiftspec.bench.long_context`); None: none.
        max_new_tokens: new tokens per request (>= 1; fewer if EOS comes first).
        configs: comma-separated configurations (:mod:`swiftspec.bench.config`).
        peers: comma-separated: "hf" adds ``hf:target`` and ``hf:assisted``, "llamacpp" adds
            ``llamacpp:target`` and ``llamacpp:assisted`` (greedy decoding only; llama.cpp is built
            on first use, :mod:`swiftspec.bench.llamacpp_build`); None/"none" for no peer.
        backend: backend of configurations without ``@backend``.
        target, draft: model names/paths; default the reference pair (draft only if needed).
        dtype: "bfloat16", "float32" (swiftspec and HF alike) or "int4" (W4A16, group size 32 from a GGUF;
            on cuda without the megakernel and with tp 1, no HF peers: :func:`swiftspec.bench.config.check_dtype`).
            GGUF files and reference names are converted to it; a checkpoint folder given as the
            target must already hold it (recorded as ``settings.dtype``).
        threads: CPU threads per swiftspec model; hf_threads: torch threads (0: all cores).
        warmup: untimed warm-up requests per configuration (the first also probes availability).
        max_context: KV capacity in tokens; None: each model's default (its trained context,
            max_position_embeddings, bounded by the memory free: ``swiftspec_core.plan_contexts``). bench.json records the target's resolved value.
        out_dir: if given, writes bench.json, bench.md, requests.jsonl and the PNG plots there.
        skip_unavailable: record configurations the runtime rejects instead of failing.
        plots: make the PNG plots (needs matplotlib) when ``out_dir`` is given.
        command: the command line to record (default: this process's argv).
        resume: continue an interrupted run in ``out_dir`` (same settings): its measured
            requests are kept, the missing ones measured.
        temperature, top_p, top_k, seed: decoding. temperature 0 (default): greedy, and the
            output checks compare speculative outputs with target-only ones token for token.
            temperature > 0: every configuration samples (top_p 1 / top_k 0: no nucleus / top-k
            filter), the request of prompt index i with seed ``seed + i``, so runs are
            reproducible; swiftspec's speculative modes run lossless speculative sampling, the HF
            peers ``do_sample=True``. Outputs are then not compared per request
            (:data:`swiftspec.bench.report.SAMPLED_NOT_CHECKED`). top_p, top_k or seed other
            than their defaults under temperature 0 is an error (they would have no effect).

    Raises:
        BenchConfigError: bad arguments (named in the message; :func:`swiftspec.bench.config.check_sampling`,
            :func:`swiftspec.bench.config.check_dtype`, :func:`swiftspec.bench.long_context.parse_context_tokens`),
            raised before any model or data set is loaded (a malformed prompt file: its line and
            field, :func:`swiftspec.bench.prompt_file.read_prompt_file`); before the engines load: a target checkpoint
            folder of another dtype than ``dtype``, a long-context N not above its prompt's frame, a
            prompt plus ``max_new_tokens`` longer than ``max_context`` or than the models take
            (:meth:`swiftspec.bench.runner.Runner.context_needed`, naming both lengths).
        ConfigUnavailable: a configuration the runtime rejects, unless ``skip_unavailable``.
        BenchResultError: the document fails validation (never expected; a harness bug).
        SwiftspecError: model or data set loading failures.
    """
    from swiftspec.fetch import DEFAULT_PAIR

    t0 = time.perf_counter()
    created = mach.now_utc()
    for name, value, low in (
        ("num_prompts", num_prompts, 1),
        ("max_new_tokens", max_new_tokens, 1),
        ("threads", threads, 0),
        ("hf_threads", hf_threads, 0),
        ("warmup", warmup, 0),
        ("max_context", max_context, 2),
    ):
        if name == "max_context" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise BenchConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    sampling = check_sampling(temperature, top_p, top_k, seed, num_prompts=num_prompts)
    contexts = [] if context_tokens is None else parse_context_tokens(context_tokens, "context_tokens")
    prompt_file = read_prompt_file(prompts) if prompts is not None else None
    if prompt_file is not None and num_prompts > len(prompt_file.records):
        raise BenchConfigError(
            f"--num-prompts {num_prompts} exceeds the {len(prompt_file.records)} records of {prompts}"
        )
    if not datasets and not contexts and prompt_file is None:
        raise BenchConfigError("no data sets given (datasets, prompts, or context_tokens for long-context workloads)")
    config_list = parse_config_list(configs, backend, peers)
    check_dtype(dtype, config_list)
    check_llamacpp_decoding(sampling, config_list)
    if target is None:
        target = DEFAULT_PAIR["target"]
        if draft is None:
            draft = DEFAULT_PAIR["draft"]
    file_sets = [prompt_file.name] if prompt_file is not None else []
    settings = BenchSettings(
        datasets=list(datasets) + file_sets + [workload_name(n) for n in contexts],
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        backend=backend,
        dtype=dtype,
        threads=threads,
        hf_threads=hf_threads,
        warmup=warmup,
        target=str(target),
        draft=str(draft) if draft else None,
        max_context=max_context,
        sampling=sampling,
        prompt_file_sha256=prompt_file.sha256 if prompt_file is not None else None,
    )
    items = load_prompts(settings.datasets, num_prompts, progress=progress, prompt_file=prompt_file)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        _check_out(out, None if resume else "pass --resume to continue it, or give another folder")
    machine = mach.machine_info()
    # The code this process runs is the checkout as it is now: a commit made while a long run goes
    # on must not be recorded as the measured one.
    commit = mach.commit_info()
    runner = Runner(settings, config_list, out, progress=progress, skip_unavailable=skip_unavailable, log=log)
    runner.load(items)
    if resume and out is None:
        raise BenchConfigError("resume needs an output folder (--out) to resume from")
    runner.run(items, resume=resume)
    machine["busy_processes_end"] = mach.busy_processes()
    settings_block = {
        "datasets": settings.datasets,
        "num_prompts": num_prompts,
        "max_new_tokens": max_new_tokens,
        "backend": backend,
        "dtype": dtype,
        "threads": threads,
        "warmup": warmup,
        "target": settings.target,
        "draft": settings.draft,
        "target_checkpoint": runner.target_checkpoint,
        "draft_checkpoint": runner.draft_checkpoint,
        "max_context": runner.resolved_max_context(),
        "hf": ({b: peer.settings() for b, peer in runner.hf.items()} if runner.hf else None),
        "llamacpp": ({b: peer.settings() for b, peer in runner.llamacpp.items()} if runner.llamacpp else None),
        "prompt_format": "chat template of the target; MT-Bench first turns; HumanEval wrapped by "
        "swiftspec.datasets.prompt_messages"
        + (f"; {CONSTRUCTION}" if contexts else "")
        + ("; the prompt file's records as swiftspec.bench.prompt_file reads them" if prompt_file else ""),
        "prompt_file": prompt_file.block() if prompt_file is not None else None,
        "context_tokens": context_workloads(settings.datasets),
        "decoding": "sampled" if sampling else "greedy",
        "sampling": sampling,
    }
    tok = runner.tokenizer
    doc = build_document(
        created=created,
        command=command if command is not None else mach.command_line(),
        commit=commit,
        machine=machine,
        settings=settings_block,
        configs=runner.configs_block(),
        rows=runner.rows,
        wall_time_s=time.perf_counter() - t0,
        load_average_end=mach.load_average(),
        interrupted=runner.interrupted,
        decode=(lambda ids: tok.decode(ids)) if tok is not None else None,
    )
    _check_and_write(doc, out, plots)
    if runner.interrupted:
        raise KeyboardInterrupt
    return doc


def _is_empty_file(path: Path) -> bool:
    return path.is_file() and path.stat().st_size == 0


def _check_out(out: Path, advice: str | None, create: bool = True) -> None:
    """Raises :class:`BenchConfigError` if ``out`` is a file, cannot be made (``create``: it is made
    here, before any model loads), holds a bench.json / requests.jsonl / run_identity.json / bench.md
    that is not a file, or (``advice`` given: not a resumed run) holds the results of an earlier run
    (an empty requests.jsonl holds none), whose message then ends with ``advice``: measured results
    are never replaced silently."""
    if out.exists() and not out.is_dir():
        raise BenchConfigError(f"--out {out} exists and is not a folder")
    try:  # now, not after the models have loaded (it was a FileNotFoundError / NotADirectoryError traceback then)
        if create:
            out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchConfigError(f"--out {out}: cannot create the folder ({exc.strerror or exc})") from None
    for name in ("bench.json", "requests.jsonl", "run_identity.json", "bench.md"):
        if (out / name).exists() and not (out / name).is_file():  # was a traceback once the models had loaded
            raise BenchConfigError(f"--out {out}: {out / name} exists and is not a file")
    if advice is not None:
        # An empty requests.jsonl (a run that stopped before measuring: a configuration the runtime
        # rejected) holds no results; it made the folder unusable except with --resume of the same settings.
        earlier = [
            n
            for n in ("bench.json", "requests.jsonl")
            if (out / n).exists() and not (n == "requests.jsonl" and _is_empty_file(out / n))
        ]
        if earlier:
            raise BenchConfigError(f"--out {out} holds the results of an earlier run ({', '.join(earlier)}): " + advice)


def _check_and_write(doc: dict, out: Path | None, plots: bool) -> None:
    """Validates ``doc`` (schema, then numbers) and writes bench.json, bench.md and the plots
    into ``out`` (if given). Raises :class:`BenchResultError` if the schema fails (the data go to
    bench.invalid.json) or, after writing (the problems recorded in ``settings``), if the numbers
    disagree."""
    try:
        validate(doc)
    except Exception as exc:  # jsonschema.ValidationError; keep the data for inspection
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
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


#: Settings the parts of a merge must share for their rows to be comparable (None: not recorded
#: there, e.g. ``max_context`` of a run without a swiftspec engine, ``draft`` of a run without one).
#: ``backend`` is among them because configuration names without ``@backend`` mean the run's backend.
#: ``decoding`` ("greedy" where a document predates the field) and each ``sampling.*`` field (None
#: under greedy decoding): a sampled part's rows are not comparable with a greedy part's, nor with
#: those of another temperature, top-p, top-k or seed. ``warmup``: with fewer warm-up requests (0)
#: a configuration's first measured request runs cold (first-touch page faults, caches, CUDA's lazy
#: module loading), so its rows measure something else. Two more must agree, among the parts they
#: apply to (:func:`merge_documents`): ``threads`` (swiftspec's CPU threads per model) among the
#: parts that measured a swiftspec configuration, and every field of ``hf.<backend>`` (torch
#: threads, library versions, device, sampling...) among the parts that measured an HF peer on
#: that backend: both change the measured times. Nothing else a part's settings hold may differ
#: (the data sets, the checkpoints' paths as recorded, prompt_format's text).
MERGE_AGREE = (
    "num_prompts",
    "max_new_tokens",
    "dtype",
    "backend",
    "target",
    "draft",
    "max_context",
    "decoding",
    "sampling.temperature",
    "sampling.top_p",
    "sampling.top_k",
    "sampling.seed",
    "warmup",
    "prompt_file.sha256",
)
_OPTIONAL_AGREE = ("draft", "max_context")


def _recorded(settings: dict, key: str):
    """A merge-relevant setting of a part: ``decoding`` defaults to "greedy" (documents older than
    sampled decoding); ``sampling.X`` is X of the sampling block (None when there is none)."""
    if key == "decoding":
        return settings.get("decoding") or "greedy"
    if "." in key:  # sampling.X, prompt_file.X: a field of that block (None without the block)
        block, field = key.split(".", 1)
        return (settings.get(block) or {}).get(field)
    return settings.get(key)


class _NonFinite(str):
    """NaN, Infinity or -Infinity in a part's bench.json (Python's json reads them; they are not
    JSON, and a run never writes them)."""


#: Nesting depth a part's bench.json may have (a run's documents nest 5 levels): deeper values
#: (an edited file) would overflow the recursion of copying and writing the merged document.
_MAX_DEPTH = 32


def _unreadable_value(doc) -> str | None:
    """What ``doc`` holds that a bench result cannot, e.g. "NaN at requests/0/ttft_s; a bench
    result holds finite numbers only" (a :class:`_NonFinite`) or "values nested more than 32
    levels deep under settings/hf"; None if nothing."""
    stack: list[tuple[Any, tuple[str, ...], int]] = [(doc, (), 0)]  # (value, path, depth)
    while stack:
        obj, where, depth = stack.pop()
        if isinstance(obj, _NonFinite):
            return f"{obj} at {'/'.join(where) or 'the top level'}; a bench result holds finite numbers only"
        if isinstance(obj, (dict, list)) and depth >= _MAX_DEPTH:
            return f"values nested more than {_MAX_DEPTH} levels deep under {'/'.join(where[:2])}"
        items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        stack.extend((v, where + (str(k),), depth + 1) for k, v in reversed(list(items)))
    return None


def read_part(folder: str | Path) -> dict:
    """The complete result document of one finished bench run in ``folder`` (its bench.json).

    Raises:
        BenchConfigError: (one line naming the folder) ``folder`` is not a folder, has no
            bench.json, bench.json is not JSON (NaN / Infinity included), not a bench result of
            this schema version, does not match the schema (naming the field: e.g. a row's time
            beyond :data:`~swiftspec.bench.schema.MAX_MEASURED`, whose statistics would overflow),
            or records an interrupted run (partial results: finish it with ``--resume`` first).
    """
    import json

    import jsonschema

    from swiftspec.bench.schema import SCHEMA_VERSION

    folder = Path(folder)
    path = folder / "bench.json"
    if not folder.is_dir():
        raise BenchConfigError(f"--merge: {folder} is not a folder")
    if not path.is_file():
        why = (
            "its bench.invalid.json failed the schema"
            if (folder / "bench.invalid.json").exists()
            else "a run writes it when it ends"
        )
        raise BenchConfigError(
            f"--merge: {folder} has no bench.json ({why}); is it the --out folder of a finished swiftspec bench run?"
        )
    try:
        doc = json.loads(path.read_text(), parse_constant=_NonFinite)
        where = _unreadable_value(doc)
    except json.JSONDecodeError as exc:
        raise BenchConfigError(f"--merge: {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise BenchConfigError(f"--merge: {path} is not a bench result (nested too deeply to read)") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise BenchConfigError(f"--merge: cannot read {path}: {exc}") from None
    if where is not None:
        raise BenchConfigError(f"--merge: {path} has {where} (an edited file?)")
    if not isinstance(doc, dict) or doc.get("kind") != "swiftspec-bench":
        raise BenchConfigError(f"--merge: {path} is not a swiftspec bench result (no kind 'swiftspec-bench')")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise BenchConfigError(
            f"--merge: {path} has schema_version {doc.get('schema_version')!r}, this swiftspec reads {SCHEMA_VERSION}"
        )
    if doc.get("interrupted"):
        raise BenchConfigError(
            f"--merge: {folder} holds an interrupted run (partial results); finish it first "
            "(its command again, plus --resume)"
        )
    try:
        validate(doc)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise BenchConfigError(
            f"--merge: {path} does not match the bench schema at {where}: {exc.message[:200]}"
        ) from None
    return doc


def _part_entries(folder: Path, doc: dict) -> list[dict]:
    """The ``merge.parts`` entries of one part: itself, or the parts it was merged from."""
    if doc.get("merge"):
        return [dict(p) for p in doc["merge"]["parts"]]
    return [
        {
            "folder": str(folder),
            "command": doc["command"],
            "created": doc["created"],
            "commit": doc["commit"],
            "wall_time_s": doc["wall_time_s"],
            "datasets": list(doc["settings"]["datasets"]),
            "configs": [c["name"] for c in doc["configs"] if c["status"] == "ok"],
            "hostname": doc["machine"]["hostname"],
            "settings": {k: v for k, v in doc["settings"].items() if k != "consistency_problems"},
        }
    ]


def _parse_time(text: str):
    import datetime as dt

    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except (TypeError, ValueError):
        return None


def _machine_identity(machine: dict) -> tuple:
    return (machine["cpu"].get("model"), [(g.get("name"), g.get("memory_mib")) for g in machine["gpus"]])


def _default_decode(settings: dict):
    """Token text for divergence records: the target's tokenizer when its checkpoint is on this
    machine, else None (token ids)."""
    path = settings.get("target_checkpoint")
    if not path or not Path(path).is_dir():
        return None
    try:
        from swiftspec.tokenizer import Tokenizer

        tok = Tokenizer.from_checkpoint(path)
    except Exception:  # noqa: BLE001 -- text is cosmetic; ids are shown instead
        return None
    return lambda ids: tok.decode(ids)


def merge_documents(
    parts: list[tuple[str | Path, dict]], *, command: str, created: str | None = None, decode=None
) -> dict:
    """One result document from the documents of several bench runs, as if they were one run.

    ``parts``: ``(folder, document)`` pairs, documents as :func:`read_part` returns them. Rows
    keep their measurements; speedups, output checks (:func:`swiftspec.bench.report.compare_outputs`)
    and aggregates are recomputed over the union, with each configuration's baseline and reference
    chosen among the union of the parts' configurations (:func:`swiftspec.bench.runner.configs_block`).
    Data sets and configurations appear in the order the parts first name them; rows are ordered
    as a run orders them (data set, prompt, configuration). The document's machine and commit
    are the first part's, ``created`` the earliest part's start, ``wall_time_s`` the span from
    the first start to the last end; ``merge`` records each part (a part that is itself a merge
    contributes its parts).

    Raises:
        BenchConfigError: (naming the field or row and the two folders) fewer than two parts;
            the parts disagree on a setting of :data:`MERGE_AGREE` (or on ``threads`` among those
            that measured swiftspec, on a field of ``hf.<backend>`` among those that measured the
            HF peers there) or run on different machines
            (CPU model, GPU list); a configuration is recorded differently by two parts or its
            name no longer parses to the recorded configuration; one (data set, prompt,
            configuration) is measured in two parts; one prompt has another id or token count
            in two parts; a part has a row of a data set or configuration it does not list; a
            part's run would end after the year 9999 (created + wall_time_s), or, where a created
            is not a run's timestamp, records a wall_time_s beyond
            :data:`~swiftspec.bench.schema.MAX_MEASURED` (the sum would overflow).
    """
    import copy

    from swiftspec.bench import machine as mach
    from swiftspec.bench.config import parse_config
    from swiftspec.bench.runner import configs_block

    if len(parts) < 2:
        raise BenchConfigError(f"--merge needs at least two folders, got {len(parts)}")
    folders = [str(f) for f, _ in parts]
    docs = [d for _, d in parts]
    first = docs[0]["settings"]
    agreed: dict = {}
    for key in MERGE_AGREE:
        owner = None
        for folder, doc in zip(folders, docs):
            value = _recorded(doc["settings"], key)
            if value is None and key in _OPTIONAL_AGREE:
                continue
            if owner is None:
                owner, agreed[key] = folder, value
            elif value != agreed[key]:
                raise BenchConfigError(
                    f"--merge: the parts disagree on {key}: {agreed[key]!r} in {owner}, "
                    f"{value!r} in {folder}; merge only runs with the same {key}"
                )
        if owner is None:
            agreed[key] = _recorded(first, key)

    def ran(doc: dict, engine: str, backend: str | None = None) -> bool:
        return any(
            c["engine"] == engine and c["status"] == "ok" and backend in (None, c["backend"]) for c in doc["configs"]
        )

    # threads and the peers' settings: only where they ran (a peers-only part records the default
    # threads, which ran nothing; a part without a peer has no block of it)
    def peer_block(doc: dict, peer: str, backend: str) -> dict | None:
        """The part's <peer>.<backend> block (peer "hf" or "llamacpp") where it measured that peer
        there, else None."""
        block = (doc["settings"].get(peer) or {}).get(backend)
        return (block if isinstance(block, dict) else {"(block)": block}) if ran(doc, peer, backend) else None

    def measured_peer(peer: str, backend: str) -> Callable[[dict], bool]:
        return lambda doc: peer_block(doc, peer, backend) is not None

    def peer_field(peer: str, backend: str, field: str) -> Callable[[dict], Any]:
        return lambda doc: (peer_block(doc, peer, backend) or {}).get(field)  # (where measured_peer)

    # (setting, applies(doc): whether the part's value counts, value_of(doc))
    scoped: list[tuple[str, Callable[[dict], bool], Callable[[dict], Any]]] = [
        ("threads", lambda doc: ran(doc, "swiftspec"), lambda doc: doc["settings"]["threads"])
    ]
    for peer in ("hf", "llamacpp"):
        for backend in sorted({b for doc in docs for b in (doc["settings"].get(peer) or {})}):
            fields = {f for doc in docs for f in (peer_block(doc, peer, backend) or {})} - _PER_PART.get(peer, set())
            for field in sorted(fields):
                scoped.append(
                    (f"{peer}.{backend}.{field}", measured_peer(peer, backend), peer_field(peer, backend, field))
                )
    for key, applies, value_of in scoped:
        owner = None
        for folder, doc in zip(folders, docs):
            if not applies(doc):
                continue
            value = value_of(doc)
            if owner is None:
                owner, want = folder, value
            elif value != want:
                raise BenchConfigError(
                    f"--merge: the parts disagree on {key}: {want!r} in {owner}, {value!r} in "
                    f"{folder}; merge only runs with the same {key}"
                )
    ident0 = _machine_identity(docs[0]["machine"])
    for folder, doc in zip(folders[1:], docs[1:]):
        ident = _machine_identity(doc["machine"])
        for what, a, b in (("CPU model", ident0[0], ident[0]), ("GPUs", ident0[1], ident[1])):
            if a != b:
                raise BenchConfigError(
                    f"--merge: the parts ran on different machines: {what} {a!r} in "
                    f"{folders[0]}, {b!r} in {folder}; merge only runs of one machine"
                )

    backend = agreed["backend"]
    datasets: list[str] = []
    blocks: dict[str, tuple[str, dict]] = {}  # name -> (folder, block)
    status: dict[str, tuple[str, str | None]] = {}
    _derived = ("baseline", "reference", "status", "error")
    for folder, doc in zip(folders, docs):
        for ds in doc["settings"]["datasets"]:
            if ds not in datasets:
                datasets.append(ds)
        for block in doc["configs"]:
            name = block["name"]
            shape = {k: v for k, v in block.items() if k not in _derived}
            if name in blocks:
                other_folder, other = blocks[name]
                for k in sorted(set(shape) | set(other)):
                    if shape.get(k) != other.get(k):
                        raise BenchConfigError(
                            f"--merge: configuration {name} has {k}={other.get(k)!r} in "
                            f"{other_folder}, {shape.get(k)!r} in {folder}"
                        )
            else:
                blocks[name] = (folder, shape)
            if block["status"] == "ok":
                status[name] = ("ok", None)
            elif name not in status:
                status[name] = ("unavailable", block["error"])
    configs = []
    for name, (folder, shape) in blocks.items():
        parsed = parse_config(name, backend)
        wrong = {k: (v, shape[k]) for k, v in parsed.to_dict().items() if k in shape and shape[k] != v}
        if parsed.name != name or wrong:
            k, (v, recorded) = next(iter(wrong.items())) if wrong else ("name", (parsed.name, name))
            raise BenchConfigError(
                f"--merge: configuration {name} in {folder} records {k}={recorded!r}, but "
                f"the name parses to {k}={v!r} now (a run of another swiftspec version?)"
            )
        configs.append(parsed)

    rows: list[dict] = []
    seen: dict[tuple, str] = {}
    prompts: dict[tuple, tuple] = {}
    for folder, doc in zip(folders, docs):
        listed = {c["name"] for c in doc["configs"]}
        for r in doc["requests"]:
            rkey = (r["dataset"], r["prompt_index"], r["config"])
            if rkey[0] not in doc["settings"]["datasets"] or rkey[2] not in listed:
                raise BenchConfigError(
                    f"--merge: {folder} has a row {rkey[0]}[{rkey[1]}] {rkey[2]} of a data set or "
                    "configuration its bench.json does not list (an edited file?)"
                )
            if seen.get(rkey) == folder:
                raise BenchConfigError(
                    f"--merge: {folder} has two rows {rkey[0]}[{rkey[1]}] {rkey[2]} (an edited file?)"
                )
            if rkey in seen:
                raise BenchConfigError(
                    f"--merge: {rkey[0]}[{rkey[1]}] {rkey[2]} is measured in both {seen[rkey]} and "
                    f"{folder}; merge runs that measured different (data set, configuration) "
                    "pairs"
                )
            seen[rkey] = folder
            prompt = (r["prompt_id"], r["prompt_tokens"])
            earlier = prompts.setdefault(rkey[:2], prompt + (folder,))
            if earlier[:2] != prompt:
                raise BenchConfigError(
                    f"--merge: prompt {rkey[0]}[{rkey[1]}] is {earlier[0]} of {earlier[1]} tokens "
                    f"in {earlier[2]}, {prompt[0]} of {prompt[1]} tokens in {folder} (another "
                    "data set file or chat template)"
                )
            row = copy.deepcopy(r)
            row["speedup"] = row["latency_speedup"] = row["matches_reference"] = None  # recomputed below
            rows.append(row)
    ds_order = {d: i for i, d in enumerate(datasets)}
    cfg_order = {c.name: i for i, c in enumerate(configs)}
    rows.sort(key=lambda r: (ds_order[r["dataset"]], r["prompt_index"], cfg_order[r["config"]]))

    settings = {k: copy.deepcopy(v) for k, v in first.items() if k != "consistency_problems"}
    settings.update({k: v for k, v in agreed.items() if "." not in k and (v is not None or k in first)})
    settings["sampling"] = copy.deepcopy(first.get("sampling"))  # agreed field by field above
    settings["datasets"] = datasets
    settings["context_tokens"] = context_workloads(datasets)
    for key in ("target_checkpoint", "draft_checkpoint"):
        settings[key] = next((d["settings"][key] for d in docs if d["settings"].get(key)), first.get(key))
    swift = next(
        (d for d in docs if any(c["engine"] == "swiftspec" and c["status"] == "ok" for c in d["configs"])), None
    )
    if swift is not None:  # the threads of swiftspec's models: a peers-only part records the default
        settings["threads"] = swift["settings"]["threads"]
    for peer in ("hf", "llamacpp"):
        peer_blocks: dict[str, tuple[dict, Any]] = {}  # backend -> (document, its block)
        for d in docs:
            for b, block in (d["settings"].get(peer) or {}).items():
                # the peers' (agreed above)
                if b not in peer_blocks or ran(d, peer, b) and not ran(peer_blocks[b][0], peer, b):
                    peer_blocks[b] = (d, block)
        merged = {b: copy.deepcopy(block) for b, (_, block) in peer_blocks.items()}
        if peer == "llamacpp":
            for b, block in merged.items():
                _merge_llamacpp_block(
                    block, [(d["settings"].get("llamacpp") or {}).get(b) for d in docs if ran(d, "llamacpp", b)]
                )
        if merged or peer in first:
            settings[peer] = merged or None

    entries = [e for f, d in zip(folders, docs) for e in _part_entries(Path(f), d)]
    starts = [_parse_time(d["created"]) for d in docs]
    if all(starts):
        import datetime as dt

        begin = min(starts)
        ends = []
        for folder, s, d in zip(folders, starts, docs):
            try:
                ends.append(s + dt.timedelta(seconds=d["wall_time_s"]))
            except (OverflowError, ValueError):  # NaN, or a finite wall time beyond datetime's range: an edited file
                raise BenchConfigError(
                    f"--merge: {folder} records wall_time_s {d['wall_time_s']!r} from created "
                    f"{d['created']!r}: the run would end after the year 9999 (an edited "
                    "file?)"
                ) from None
        wall = (max(ends) - begin).total_seconds()
        last = docs[ends.index(max(ends))]
        doc_created = min(d["created"] for d in docs)
    else:  # a created that is not a run's timestamp (an edited file): the parts' wall times added
        for folder, d in zip(folders, docs):
            if d["wall_time_s"] > MAX_MEASURED:  # their sum would overflow to Infinity (not JSON)
                raise BenchConfigError(
                    f"--merge: {folder} records wall_time_s {d['wall_time_s']!r}, beyond any run "
                    f"(at most {MAX_MEASURED:g} s; an edited file?)"
                )
        wall, last, doc_created = sum(d["wall_time_s"] for d in docs), docs[-1], docs[0]["created"]
    machine = copy.deepcopy(docs[0]["machine"])
    machine["busy_processes_end"] = last["machine"].get("busy_processes_end")
    if decode is None:
        decode = _default_decode(settings)
    doc = build_document(
        created=doc_created,
        command=command,
        commit=copy.deepcopy(docs[0]["commit"]),
        machine=machine,
        settings=settings,
        configs=configs_block(configs, status),
        rows=rows,
        wall_time_s=wall,
        load_average_end=last["load_average_end"],
        decode=decode,
    )
    doc["merge"] = {"created": created or mach.now_utc(), "parts": entries}
    return doc


#: Fields of a peer's settings block that may differ between the parts of a merge: the llama.cpp
#: peer's counts of inferred token ids and of retokenized prompts (added up), and what only a part
#: that ran llamacpp:assisted records (the draft's file and draft length).
_COUNTED = ("unresolved_pieces", "prompts_retokenized")
_PER_PART = {"llamacpp": {*_COUNTED, "draft_gguf", "draft_n_max"}}


def _merge_llamacpp_block(block: dict, parts: list[dict | None]) -> None:
    """Fills the merged ``settings.llamacpp.<backend>`` block: the counts (:data:`_COUNTED`) of the
    parts that measured the peer added up, the draft's fields from a part that has them."""
    blocks = [p for p in parts if isinstance(p, dict)]
    for field in _COUNTED:
        counts: dict = {}
        for p in blocks:
            for k, v in (p.get(field) or {}).items():
                counts[k] = counts.get(k, 0) + (v if isinstance(v, int) else 0)
        if blocks and any(field in p for p in blocks):
            block[field] = counts
    for key in ("draft_gguf", "draft_n_max"):
        block[key] = next((p[key] for p in blocks if p.get(key) is not None), block.get(key))


def merge_bench(
    folders: list[str | Path], out_dir: str | Path, *, plots: bool = True, command: str | None = None, decode=None
) -> dict:
    """``swiftspec bench --merge``: combines the results of several bench runs made separately on
    one machine (e.g. the slow HF peers as detached parts, one data set per GPU, and swiftspec's
    configurations in another invocation) into one result in ``out_dir`` (bench.json, bench.md,
    requests.jsonl, plots), as if they had been one run (:func:`merge_documents`).

    Args:
        folders: the parts' --out folders (each holding a finished run's bench.json).
        out_dir: where the merged result goes; must not hold results already.
        plots: make the PNG plots.
        command: the command line to record (default: this process's argv).
        decode: ``decode(ids) -> str`` for divergence text (default: the target's tokenizer
            when its checkpoint is on this machine, else the token ids).

    Raises:
        BenchConfigError: a part is unreadable, interrupted or disagrees with another
            (:func:`read_part`, :func:`merge_documents`), a folder is named twice, or ``out_dir``
            holds results or is a file.
        BenchResultError: the merged document fails validation (the numbers' problems are
            recorded in its settings and the files are written first).
    """
    import json

    from swiftspec.bench import machine as mach

    def resolve(path: Path, flag: str) -> Path:
        try:
            return path.resolve()
        except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
            raise BenchConfigError(f"{flag} {path}: cannot resolve the path ({exc})") from None

    part_dirs = [Path(f) for f in folders]
    out = Path(out_dir)
    resolved = [resolve(f, "--merge") for f in part_dirs]
    out_resolved = resolve(out, "--out")
    for i, f in enumerate(resolved):
        if f in resolved[:i]:
            raise BenchConfigError(f"--merge names {part_dirs[i]} twice")
        if f == out_resolved:
            raise BenchConfigError(f"--out {out} is one of the --merge folders; give a new folder")
    _check_out(out, "give another folder", create=False)  # made once the parts are read and agree
    parts: list[tuple[str | Path, dict]] = [(f, read_part(f)) for f in part_dirs]
    doc = merge_documents(parts, command=command if command is not None else mach.command_line(), decode=decode)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchConfigError(f"--out {out}: cannot create the folder ({exc.strerror or exc})") from None
    with open(out / "requests.jsonl", "w") as jsonl:  # as a run writes them: measured fields, nothing compared
        for r in doc["requests"]:
            jsonl.write(json.dumps({**r, "speedup": None, "latency_speedup": None, "matches_reference": None}) + "\n")
    _check_and_write(doc, out, plots)
    return doc
