"""Runs prompt sets through benchmark configurations and collects one row per request.

Order: for each data set, for each prompt, every configuration in turn (interleaved, so slow
drift of the machine — other jobs, thermal state — spreads over all configurations alike
instead of biasing whichever ran last). Before measuring, each configuration runs ``warmup``
short untimed requests. The first request of a configuration (warm-up or measured) also probes
whether the runtime accepts it at all (e.g. a decode mode this build does not have): a
rejection there marks it unavailable (``skip_unavailable``) or stops the run with a clear error.

Rows are appended to ``requests.jsonl`` in the output folder as they are measured, so a long
run that dies leaves its measurements behind.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from swiftspec.bench.config import (
    SAMPLING_DEFAULTS,
    BenchConfig,
    BenchConfigError,
    engine_key,
    engine_placement,
    find_baseline,
)
from swiftspec.bench.prompt_file import PromptFile
from swiftspec.errors import SwiftspecError

if TYPE_CHECKING:
    from swiftspec.bench.peers_hf import HFPeer
    from swiftspec.bench.peers_llamacpp import LlamaCppPeer
    from swiftspec.engine import Engine
    from swiftspec.tokenizer import Tokenizer

#: Tokens of a warm-up request (enough to run prefill, a few decode / verification steps).
WARMUP_TOKENS = 8


@dataclass
class BenchSettings:
    """What a run measures (recorded in the result's ``settings``).

    Attributes:
        datasets: data set names ("mtbench": first turns; "humaneval").
        num_prompts: the first N records of each data set.
        max_new_tokens: new tokens per request (fewer if EOS comes first).
        backend: default backend of configurations without ``@backend``.
        dtype: weight dtype ("bfloat16" or "float32": of swiftspec and of the HF peer; "int4":
            swiftspec only, on cuda without the megakernel and with tp 1,
            :func:`swiftspec.bench.config.check_dtype`).
        threads: CPU threads per swiftspec model (0: all cores).
        hf_threads: torch threads of the HF peer (0: torch's default).
        warmup: untimed warm-up requests per configuration.
        target, draft: model names or paths (``swiftspec.models.resolve_checkpoint``).
        max_context: KV capacity, tokens; None: each model's default (its trained context,
            bounded by the memory free).
        sampling: None for greedy decoding, or ``{"temperature", "top_p", "top_k", "seed"}``
            (:func:`swiftspec.bench.config.check_sampling`): every configuration samples, the
            request of prompt index ``i`` with seed ``seed + i`` (swiftspec's speculative modes run
            lossless speculative sampling; the HF peers ``do_sample=True`` after
            ``torch.manual_seed``).
        prompt_file_sha256: the sha256 of the ``--prompts`` file, None without one (a resumed run
            must measure the same file).
    """

    datasets: list[str]
    num_prompts: int
    max_new_tokens: int
    backend: str = "cpu"
    dtype: str = "bfloat16"
    threads: int = 0
    hf_threads: int = 0
    warmup: int = 1
    target: str = ""
    draft: str | None = None
    max_context: int | None = None
    sampling: dict | None = None
    prompt_file_sha256: str | None = None

    def request_seed(self, prompt_index: int) -> int:
        """The seed of a data set's request for prompt ``prompt_index`` (0 under greedy decoding)."""
        return self.sampling["seed"] + prompt_index if self.sampling else 0


@dataclass
class PromptItem:
    """One prompt of a data set: its record index, id and chat messages; for a long-context
    workload (``ctxN``) its length N in tokens, its messages and ids made with the target's
    tokenizer (:meth:`Runner.tokenize`)."""

    dataset: str
    index: int
    prompt_id: str
    messages: list[dict]
    prompt_ids: list[int] = field(default_factory=list)
    context_tokens: int | None = None


def load_prompts(
    datasets: list[str], num_prompts: int, progress: bool = True, prompt_file: PromptFile | None = None
) -> list[PromptItem]:
    """The first ``num_prompts`` prompts of each data set, as chat messages
    (:func:`swiftspec.datasets.prompt_messages`; MT-Bench uses first turns; the data set
    ``prompt_file.name`` is the records of ``prompt_file``, in file order, with their ids). A long-context workload
    ``ctxN`` (:mod:`swiftspec.bench.long_context`) has prompts 0 .. num_prompts - 1, the files of
    prompt i beginning with HumanEval problem i; they are made once the tokenizer is loaded.

    Raises :class:`BenchConfigError` for an unknown data set or too few records, and
    :class:`swiftspec.FetchError` if a data set cannot be fetched.
    """
    from swiftspec import datasets as ds
    from swiftspec.bench.long_context import context_tokens_of

    loaders = {"mtbench": ds.load_mtbench, "humaneval": ds.load_humaneval}
    items: list[PromptItem] = []
    for name in datasets:
        if prompt_file is not None and name == prompt_file.name:
            if num_prompts > len(prompt_file.records):
                raise BenchConfigError(
                    f"--num-prompts {num_prompts} exceeds the {len(prompt_file.records)} records of {prompt_file.path}"
                )
            items += [
                PromptItem(name, i, pid, messages)
                for i, (pid, messages) in enumerate(prompt_file.records[:num_prompts])
            ]
            continue
        n_tokens = context_tokens_of(name)
        if name not in loaders and n_tokens is None:
            raise BenchConfigError(
                f"unknown data set {name!r} in --datasets (expected mtbench or humaneval; "
                "long-context workloads come from --context-tokens)"
            )
        records = loaders.get(name, ds.load_humaneval)(progress=progress)
        if num_prompts > len(records):
            raise BenchConfigError(
                f"--num-prompts {num_prompts} exceeds the {len(records)} records of {name}"
                if n_tokens is None
                else f"--num-prompts {num_prompts} exceeds the {len(records)} HumanEval problems the "
                f"prompts of the long-context workload {name} begin with"
            )
        for i, rec in enumerate(records[:num_prompts]):
            if n_tokens is not None:
                items.append(PromptItem(name, i, f"{rec['task_id']}+", [], context_tokens=n_tokens))
                continue
            pid = str(rec.get("question_id", rec.get("task_id", i)))
            items.append(PromptItem(name, i, pid, ds.prompt_messages(name, rec, 0)))
    return items


def _checkpoint_dtype(folder: str) -> str | None:
    """The ``dtype`` of a checkpoint folder's manifest.json ("bfloat16", "float32", "int4"), or None
    when it cannot be read (the runtime then names the problem when it loads the folder)."""
    try:
        dtype = json.loads((Path(folder) / "manifest.json").read_text(encoding="utf-8")).get("dtype")
    except (OSError, ValueError, AttributeError):
        return None
    return dtype if isinstance(dtype, str) else None


class ConfigUnavailable(SwiftspecError):
    """The runtime (or the peer) rejected a configuration; the message says why."""


def _count(n: int, noun: str) -> str:
    """ "1 request", "2 requests" (log lines)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


class Runner:
    """Loads engines for the configurations and measures every prompt under each.

    Args:
        settings: the run's :class:`BenchSettings`.
        configs: parsed configurations (:func:`swiftspec.bench.config.parse_config_list`).
        out_dir: folder for ``requests.jsonl`` (created), or None.
        progress: show a tqdm progress bar on stderr.
        skip_unavailable: record configurations the runtime rejects as unavailable and go on;
            otherwise raise :class:`ConfigUnavailable` before measuring anything (always for one of
            which a resumed run kept rows: :meth:`run`).
        log: where status lines go (default: stderr).
    """

    def __init__(
        self,
        settings: BenchSettings,
        configs: list[BenchConfig],
        out_dir: Path | None = None,
        progress: bool = True,
        skip_unavailable: bool = False,
        log: Callable[[str], None] | None = None,
    ):
        self.settings = settings
        self.configs = configs
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.progress = progress
        self.skip_unavailable = skip_unavailable
        self.log = log or (lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True))
        self.engines: dict[str, Engine] = {}
        self.hf: dict[str, HFPeer] = {}  # backend -> HFPeer
        self.llamacpp: dict[str, LlamaCppPeer] = {}  # backend -> LlamaCppPeer
        self.status: dict[str, tuple[str, str | None]] = {c.name: ("ok", None) for c in configs}
        self.rows: list[dict] = []
        self._resume_cut: str | None = None  # the cut last line _resumed_rows dropped
        self._resumed_counts: dict[str, int] = {}  # configuration name -> rows kept by --resume
        self.interrupted = False
        self.target_checkpoint: str | None = None
        self.draft_checkpoint: str | None = None
        self.tokenizer: Tokenizer | None = None  # the target's (load())

    # ----------------------------------------------------------------- loading
    def _swiftspec_configs(self, backend: str | None = None) -> list[BenchConfig]:
        return [c for c in self.configs if c.engine == "swiftspec" and (backend is None or c.backend == backend)]

    def _mark_unavailable(self, config: BenchConfig, reason: str) -> None:
        """Records ``config`` as unavailable, or raises :class:`ConfigUnavailable` (without
        ``skip_unavailable``, or when a resumed run already holds rows of it: :meth:`_refuse_resumed`)."""
        self._refuse_resumed(config.name, reason)
        if not self.skip_unavailable:
            raise ConfigUnavailable(
                f"configuration {config.name} is not available: {reason} "
                + (
                    "(drop --peers hf, install the peers with pip install '.[test]', "
                    if config.engine == "hf"
                    else "(drop --peers llamacpp, "
                    if config.engine == "llamacpp"
                    else "(drop it from --configs, "
                )
                + "or pass --skip-unavailable to record it as unavailable)"
            )
        self.log(f"{config.name}: unavailable: {reason}")
        self.status[config.name] = ("unavailable", reason)

    def _refuse_resumed(self, name: str, reason: str) -> None:
        """Raises :class:`ConfigUnavailable` if the run being resumed measured requests of
        configuration ``name``, which the runtime now rejects (``reason``).

        Refused rather than dropped or kept: the rows were measured where the configuration ran, and
        the rejection is about this process (another build, no GPU, not enough memory), not about
        them, so dropping them would throw away measurements; keeping them next to the status
        "unavailable" contradicts the result (an unavailable configuration has no rows) and would
        only fail the consistency check after the whole run. Refusing up front measures nothing and
        leaves requests.jsonl as it is: the user resumes again where the configuration runs.
        ``skip_unavailable`` still applies to configurations without measured rows."""
        n = self._resumed_counts.get(name, 0)
        if n:
            assert self.out_dir is not None  # rows are resumed only from an out_dir (run())
            raise ConfigUnavailable(
                f"--resume: configuration {name} is not available now ({reason}), but the interrupted run measured "
                f"{n} of its requests (kept in {self.out_dir / 'requests.jsonl'}): resume where the runtime "
                "accepts it, or measure without it in a new --out folder"
            )

    def load(self, items: list[PromptItem] | None = None) -> None:
        """Resolve checkpoints, tokenize ``items`` (the run's prompts; :meth:`tokenize`) and load
        the engines the configurations need, with a KV capacity that holds the longest prompt plus
        ``max_new_tokens`` (:meth:`context_needed`).

        Raises:
            BenchConfigError: the target is a checkpoint folder of another dtype than the run's (a
                folder is used as it is, so bench.json's ``settings.dtype`` would misstate it);
                configurations that need a draft without one; a prompt plus ``max_new_tokens``
                longer than the context the engines can have (:meth:`context_needed`), before any
                model loads.
            ConfigUnavailable: a configuration the runtime rejects (without ``skip_unavailable``).
        """
        from swiftspec.engine import Engine
        from swiftspec.models import resolve_checkpoint
        from swiftspec.tokenizer import Tokenizer

        s = self.settings
        self.target_checkpoint = str(resolve_checkpoint(s.target, dtype=s.dtype))
        held = _checkpoint_dtype(self.target_checkpoint)
        if held is not None and held != s.dtype:
            raise BenchConfigError(
                f"the target checkpoint {self.target_checkpoint} holds {held} weights, but the run's "
                f"dtype (recorded in bench.json) is {s.dtype}: pass --dtype {held}"
            )
        needs_draft = any(c.speculative for c in self.configs)
        if needs_draft and s.draft is None:
            names = ", ".join(c.name for c in self.configs if c.speculative)
            raise BenchConfigError(f"configurations {names} need a draft model (--draft)")
        if s.draft is not None and needs_draft:
            self.draft_checkpoint = str(resolve_checkpoint(s.draft, dtype=s.dtype))
        self.tokenizer = Tokenizer.from_checkpoint(self.target_checkpoint)  # the one every engine loads
        max_context = s.max_context
        if items:
            self.tokenize(items)
            max_context = self.context_needed(items)
        max_tree = max([c.tree_budget + 2 for c in self.configs if c.tree_budget] + [64])
        # One engine per backend, plus one per target TP degree, draft SM partition (green contexts
        # on one GPU), draft GPU and target stream priority (engine_key).
        for key in sorted({engine_key(c) for c in self._swiftspec_configs()}):
            configs = [c for c in self._swiftspec_configs() if engine_key(c) == key]
            backend = configs[0].backend
            for c in configs:  # the draft group runs at TP 1 (a draft TP group is not built)
                if (c.draft_tp or 1) != 1:
                    self._mark_unavailable(c, f"draft TP degree {c.draft_tp}: the draft group runs at TP 1 only")
            wanted = [c for c in configs if self.status[c.name][0] == "ok"]
            if not wanted:
                continue
            with_draft = any(c.speculative for c in wanted)
            placement = engine_placement(configs[0])
            self.log(
                f"loading swiftspec {key}: target {self.target_checkpoint}"
                + (f", draft {self.draft_checkpoint}" if with_draft else "")
                + (f", placement {placement}" if placement else "")
            )
            try:
                self.engines[key] = Engine(
                    self.target_checkpoint,
                    self.draft_checkpoint if with_draft else None,
                    backend=backend,
                    dtype=s.dtype,
                    max_context=max_context,
                    max_tree=max_tree,
                    num_threads=s.threads,
                    placement=placement,
                )
            except SwiftspecError as exc:
                for c in wanted:
                    self._mark_unavailable(c, f"backend {key} could not load the models: {exc}")
        for backend in sorted({c.backend for c in self.configs if c.engine == "hf"}):
            from swiftspec.bench.peers_hf import HFPeer, PeerUnavailableError

            hf_configs = [c for c in self.configs if c.engine == "hf" and c.backend == backend]
            assisted = any(c.mode == "assisted" for c in hf_configs)
            self.log(f"loading HF transformers peer on {backend}" + (" with assistant" if assisted else ""))
            try:
                self.hf[backend] = HFPeer(
                    self.target_checkpoint,
                    self.draft_checkpoint if assisted else None,
                    dtype=s.dtype,
                    threads=s.hf_threads,
                    device=backend,
                    sampling=s.sampling,
                )
            except PeerUnavailableError as exc:
                for c in hf_configs:
                    self._mark_unavailable(c, str(exc))
        for backend in sorted({c.backend for c in self.configs if c.engine == "llamacpp"}):
            self._load_llamacpp(backend)

    def _load_llamacpp(self, backend: str) -> None:
        """The llama.cpp peer on ``backend``: its GGUF files and its build (built now if this machine
        has none: minutes). What keeps it from running marks its configurations unavailable."""
        from swiftspec.bench.llamacpp_build import LlamaCppBuildError, ensure_llamacpp
        from swiftspec.bench.peers_hf import PeerUnavailableError
        from swiftspec.bench.peers_llamacpp import LlamaCppPeer, gguf_source

        configs = [c for c in self.configs if c.engine == "llamacpp" and c.backend == backend]
        assisted = any(c.mode == "assisted" for c in configs)
        s = self.settings
        try:
            target_gguf = gguf_source(s.target, self.target_checkpoint)
            draft_gguf = gguf_source(s.draft, self.draft_checkpoint) if assisted else None
            self.log(
                f"llama.cpp peer on {backend}: target {target_gguf}"
                + (f", draft {draft_gguf}" if assisted else "")
                + " (the GGUF files' own quantized weights)"
            )
            build = ensure_llamacpp(backend, progress=self.progress)
            self.llamacpp[backend] = LlamaCppPeer(build, target_gguf, draft_gguf, self.tokenizer, threads=s.threads)
        except (PeerUnavailableError, LlamaCppBuildError) as exc:
            for c in configs:
                self._mark_unavailable(c, str(exc))

    def tokenize(self, items: list[PromptItem]) -> None:
        """Sets each item's ``prompt_ids``: its messages through the chat template, or for a
        long-context workload its prompt of exactly N tokens and the messages it spells
        (:class:`swiftspec.bench.long_context.ContextPrompts`). Raises :class:`BenchConfigError`
        for an N that does not exceed the long-context prompt's frame."""
        prompts = None
        for item in items:
            assert self.tokenizer is not None  # prompts are tokenized once load() has it
            if item.context_tokens is None:
                item.prompt_ids = self.tokenizer.encode_chat(item.messages)
                continue
            if prompts is None:
                from swiftspec.bench.long_context import ContextPrompts
                from swiftspec.datasets import load_humaneval

                prompts = ContextPrompts(self.tokenizer, load_humaneval(progress=self.progress))
            item.messages, item.prompt_ids = prompts.prompt(item.context_tokens, item.index)

    def context_needed(self, items: list[PromptItem]) -> int | None:
        """The max_context the swiftspec engines are loaded with: ``--max-context`` if given,
        else None (each model's default) when that holds the longest prompt plus max_new_tokens,
        else exactly that many tokens. The models' limits are the runtime's
        (``swiftspec_core.resolve_max_context`` on their config.json); nothing is loaded.

        Raises:
            BenchConfigError: naming the prompt, its length, max_new_tokens and the context needed:
                more than ``--max-context``, or than a model takes (with the runtime's reason,
                e.g. its ``max_position_embeddings``).
        """
        from swiftspec import swiftspec_core as core
        from swiftspec.errors import InvalidRequestError

        s = self.settings
        swift = self._swiftspec_configs()
        if not swift or not items:
            return s.max_context
        longest = max(items, key=lambda i: len(i.prompt_ids))
        need = len(longest.prompt_ids) + s.max_new_tokens
        what = (
            f"{longest.dataset}[{longest.index}] is a prompt of {len(longest.prompt_ids)} tokens; with "
            f"--max-new-tokens {s.max_new_tokens} it needs a context of {need} tokens"
        )
        if s.max_context is not None:
            if need > s.max_context:
                raise BenchConfigError(f"{what}, more than --max-context {s.max_context}")
            return s.max_context
        assert self.target_checkpoint is not None  # set by load() before it calls this
        models = [("target", self.target_checkpoint)]
        if self.draft_checkpoint is not None and any(c.speculative for c in swift):
            models.append(("draft", self.draft_checkpoint))
        configs = [(role, Path(folder) / "config.json") for role, folder in models]
        texts = [(role, path.read_text(encoding="utf-8"), str(path)) for role, path in configs]
        if all(need <= core.resolve_max_context(text, origin, 0) for _, text, origin in texts):
            return None
        for role, text, origin in texts:
            try:
                core.resolve_max_context(text, origin, need)
            except InvalidRequestError as exc:
                raise BenchConfigError(f"{what}, more than the {role} model takes: {exc}") from None
        return need

    # --------------------------------------------------------------- requests
    def _run_one(self, config: BenchConfig, prompt_ids: list[int], max_new_tokens: int, seed: int = 0) -> dict:
        """Runs one request (sampled under ``seed`` when the run samples); returns the measured
        fields of a row."""
        sampling = self.settings.sampling
        if config.engine == "hf":
            assert self.tokenizer is not None  # the peers are loaded by load(), after the tokenizer
            hr = self.hf[config.backend].generate(
                prompt_ids, max_new_tokens, self.tokenizer.eos_token_ids, assisted=config.mode == "assisted", seed=seed
            )
            n = len(hr.token_ids)
            first = hr.emissions[0] if hr.emissions else 0
            steps = max(0, len(hr.emissions) - 1)
            return dict(
                token_ids=hr.token_ids,
                counted_tokens=hr.counted_tokens,
                first_emission_tokens=first,
                finish_reason="stop" if n and hr.token_ids[-1] in self.tokenizer.eos_token_ids else "length",
                ttft_s=hr.ttft_s,
                decode_s=hr.decode_s,
                verification_steps=steps,
                draft_steps=None,
                acceptance_length=(n - first) / steps if steps else None,
                target_time_s=None,
                draft_time_s=None,
                wall_s=hr.wall_s,
            )
        if config.engine == "llamacpp":
            assert self.tokenizer is not None
            lr = self.llamacpp[config.backend].generate(prompt_ids, max_new_tokens, assisted=config.mode == "assisted")
            n = len(lr.token_ids)
            first = lr.emissions[0]
            steps = len(lr.emissions) - 1
            return dict(
                token_ids=lr.token_ids,
                counted_tokens=lr.counted_tokens,
                first_emission_tokens=first,
                finish_reason="stop" if lr.token_ids[-1] in self.tokenizer.eos_token_ids else "length",
                ttft_s=lr.ttft_s,
                decode_s=lr.decode_s,
                verification_steps=steps,
                draft_steps=None,
                acceptance_length=(n - first) / steps if steps else None,
                target_time_s=None,
                draft_time_s=None,
                wall_s=lr.wall_s,
                peer_prompt_tokens=len(lr.prompt_ids),
            )
        engine = self.engines[engine_key(config)]
        kwargs: dict[str, Any] = {}
        if config.speculative:
            kwargs = dict(tree_budget=config.tree_budget, max_depth=config.max_depth, branching=config.branching)
        if sampling:
            kwargs.update(
                temperature=sampling["temperature"], top_p=sampling["top_p"], top_k=sampling["top_k"], seed=seed
            )
        else:
            kwargs.update(temperature=0.0)
        r = engine.generate(prompt_ids, max_new_tokens=max_new_tokens, mode=config.mode, **kwargs)
        st = r.stats
        steps = int(st.get("verification_steps", 0))
        return dict(
            token_ids=list(r.token_ids),
            counted_tokens=int(st["new_tokens"]),
            first_emission_tokens=1 if r.token_ids else 0,
            finish_reason=r.finish_reason,
            ttft_s=float(r.ttft_s),
            decode_s=float(r.decode_s),
            verification_steps=steps,
            draft_steps=int(st.get("draft_steps", 0)),
            acceptance_length=float(st["acceptance_length"]) if steps else None,
            target_time_s=float(st.get("target_time", 0.0)),
            draft_time_s=float(st.get("draft_time", 0.0)),
            wall_s=float(st.get("wall_time", r.ttft_s + r.decode_s)),
        )

    def _warmup(self, items: list[PromptItem]) -> None:
        """Warm-up requests (the first of each configuration probes availability). Logs an
        estimate of the run's duration from the last warm-up of each configuration (its TTFT on
        the first prompt, in proportion to each prompt's length, plus max_new_tokens at its
        warm-up decode rate, per prompt)."""
        probe, seed = items[0].prompt_ids, self.settings.request_seed(items[0].index)
        tokens = min(WARMUP_TOKENS, self.settings.max_new_tokens)
        estimate = 0.0
        for c in self.configs:
            if self.status[c.name][0] != "ok":
                continue
            last = None
            for i in range(self.settings.warmup):
                try:
                    last = self._run_one(c, probe, tokens, seed)
                except SwiftspecError as exc:
                    if i == 0:
                        self._mark_unavailable(c, f"the runtime rejected it: {exc}")
                        break
                    raise
            if last is not None:
                produced = len(last["token_ids"]) - last["first_emission_tokens"]
                per_token = last["decode_s"] / produced if produced > 0 else last["ttft_s"]
                # prefill time in proportion to the prompt's tokens (the long-context workloads)
                prompt_tokens = sum(len(item.prompt_ids) for item in items) / len(probe)
                estimate += last["ttft_s"] * prompt_tokens + per_token * (self.settings.max_new_tokens - 1) * len(items)
        if estimate > 0:
            self.log(
                f"estimated measuring time: ~{estimate / 60:.0f} min for "
                f"{_count(len(items), 'prompt')} (from the warm-up requests; the machine's load changes it)"
            )

    def resolved_max_context(self) -> int | None:
        """The KV capacity the swiftspec engines run with (the target's; the requested value
        resolved by the runtime), or the requested value when no swiftspec engine was loaded."""
        engine = next(iter(self.engines.values()), None)
        return engine.target_model.max_context if engine is not None else self.settings.max_context

    def _run_identity(self) -> dict:
        """What a resumed run must share with the run it continues (``run_identity.json``):
        the decoding settings among them (``temperature`` ... ``seed``, greedy decoding's values
        under greedy decoding; a file without them, written before sampling existed, was greedy), and
        the schema version its rows were written in."""
        from swiftspec.bench.schema import SCHEMA_VERSION

        s = self.settings
        return {
            "schema_version": SCHEMA_VERSION,
            "datasets": s.datasets,
            "num_prompts": s.num_prompts,
            "max_new_tokens": s.max_new_tokens,
            "backend": s.backend,
            "dtype": s.dtype,
            "threads": s.threads,
            "hf_threads": s.hf_threads,
            "target": s.target,
            "draft": s.draft,
            "max_context": s.max_context,
            "configs": [c.name for c in self.configs],
            **(s.sampling or SAMPLING_DEFAULTS),
            **({"prompt_file_sha256": s.prompt_file_sha256} if s.prompt_file_sha256 else {}),
        }

    def _resumed_rows(self, items: list[PromptItem]) -> list[dict]:
        """Rows already measured by an interrupted run into the same folder (``resume=True``).
        ``items``: this run's prompts, tokenized.

        A last line without its line end that is not JSON is the write a kill cut: it is dropped
        (said in the log, with the number of rows kept) and its request measured again; :meth:`run`
        then rewrites requests.jsonl with exactly the kept rows before appending (``self._resume_cut``
        holds the dropped text, None if there was none).

        Raises:
            BenchConfigError: (one line naming the file) that run had other settings (the field is
                named), or its run_identity.json is not a JSON object, or is missing while its
                requests.jsonl holds rows; a line of its requests.jsonl (named with the field) is not
                JSON (except a last line cut by a kill, see above; a complete line is never dropped),
                not a request row of the schema (a field missing, of another type, out of
                range, NaN: :func:`swiftspec.bench.schema.request_row_problem`), has a token id outside
                the vocabulary of the target's tokenizer (when loaded), has numbers that
                disagree (:func:`swiftspec.bench.schema.row_consistency_problems`), is of a prompt
                or configuration this run does not measure or of a prompt another id or token count
                now, or repeats an earlier line's request.
        """
        from swiftspec.bench.resume import resumed_rows

        return resumed_rows(self, items)

    def run(self, items: list[PromptItem], resume: bool = False) -> list[dict]:
        """Measures every prompt under every available configuration; returns the rows
        (speedups and output checks are filled in by :func:`swiftspec.bench.report.build_document`).
        A KeyboardInterrupt stops early with the rows so far (``self.interrupted``).

        ``resume``: keep the requests an interrupted run with the same settings left in
        ``out_dir/requests.jsonl`` and measure only the missing ones (a long CPU run can span
        several sittings). The file is first replaced (atomically) by exactly the kept rows, so a
        row cut by the kill is not continued by the next one. Raises :class:`BenchConfigError` if
        the settings differ or a row is not one this run would have measured (:meth:`_resumed_rows`),
        and :class:`ConfigUnavailable`, before measuring, if the runtime rejects a configuration of
        which rows were kept, even with ``skip_unavailable`` (:meth:`_refuse_resumed`)."""
        from tqdm.auto import tqdm

        self.tokenize([item for item in items if not item.prompt_ids])  # (load() tokenized them)
        done: set[tuple[str, int, str]] = set()
        if resume and self.out_dir is not None:
            for row in self._resumed_rows(items):
                self.rows.append(row)
                done.add((row["dataset"], row["prompt_index"], row["config"]))
                self._resumed_counts[row["config"]] = self._resumed_counts.get(row["config"], 0) + 1
            for name, (status, reason) in self.status.items():  # rejected while loading (load())
                if status != "ok":
                    assert reason is not None  # an unavailable configuration has its why (_mark_unavailable)
                    self._refuse_resumed(name, reason)
        self._warmup(items)  # a rejection of a configuration with resumed rows raises (_mark_unavailable)
        active = [c for c in self.configs if self.status[c.name][0] == "ok"]
        jsonl = None
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(self.out_dir / "run_identity.json", json.dumps(self._run_identity(), indent=1) + "\n")
            jsonl_path = self.out_dir / "requests.jsonl"
            if resume:  # exactly the kept rows, each with its line end: appending starts on a line of its own
                write_atomically(jsonl_path, "".join(json.dumps(row) + "\n" for row in self.rows))
            jsonl = open(jsonl_path, "a" if resume else "w")
        bar = tqdm(
            total=len(items) * len(active),
            initial=len(done),
            desc="bench",
            unit="req",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        try:
            for n_item, item in enumerate(items):
                for c in active:
                    if self.status[c.name][0] != "ok" or (item.dataset, item.index, c.name) in done:
                        continue
                    bar.set_postfix_str(f"{item.dataset}[{item.index}] {c.name}", refresh=False)
                    try:
                        measured = self._run_one(
                            c, item.prompt_ids, self.settings.max_new_tokens, self.settings.request_seed(item.index)
                        )
                    except SwiftspecError as exc:
                        if n_item > 0:  # it ran before: a real failure, not an unsupported configuration
                            raise
                        self._mark_unavailable(c, f"the runtime rejected it: {exc}")
                        bar.total -= len(items)
                        continue
                    row = make_row(item, c, measured)
                    self.rows.append(row)
                    if jsonl is not None:
                        jsonl.write(json.dumps(row) + "\n")
                        jsonl.flush()
                    bar.update(1)
                    if row["tokens_per_s"] is not None:
                        bar.set_postfix_str(
                            f"{item.dataset}[{item.index}] {c.name} {row['tokens_per_s']:.2f} tok/s", refresh=True
                        )
        except KeyboardInterrupt:
            self.interrupted = True
            self.log(f"interrupted after {_count(len(self.rows), 'request')}; writing what was measured")
        finally:
            bar.close()
            if jsonl is not None:
                jsonl.close()
        return self.rows

    def configs_block(self) -> list[dict]:
        """The result's ``configs`` list: each configuration with its baseline, reference and status."""
        return configs_block(self.configs, self.status)


def configs_block(configs: list[BenchConfig], status: dict[str, tuple[str, str | None]]) -> list[dict]:
    """The result's ``configs`` list: each configuration with its baseline and reference among
    ``configs`` (:func:`find_baseline`, :func:`reference_config`) and its ``status[name]``
    (``("ok", None)`` or ``("unavailable", why)``). A normal run passes its own configurations;
    ``swiftspec bench --merge`` the union of its parts', so a configuration's baseline may have been
    measured in another part."""
    out = []
    for c in configs:
        d = c.to_dict()
        base = find_baseline(c, configs)
        d["baseline"] = base.name if base is not None else None
        ref = reference_config(c, configs)
        d["reference"] = ref.name if ref is not None else None
        d["status"], d["error"] = status[c.name]
        out.append(d)
    return out


def reference_config(config: BenchConfig, configs: list[BenchConfig]) -> BenchConfig | None:
    """The configuration whose greedy outputs ``config``'s are checked against (under sampled
    decoding outputs are not compared per request; see :func:`swiftspec.bench.report.compare_outputs`): its baseline
    (speculation vs target-only) when that runs the target at the same TP degree (another degree
    sums in another order, so its outputs may differ at near-ties and are not a reference; the
    speedup is still taken against it), or for ``hf:target`` the swiftspec target-only run on the
    same backend (two implementations of the same model; likewise ``llamacpp:target``, which runs the
    GGUF's quantized weights), or for ``target:mk`` the plain target
    (the decode megakernel sums in another order than the layered path)."""
    base = find_baseline(config, configs)
    if base is not None:
        return base if base.target_tp == config.target_tp else None
    if config.mode == "target" and config.target_megakernel:  # megakernel vs the layered target
        for c in configs:
            if (
                c.engine == "swiftspec"
                and c.mode == "target"
                and not c.target_megakernel
                and c.backend == config.backend
                and c.target_tp == config.target_tp
            ):
                return c
    if config.engine in ("hf", "llamacpp") and config.mode == "target":
        for c in configs:
            if c.engine == "swiftspec" and c.mode == "target" and c.backend == config.backend:
                return c
    return None


def make_row(item: PromptItem, config: BenchConfig, m: dict) -> dict:
    """One ``requests`` row (schema: :mod:`swiftspec.bench.schema`) from measured fields."""
    n = len(m["token_ids"])
    produced = n - m["first_emission_tokens"]
    tps = produced / m["decode_s"] if produced > 0 and m["decode_s"] > 0 else None
    row = {
        "dataset": item.dataset,
        "prompt_index": item.index,
        "prompt_id": item.prompt_id,
        "config": config.name,
        "prompt_tokens": len(item.prompt_ids),
        "prefill_tokens_per_s": len(item.prompt_ids) / m["ttft_s"],
        "new_tokens": n,
        "counted_tokens": m["counted_tokens"],
        "first_emission_tokens": m["first_emission_tokens"],
        "finish_reason": m["finish_reason"],
        "ttft_s": m["ttft_s"],
        "decode_s": m["decode_s"],
        "tpot_s": 1.0 / tps if tps else None,
        "tokens_per_s": tps,
        "verification_steps": m["verification_steps"],
        "draft_steps": m["draft_steps"],
        "acceptance_length": m["acceptance_length"],
        "target_time_s": m["target_time_s"],
        "draft_time_s": m["draft_time_s"],
        "wall_s": m["wall_s"],
        "latency_s": m["ttft_s"] + m["decode_s"],
        "speedup": None,
        "latency_speedup": None,
        "matches_reference": None,
        "token_ids": m["token_ids"],
    }
    if "peer_prompt_tokens" in m:  # the llama.cpp peers: the prompt tokens llama.cpp made of the prompt's text
        row["peer_prompt_tokens"] = m["peer_prompt_tokens"]
    return row


def write_atomically(path: Path, text: str) -> None:
    """Replaces ``path`` by a file holding ``text`` such that a kill or a crash leaves either the
    old file or the new one, never a mix: a temporary file in the same folder, fsynced, then
    ``os.replace``. Raises ``OSError`` if it cannot be written (the old file is then untouched)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # open() applies the umask, as for the file itself
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def elapsed_since(t0: float) -> float:
    """Seconds since ``t0`` (a ``time.perf_counter()`` value)."""
    return time.perf_counter() - t0
