"""PNG plots of a bench result document (matplotlib, Agg backend; no display needed).

* ``tokens_per_s.png`` — decode tokens/s per data set and configuration: bars are means, dots
  are individual requests.
* ``speedup.png`` — the per-request speedup distribution vs the baseline (box plots, one per
  configuration and data set; the dashed line is 1x).
* ``acceptance.png`` — mean acceptance length per tree budget, one line per speculative mode
  and tree shape (chain / tree with its branching and depth), per data set; the HF assisted
  peer, whose draft length varies, is a horizontal line (so is llama.cpp's speculation).
* ``context.png`` — long-context workloads (``--context-tokens``): decode tokens/s, prefill
  tokens/s and TTFT per prompt length N, one line per configuration (means over the prompts).

llama.cpp configurations carry a dagger: they run the GGUF files' quantized weights
(:func:`swiftspec.bench.report.config_label`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from swiftspec.bench.report import config_label


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(document: dict, what: str) -> str:
    s = document["settings"]
    quantized = any(c["engine"] == "llamacpp" for c in document["configs"])
    return (
        f"{what}\n{document['machine']['cpu']['model'] if s['backend'] == 'cpu' else s['backend']}, "
        f"{s['dtype']}, {s['max_new_tokens']} new tokens, commit {document['commit']['short']}, "
        f"{document['created'][:10]}" + ("\n† llama.cpp runs the GGUF files' quantized weights" if quantized else "")
    )


def plot_tokens_per_s(document: dict, path: Path) -> Path:
    """Bars of mean decode tokens/s per data set (groups) and configuration (colors)."""
    plt = _plt()
    configs = [c["name"] for c in document["configs"] if c["status"] == "ok"]
    labels = {c["name"]: config_label(c) for c in document["configs"]}
    datasets = document["settings"]["datasets"]
    rows = document["requests"]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(configs) * len(datasets) + 2), 4.5))
    width = 0.8 / max(1, len(configs))
    rng = np.random.default_rng(0)
    for j, cfg in enumerate(configs):
        xs, means, empty = [], [], []
        for i, ds in enumerate(datasets):
            vals = [
                r["tokens_per_s"]
                for r in rows
                if r["config"] == cfg and r["dataset"] == ds and r["tokens_per_s"] is not None
            ]
            x = i + (j - (len(configs) - 1) / 2) * width
            xs.append(x)
            means.append(float(np.mean(vals)) if vals else 0.0)
            empty.append(not vals)
            if vals:
                ax.scatter(
                    x + rng.uniform(-width / 4, width / 4, len(vals)), vals, s=6, color="black", alpha=0.5, zorder=3
                )
        bars = ax.bar(xs, means, width=width * 0.95, label=labels[cfg], zorder=2)
        for b, mval, none in zip(bars, means, empty):
            ax.annotate(
                "n/a" if none else f"{mval:.1f}",
                (b.get_x() + b.get_width() / 2, mval),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel("decode tokens/s (bars: mean; dots: requests)")
    ax.set_title(_title(document, "Decode throughput per configuration"), fontsize=9)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    ax.legend(fontsize=8, ncol=min(4, len(configs)))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speedup(document: dict, path: Path) -> Path | None:
    """Box plots of per-request speedup vs the baseline; None if no configuration has speedups."""
    plt = _plt()
    datasets = document["settings"]["datasets"]
    rows = document["requests"]
    configs = [c for c in document["configs"] if c["status"] == "ok" and c["baseline"]]
    data, labels = [], []
    for c in configs:
        for ds in datasets:
            vals = [
                r["speedup"]
                for r in rows
                if r["config"] == c["name"] and r["dataset"] == ds and r["speedup"] is not None
            ]
            if vals:
                data.append(vals)
                labels.append(f"{config_label(c)}\n{ds}\n(vs {c['baseline']})")
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(data) + 2), 4.8))
    ax.boxplot(data, showmeans=True, whis=(5, 95))
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_ylabel("per-request speedup (baseline TPOT / TPOT)")
    ax.set_title(
        _title(document, "Per-request speedup distribution (box: p25–p75, whiskers: p5–p95, triangle: mean)"),
        fontsize=9,
    )
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_acceptance(document: dict, path: Path) -> Path | None:
    """Mean acceptance length per tree budget; None if no speculative configuration ran."""
    plt = _plt()
    datasets = document["settings"]["datasets"]
    aggs = {(a["dataset"], a["config"]): a for a in document["aggregates"]}
    spec = [c for c in document["configs"] if c["status"] == "ok" and c["speculative"]]
    if not spec:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = ["o", "s", "^", "D"]
    series: dict[tuple, list] = {}
    for c in spec:
        if c["engine"] != "swiftspec":
            continue
        key = (
            c["mode"],
            c["shape"],
            c["branching"] if c["shape"] == "tree" else None,
            c["max_depth"] if c["shape"] == "tree" else None,
            c["backend"],
        )
        series.setdefault(key, []).append(c)
    for k, ds in enumerate(datasets):
        for (mode, shape, b, d, backend), cs in series.items():
            pts = sorted(
                (c["tree_budget"], aggs[(ds, c["name"])]["acceptance_length"]["mean"])
                for c in cs
                if aggs.get((ds, c["name"])) and aggs[(ds, c["name"])]["acceptance_length"]
            )
            if not pts:
                continue
            label = f"{mode} {shape}" + (f" b{b} d{d}" if shape == "tree" else "") + f" {backend} — {ds}"
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker=markers[k % len(markers)],
                linestyle="-" if k == 0 else "--",
                label=label,
            )
        for c in spec:
            if c["engine"] in ("hf", "llamacpp"):
                a = aggs.get((ds, c["name"]))
                if a and a["acceptance_length"]:
                    ax.axhline(
                        a["acceptance_length"]["mean"],
                        color="gray" if c["engine"] == "hf" else "tab:brown",
                        linestyle=":" if k else "-.",
                        linewidth=1,
                        label=f"{config_label(c)} — {ds}",
                    )
    ax.set_xscale("log", base=2)
    low, high = ax.get_ylim()
    ax.set_ylim(min(0.9, low), max(high, 2.0))
    ax.set_xlabel("tree budget (draft nodes verified per target step)")
    ax.set_ylabel("acceptance length (tokens per verification)")
    ax.set_title(_title(document, "Acceptance length per tree budget"), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_context(document: dict, path: Path) -> Path | None:
    """Decode tokens/s, prefill tokens/s and TTFT per long-context prompt length N (log-2 axis), one
    line per configuration; None without long-context workloads."""
    from swiftspec.bench.long_context import workload_name

    contexts = document["settings"].get("context_tokens") or []
    if not contexts:
        return None
    plt = _plt()
    aggs = {(a["dataset"], a["config"]): a for a in document["aggregates"]}
    configs = [c["name"] for c in document["configs"] if c["status"] == "ok"]
    labels = {c["name"]: config_label(c) for c in document["configs"]}
    panels = (("tokens_per_s", "decode tokens/s"), ("prefill_tokens_per_s", "prefill tokens/s"), ("ttft_s", "TTFT, s"))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.5))
    for ax, (key, label) in zip(axes, panels):
        for name in configs:
            pts = [
                (n, aggs[(workload_name(n), name)][key]["mean"])
                for n in contexts
                if aggs.get((workload_name(n), name)) and aggs[(workload_name(n), name)][key]
            ]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=labels[name])
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [str(n) for n in contexts], fontsize=7)
        ax.set_xlabel("prompt tokens N")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(_title(document, "Long context: per prompt length (means over the prompts)"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def make_plots(document: dict, out_dir: Path) -> list[Path]:
    """Writes every plot that has data into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    made = [
        plot_tokens_per_s(document, out_dir / "tokens_per_s.png"),
        plot_speedup(document, out_dir / "speedup.png"),
        plot_acceptance(document, out_dir / "acceptance.png"),
        plot_context(document, out_dir / "context.png"),
    ]
    return [p for p in made if p is not None]
