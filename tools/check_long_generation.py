#!/usr/bin/env python3
"""Host time per token of a long generation (issue 27, "long answers").

Decodes ``--max-new-tokens`` tokens (default 16384) greedily with the reference target alone,
past any end-of-sequence token (no stop tokens: the runtime's generate with an empty stop
list), streaming the tokens through :class:`swiftspec.text_stream.TextStream` as the engine
does, and measures per window of ``--window`` tokens (default 1000): wall time per token,
this process's CPU time per token (the host: the runtime's loop, the binding, Python), and
the time spent turning tokens into text. Work that grows with the output (re-decoding it,
re-searching it for stop strings) shows as a last window slower than the first.

    python3 tools/check_long_generation.py --backend cuda --max-new-tokens 16384 --json out.json
    python3 tools/check_long_generation.py --max-new-tokens 3000 --window 500     # the CPU backend

Writes the windows and the first / last ratios as JSON (--json) and prints a table. The wall
time per token grows with the context on any backend (each step reads more keys); the host CPU
time and the text time should not. With a GPU the host also waits for it in
cudaStreamSynchronize, which spins: read the text time and the wall time against the device's
own step time.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from _cli import import_swiftspec, run

import_swiftspec()


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    from swiftspec import swiftspec_core as core
    from swiftspec.errors import InvalidRequestError
    from swiftspec.fetch import DEFAULT_PAIR, ensure_checkpoint
    from swiftspec.text_stream import TextStream
    from swiftspec.tokenizer import Tokenizer

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=16384)
    p.add_argument("--window", type=int, default=1000, help="tokens per measured window (default 1000)")
    p.add_argument("--prompt", default="Write a long, detailed tutorial on writing an inference engine in C++.")
    p.add_argument("--json", default=None, help="write the windows here")
    a = p.parse_args()
    if a.max_new_tokens < 2 * a.window or a.window < 1:
        raise InvalidRequestError(
            f"--max-new-tokens ({a.max_new_tokens}) must hold two --window ({a.window}) "
            "windows, and --window must be >= 1"
        )

    tdir = ensure_checkpoint(DEFAULT_PAIR["target"], a.dtype, progress=False)
    tok = Tokenizer.from_checkpoint(tdir)
    prompt_ids = tok.encode_chat([{"role": "user", "content": a.prompt}])
    opts = core.ModelOptions()
    opts.max_context = len(prompt_ids) + a.max_new_tokens + 8
    engine = core.Engine(core.load_model(str(tdir), a.backend, opts), None)

    stream = TextStream(tok)
    marks: list[tuple[int, float, float, float]] = []  # (tokens so far, wall, cpu, text seconds so far)
    state = {"n": 0, "text_s": 0.0}

    def on_tokens(ids) -> bool:
        t0 = time.perf_counter()
        stream.push(list(ids))
        state["text_s"] += time.perf_counter() - t0
        state["n"] += len(ids)
        marks.append((state["n"], time.perf_counter(), _cpu_s(), state["text_s"]))
        return True

    marks.append((0, time.perf_counter(), _cpu_s(), 0.0))
    out = engine.generate(
        prompt_ids,
        mode="target",
        max_new_tokens=a.max_new_tokens,
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        seed=0,
        stop_token_ids=[],
        tree_budget=16,
        max_depth=8,
        branching=2,
        on_tokens=on_tokens,
        cancel_check=None,
    )
    n = len(out["tokens"])
    # The first mark is the prompt's prefill; windows start at the first token.
    first = marks[1]
    windows = []
    start = first
    for m in marks[2:]:
        if m[0] - start[0] >= a.window or m is marks[-1]:
            k = m[0] - start[0]
            windows.append(
                {
                    "from_token": start[0],
                    "tokens": k,
                    "wall_ms_per_token": 1e3 * (m[1] - start[1]) / k,
                    "cpu_ms_per_token": 1e3 * (m[2] - start[2]) / k,
                    "text_us_per_token": 1e6 * (m[3] - start[3]) / k,
                }
            )
            start = m
    w0, w1 = windows[0], windows[-1] if windows[-1]["tokens"] >= a.window // 2 else windows[-2]
    ratios = {
        key: w1[key] / w0[key] if w0[key] > 0 else None
        for key in ("wall_ms_per_token", "cpu_ms_per_token", "text_us_per_token")
    }
    result = {
        "backend": a.backend,
        "dtype": a.dtype,
        "prompt_tokens": len(prompt_ids),
        "new_tokens": n,
        "window": a.window,
        "windows": windows,
        "last_over_first": ratios,
    }
    print(f"{'from':>7} {'tokens':>7} {'wall ms/tok':>12} {'cpu ms/tok':>11} {'text us/tok':>12}")
    for w in windows:
        print(
            f"{w['from_token']:7d} {w['tokens']:7d} {w['wall_ms_per_token']:12.4f} {w['cpu_ms_per_token']:11.4f} "
            f"{w['text_us_per_token']:12.2f}"
        )
    print("last / first window: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items() if v is not None))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run(main)
