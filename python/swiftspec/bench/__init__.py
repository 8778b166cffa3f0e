"""The benchmark and evaluation harness behind ``swiftspec bench`` (issue 6).

One job per module:

* :mod:`~swiftspec.bench.config`   the configuration grammar (``target``, ``serial:tree16``, ...)
* :mod:`~swiftspec.bench.runner`   loads engines, runs prompts through configurations, one row each
* :mod:`~swiftspec.bench.long_context` the long-context workloads (``--context-tokens``): prompts of
                                   exactly N tokens
* :mod:`~swiftspec.bench.peers_hf` the HF transformers peers (target-only and assisted generation)
* :mod:`~swiftspec.bench.report`   speedups, output checks, aggregates; JSON and Markdown
* :mod:`~swiftspec.bench.plots`    PNG plots (matplotlib)
* :mod:`~swiftspec.bench.schema`   the JSON schema (the format's documentation) and validation
* :mod:`~swiftspec.bench.machine`  machine, CPU/GPU, software and commit information
* :mod:`~swiftspec.bench.api`      :func:`run_bench`, the whole pipeline; :func:`merge_bench`,
                                   several finished runs combined into one result

    from swiftspec.bench import run_bench
    doc = run_bench(datasets=["humaneval"], num_prompts=2, max_new_tokens=16,
                    configs="target,serial:tree16", out_dir="bench-out")
"""

from swiftspec.bench.api import merge_bench, run_bench
from swiftspec.bench.config import BenchConfig, BenchConfigError, parse_config, parse_config_list

__all__ = ["run_bench", "merge_bench", "BenchConfig", "BenchConfigError", "parse_config", "parse_config_list"]
