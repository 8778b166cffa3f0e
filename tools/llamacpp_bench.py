#!/usr/bin/env python3
"""llama.cpp's long-context numbers (issue 27): decode speed at depth and prefill speed of a GGUF
model, from ``llama-bench`` of the llama-cpp-python 0.3.36 sdist's llama.cpp (built once and cached:
swiftspec.bench.llamacpp_build).

    python3 tools/llamacpp_bench.py --backend cuda --out results/llamacpp-long
    # = llama-bench -m TARGET.gguf -p 0 -n 128 -d 0,4096,16384,32768 -ngl 99 -fa 1 -o json
    #   llama-bench -m TARGET.gguf -p 512,4096,16384 -n 0 -ngl 99 -fa 1 -o json

writes OUT/llamacpp_long_context.json (the compact table plus llama-bench's own records) and
OUT/llamacpp_long_context.md, and prints the Markdown table. --model defaults to the reference
target (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M), fetched if needed. Without network (the GPU machine)
give the sdist with --sdist or $SWIFTSPEC_LLAMACPP_SDIST; to carry it there,

    python3 tools/llamacpp_bench.py --pack-source llama-src.tar.gz   # ~7 MB, where pip works
    # there: tar xzf llama-src.tar.gz && export SWIFTSPEC_LLAMACPP_SDIST=$PWD/llama_cpp_python-0.3.36

Exit status 2 with one line for bad input, a failed build or a failed llama-bench run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _cli import import_swiftspec, run

import_swiftspec()


def _int_list(text: str, name: str, allow_empty: bool = False) -> list[int]:
    from swiftspec.bench.peers_llamacpp import LlamaCppPeerError

    if allow_empty and text.strip() in ("", "none"):
        return []
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise LlamaCppPeerError(f"{name} must be comma-separated integers, got {text!r}") from None


def main() -> int:
    from swiftspec.bench import peers_llamacpp as lc
    from swiftspec.bench.llamacpp_build import ensure_llamacpp
    from swiftspec.bench.peers_llamacpp import LlamaCppPeerError
    from swiftspec.fetch import DEFAULT_PAIR, REFERENCE_MODELS, fetch_model

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--model",
        default=DEFAULT_PAIR["target"],
        help=f"GGUF file or reference model name (default {DEFAULT_PAIR['target']})",
    )
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"), help="llama.cpp build (cuda: -ngl 99)")
    p.add_argument(
        "--depths",
        default=",".join(map(str, lc.DECODE_DEPTHS)),
        help="decode tests: context tokens before the generated ones (llama-bench -d)",
    )
    p.add_argument("--n-gen", default="128", help="tokens generated per decode test (llama-bench -n)")
    p.add_argument(
        "--prefill",
        default=",".join(map(str, lc.PREFILL_TOKENS)),
        help="prefill tests: prompt lengths (llama-bench -p; 'none': no prefill test)",
    )
    p.add_argument("--threads", default="0", help="CPU threads (0: llama-bench's default)")
    p.add_argument("--repetitions", default="5", help="llama-bench -r: repetitions of each test")
    p.add_argument("--timeout", default="1800", help="seconds per llama-bench run")
    p.add_argument("--sdist", help="local llama-cpp-python 0.3.36 sdist (.tar.gz or unpacked folder)")
    p.add_argument("--jobs", default="0", help="build jobs (0: all usable CPUs)")
    p.add_argument("--out", help="output folder (default: print only)")
    p.add_argument(
        "--pack-source",
        metavar="FILE.tar.gz",
        help="only write the part of the sdist the build reads (~7 MB) into FILE.tar.gz and exit",
    )
    args = p.parse_args()
    if args.pack_source:
        from swiftspec.bench.llamacpp_build import pack_source

        path = pack_source(args.pack_source, sdist=args.sdist)
        print(
            f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): unpack it and point $SWIFTSPEC_LLAMACPP_SDIST at "
            f"the llama_cpp_python-0.3.36 folder"
        )
        return 0

    def number(name: str, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise LlamaCppPeerError(f"{name} must be an integer, got {text!r}") from None

    depths = _int_list(args.depths, "--depths")
    prefill = _int_list(args.prefill, "--prefill", allow_empty=True)
    model = Path(fetch_model(args.model)) if args.model in REFERENCE_MODELS else Path(args.model)
    if not model.is_file():
        raise LlamaCppPeerError(
            f"--model {args.model}: no such GGUF file (and not a reference model name: "
            f"{', '.join(sorted(REFERENCE_MODELS))})"
        )
    build = ensure_llamacpp(args.backend, sdist=args.sdist, jobs=number("--jobs", args.jobs) or None)
    result = lc.long_context_bench(
        build,
        model,
        decode_depths=depths,
        n_gen=number("--n-gen", args.n_gen),
        prefill_tokens=prefill,
        threads=number("--threads", args.threads),
        repetitions=number("--repetitions", args.repetitions),
        timeout_s=number("--timeout", args.timeout),
    )
    md = lc.long_context_markdown(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "llamacpp_long_context.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "llamacpp_long_context.md").write_text(md)
        print(f"wrote {out / 'llamacpp_long_context.json'} and .md", file=sys.stderr)
    print(md)
    return 0


if __name__ == "__main__":
    run(main)
