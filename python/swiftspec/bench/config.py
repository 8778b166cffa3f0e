"""The configuration grammar of ``swiftspec bench``: what one column of a benchmark runs.

A configuration is written as one token (``--configs`` takes a comma-separated list)::

    CONFIG  := ENGINE_MODE [":" SHAPE] (":" OPTION)* ["@" BACKEND]
    ENGINE_MODE := "target" | "serial" | "async" | "auto"   swiftspec runtime (auto: SHAPE is its
                                                        largest tree; the rounds choose)
                 | "hf:target" | "hf:assisted"          Hugging Face transformers peers
                 | "llamacpp:target" | "llamacpp:assisted"   llama.cpp peers (the GGUF files'
                                                        quantized weights; peers_llamacpp)
    SHAPE   := "chain" [N]    a chain of N draft tokens: tree budget N, depth N, branching 1
                                 (N defaults to 4)
             | "tree" [N]     a token tree of N nodes: tree budget N, branching 2, depth 8
                                 (N defaults to 16)
    OPTION  := "b" N          branching: children added per expanded node (top-k of the draft)
             | "d" N          depth limit of the token tree
             | "tp" N         TP degree of the target group (cpu: ranks on the cores; cuda: GPUs
                                 0..N-1, with ``dg``: the draft GPU may be one of them)
             | "dtp" N        TP degree of the draft group (1 today: the runtime rejects others)
             | "sm" N         cuda, one GPU: the draft group runs in a green context on SMs [0, N),
                                 the target group on SMs [N, last] (placement sm_partition; N on
                                 the driver's granularity, a multiple of 8 on an H200). Without it
                                 both models share all SMs on their own streams.
             | "hp"           cuda: the target's stream at the highest priority (the block
                                 scheduler starts its waiting CTAs before the draft's)
             | "dmma"         cuda: the draft's GEMMs on the mma.sync engine (placement
                                 gemm_engine; the target keeps wgmma)
             | "dmk"          cuda: the draft's single-token steps as the decode megakernel
                                 (placement megakernel)
             | "mk"           cuda, target-only decoding and auto: the target's single-token steps
                                 (auto's target-only rounds) as the decode megakernel; target:mk's
                                 greedy outputs are checked against plain ``target`` (same TP
                                 degree) when the run has it
             | "dg" N         cuda: the draft group on GPU N, the target on GPU 0 (with tpM:
                                 GPUs 0..M-1): draft and target on GPUs of their own
                                 (placement devices)
             | "w" N          the draft attends an attention window: its first 4 committed keys
                                 (attention sinks) and each row's last N keys, its own among them
                                 (placement kv_window; cpu backend); the target keeps its full KV
             | "ws" N         with wN: N attention sinks instead of 4
    BACKEND := "cpu" | "cuda" (default: the run's --backend)

Examples: ``target``, ``serial:chain``, ``serial:chain6``, ``serial:tree16``,
``serial:tree32:b4:d6``, ``async:tree64:tp2:dtp1@cuda``, ``async:tree16:sm16@cuda``,
``async:tree16:hp@cuda``, ``async:tree16:dg1@cuda``, ``async:tree16:dmma@cuda``,
``async:tree16:dmk@cuda``, ``target:mk@cuda``, ``serial:tree16:w1024``, ``hf:assisted``.

``target`` takes no shape and only the options ``tpN`` and ``mk``; ``hf:*`` and ``llamacpp:*`` take no shape or
options (``hf:*`` runs PyTorch on the backend's device: ``cpu`` or ``cuda``; ``llamacpp:*`` a llama.cpp build for
it, :mod:`swiftspec.bench.llamacpp_build`). Speculative modes without a shape use ``tree16``.

:func:`parse_config` raises :class:`BenchConfigError` (a :class:`swiftspec.SwiftspecError`)
naming the bad token; the CLI turns it into exit status 2.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from swiftspec import swiftspec_core
from swiftspec.errors import SwiftspecError
from swiftspec.sampling_params import (
    SAMPLING_DEFAULTS,  # noqa: F401 (re-exported)
    check_sampling_params,
    check_unused_under_greedy,
)

#: Decode modes of the swiftspec runtime (GenerationConfig's DecodeMode).
SWIFTSPEC_MODES: tuple[str, ...] = tuple(swiftspec_core.DECODE_MODES)  # the runtime's list
#: Peer configurations (Hugging Face transformers ``generate``).
HF_MODES = ("hf:target", "hf:assisted")
#: Peer configurations (llama.cpp: llama-completion and llama-speculative-simple).
LLAMACPP_MODES = ("llamacpp:target", "llamacpp:assisted")
#: ``--peers`` names and the configurations each adds.
PEERS = {"hf": HF_MODES, "llamacpp": LLAMACPP_MODES}
BACKENDS = ("cpu", "cuda")

DEFAULT_CHAIN = 4
DEFAULT_TREE = 16
DEFAULT_TREE_BRANCHING = 2
DEFAULT_TREE_DEPTH = 8
#: The largest tree budget the bench asks an engine to hold (its ``max_tree``).
MAX_TREE_BUDGET = 1024


class BenchConfigError(SwiftspecError, ValueError):
    """A benchmark configuration, data set name or option is invalid (the message names it)."""


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark configuration.

    Attributes:
        name: the canonical spelling (``str(parse_config(name)) == name`` round-trips).
        engine: "swiftspec", "hf" or "llamacpp".
        mode: "target", "serial" or "async" (swiftspec); "target" or "assisted" (hf, llamacpp).
        backend: "cpu" or "cuda".
        tree_budget: draft nodes verified per target step (speculative modes), else None.
        max_depth: depth limit of the token tree, else None.
        branching: children per expanded node (1 = chain), else None.
        target_tp: TP degree of the target group.
        draft_tp: TP degree of the draft group (speculative modes), else None.
        draft_sms: SMs of the draft group's green-context partition on one GPU (the target
            gets the rest), or None: both models on all SMs.
        target_priority: the target's CUDA stream at the highest priority (``hp``).
        draft_gpu: the GPU of the draft group (``dgN``; the target on GPU 0), or None: both on
            GPU 0.
        draft_engine: the GEMM engine of the draft (``dmma``: "mma"), or None: the default.
        draft_megakernel: the draft's single-token steps as the decode megakernel (``dmk``).
        target_megakernel: the target's single-token steps as the decode megakernel (``mk``:
            target-only decoding, or auto's target-only rounds).
        draft_window: the draft's attention window (``wN``): how many of each row's last keys (its
            own among them) it attends besides its sinks, or None: full attention.
        draft_sinks: the draft's attention sinks under ``wN`` (``wsN``; default 4), else None.
        shape: "chain", "tree" or None (for plots: acceptance length per tree budget).
    """

    name: str
    engine: str
    mode: str
    backend: str
    tree_budget: int | None = None
    max_depth: int | None = None
    branching: int | None = None
    target_tp: int = 1
    draft_tp: int | None = None
    shape: str | None = None
    draft_sms: int | None = None
    target_priority: bool = False
    draft_gpu: int | None = None
    draft_engine: str | None = None
    draft_megakernel: bool = False
    target_megakernel: bool = False
    draft_window: int | None = None
    draft_sinks: int | None = None

    @property
    def speculative(self) -> bool:
        """True if a draft model is loaded to propose tokens (serial, async, auto, hf:assisted)."""
        return self.mode in ("serial", "async", "auto", "assisted")

    @property
    def is_reference(self) -> bool:
        """True for plain target-only decoding (the baseline of speedups and output checks)."""
        return self.mode == "target"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["speculative"] = self.speculative
        return d


#: Flag options of speculative configurations that need the cuda backend, and what each does.
_CUDA_FLAGS = {
    "dmma": "picks a CUDA GEMM engine",
    "dmk": "runs the CUDA decode megakernel",
    "hp": "sets a CUDA stream priority",
}

_SHAPE = re.compile(r"^(chain|tree)(\d*)$")
_OPTION = re.compile(r"^(b|d|tp|dtp|sm|dg|ws|w)(\d+)$")
#: Attention sinks of a draft window (``wN``) without ``wsN``: StreamingLLM's 4 (Xiao et al., ICLR 2024).
DEFAULT_WINDOW_SINKS = 4


def _positive(token: str, what: str, text: str, limit: int | None = None) -> int:
    value = int(text)
    if value < 1:
        raise BenchConfigError(f"configuration {token!r}: {what} must be >= 1, got {value}")
    if limit is not None and value > limit:
        raise BenchConfigError(f"configuration {token!r}: {what} must be <= {limit}, got {value}")
    return value


def parse_config(token: str, default_backend: str = "cpu") -> BenchConfig:
    """Parse one configuration token (grammar in the module docstring).

    ``default_backend`` applies when the token has no ``@backend``; the canonical name then
    carries no ``@`` suffix either. Raises :class:`BenchConfigError` naming the token and the
    part that is wrong.
    """
    if not isinstance(token, str) or not token.strip():
        raise BenchConfigError("empty configuration in --configs")
    raw = token.strip()
    backend = default_backend
    explicit_backend = False
    body = raw
    if "@" in raw:
        body, _, backend = raw.partition("@")
        explicit_backend = True
        if backend not in BACKENDS:
            raise BenchConfigError(f"configuration {raw!r}: unknown backend {backend!r} (expected cpu or cuda)")
    if default_backend not in BACKENDS:
        raise BenchConfigError(f"unknown backend {default_backend!r} (expected cpu or cuda)")

    if body in HF_MODES or body in LLAMACPP_MODES:
        engine, mode = body.split(":", 1)
        return BenchConfig(
            name=body + (f"@{backend}" if explicit_backend else ""), engine=engine, mode=mode, backend=backend
        )

    parts = body.split(":")
    mode = parts[0]
    if mode not in SWIFTSPEC_MODES:
        raise BenchConfigError(
            f"configuration {raw!r}: unknown mode {mode!r} (expected one of "
            f"{', '.join(SWIFTSPEC_MODES + HF_MODES + LLAMACPP_MODES)})"
        )
    rest = parts[1:]
    suffix = f"@{backend}" if explicit_backend else ""
    if mode == "target":
        tp, megakernel = 1, False
        for opt in rest:
            m = _OPTION.match(opt)
            if m and m.group(1) == "tp" and tp == 1:
                tp = _positive(raw, "target TP degree", m.group(2))
            elif opt == "mk" and not megakernel:
                if backend != "cuda":
                    raise BenchConfigError(
                        f"configuration {raw!r}: mk runs the CUDA decode megakernel; it needs "
                        f"the cuda backend, not {backend!r}"
                    )
                megakernel = True
            else:
                raise BenchConfigError(
                    f"configuration {raw!r}: target-only decoding takes no shape and only the "
                    "options tpN (the target's TP degree) and mk (the decode megakernel), "
                    f"each once; got {opt!r}"
                )
        return BenchConfig(
            name="target" + (f":tp{tp}" if tp != 1 else "") + (":mk" if megakernel else "") + suffix,
            engine="swiftspec",
            mode="target",
            backend=backend,
            target_tp=tp,
            target_megakernel=megakernel,
        )

    shape, n = "tree", DEFAULT_TREE
    if rest and (m := _SHAPE.match(rest[0])):
        shape = m.group(1)
        default_n = DEFAULT_CHAIN if shape == "chain" else DEFAULT_TREE
        n = _positive(raw, f"{shape} size", m.group(2), MAX_TREE_BUDGET) if m.group(2) else default_n
        rest = rest[1:]
    if shape == "chain":
        branching, depth = 1, n
    else:
        branching, depth = DEFAULT_TREE_BRANCHING, DEFAULT_TREE_DEPTH
    target_tp, draft_tp = 1, 1
    draft_sms = None
    draft_gpu = None
    draft_window = draft_sinks = None
    flags: set[str] = set()
    seen: set[str] = set()
    for opt in rest:
        if opt in _CUDA_FLAGS:
            if opt in flags:
                raise BenchConfigError(f"configuration {raw!r}: option {opt!r} given twice")
            if backend != "cuda":
                raise BenchConfigError(
                    f"configuration {raw!r}: {opt} {_CUDA_FLAGS[opt]}; it needs the cuda backend, not {backend!r}"
                )
            flags.add(opt)
            continue
        if opt == "mk":
            if mode != "auto" or "mk" in flags:
                raise BenchConfigError(
                    f"configuration {raw!r}: mk applies to target-only decoding (target:mk) and to auto's "
                    "target-only rounds (auto:...:mk), once; the draft's is dmk"
                )
            if backend != "cuda":
                raise BenchConfigError(
                    f"configuration {raw!r}: mk runs the CUDA decode megakernel; it needs the cuda backend, "
                    f"not {backend!r}"
                )
            flags.add(opt)
            continue
        m = _OPTION.match(opt)
        if not m:
            raise BenchConfigError(
                f"configuration {raw!r}: bad part {opt!r} (expected chain[N], tree[N], bN, dN, tpN, dtpN, smN, dgN, wN, "
                "wsN, dmma, dmk or hp)"
            )
        key = m.group(1)
        if key in seen:
            raise BenchConfigError(f"configuration {raw!r}: option {key!r} given twice")
        seen.add(key)
        if key == "b":
            branching = _positive(raw, "branching", m.group(2), MAX_TREE_BUDGET)
        elif key == "d":
            depth = _positive(raw, "depth", m.group(2), MAX_TREE_BUDGET)
        elif key == "tp":
            target_tp = _positive(raw, "target TP degree", m.group(2))
        elif key == "sm":
            draft_sms = _positive(raw, "draft SM partition (smN)", m.group(2))
            if backend != "cuda":
                raise BenchConfigError(
                    f"configuration {raw!r}: sm{draft_sms} partitions a GPU's SMs (green contexts); it needs the "
                    f"cuda backend, not {backend!r} (add @cuda or run with --backend cuda)"
                )
        elif key == "dg":
            draft_gpu = int(m.group(2))
            if backend != "cuda":
                raise BenchConfigError(
                    f"configuration {raw!r}: dg{draft_gpu} puts the draft on a GPU; it needs the "
                    f"cuda backend, not {backend!r} (add @cuda or run with --backend cuda)"
                )
        elif key == "w":
            draft_window = _positive(raw, "draft attention window (wN)", m.group(2))
        elif key == "ws":
            draft_sinks = int(m.group(2))
        else:
            draft_tp = _positive(raw, "draft TP degree", m.group(2))
    draft_engine = "mma" if "dmma" in flags else None
    draft_megakernel = "dmk" in flags
    target_megakernel = "mk" in flags
    target_priority = "hp" in flags
    if draft_sinks is not None and draft_window is None:
        raise BenchConfigError(f"configuration {raw!r}: ws{draft_sinks} sets the sinks of a draft window; add wN")
    if draft_window is not None and draft_sinks is None:
        draft_sinks = DEFAULT_WINDOW_SINKS
    if draft_window is not None:
        from swiftspec.placement import backend_problems

        problems = backend_problems({"draft": {"kv_window": [draft_sinks, draft_window]}}, backend)
        if problems:
            raise BenchConfigError(f"configuration {raw!r}: w{draft_window}: {problems[0]}")
    if shape == "chain" and branching != 1:
        raise BenchConfigError(f"configuration {raw!r}: a chain has branching 1; use tree{n}:b{branching}")

    # Canonical name: mode:shapeN, then only the options that differ from the shape's defaults.
    name = f"{mode}:{shape}{n}"
    if shape == "chain":
        if depth != n:
            name += f":d{depth}"
    else:
        if branching != DEFAULT_TREE_BRANCHING:
            name += f":b{branching}"
        if depth != DEFAULT_TREE_DEPTH:
            name += f":d{depth}"
    if target_tp != 1:
        name += f":tp{target_tp}"
    if draft_tp != 1:
        name += f":dtp{draft_tp}"
    if draft_sms is not None:
        name += f":sm{draft_sms}"
    if draft_gpu is not None:
        name += f":dg{draft_gpu}"
    if draft_engine is not None:
        name += ":dmma"
    if draft_megakernel:
        name += ":dmk"
    if target_megakernel:
        name += ":mk"
    if target_priority:
        name += ":hp"
    if draft_window is not None:
        name += f":w{draft_window}" + (f":ws{draft_sinks}" if draft_sinks != DEFAULT_WINDOW_SINKS else "")
    name += suffix
    return BenchConfig(
        name=name,
        engine="swiftspec",
        mode=mode,
        backend=backend,
        tree_budget=n,
        max_depth=depth,
        branching=branching,
        target_tp=target_tp,
        draft_tp=draft_tp,
        shape=shape,
        draft_sms=draft_sms,
        target_priority=target_priority,
        draft_gpu=draft_gpu,
        draft_engine=draft_engine,
        draft_megakernel=draft_megakernel,
        target_megakernel=target_megakernel,
        draft_window=draft_window,
        draft_sinks=draft_sinks,
    )


def engine_key(config: BenchConfig) -> str:
    """Which loaded engine runs ``config``: one per backend, plus one per target TP degree
    (``cuda:tp2``), draft SM partition (``cuda:sm16``: draft in a green context on SMs [0, 16),
    target on the rest), draft GPU (``cuda:dg1``), draft GEMM engine (``cuda:dmma``), decode
    megakernels (``cuda:dmk``, ``cuda:mk``), stream priority (``cuda:hp``) and draft attention window
    (``cpu:w1024``, ``cpu:w1024ws8``)."""
    return (
        config.backend
        + (f":tp{config.target_tp}" if config.target_tp != 1 else "")
        + (f":sm{config.draft_sms}" if config.draft_sms is not None else "")
        + (f":dg{config.draft_gpu}" if config.draft_gpu is not None else "")
        + (":dmma" if config.draft_engine is not None else "")
        + (":dmk" if config.draft_megakernel else "")
        + (":mk" if config.target_megakernel else "")
        + (":hp" if config.target_priority else "")
        + (
            f":w{config.draft_window}"
            + (f"ws{config.draft_sinks}" if config.draft_sinks != DEFAULT_WINDOW_SINKS else "")
            if config.draft_window is not None
            else ""
        )
    )


#: Stream priority asked for by ``hp`` (CUDA clamps it to the device's highest priority).
HIGHEST_STREAM_PRIORITY = -1000


def engine_placement(config: BenchConfig) -> dict | None:
    """The placement (``swiftspec.placement``) of ``config``'s ``smN`` (draft on logical SMs
    [0, N), target on [N, last]), ``hp`` (the target's stream at the highest priority), ``dgN``
    (the draft on GPU N, the target on GPUs 0..tp-1), ``dmma`` (the draft's GEMM engine),
    ``dmk`` / ``mk`` (the draft's / target's decode megakernel), ``tpN`` (the target group's
    TP degree) and ``wN`` (the draft's attention window, ``kv_window``); None when none is asked for."""
    draft_sms, target_priority, draft_gpu = config.draft_sms, config.target_priority, config.draft_gpu
    target_tp = config.target_tp
    if (
        draft_sms is None
        and not target_priority
        and draft_gpu is None
        and target_tp == 1
        and config.draft_engine is None
        and not config.draft_megakernel
        and not config.target_megakernel
        and config.draft_window is None
    ):
        return None
    p: dict = {"draft": {}, "target": {}}
    if config.draft_engine is not None:
        p["draft"]["gemm_engine"] = config.draft_engine
    if config.draft_megakernel:
        p["draft"]["megakernel"] = True
    if config.target_megakernel:
        p["target"]["megakernel"] = True
    if target_tp != 1:
        p["target"]["tp"] = target_tp
    if config.draft_window is not None:
        p["draft"]["kv_window"] = [config.draft_sinks, config.draft_window]
    if draft_gpu is not None:
        p["draft"]["devices"] = [draft_gpu]
        p["target"]["devices"] = list(range(target_tp))
    if draft_sms is not None:
        p["draft"]["sm_partition"] = [0, draft_sms]
        p["target"]["sm_partition"] = [draft_sms, 0]
    if target_priority:
        p["target"]["stream_priority"] = HIGHEST_STREAM_PRIORITY
    return p


def find_baseline(config: BenchConfig, configs: list[BenchConfig]) -> BenchConfig | None:
    """The target-only configuration ``config``'s speedup is taken against: swiftspec ``target``
    on the same backend for swiftspec configurations (the one with the same target TP degree if
    the run has it, else the first), ``hf:target`` for HF peers, ``llamacpp:target`` for llama.cpp
    peers; None if the run has none or
    ``config`` is itself target-only. Outputs are checked only against a baseline of the same
    TP degree (runner.reference_config): TP changes the reduction order."""
    if config.mode == "target":
        return None
    refs = [c for c in configs if c.engine == config.engine and c.mode == "target" and c.backend == config.backend]
    refs.sort(key=lambda c: c.target_megakernel)  # the exact (layered) target first
    same_tp = [c for c in refs if c.target_tp == config.target_tp]
    return (same_tp or refs)[0] if same_tp or refs else None


def parse_config_list(text: str, default_backend: str = "cpu", peers: str | None = None) -> list[BenchConfig]:
    """Parse ``--configs`` (comma-separated) plus ``--peers`` (comma-separated: "hf" adds
    hf:target and hf:assisted, "llamacpp" llamacpp:target and llamacpp:assisted; "none" or None
    adds nothing). Duplicates (same canonical name) are dropped, order is kept. Raises
    :class:`BenchConfigError` for an empty list or a bad token."""
    tokens = [t for t in (text or "").split(",")]
    if not any(t.strip() for t in tokens):
        raise BenchConfigError("--configs is empty: give at least one configuration, e.g. target,serial:tree16")
    configs: list[BenchConfig] = []
    for t in tokens:
        if not t.strip():
            raise BenchConfigError(f"--configs {text!r} has an empty entry")
        configs.append(parse_config(t, default_backend))
    for peer in (p.strip() for p in (peers or "").split(",") if p.strip()):
        if peer == "none":
            continue
        if peer not in PEERS:
            raise BenchConfigError(f"unknown peer {peer!r} in --peers (expected hf, llamacpp or none)")
        configs += [parse_config(m, default_backend) for m in PEERS[peer]]
    unique: dict[str, BenchConfig] = {}
    for c in configs:
        unique.setdefault(c.name, c)
    return list(unique.values())


#: Weight dtypes of a run (``--dtype``): the dtype of the converted checkpoints, and of the target
#: checkpoint recorded in ``settings.dtype``. int4 runs on swiftspec's cpu backend, and on its cuda
#: backend without the decode megakernel and with tp 1.
DTYPES = ("bfloat16", "float32", "int4")


def check_dtype(dtype: str, configs: list[BenchConfig], flag: str = "dtype") -> None:
    """Checks a run's weight dtype against its configurations, before anything is loaded.

    Args:
        dtype: "bfloat16", "float32" or "int4" (W4A16, group size 32 from a GGUF).
        configs: the run's configurations (:func:`parse_config_list`).
        flag: how messages name the option (the CLI passes "--dtype").

    Raises:
        BenchConfigError: (one line) an unknown dtype; int4 with a configuration the cuda backend
            cannot run int4 with (``mk``, ``dmk``: the decode megakernel; ``tp2``...: tensor
            parallelism; the runtime's rule, ``int4_backend_problem``); int4 with an HF peer (``hf:*``): HF
            transformers cannot load swiftspec's int4 checkpoints (packed 4-bit projections), and
            peers run in bf16 instead would decode other weights, so their speedups and output
            checks against the int4 configurations would mix the quantization with the engine.
    """
    if dtype not in DTYPES:
        raise BenchConfigError(f"{flag} must be bfloat16, float32 or int4, got {dtype!r}")
    if dtype != "int4":
        return
    from swiftspec import swiftspec_core as core

    for c in configs:
        if c.engine != "swiftspec":
            continue
        groups = [("target", c.target_megakernel, c.target_tp)]
        if c.mode != "target":
            groups.append(("draft", c.draft_megakernel, c.draft_tp or 1))
        for group, megakernel, tp in groups:
            problem = core.int4_backend_problem(c.backend, megakernel, tp)
            if problem:
                raise BenchConfigError(
                    f"{flag} int4: configuration {c.name} runs its {group} on {c.backend} with {problem}"
                )
    hf = [c.name for c in configs if c.engine == "hf"]
    if hf:
        raise BenchConfigError(
            f"{flag} int4: the HF transformers peers ({', '.join(hf)}) cannot load swiftspec's int4 "
            f"checkpoints (packed 4-bit projections); drop --peers hf, or measure the peers in a "
            f"run of their own with --dtype bfloat16"
        )


def check_sampling(
    temperature=0.0,
    top_p=1.0,
    top_k=0,
    seed=0,
    *,
    num_prompts: int = 1,
    names: dict[str, str] | None = None,
    given: list[str] | None = None,
) -> dict | None:
    """Validates the decoding settings of a run; returns its ``settings.sampling`` block
    ``{"temperature", "top_p", "top_k", "seed"}`` (Python numbers), or None for greedy decoding
    (temperature 0).

    The values are checked as :meth:`swiftspec.Engine.generate` checks them
    (:func:`swiftspec.sampling_params.check_sampling_params`, with messages that state each
    option's range and "off" value). Request ``i`` of a data set samples with seed ``seed + i``
    (``i`` the prompt index), so ``seed + num_prompts - 1`` must fit in 64 bits.

    Args:
        names: how messages name each option (default the field names; the CLI passes its flags).
        given: the sampling options the caller set explicitly (the CLI: flags on the command line);
            default: those whose value differs from greedy decoding's (``SAMPLING_DEFAULTS``).

    Raises:
        BenchConfigError: (one line naming the option and the value) temperature negative, NaN,
            infinite, beyond float32 or below its smallest normal number (but not 0); top_p outside
            (0, 1]; top_k or seed negative or not an integer; top_k beyond 32 bits; seed + prompt
            index beyond 64 bits; top_p / top_k / seed given under greedy decoding (temperature 0),
            where they have no effect.
    """
    values = check_sampling_params(
        temperature,
        top_p,
        top_k,
        seed,
        names=names,
        explain=True,
        seeds=max(1, num_prompts),
        seed_note="request i of a data set samples with seed + i",
        error=BenchConfigError,
    )
    if values["temperature"] == 0:
        check_unused_under_greedy(values, given, names=names, error=BenchConfigError)
        return None
    return values


def describe_sampling(sampling: dict | None) -> str:
    """One phrase for reports: "greedy", or the sampling settings."""
    if not sampling:
        return "greedy"
    return (
        f"sampled (temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}, top-k "
        f"{sampling['top_k'] or 'off'}, seed {sampling['seed']} + prompt index)"
    )


def check_llamacpp_decoding(sampling: dict | None, configs: list[BenchConfig]) -> None:
    """Raises :class:`BenchConfigError` if a llama.cpp peer is asked to sample (``sampling`` not
    None): the peer runs greedy decoding only (llama.cpp's sampler and its speculative acceptance of
    sampled drafts are not swiftspec's, so sampled runs would not measure the same thing)."""
    names = [c.name for c in configs if c.engine == "llamacpp"]
    if sampling and names:
        raise BenchConfigError(
            f"the llama.cpp peers ({', '.join(names)}) run greedy decoding only; drop --peers llamacpp or --temperature"
        )
