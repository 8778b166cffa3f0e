"""The JSON schema of a ``swiftspec bench`` result file (``bench.json``), and its validator.

This module is the schema's documentation: every field carries a ``description`` with its
unit. Print it with ``swiftspec bench --print-schema``. Times are seconds, rates tokens per
second. Definitions used throughout (the same for swiftspec and the HF and llama.cpp peers):

* **TTFT** (``ttft_s``): from the start of the request (prompt ids ready) to the first emitted
  new token(s): prefill plus the first sample (the HF peers: first ``streamer.put`` of new
  tokens; assisted generation may emit several tokens at once there; the llama.cpp peers: from
  the last echoed prompt token to the first new token, by llama.cpp's own log clock, see
  ``settings.llamacpp``).
* **prefill tokens/s** (``prefill_tokens_per_s``): prompt_tokens / ttft_s, the rate at which the
  prompt was taken in (TTFT holds the first sample too, so short prompts understate it).
* **first emission** (``first_emission_tokens``): tokens emitted together at TTFT (1 for
  swiftspec, whose prefill yields exactly one token).
* **decode** (``decode_s``): from the first emission to the last token.
* **tokens/s** (``tokens_per_s``): (new_tokens - first_emission_tokens) / decode_s; **TPOT**
  (``tpot_s``) is its inverse. Both null if fewer than 2 tokens were emitted.
* **verification steps**: target forward passes after the first emission.
* **acceptance length**: (new_tokens - first_emission_tokens) / verification_steps, the mean
  tokens committed per target verification (1 for target-only; null without verification).
* **speedup**: baseline TPOT / this TPOT on the same prompt, where the baseline is target-only
  decoding of the same engine and backend (swiftspec ``target``, or ``hf:target`` /
  ``llamacpp:target`` for peers).

**The llama.cpp peers** (``engine`` "llamacpp": ``llamacpp:target`` is ``llama-completion``,
``llamacpp:assisted`` is ``llama-speculative-simple --spec-type draft-simple``) run the GGUF files'
own quantized weights (the reference target: Q4_K_M), not ``settings.dtype``; their times come
from llama.cpp's log timestamps, their token ids from the pieces llama.cpp prints
(``settings.llamacpp``; :mod:`swiftspec.bench.peers_llamacpp`).
* **latency** (``latency_s``): ttft_s + decode_s, the whole answer; **latency speedup**: baseline
  latency / this latency, only where both produced the same number of tokens (else null). It
  credits what TPOT cannot see, e.g. HF assisted generation emitting many tokens at once at TTFT.

**Decoding** (``settings.decoding``): "greedy" (the default; documents without the field are
greedy), or "sampled" with ``settings.sampling`` = {temperature, top_p, top_k, seed}: every
configuration samples, the request of prompt index i with seed ``seed + i``. Speculative sampling
is lossless in distribution, not per seed, so a sampled run compares no outputs per request
(``matches_reference`` null, no divergences, ``outputs_checked`` 0); speedups and acceptance
lengths are measured as under greedy decoding.

**Long-context workloads** (``--context-tokens 512,4096,...``, ``settings.context_tokens``): for each
N a data set ``ctxN`` whose prompts are exactly N tokens of real code (HumanEval problems as files,
then an instruction asking for a long answer; ``swiftspec.bench.long_context``), measured, checked
and aggregated like the prompt sets.

A document made by ``swiftspec bench --merge DIR,DIR,...`` (several runs on one machine, e.g.
the slow HF peers as detached parts, combined as if they were one run) has a ``merge`` block
naming its parts; its speedups, output checks and aggregates are computed over the union of the
parts' rows, so a configuration's baseline or reference may come from another part. Documents
without ``merge`` are single runs.

Bump :data:`SCHEMA_VERSION` on any incompatible change.
"""

from __future__ import annotations

import copy
from typing import Any

SCHEMA_VERSION = 2

_NUM = {"type": "number"}
_NNUM = {"type": ["number", "null"]}
_NINT = {"type": ["integer", "null"]}
_NSTR = {"type": ["string", "null"]}

#: The largest value a request row's measured numbers may hold (seconds, tokens, steps, tokens per
#: second): 1e12 s is over 30000 years, 1e12 tokens beyond any run. A larger finite value (an edited
#: file: 1e308) would overflow the sums, means and ratios computed from the rows into Infinity,
#: which is not JSON.
MAX_MEASURED = 1e12
#: The smallest positive time per output token and latency of a row, s (a picosecond, far below
#: any clock's resolution): they divide the speedups, which a smaller one (1e-308) overflows.
MIN_DIVISOR_S = 1e-12
_MEASURED = {"maximum": MAX_MEASURED}
#: The largest token id a request row may hold: the engine's token ids are int32. A larger one
#: (an edited file: 2**40) is no token of any vocabulary; the tokenizer refuses to decode it.
MAX_TOKEN_ID = 2**31 - 1


def _stats(desc: str) -> dict:
    return {
        "description": f"{desc}; null when no request had a value",
        "type": ["object", "null"],
        "required": ["n", "mean", "p50", "p95", "min", "max"],
        "additionalProperties": False,
        "properties": {
            "n": {"type": "integer", "minimum": 1, "description": "values summarized"},
            "mean": _NUM,
            "p50": _NUM,
            "p95": _NUM,
            "min": _NUM,
            "max": _NUM,
        },
    }


_SAMPLING = {
    "type": ["object", "null"],
    "description": "sampled decoding's settings (null under greedy decoding), the same for swiftspec "
    "(Engine.generate) and the HF peers (do_sample=True)",
    "required": ["temperature", "top_p", "top_k", "seed"],
    "additionalProperties": False,
    "properties": {
        "temperature": {"type": "number", "exclusiveMinimum": 0, "description": "softmax temperature"},
        "top_p": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "description": "nucleus: the smallest set of tokens reaching this probability (1: off)",
        },
        "top_k": {"type": "integer", "minimum": 0, "description": "the k most likely tokens (0: off)"},
        "seed": {
            "type": "integer",
            "minimum": 0,
            "description": "the request of prompt index i samples with seed + i (swiftspec: "
            "Engine.generate(seed=...); HF: torch.manual_seed before generate)",
        },
    },
}

_CONFIG = {
    "type": "object",
    "description": "one configuration (grammar: swiftspec.bench.config)",
    "required": [
        "name",
        "engine",
        "mode",
        "backend",
        "tree_budget",
        "max_depth",
        "branching",
        "target_tp",
        "draft_tp",
        "shape",
        "speculative",
        "baseline",
        "reference",
        "status",
        "error",
    ],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "description": "canonical name, e.g. serial:tree16"},
        "engine": {
            "enum": ["swiftspec", "hf", "llamacpp"],
            "description": "llamacpp: llama.cpp on the GGUF files' quantized weights (settings.llamacpp)",
        },
        "mode": {"enum": ["target", "serial", "async", "auto", "assisted"]},
        "backend": {"enum": ["cpu", "cuda"]},
        "tree_budget": {**_NINT, "description": "draft nodes verified per target step"},
        "max_depth": {**_NINT, "description": "depth limit of the token tree"},
        "branching": {**_NINT, "description": "children per expanded node (1 = chain)"},
        "target_tp": {"type": "integer", "minimum": 1, "description": "TP degree of the target group"},
        "draft_tp": {**_NINT, "description": "TP degree of the draft group"},
        "draft_sms": {
            **_NINT,
            "description": "one-GPU disaggregation: SMs of the draft group's green-context "
            "partition [0, N), the target on the rest; null: both models on "
            "all SMs (plain streams)",
        },
        "draft_gpu": {
            **_NINT,
            "description": "the draft group's GPU (dgN; the target on GPU 0); null: both models on GPU 0",
        },
        "draft_engine": {**_NSTR, "description": "the draft's GEMM engine (dmma: mma); null: the default"},
        "draft_megakernel": {
            "type": "boolean",
            "description": "the draft's single-token steps as the CUDA decode megakernel (dmk)",
        },
        "target_megakernel": {
            "type": "boolean",
            "description": "target-only decoding with the CUDA decode megakernel (mk)",
        },
        "target_priority": {"type": "boolean", "description": "the target's CUDA stream at the highest priority (hp)"},
        "draft_window": {
            **_NINT,
            "description": "the draft's attention window (wN): committed keys before each row it attends "
            "besides its sinks; null: full attention",
        },
        "draft_sinks": {**_NINT, "description": "attention sinks of the draft's window (wsN, default 4); null: none"},
        "shape": {"enum": ["chain", "tree", None]},
        "speculative": {"type": "boolean"},
        "baseline": {**_NSTR, "description": "name of the target-only configuration compared against"},
        "reference": {
            **_NSTR,
            "description": "configuration whose greedy outputs this one's are checked against (see divergence kinds)",
        },
        "status": {
            "enum": ["ok", "unavailable"],
            "description": "unavailable: the runtime rejected it (see error); no rows",
        },
        "error": {**_NSTR, "description": "why the configuration is unavailable"},
    },
}

_REQUEST: dict[str, Any] = {
    "type": "object",
    "description": "one prompt run through one configuration",
    "required": [
        "dataset",
        "prompt_index",
        "prompt_id",
        "config",
        "prompt_tokens",
        "prefill_tokens_per_s",
        "new_tokens",
        "counted_tokens",
        "first_emission_tokens",
        "finish_reason",
        "ttft_s",
        "decode_s",
        "tpot_s",
        "tokens_per_s",
        "verification_steps",
        "draft_steps",
        "acceptance_length",
        "target_time_s",
        "draft_time_s",
        "wall_s",
        "latency_s",
        "speedup",
        "latency_speedup",
        "matches_reference",
        "token_ids",
    ],
    "additionalProperties": False,
    "properties": {
        "dataset": {"type": "string"},
        "prompt_index": {"type": "integer", "minimum": 0, "description": "record index in the data set file"},
        "prompt_id": {
            "type": "string",
            "description": "MT-Bench question_id or HumanEval task_id; ctxN: the "
            "HumanEval task_id its files begin with, and '+'",
        },
        "config": {"type": "string"},
        "prompt_tokens": {"type": "integer", "minimum": 1, **_MEASURED},
        "prefill_tokens_per_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "prompt_tokens / ttft_s, tokens per second",
        },
        "new_tokens": {"type": "integer", "minimum": 0, **_MEASURED, "description": "len(token_ids)"},
        "counted_tokens": {
            "type": "integer",
            "minimum": 0,
            **_MEASURED,
            "description": "new tokens as the engine counted them (swiftspec: the "
            "runtime's stats.new_tokens; HF: tokens streamed)",
        },
        "first_emission_tokens": {"type": "integer", "minimum": 0, **_MEASURED},
        "finish_reason": {"enum": ["length", "stop", "cancelled"]},
        "ttft_s": {"type": "number", "exclusiveMinimum": 0, **_MEASURED, "description": "time to first token, s"},
        "decode_s": {"type": "number", "minimum": 0, **_MEASURED, "description": "first emission to last token, s"},
        "tpot_s": {
            **_NNUM,
            "minimum": MIN_DIVISOR_S,
            **_MEASURED,
            "description": "time per output token after the first emission, s",
        },
        "tokens_per_s": {**_NNUM, "minimum": 0, **_MEASURED, "description": "decode tokens per second"},
        "verification_steps": {"type": "integer", "minimum": 0, **_MEASURED},
        "draft_steps": {
            **_NINT,
            "minimum": 0,
            **_MEASURED,
            "description": "draft forward passes after prefill (null if unknown)",
        },
        "acceptance_length": {
            **_NNUM,
            "minimum": 0,
            **_MEASURED,
            "description": "tokens committed per verification step",
        },
        "target_time_s": {
            **_NNUM,
            "minimum": 0,
            **_MEASURED,
            "description": "time inside target forward passes during decode, s",
        },
        "draft_time_s": {
            **_NNUM,
            "minimum": 0,
            **_MEASURED,
            "description": "time inside draft forward passes during decode, s",
        },
        "wall_s": {"type": "number", "minimum": 0, **_MEASURED, "description": "whole request including Python, s"},
        "latency_s": {"type": "number", "minimum": MIN_DIVISOR_S, **_MEASURED, "description": "ttft_s + decode_s"},
        "speedup": {**_NNUM, "description": "baseline TPOT / this TPOT on the same prompt"},
        "latency_speedup": {**_NNUM, "description": "baseline latency / this latency (same token count)"},
        "matches_reference": {
            "type": ["boolean", "null"],
            "description": "token ids equal the reference configuration's (null: no reference, or sampled decoding)",
        },
        "peer_prompt_tokens": {
            "type": "integer",
            "minimum": 1,
            **_MEASURED,
            "description": "llama.cpp peers only: the prompt tokens llama.cpp processed, its "
            "tokenization of the prompt's text (prompt ids that are not their "
            "text's own tokenization, e.g. a long-context prompt cut at a token "
            "boundary, can come out a token longer or shorter; the same ids "
            "otherwise)",
        },
        "token_ids": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID},
            "description": "the new tokens' ids, each in [0, 2**31)",
        },
    },
}

_AGGREGATE = {
    "type": "object",
    "description": "summary of one configuration over one data set (dataset 'all': every prompt)",
    "required": [
        "dataset",
        "config",
        "requests",
        "prompt_tokens",
        "new_tokens",
        "ttft_s",
        "prefill_tokens_per_s",
        "tpot_s",
        "tokens_per_s",
        "acceptance_length",
        "verification_steps",
        "latency_s",
        "speedup",
        "latency_speedup",
        "outputs_checked",
        "divergences",
    ],
    "additionalProperties": False,
    "properties": {
        "dataset": {"type": "string"},
        "config": {"type": "string"},
        "requests": {"type": "integer", "minimum": 0},
        "prompt_tokens": _stats("prompt tokens per request"),
        "new_tokens": _stats("new tokens per request"),
        "ttft_s": _stats("TTFT, s"),
        "prefill_tokens_per_s": _stats("prefill tokens/s (prompt tokens / TTFT)"),
        "tpot_s": _stats("TPOT, s"),
        "tokens_per_s": _stats("decode tokens/s"),
        "acceptance_length": _stats("acceptance length, tokens per verification step"),
        "verification_steps": _stats("verification steps per request"),
        "latency_s": _stats("latency (TTFT + decode), s"),
        "speedup": _stats("per-request speedup vs the baseline"),
        "latency_speedup": _stats("per-request latency speedup vs the baseline"),
        "outputs_checked": {
            "type": "integer",
            "minimum": 0,
            "description": "requests compared token for token with the reference (0 under sampled decoding)",
        },
        "divergences": {"type": "integer", "minimum": 0, "description": "of those, how many differ"},
    },
}

_DIVERGENCE = {
    "type": "object",
    "description": "a request whose greedy output differs from its reference",
    "required": [
        "kind",
        "dataset",
        "prompt_index",
        "prompt_id",
        "config",
        "reference",
        "position",
        "token",
        "reference_token",
        "text",
        "reference_text",
        "length",
        "reference_length",
    ],
    "additionalProperties": False,
    "properties": {
        "kind": {
            "enum": ["lossless", "peer", "implementation"],
            "description": "lossless: swiftspec speculation vs swiftspec target-only (must never "
            "happen); peer: hf:assisted vs hf:target, llamacpp:assisted vs "
            "llamacpp:target; implementation: hf:target or llamacpp:target vs "
            "swiftspec target, or target:mk (decode megakernel) vs target (different "
            "kernels or weights, informational)",
        },
        "dataset": {"type": "string"},
        "prompt_index": {"type": "integer"},
        "prompt_id": {"type": "string"},
        "config": {"type": "string"},
        "reference": {"type": "string", "description": "the configuration compared against"},
        "position": {"type": "integer", "minimum": 0, "description": "first differing new-token index"},
        "token": {**_NINT, "description": "this configuration's token there (null: output ended)"},
        "reference_token": {**_NINT, "description": "the reference's token there (null: ended)"},
        "text": {"type": "string", "description": "decoded text of this output from the position on"},
        "reference_text": {"type": "string", "description": "the same for the reference"},
        "length": {"type": "integer"},
        "reference_length": {"type": "integer"},
    },
}

_PART = {
    "type": "object",
    "description": "one bench run merged into this document (its own bench.json)",
    "required": ["folder", "command", "created", "commit", "wall_time_s", "datasets", "configs"],
    "properties": {
        "folder": {"type": "string", "description": "the part's output folder, as given to --merge"},
        "command": {"type": "string", "description": "the part's command line"},
        "created": {"type": "string", "description": "start of the part's run, ISO 8601 UTC"},
        "commit": {"type": "object", "description": "the part's commit block (see commit)"},
        "wall_time_s": {"type": "number", "minimum": 0, "description": "the part's wall time, s"},
        "datasets": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "the data sets the part ran",
        },
        "configs": {
            "type": "array",
            "items": {"type": "string"},
            "description": "the configurations the part measured (status ok there): its rows are "
            "every prompt of each of its data sets under each of these",
        },
        "hostname": {"type": "string"},
        "settings": {"type": "object", "description": "the part's settings block as it recorded it"},
    },
}

SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"https://swiftspec.invalid/schemas/bench-v{SCHEMA_VERSION}.json",
    "title": "swiftspec bench result",
    "description": __doc__,
    "type": "object",
    "required": [
        "schema_version",
        "kind",
        "created",
        "command",
        "commit",
        "machine",
        "settings",
        "configs",
        "requests",
        "aggregates",
        "divergences",
        "wall_time_s",
        "load_average_end",
    ],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "kind": {"const": "swiftspec-bench"},
        "created": {"type": "string", "description": "start of the run, ISO 8601 UTC"},
        "command": {"type": "string", "description": "the command line, shell-quoted"},
        "commit": {
            "type": "object",
            "required": ["sha", "short", "branch", "dirty", "dirty_files"],
            "properties": {
                "sha": _NSTR,
                "short": _NSTR,
                "branch": _NSTR,
                "dirty": {"type": ["boolean", "null"], "description": "tracked files modified"},
                "dirty_files": {"type": "array", "items": {"type": "string"}},
            },
        },
        "machine": {
            "type": "object",
            "required": ["hostname", "os", "cpu", "memory_gib", "gpus", "software", "load_average_start"],
            "properties": {
                "hostname": {"type": "string"},
                "os": {"type": "string"},
                "cpu": {"type": "object", "required": ["model", "logical_cpus", "usable_cpus"]},
                "memory_gib": _NNUM,
                "gpus": {"type": "array", "items": {"type": "object"}},
                "software": {"type": "object"},
                "load_average_start": {
                    "type": ["array", "null"],
                    "items": _NUM,
                    "description": "1/5/15-minute load averages at the start",
                },
            },
        },
        "settings": {
            "type": "object",
            "required": [
                "datasets",
                "num_prompts",
                "max_new_tokens",
                "backend",
                "dtype",
                "threads",
                "warmup",
                "target",
                "draft",
                "target_checkpoint",
                "draft_checkpoint",
                "max_context",
                "hf",
                "context_tokens",
            ],
            "properties": {
                "datasets": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "description": "mtbench, humaneval, file:<name> of a --prompts file, then ctxN for "
                    "each long-context workload",
                },
                "context_tokens": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1},
                    "description": "N of each long-context workload ctxN among the datasets, in "
                    "their order (empty: none)",
                },
                "num_prompts": {"type": "integer", "minimum": 1, "description": "prompts per data set"},
                "max_new_tokens": {"type": "integer", "minimum": 1},
                "backend": {"enum": ["cpu", "cuda"]},
                "dtype": {
                    "enum": ["bfloat16", "float32", "int4"],
                    "description": "weights of the target (and of the draft when converted by the run); "
                    "int4: W4A16 (docs/checkpoint_format.md), no HF peer; on cuda no megakernel, tp 1",
                },
                "threads": {"type": "integer", "minimum": 0, "description": "CPU threads per model, 0 = all"},
                "warmup": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "untimed warm-up requests per configuration, of min(8, "
                    "max_new_tokens) tokens on the first prompt",
                },
                "target": {"type": "string"},
                "draft": _NSTR,
                "target_checkpoint": {"type": "string"},
                "draft_checkpoint": _NSTR,
                "max_context": {
                    "type": ["integer", "null"],
                    "description": "KV capacity of the swiftspec models, tokens (prompt + new "
                    "tokens); null: no swiftspec engine loaded",
                },
                "hf": {
                    "type": ["object", "null"],
                    "description": 'HF peer settings per backend, e.g. {"cpu": {dtype, device, '
                    "torch_threads, versions, do_sample, sampling, assisted: "
                    "{...}}} (null: no peer)",
                },
                "llamacpp": {
                    "type": ["object", "null"],
                    "description": "llama.cpp peer settings per backend (null or absent: no llama.cpp "
                    'peer), e.g. {"cuda": {llama_cpp_python (the sdist version built), '
                    "build: {key, cmake_args, ggml_commit, build_seconds}, target_gguf, "
                    "draft_gguf, weights (the GGUF files as stored: quantized), programs, "
                    "draft_n_max, threads, gpu_layers, flash_attention, timing (how TTFT and "
                    "decode time are taken: llama.cpp's log timestamps), unresolved_pieces "
                    "({target, assisted}: new tokens whose id was inferred from an "
                    "ambiguous printed piece), prompts_retokenized ({target, assisted}: "
                    "requests whose prompt llama.cpp tokenized otherwise than its ids, "
                    "same text; their rows hold peer_prompt_tokens)}}",
                },
                "prompt_file": {
                    "type": ["object", "null"],
                    "description": "the --prompts file (null or absent: none): {dataset (file:<name>), "
                    "path, sha256, records}",
                },
                "decoding": {
                    "enum": ["greedy", "sampled"],
                    "description": "greedy (argmax; absent in older documents: greedy) or sampled (see sampling)",
                },
                "sampling": _SAMPLING,
            },
            # sampled decoding has its sampling block; greedy decoding (or no decoding field) has none
            "if": {"required": ["decoding"], "properties": {"decoding": {"const": "sampled"}}},
            "then": {"required": ["sampling"], "properties": {"sampling": {"type": "object"}}},
            "else": {"properties": {"sampling": {"type": "null"}}},
        },
        "configs": {"type": "array", "items": _CONFIG, "minItems": 1},
        "requests": {"type": "array", "items": _REQUEST},
        "aggregates": {"type": "array", "items": _AGGREGATE},
        "divergences": {"type": "array", "items": _DIVERGENCE},
        "wall_time_s": {"type": "number", "minimum": 0, "description": "whole run including model loading"},
        "load_average_end": {"type": ["array", "null"], "items": _NUM},
        "interrupted": {"type": "boolean", "description": "true if the run was stopped early (partial rows)"},
        "merge": {
            "type": "object",
            "description": "present when `swiftspec bench --merge` combined several runs into this document: "
            "created is then the earliest part's start, wall_time_s the span from the first "
            "part's start to the last part's end, commit and machine the first part's, "
            "command the merge command",
            "required": ["created", "parts"],
            "additionalProperties": False,
            "properties": {
                "created": {"type": "string", "description": "when the parts were merged, ISO 8601 UTC"},
                "parts": {"type": "array", "items": _PART, "minItems": 1},
            },
        },
    },
}


def schema() -> dict:
    """A copy of :data:`SCHEMA`."""
    return copy.deepcopy(SCHEMA)


def validate(document: dict) -> None:
    """Validate a bench result against :data:`SCHEMA` (needs the ``jsonschema`` package).

    Raises ``jsonschema.ValidationError`` naming the first offending path and value.
    """
    import jsonschema

    jsonschema.Draft202012Validator(SCHEMA).validate(document)


def request_row_problem(row) -> str | None:
    """What keeps ``row`` from being a ``requests`` row of this schema, naming the field, e.g.
    "field ttft_s is missing", "ttft_s: 'fast' is not of type 'number'", "new_tokens: -3 is less than
    the minimum of 0", "ttft_s is NaN (a row holds finite numbers only)", "token_ids/3: 7.0 is not
    of type 'integer'" (JSON Schema counts 7.0 as an integer; a row's integers are written without
    a fraction or exponent, and the tokenizer decodes ints only); None if it is one (its numbers
    may still disagree with each other: :func:`row_consistency_problems`). Needs ``jsonschema``."""
    import math

    import jsonschema

    if not isinstance(row, dict):
        return f"not a JSON object (got {type(row).__name__})"
    for key, value in row.items():  # Python's json reads NaN / Infinity; the schema's "number" takes them
        if isinstance(value, float) and not math.isfinite(value):
            shown = "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
            return f"{key} is {shown} (a row holds finite numbers only)"
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(_REQUEST).iter_errors(row))
    if error is None:
        for key, value in row.items():
            types = _REQUEST["properties"][key].get("type", ())
            if isinstance(value, float) and "integer" in types and "number" not in types:
                return f"{key}: {value!r} is not of type 'integer'"
        floats = [i for i, t in enumerate(row["token_ids"]) if isinstance(t, float)]
        return f"token_ids/{floats[0]}: {row['token_ids'][floats[0]]!r} is not of type 'integer'" if floats else None
    if error.validator == "required" and not error.absolute_path:
        missing = next(k for k in _REQUEST["required"] if k not in row)
        return f"field {missing} is missing"
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message[:200]}" if where else error.message[:200]


def row_consistency_problems(row: dict, max_new_tokens: int, mode: str | None = None) -> list[str]:
    """The per-row checks of :func:`consistency_problems` for one schema-valid ``requests`` row
    (``mode``: its configuration's mode, for the target-only acceptance length; None: unknown),
    each message starting with the row ("mtbench[0] target: ..."); [] when consistent."""
    problems: list[str] = []
    r = row
    where = f"{r['dataset']}[{r['prompt_index']}] {r['config']}"
    n = r["new_tokens"]
    if n != len(r["token_ids"]) or r["counted_tokens"] != n:
        problems.append(f"{where}: new_tokens {n}, counted {r['counted_tokens']}, returned {len(r['token_ids'])}")
    if n > max_new_tokens:
        problems.append(f"{where}: {n} new tokens > max_new_tokens {max_new_tokens}")
    if not r["ttft_s"] > 0:
        problems.append(f"{where}: TTFT {r['ttft_s']} is not > 0")
    first, steps, acc = r["first_emission_tokens"], r["verification_steps"], r["acceptance_length"]
    if steps > 0:
        if acc is None or acc < 1 - 1e-9:
            problems.append(f"{where}: acceptance length {acc} < 1")
        elif abs(first + acc * steps - n) > 1e-6 * max(1, n):
            problems.append(f"{where}: {first} + {acc} * {steps} verification steps != {n} tokens")
        if mode == "target" and acc is not None and abs(acc - 1) > 1e-9:
            problems.append(f"{where}: target-only acceptance length {acc} != 1")
    if abs(r["prefill_tokens_per_s"] * r["ttft_s"] - r["prompt_tokens"]) > 1e-6 * r["prompt_tokens"]:
        problems.append(
            f"{where}: prefill tokens/s x TTFT = {r['prefill_tokens_per_s'] * r['ttft_s']:.6f}, "
            f"expected {r['prompt_tokens']} prompt tokens"
        )
    if abs(r["latency_s"] - (r["ttft_s"] + r["decode_s"])) > 1e-9:
        problems.append(f"{where}: latency {r['latency_s']} != TTFT + decode time")
    if r["tokens_per_s"] is not None:
        produced = r["tokens_per_s"] * r["decode_s"]
        if abs(produced - (n - first)) > 1e-6 * max(1, n):
            problems.append(f"{where}: tokens/s x decode time = {produced:.6f}, expected {n - first}")
    return problems


def consistency_problems(document: dict) -> list[str]:
    """Checks the numbers of a (schema-valid) bench result against each other; returns one
    message per problem, [] when consistent:

    * tokens counted by the engine equal tokens returned (``counted_tokens == new_tokens ==
      len(token_ids)``), and no request exceeds ``max_new_tokens``;
    * TTFT > 0; decode time >= 0;
    * acceptance length >= 1 wherever there was a verification step, exactly 1 for target-only,
      and ``first_emission_tokens + acceptance_length * verification_steps == new_tokens``;
    * ``tokens_per_s * decode_s == new_tokens - first_emission_tokens`` and
      ``prefill_tokens_per_s * ttft_s == prompt_tokens`` (1e-6 relative);
    * a long-context workload's rows have exactly its N prompt tokens, and ``settings.context_tokens``
      lists the N of the ctxN data sets;
    * every ok configuration has one row per prompt and data set, unavailable ones have none
      (a merged document: one row per prompt for each part that ran the data set and measured
      the configuration, so parts may cover different data sets and configurations);
    * the divergence counts of the aggregates match the divergence list;
    * sampled decoding: no output was compared per request (no divergences, no
      ``matches_reference``, ``outputs_checked`` 0): outputs are not expected to match there.
    """
    problems: list[str] = []
    settings = document["settings"]
    max_new = settings["max_new_tokens"]
    configs = {c["name"]: c for c in document["configs"]}
    for r in document["requests"]:
        problems += row_consistency_problems(r, max_new, configs.get(r["config"], {}).get("mode"))
    from swiftspec.bench.long_context import context_tokens_of, context_workloads

    if settings["context_tokens"] != context_workloads(settings["datasets"]):
        problems.append(
            f"settings.context_tokens {settings['context_tokens']} are not the long-context workloads "
            f"among the data sets {settings['datasets']}"
        )
    for r in document["requests"]:
        n = context_tokens_of(r["dataset"])
        if n is not None and r["prompt_tokens"] != n:
            problems.append(
                f"{r['dataset']}[{r['prompt_index']}] {r['config']}: {r['prompt_tokens']} prompt tokens, "
                f"the workload's prompts have {n}"
            )
    counts: dict[tuple, int] = {}
    for r in document["requests"]:
        counts[(r["dataset"], r["config"])] = counts.get((r["dataset"], r["config"]), 0) + 1
    parts = document["merge"]["parts"] if document.get("merge") else None
    if not document.get("interrupted"):
        for name, c in configs.items():
            for ds in settings["datasets"]:
                got = counts.get((ds, name), 0)
                if parts is None:
                    want = settings["num_prompts"] if c["status"] == "ok" else 0
                else:
                    want = settings["num_prompts"] * sum(
                        1 for p in parts if ds in p["datasets"] and name in p["configs"]
                    )
                if got != want:
                    problems.append(f"{ds} {name}: {got} rows, expected {want}")
    div_counts: dict[tuple, int] = {}
    for d in document["divergences"]:
        for ds in (d["dataset"], "all"):
            div_counts[(ds, d["config"])] = div_counts.get((ds, d["config"]), 0) + 1
    for a in document["aggregates"]:
        if a["divergences"] != div_counts.get((a["dataset"], a["config"]), 0):
            problems.append(
                f"aggregate {a['dataset']} {a['config']}: {a['divergences']} divergences, "
                f"the list has {div_counts.get((a['dataset'], a['config']), 0)}"
            )
    if settings.get("decoding") == "sampled":
        compared = sum(1 for r in document["requests"] if r["matches_reference"] is not None)
        checked = sum(a["outputs_checked"] for a in document["aggregates"] if a["dataset"] == "all")
        if compared or checked or document["divergences"]:
            problems.append(
                f"sampled decoding, yet outputs were compared per request ({compared} rows with "
                f"matches_reference, {checked} checked, {len(document['divergences'])} divergences)"
            )
    return problems
