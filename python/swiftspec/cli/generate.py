"""`swiftspec generate`: decode one prompt and stream the answer."""

from __future__ import annotations

import argparse
import json
import sys

from swiftspec.cli.engine_options import add_decode_options, add_model_options, check_engine_options, load_engine
from swiftspec.result import describe_auto_rounds


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text for one prompt",
        description="Generate text. With no --target/--draft it uses the reference pair "
        "(Qwen2.5-Coder 1.5B target, 0.5B draft), fetched and converted on first use.",
    )
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin when omitted or '-')")
    add_model_options(p)
    p.add_argument("--raw", action="store_true", help="send the prompt as raw text, without the chat template")
    p.add_argument("--system", help="a system message for the chat template")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new tokens at most (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    # None: not given (set to the defaults by check_options, which refuses them under greedy decoding)
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="sample from the k most likely tokens (default 0: all); needs --temperature > 0",
    )
    p.add_argument(
        "--top-p", type=float, default=None, help="nucleus sampling mass (default 1.0: all); needs --temperature > 0"
    )
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default 0); needs --temperature > 0")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_decode_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (text, ids, timing) instead of text")
    p.set_defaults(run=run)


def check_options(args: argparse.Namespace) -> None:
    """Range checks named by their flags, before any model is loaded; sets the sampling options
    not given to their defaults. Raises InvalidRequestError, e.g. for --top-p / --top-k / --seed
    without --temperature > 0 (greedy decoding: they would have no effect), as swiftspec bench does.
    (The engine checks the same again, and what depends on the models: the default context, the tree KV.)"""
    from swiftspec.errors import InvalidRequestError
    from swiftspec.sampling_params import SAMPLING_DEFAULTS, check_sampling_params, check_unused_under_greedy

    if args.max_new_tokens < 1:
        raise InvalidRequestError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    check_engine_options(args)
    given = [k for k in ("top_p", "top_k", "seed") if getattr(args, k) is not None]
    for k in ("top_p", "top_k", "seed"):
        if getattr(args, k) is None:
            setattr(args, k, SAMPLING_DEFAULTS[k])
    names = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "seed": "--seed"}
    values = check_sampling_params(args.temperature, args.top_p, args.top_k, args.seed, names=names)
    check_unused_under_greedy(values, given, names=names)
    for stop in args.stop:
        if not stop:  # (the engine refuses it too, but only once the models are loaded)
            raise InvalidRequestError("--stop must be a non-empty string, got ''")
    # An explicit context is known before loading; the default one only once the models are
    # loaded (their trained length, bounded by free memory): the engine checks it then.
    if args.max_context is not None and args.max_new_tokens >= args.max_context:
        raise InvalidRequestError(
            f"--max-new-tokens {args.max_new_tokens} does not fit in --max-context "
            f"{args.max_context} (the prompt needs room too): raise --max-context"
        )


def run(args: argparse.Namespace) -> int:
    from swiftspec.errors import InvalidRequestError

    check_options(args)
    prompt = args.prompt
    if prompt is None or prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise InvalidRequestError("the prompt is empty: give it as an argument or on stdin")
    engine = load_engine(args)
    if args.raw:
        request = prompt
    else:
        request = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": prompt}
        ]
    stream_to_stdout = not args.json
    line_open = False  # the streamed text so far does not end with a newline

    def on_text(delta: str):
        nonlocal line_open
        sys.stdout.write(delta)
        sys.stdout.flush()
        if delta:
            line_open = not delta.endswith("\n")

    try:
        result = engine.generate(
            request,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop=args.stop,
            mode=args.mode,
            tree_budget=args.tree_budget,
            max_depth=args.max_depth,
            branching=args.branching,
            on_text=on_text if stream_to_stdout else None,
        )
    except KeyboardInterrupt:  # "interrupted" goes on a line of its own, not after the streamed text
        if line_open:
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    if args.json:
        print(
            json.dumps(
                {
                    "text": result.text,
                    "token_ids": result.token_ids,
                    "prompt_tokens": len(result.prompt_token_ids),
                    "finish_reason": result.finish_reason,
                    "ttft_s": result.ttft_s,
                    "tokens_per_s": result.tokens_per_s,
                    "stats": result.stats,
                    "report": result.report,
                }
            )
        )
    else:
        print()
        s = result.stats
        speculative = s.get("draft_steps", 0) > 0  # a draft proposed tokens
        print(
            f"[swiftspec] {len(result.token_ids)} tokens, finish={result.finish_reason}, "
            f"TTFT {result.ttft_s * 1000:.0f} ms, {result.tokens_per_s:.2f} tok/s"
            + (f", acceptance length {s.get('acceptance_length', 0):.2f}" if speculative else ""),
            file=sys.stderr,
        )
        rounds = describe_auto_rounds(result.report)
        if rounds:
            print(f"[swiftspec] {rounds}", file=sys.stderr)
    return 0
