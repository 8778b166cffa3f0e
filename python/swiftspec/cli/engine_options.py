"""The options that say which models an engine loads and how it decodes, shared by the
subcommands that load one (``swiftspec generate``, ``swiftspec serve``): one parser, one set of
checks, one loader, so the two take the same command lines and refuse the same mistakes.

    add_model_options(p)    --target, --draft, --no-draft
    add_decode_options(p)   --mode, --tree-budget, --max-depth, --branching, --backend, --dtype,
                            --threads, --max-context, --placement
    check_engine_options(args)  range checks and --placement, before anything is loaded
    load_engine(args)           the Engine those options describe
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings


def add_model_options(p: argparse.ArgumentParser) -> None:
    """--target, --draft, --no-draft (the models; default: the reference pair)."""
    p.add_argument(
        "--target",
        help="target model: checkpoint folder, GGUF file, HF folder, reference name, or "
        "Hugging Face model id (org/name, org/name@revision)",
    )
    p.add_argument("--draft", help="draft model (same kinds); enables speculative decoding")
    p.add_argument(
        "--no-draft",
        action="store_true",
        help="target-only decoding with the reference target (a --target without --draft is target-only already)",
    )


def add_decode_options(p: argparse.ArgumentParser) -> None:
    """--mode and the token tree's shape; where and how the models run."""
    from swiftspec.swiftspec_core import DECODE_MODES

    p.add_argument(
        "--mode",
        choices=list(DECODE_MODES),
        help="decode mode (default: auto: per round, target-only decoding or a token tree of the budget "
        "(at most --tree-budget) that the measured pass times and acceptance favour; target-only without "
        "a draft); 'target' does not load the reference draft; 'serial' always speculates; 'async' runs "
        "the draft and the target concurrently, e.g. on the cores that --placement gives each",
    )
    p.add_argument("--tree-budget", type=int, default=16, help="token-tree nodes verified per target step (default 16)")
    p.add_argument("--max-depth", type=int, default=8, help="depth limit of the token tree (default 8)")
    p.add_argument("--branching", type=int, default=2, help="children per expanded node (1 = chain; default 2)")
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float32", "int4"],
        help="weight dtype when converting a GGUF/HF model or a reference model (int4: 4-bit projections, "
        "group size 32 from a GGUF file, 128 from an HF folder; on cuda without the megakernel and with "
        "tp 1; a converted folder keeps its own dtype)",
    )
    p.add_argument("--threads", type=int, default=0, help="CPU threads per model (0: all cores)")
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="tokens of KV cache per model: prompt + new tokens must fit; at most the model's "
        "max_position_embeddings (default 4096, or that limit when smaller)",
    )
    p.add_argument(
        "--placement",
        metavar="JSON|FILE|auto",
        help="where the draft and target groups run and with which options (swiftspec.placement): "
        "JSON text, a JSON file or 'auto'. Per group: tp, cores (one list per rank), "
        "threads_per_rank; cuda only: devices, sm_partition, stream_priority, gemm_engine, "
        'megakernel. E.g. cpu \'{"target": {"cores": [[0, 1]]}}\', cuda '
        '\'{"target": {"megakernel": true}}\' (target-only decoding with the decode megakernel)',
    )


def check_engine_options(args: argparse.Namespace) -> None:
    """Range checks of the decode options, named by their flags, and --placement normalized
    (``args.placement`` becomes its dict), before any model is loaded.

    Raises:
        InvalidRequestError: e.g. "--tree-budget must be >= 1, got 0", --no-draft with --draft,
            a --placement that does not parse, cuda-only placement fields on the cpu backend, a
            placement field the backend does not implement (a draft kv_window on cuda), or
            --dtype int4 on cuda with a placement the cuda backend cannot run int4 with (the decode
            megakernel, tp > 1).
    """
    from swiftspec.errors import InvalidRequestError, SwiftspecError
    from swiftspec.placement import backend_problems, cuda_only_fields, int4_problems, normalize

    at_least = {
        "--tree-budget": (args.tree_budget, 1),
        "--max-depth": (args.max_depth, 1),
        "--branching": (args.branching, 1),
        "--threads": (args.threads, 0),
        "--max-context": (args.max_context, 1),
    }
    for flag, (value, low) in at_least.items():
        if value is not None and value < low:
            raise InvalidRequestError(f"{flag} must be >= {low}, got {value}")
    if args.no_draft and args.draft is not None:  # (the draft was loaded and used, --no-draft ignored)
        raise InvalidRequestError("--no-draft and --draft contradict each other: give one of them")
    if args.placement is not None:
        try:
            args.placement = normalize(args.placement)
        except (SwiftspecError, ValueError) as exc:  # cores and devices are checked again at load
            raise InvalidRequestError(f"--placement: {exc}") from None
        cuda_only = cuda_only_fields(args.placement)
        if args.backend != "cuda" and cuda_only:
            raise InvalidRequestError(
                f"--placement: {', '.join(cuda_only)} applies to the cuda backend only "
                f"(add --backend cuda; on the {args.backend} backend place groups with "
                "'cores' and 'threads_per_rank')"
            )
        problems = backend_problems(args.placement, args.backend)
        if problems:
            raise InvalidRequestError(f"--placement: {problems[0]}")
    if args.dtype == "int4":  # (else the models are converted, then refused)
        problems = int4_problems(args.placement, args.backend)
        if problems:
            raise InvalidRequestError(f"--dtype int4: {problems[0]}")


def load_engine(args: argparse.Namespace):
    """The Engine the options describe (after :func:`check_engine_options`): the reference target
    unless --target; the reference draft only when it would be used (no --target, no --no-draft,
    --mode not 'target'). Reports what it loads, a placed draft group without a draft, and a
    default context that the free memory capped (the engine's ``context_note``), on stderr as
    ``[swiftspec] ...``.

    Raises:
        CheckpointError, InvalidRequestError: from :class:`swiftspec.Engine` (a missing model, a
            context beyond the model's, not enough memory).
    """
    from swiftspec import engine as engine_module  # looked up now: tests replace Engine
    from swiftspec.engine_loading import DRAFT_GROUP_IGNORED
    from swiftspec.fetch import DEFAULT_PAIR

    target = args.target or DEFAULT_PAIR["target"]
    draft = args.draft
    if draft is None and args.target is None and not args.no_draft and args.mode != "target":
        draft = DEFAULT_PAIR["draft"]  # (target-only decoding never uses it: not loaded)
    if args.placement is not None and draft is None:
        from swiftspec.placement import is_default_group

        if not is_default_group(args.placement["draft"]):
            print("[swiftspec] --placement: the draft group is ignored: no draft model is loaded", file=sys.stderr)
    weights = "" if args.dtype == "bfloat16" else f" ({args.dtype} weights where converted)"
    print(f"[swiftspec] loading target {target}" + (f" and draft {draft}" if draft else "") + weights, file=sys.stderr)
    with warnings.catch_warnings():  # (the notice above says it in the CLI's words)
        warnings.filterwarnings("ignore", message=re.escape(DRAFT_GROUP_IGNORED))
        engine = engine_module.Engine(
            target,
            draft,
            backend=args.backend,
            dtype=args.dtype,
            num_threads=args.threads,
            max_context=args.max_context,
            placement=args.placement,
        )
    note = getattr(engine, "context_note", "")  # (tests replace Engine)
    if note:
        print(f"[swiftspec] {note}", file=sys.stderr)
    return engine
