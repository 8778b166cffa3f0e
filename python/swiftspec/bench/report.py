"""Turns measured rows into the result document (JSON), and the document into Markdown.

:func:`build_document` fills in what needs all rows at once: per-request speedups against the
baseline configuration, the token-for-token output checks and their divergences (greedy decoding
only: see :data:`SAMPLED_NOT_CHECKED`), and the aggregates (mean, p50, p95, min, max per data set
and configuration, plus data set "all").
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from swiftspec.bench.config import describe_sampling
from swiftspec.bench.long_context import CONTEXT_INSTRUCTION, context_tokens_of, workload_name
from swiftspec.bench.schema import SCHEMA_VERSION

#: Decoded text shown for a divergence: this many tokens from the first differing position.
DIVERGENCE_CONTEXT_TOKENS = 12

#: Why a run with sampled decoding has no output checks: speculative sampling reproduces the
#: target's distribution, not its draw under one seed (the draft's proposals consume the random
#: source differently), so two configurations' outputs for one request differ legitimately.
SAMPLED_NOT_CHECKED = "sampled decoding: outputs are compared in distribution by tests, not per request"


#: Engines of the peers (their speculation is checked against their own target-only decoding).
PEER_ENGINES = ("hf", "llamacpp")
#: Marks a llama.cpp configuration in tables: it runs the GGUF files' quantized weights.
QUANTIZED_MARK = " †"


def config_label(config: dict) -> str:
    """A configuration's name as tables and plots show it: llama.cpp's marked as running the GGUF
    files' quantized weights (:data:`QUANTIZED_MARK`)."""
    return config["name"] + (QUANTIZED_MARK if config.get("engine") == "llamacpp" else "")


def is_sampled(settings: dict) -> bool:
    """True when a document's settings record sampled decoding (old documents: greedy)."""
    return settings.get("decoding") == "sampled"


def summarize(values) -> dict | None:
    """``{"n", "mean", "p50", "p95", "min", "max"}`` of the non-None values (percentiles by
    linear interpolation, numpy's default); None if there are none."""
    v = np.asarray(
        [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], dtype=np.float64
    )
    if v.size == 0:
        return None
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "p50": float(np.percentile(v, 50)),
        "p95": float(np.percentile(v, 95)),
        "min": float(v.min()),
        "max": float(v.max()),
    }


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where token lists differ (a shorter list differs where it
    ends), or None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _divergence_kind(config: dict, reference: dict) -> str:
    # Speculation must reproduce target-only decoding exactly; a swiftspec run whose target-only
    # steps run on the decode megakernel (target:mk, auto:...:mk) against the layered target sums
    # in another order: two kernels of one model.
    if (
        config["engine"] == "swiftspec"
        and reference["engine"] == "swiftspec"
        and config["mode"] != "target"
        and not config.get("target_megakernel")
    ):
        return "lossless"
    if config["engine"] in PEER_ENGINES and reference["engine"] == config["engine"]:
        return "peer"
    return "implementation"


def compare_outputs(rows: list[dict], configs: list[dict], decode=None, check_outputs: bool = True) -> list[dict]:
    """Fills ``speedup`` and ``matches_reference`` of every row in place; returns the
    divergence records (schema: ``divergences``). ``decode(ids) -> str`` renders token text
    (default: the ids as a string). ``check_outputs=False`` (sampled decoding,
    :data:`SAMPLED_NOT_CHECKED`): speedups only; ``matches_reference`` stays None, no divergences."""
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    by_name = {c["name"]: c for c in configs}
    index = {(r["dataset"], r["prompt_index"], r["config"]): r for r in rows}
    divergences = []
    for r in rows:
        cfg = by_name[r["config"]]
        base = index.get((r["dataset"], r["prompt_index"], cfg["baseline"])) if cfg["baseline"] else None
        if base is not None and base["tpot_s"] and r["tpot_s"]:
            r["speedup"] = base["tpot_s"] / r["tpot_s"]
        if base is not None and base["new_tokens"] == r["new_tokens"] and r["latency_s"] > 0:
            r["latency_speedup"] = base["latency_s"] / r["latency_s"]
        ref = index.get((r["dataset"], r["prompt_index"], cfg["reference"])) if cfg["reference"] else None
        if ref is None or not check_outputs:
            continue
        pos = first_difference(r["token_ids"], ref["token_ids"])
        r["matches_reference"] = pos is None
        if pos is None:
            continue
        mine, theirs = r["token_ids"], ref["token_ids"]
        divergences.append(
            {
                "kind": _divergence_kind(cfg, by_name[ref["config"]]),
                "dataset": r["dataset"],
                "prompt_index": r["prompt_index"],
                "prompt_id": r["prompt_id"],
                "config": r["config"],
                "reference": ref["config"],
                "position": pos,
                "token": mine[pos] if pos < len(mine) else None,
                "reference_token": theirs[pos] if pos < len(theirs) else None,
                "text": decode(mine[pos : pos + DIVERGENCE_CONTEXT_TOKENS]),
                "reference_text": decode(theirs[pos : pos + DIVERGENCE_CONTEXT_TOKENS]),
                "length": len(mine),
                "reference_length": len(theirs),
            }
        )
    return divergences


def aggregate(rows: list[dict], configs: list[dict], datasets: list[str], divergences: list[dict]) -> list[dict]:
    """Aggregates per (data set, configuration) for every data set and "all"."""
    out = []
    for ds in list(datasets) + ["all"]:
        for c in configs:
            if c["status"] != "ok":
                continue
            sel = [r for r in rows if r["config"] == c["name"] and (ds == "all" or r["dataset"] == ds)]
            checked = [r for r in sel if r["matches_reference"] is not None]
            out.append(
                {
                    "dataset": ds,
                    "config": c["name"],
                    "requests": len(sel),
                    "prompt_tokens": summarize(r["prompt_tokens"] for r in sel),
                    "new_tokens": summarize(r["new_tokens"] for r in sel),
                    "ttft_s": summarize(r["ttft_s"] for r in sel),
                    "prefill_tokens_per_s": summarize(r["prefill_tokens_per_s"] for r in sel),
                    "tpot_s": summarize(r["tpot_s"] for r in sel),
                    "tokens_per_s": summarize(r["tokens_per_s"] for r in sel),
                    "acceptance_length": summarize(r["acceptance_length"] for r in sel),
                    "verification_steps": summarize(r["verification_steps"] for r in sel),
                    "latency_s": summarize(r["latency_s"] for r in sel),
                    "speedup": summarize(r["speedup"] for r in sel),
                    "latency_speedup": summarize(r["latency_speedup"] for r in sel),
                    "outputs_checked": len(checked),
                    "divergences": sum(
                        1 for d in divergences if d["config"] == c["name"] and (ds == "all" or d["dataset"] == ds)
                    ),
                }
            )
    return out


def build_document(
    *,
    created: str,
    command: str,
    commit: dict,
    machine: dict,
    settings: dict,
    configs: list[dict],
    rows: list[dict],
    wall_time_s: float,
    load_average_end,
    interrupted: bool = False,
    decode=None,
) -> dict:
    """The complete result document (validate with :func:`swiftspec.bench.schema.validate`).
    Outputs are compared per request only under greedy decoding (``settings["decoding"]``)."""
    divergences = compare_outputs(rows, configs, decode, check_outputs=not is_sampled(settings))
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": "swiftspec-bench",
        "created": created,
        "command": command,
        "commit": commit,
        "machine": machine,
        "settings": settings,
        "configs": configs,
        "requests": rows,
        "aggregates": aggregate(rows, configs, settings["datasets"], divergences),
        "divergences": divergences,
        "wall_time_s": wall_time_s,
        "load_average_end": load_average_end,
    }
    if interrupted:
        doc["interrupted"] = True
    return doc


def write_json(document: dict, path: Path) -> None:
    """Writes the document (indented, one request row per line is not needed: plain indent=1)."""
    path.write_text(json.dumps(document, indent=1) + "\n")


def _fmt(x, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if x is None else f"{x * scale:.{digits}f}"


def markdown(document: dict, plots: list[str] | None = None) -> str:
    """A Markdown report: provenance, one table per data set (and all), divergences, plots."""
    s = document["settings"]
    m = document["machine"]
    c = document["commit"]
    cpu = m["cpu"]
    gpus = ", ".join(g["name"] for g in m["gpus"]) or "none"
    merged = document.get("merge")
    sampled = is_sampled(s)
    lines = [
        f"# swiftspec bench — {document['created']}",
        "",
        f"- command: `{document['command']}`",
        f"- commit (the checkout when the {'first part' if merged else 'run'} started): "
        f"`{c['sha'] or 'unknown (not a git checkout)'}`"
        + (" (dirty: " + ", ".join(c["dirty_files"][:8]) + ")" if c.get("dirty") else ""),
        f"- machine: {m['hostname']}, {cpu['model']}, {cpu['usable_cpus']} usable CPUs, "
        f"{m['memory_gib']} GiB RAM, GPUs: {gpus}; load average at start {m['load_average_start']}, "
        f"at end {document['load_average_end']}",
        "- other busy processes (>= 20% of a core) at start: "
        + _busy(m.get("busy_processes_start"))
        + "; at end: "
        + _busy(m.get("busy_processes_end")),
        f"- models: target `{s['target']}`, draft `{s['draft']}`, {s['dtype']}, backend {s['backend']}, "
        f"threads {s['threads'] or 'all'}",
        f"- prompts: {s['num_prompts']} per data set ({', '.join(s['datasets'])}), "
        f"{s['max_new_tokens']} new tokens max, {s['warmup']} warm-up request(s) per configuration"
        + (f", KV capacity {s['max_context']} tokens" if s.get("max_context") else ""),
        f"- decoding: {describe_sampling(s.get('sampling') if sampled else None)}",
        f"- wall time: {document['wall_time_s'] / 60:.1f} min"
        + (" (from the first part's start to the last part's end)" if merged else "")
        + (" — **interrupted, partial results**" if document.get("interrupted") else ""),
    ]
    if merged:
        lines.append(
            f"- merged from {len(merged['parts'])} runs on {merged['created']} (rows compared across "
            "runs as if they were one):"
        )
        for p in merged["parts"]:
            lines.append(
                f"  - `{p['folder']}`: {', '.join(p['datasets'])}; {', '.join(p['configs']) or 'none'}; "
                f"started {p['created']}, {p['wall_time_s'] / 60:.1f} min, commit "
                f"`{p['commit'].get('short') or 'unknown'}`; `{p['command']}`"
            )
    if s.get("context_tokens"):
        lines.append(
            f"- long-context workloads: ctxN, prompt i = exactly N tokens (N = "
            f"{', '.join(map(str, s['context_tokens']))}): HumanEval problems as files (prompt, solution, "
            f'test) from problem i on, then the instruction "{CONTEXT_INSTRUCTION}"'
        )
    if s.get("hf"):
        lines.append(f"- HF peer: {json.dumps(s['hf'])}")
    for backend, block in (s.get("llamacpp") or {}).items():
        unresolved = block.get("unresolved_pieces") or {}
        retokenized = block.get("prompts_retokenized") or {}
        lines.append(
            f"- llama.cpp peer on {backend}{QUANTIZED_MARK}: llama-cpp-python {block.get('llama_cpp_python')} sdist's llama.cpp "
            f"(ggml {(block.get('build') or {}).get('ggml_commit')}), **runs the GGUF files' own quantized weights** "
            f"(`{Path(str(block.get('target_gguf'))).name}`"
            + (f", draft `{Path(str(block['draft_gguf'])).name}`" if block.get("draft_gguf") else "")
            + f") while swiftspec runs {s['dtype']}; {block.get('threads')} threads, -ngl {block.get('gpu_layers')}, "
            f"flash attention {block.get('flash_attention')}, draft length {block.get('draft_n_max')}; times: "
            f"{block.get('timing')}"
            + (
                f"; {sum(unresolved.values())} new token id(s) inferred from ambiguous printed pieces "
                f"({json.dumps(unresolved)})"
                if sum(unresolved.values())
                else ""
            )
            + (
                f"; {sum(retokenized.values())} prompt(s) that llama.cpp tokenized otherwise than their ids, same text "
                f"({json.dumps(retokenized)}; rows: peer_prompt_tokens)"
                if sum(retokenized.values())
                else ""
            )
        )
    unavailable = [cf for cf in document["configs"] if cf["status"] != "ok"]
    for cf in unavailable:
        lines.append(f"- **{cf['name']} unavailable**: {cf['error']}")
    lines.append("")
    lines.append(
        "TTFT and TPOT in ms; tokens/s counts decode tokens after the first emission; "
        "speedup = baseline TPOT / TPOT per request (baseline: target-only of the same engine); "
        "latency speedup = baseline (TTFT + decode) / (TTFT + decode), requests of equal length; "
        + (
            "outputs are not compared (" + SAMPLED_NOT_CHECKED + ")."
            if sampled
            else "outputs: requests whose greedy tokens equal the reference configuration's."
        )
        + (
            f" {QUANTIZED_MARK.strip()} llama.cpp on the GGUF files' own quantized weights, swiftspec on {s['dtype']}."
            if any(cf["engine"] == "llamacpp" for cf in document["configs"])
            else ""
        )
    )
    contexts = s.get("context_tokens") or []
    eq_head, eq_rule = ("", "") if sampled else (" outputs equal |", "---|")
    labels = {cf["name"]: config_label(cf) for cf in document["configs"]}
    if contexts:
        lines += _long_context_lines(document, sampled)
    for ds in [d for d in s["datasets"] if context_tokens_of(d) is None] + ["all"]:
        aggs = [a for a in document["aggregates"] if a["dataset"] == ds]
        if not aggs:
            continue
        lines += [
            "",
            f"## {ds}",
            "",
            "| config | n | TTFT p50 | TPOT mean | tok/s mean | tok/s p50 | tok/s p95 | accept. len | "
            "speedup mean | speedup p50 | speedup p95 | latency speedup mean |" + eq_head,
            "|---|---|---|---|---|---|---|---|---|---|---|---|" + eq_rule,
        ]
        for a in aggs:

            def g(key, stat, scale=1.0, digits=2):
                block = a[key]
                return _fmt(block[stat] if block else None, scale, digits)

            eq = f"{a['outputs_checked'] - a['divergences']}/{a['outputs_checked']}" if a["outputs_checked"] else "–"
            lines.append(
                f"| {labels.get(a['config'], a['config'])} | {a['requests']} | {g('ttft_s', 'p50', 1000, 0)} | {g('tpot_s', 'mean', 1000, 1)} "
                f"| {g('tokens_per_s', 'mean')} | {g('tokens_per_s', 'p50')} | {g('tokens_per_s', 'p95')} "
                f"| {g('acceptance_length', 'mean')} | {g('speedup', 'mean')} | {g('speedup', 'p50')} "
                f"| {g('speedup', 'p95')} | {g('latency_speedup', 'mean')} |" + ("" if sampled else f" {eq} |")
            )
    lines += ["", "## Output checks", ""]
    if sampled:
        lines.append(
            f"- not made: {SAMPLED_NOT_CHECKED} (speculative sampling is lossless in distribution, "
            "not per seed; tests/test_verification.py and tests/test_sampling.py check the distributions)"
        )
    else:
        lines += _output_check_lines(document)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def _long_context_lines(document: dict, sampled: bool) -> list[str]:
    """The "Long context" section: per prompt length N and configuration, TTFT, prefill and decode
    rates, acceptance length, speedup and output checks."""
    aggs = {(a["dataset"], a["config"]): a for a in document["aggregates"]}
    configs = [c["name"] for c in document["configs"] if c["status"] == "ok"]
    labels = {c["name"]: config_label(c) for c in document["configs"]}
    lines = [
        "",
        "## Long context",
        "",
        "Per prompt length N (data set ctxN): TTFT and prefill tokens/s (prompt tokens / TTFT) take in the "
        "prompt, decode tokens/s and acceptance length the answer; means over the prompts.",
        "",
        "| N | config | n | TTFT mean (ms) | prefill tok/s | decode tok/s | TPOT mean (ms) | accept. len | "
        "speedup mean | new tokens mean |" + ("" if sampled else " outputs equal |"),
        "|---|---|---|---|---|---|---|---|---|---|" + ("" if sampled else "---|"),
    ]
    for n in document["settings"]["context_tokens"]:
        for name in configs:
            a = aggs.get((workload_name(n), name))
            if a is None:
                continue

            def g(key, scale=1.0, digits=2):
                return _fmt(a[key]["mean"] if a[key] else None, scale, digits)

            eq = f"{a['outputs_checked'] - a['divergences']}/{a['outputs_checked']}" if a["outputs_checked"] else "–"
            lines.append(
                f"| {n} | {labels[name]} | {a['requests']} | {g('ttft_s', 1000, 0)} | {g('prefill_tokens_per_s', 1, 0)} "
                f"| {g('tokens_per_s')} | {g('tpot_s', 1000, 1)} | {g('acceptance_length')} | {g('speedup')} "
                f"| {g('new_tokens', 1, 0)} |" + ("" if sampled else f" {eq} |")
            )
    return lines


def _output_check_lines(document: dict) -> list[str]:
    """The "Output checks" section of a greedy run: divergence counts per kind, then the list."""
    divs = document["divergences"]
    lines: list[str] = []
    lossless = [d for d in divs if d["kind"] == "lossless"]
    lines.append(f"- swiftspec speculation vs swiftspec target-only (must be identical): {len(lossless)} divergence(s)")
    hf_run = any(c["engine"] == "hf" and c["status"] == "ok" for c in document["configs"])
    hf_impl = [d for d in divs if d["kind"] == "implementation" and d["config"].startswith("hf:")]
    hf_peer = [d for d in divs if d["kind"] == "peer" and d["config"].startswith("hf:")]
    for label, count in (
        ("HF assisted vs HF target-only", len(hf_peer)),
        ("HF target-only vs swiftspec target-only (different kernels)", len(hf_impl)),
    ):
        lines.append(f"- {label}: {count} divergence(s)" if hf_run else f"- {label}: not run (no HF peer)")
    if any(c["engine"] == "llamacpp" and c["status"] == "ok" for c in document["configs"]):
        lc_peer = [d for d in divs if d["kind"] == "peer" and d["config"].startswith("llamacpp:")]
        lc_impl = [d for d in divs if d["kind"] == "implementation" and d["config"].startswith("llamacpp:")]
        lines.append(f"- llama.cpp speculative vs llama.cpp target-only: {len(lc_peer)} divergence(s)")
        lines.append(
            f"- llama.cpp target-only{QUANTIZED_MARK} vs swiftspec target-only (quantized vs {s_dtype(document)} "
            f"weights, other kernels: divergences expected): {len(lc_impl)} divergence(s)"
        )
    if any(
        c["engine"] == "swiftspec" and c.get("target_megakernel") and c["status"] == "ok" for c in document["configs"]
    ):
        mk = [d for d in divs if d["kind"] == "implementation" and not d["config"].startswith(("hf:", "llamacpp:"))]
        lines.append(
            f"- target:mk / auto:...:mk (target-only steps on the decode megakernel) vs swiftspec target-only "
            f"(another summation order: near-ties may resolve the other way): {len(mk)} divergence(s)"
        )
    if divs:
        lines += [
            "",
            "| kind | data set | prompt | config | reference | position | token | reference token | text | reference text |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in divs:
            lines.append(
                f"| {d['kind']} | {d['dataset']} | {d['prompt_id']} | {d['config']} | {d['reference']} | "
                f"{d['position']} | {d['token']} | {d['reference_token']} | {_md_text(d['text'])} | "
                f"{_md_text(d['reference_text'])} |"
            )
    return lines


def s_dtype(document: dict) -> str:
    """The dtype swiftspec ran in a document."""
    return document["settings"]["dtype"]


def _busy(procs) -> str:
    if not procs:
        return "none"
    return ", ".join(f"`{p['command'][:60]}` ({p['cpu_percent']:.0f}%)" for p in procs[:4])


def _md_text(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'").replace("\n", "⏎") + "`"
