"""RoPE scaling for long contexts (issue 27: Llama 3.1 "llama3" scaling and YaRN, as Qwen2.5
documents past 32K) against HF transformers, the independent oracle.

* The RoPE tables both backends rotate with (``swiftspec_core.rope_tables``, cpp/src/model_api/
  rope_tables.cpp) equal HF's (``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``) bit for
  bit in fp32 given the same powers theta^(2i/d) (torch's vectorized pow is off by 1 ulp at times:
  within 1 ulp of HF as it runs), at the real models' shapes (head_dim 128, theta 1e6 / 5e5,
  original contexts of 32768 / 8192) and with every YaRN option HF reads.
* Tiny random Llama and Qwen2 models written as HF folders (``save_pretrained``), converted by
  ``convert_hf`` and run on the CPU backend: full-model logits within 1e-4 relative error of HF
  fp32 at every position of a 320-token prompt, i.e. at 256 positions past an original context of
  64; the same weights without the scaling are far off there (the comparison can fail).
* A model without scaling computes what it did before (``default`` spelled three ways gives
  bit-identical logits, matching HF).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from swiftspec import swiftspec_core as core
from swiftspec.convert import convert_hf

ORIGINAL = 64  # the tiny models' "pretraining" context
PROMPT = 320  # tokens: 256 positions past it
VOCAB = 256


def hf_config(arch: str, rope_scaling: dict | None, **overrides):
    """A transformers config of a tiny Llama or Qwen2 (2 layers, 4 query heads of 32, 2 KV heads)."""
    from transformers import LlamaConfig, Qwen2Config

    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        # larger than HF's 0.02 so that attention is far from uniform and positions matter
        initializer_range=0.25,
    )
    kwargs.update(overrides)
    if rope_scaling is not None:
        kwargs["rope_scaling"] = dict(rope_scaling)
    return (LlamaConfig if arch == "llama" else Qwen2Config)(**kwargs)


def hf_tables(config) -> tuple[np.ndarray, float]:
    """HF's (inv_freq, attention_scaling) for a transformers config."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = config.rope_parameters["rope_type"]
    if kind == "default":
        base, dim = config.rope_parameters["rope_theta"], config.head_dim
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
        return inv.numpy(), 1.0
    inv, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv.numpy(), scale


@contextmanager
def correctly_rounded_powers():
    """HF's ``theta ** tensor`` (Tensor.__rpow__) computed in float64 and rounded to fp32 once.
    torch's vectorized fp32 pow is within 1 ulp but not always correctly rounded (theta 1e6,
    exponent 74/128: 2942.72705 where the nearest fp32 is 2942.72729), and which element it
    rounds differently depends on the tensor's length; the runtime uses libm's powf, which is."""
    plain = torch.Tensor.__rpow__
    torch.Tensor.__rpow__ = lambda self, base: torch.pow(torch.tensor(base, dtype=torch.float64), self.double()).to(
        self.dtype
    )
    try:
        yield
    finally:
        torch.Tensor.__rpow__ = plain


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in fp32 units in the last place of positive fp32 arrays."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def runtime_config_text(arch: str, rope_scaling: dict | None, **overrides) -> str:
    """The checkpoint config.json the converter would write for the same model, as text."""
    config = hf_config(arch, None, **overrides).to_dict()
    config.pop("rope_parameters", None)
    config["model_type"] = arch
    config["rope_theta"] = overrides.get("rope_theta", 10000.0)
    config["rope_scaling"] = rope_scaling
    return json.dumps(config)


QWEN25_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}  # Qwen2.5's README
LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
QWEN_SHAPE = dict(
    hidden_size=1536, num_attention_heads=12, head_dim=128, rope_theta=1000000.0, max_position_embeddings=131072
)
LLAMA_SHAPE = dict(
    hidden_size=4096, num_attention_heads=32, head_dim=128, rope_theta=500000.0, max_position_embeddings=131072
)

TABLE_CASES = {
    "qwen2.5 yarn": ("qwen2", QWEN25_YARN, QWEN_SHAPE),
    "llama3.1 llama3": ("llama", LLAMA31, LLAMA_SHAPE),
    "qwen2.5 default": ("qwen2", None, QWEN_SHAPE),
    "yarn factor 16 beta 16/2": (
        "qwen2",
        {
            "rope_type": "yarn",
            "factor": 16.0,
            "beta_fast": 16,
            "beta_slow": 2,
            "original_max_position_embeddings": 4096,
        },
        QWEN_SHAPE,
    ),
    "yarn not truncated": ("qwen2", {**QWEN25_YARN, "truncate": False}, QWEN_SHAPE),
    "yarn mscale / mscale_all_dim": (
        "llama",
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
        },
        LLAMA_SHAPE,
    ),
    "yarn attention_factor given": ("qwen2", {**QWEN25_YARN, "attention_factor": 1.3}, QWEN_SHAPE),
    "yarn zero-width ramp": (
        "qwen2",
        {
            "rope_type": "yarn",
            "factor": 2.0,
            "beta_fast": 8,
            "beta_slow": 8,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        QWEN_SHAPE,
    ),
    "yarn tiny (the models below)": (
        "qwen2",
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
        {},
    ),
    "llama3 tiny (the models below)": (
        "llama",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
        {},
    ),
}


@pytest.mark.parametrize("case", TABLE_CASES)
def test_rope_tables_equal_hf(case):
    """Bit for bit HF's fp32 arithmetic given the same powers theta^(2i/d); within 1 ulp of HF as it
    runs (torch's own pow); the same attention scale."""
    arch, scaling, shape = TABLE_CASES[case]
    ours = core.rope_tables(runtime_config_text(arch, scaling, **shape), "config.json")
    inv = np.asarray(ours["inv_freq"], dtype=np.float32)
    with correctly_rounded_powers():
        exact, exact_scale = hf_tables(hf_config(arch, scaling, **shape))
    ref_inv, ref_scale = hf_tables(hf_config(arch, scaling, **shape))
    assert inv.shape == exact.shape == ref_inv.shape == (shape.get("head_dim", 32) // 2,)
    mismatch = np.flatnonzero(inv != exact)
    assert mismatch.size == 0, f"pairs {mismatch.tolist()}: ours {inv[mismatch]} HF {exact[mismatch]}"
    assert ulps(inv, ref_inv).max() <= 1
    assert ours["attention_scale"] == np.float32(ref_scale) == np.float32(exact_scale)
    if scaling is not None:  # the scaling changes the table (or the scale): the test can fail
        plain, _ = hf_tables(hf_config(arch, None, **shape))
        assert not np.array_equal(inv, plain) or ours["attention_scale"] != 1.0


def test_yarn_attention_factor_is_reported_as_resolved():
    """config dict: YaRN's attention factor derived as HF does (0.1 ln 4 + 1) when not given."""
    config = core.parse_model_config(runtime_config_text("qwen2", QWEN25_YARN, **QWEN_SHAPE), "config.json")
    assert config["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": pytest.approx(0.1 * np.log(4.0) + 1.0, abs=1e-15),
        "truncate": True,
    }
    assert core.parse_model_config(runtime_config_text("qwen2", None), "c")["rope_scaling"] is None


def test_yarn_extends_the_context_a_model_may_take():
    """Qwen2.5 ships max_position_embeddings 32768 and documents YaRN factor 4 for 131072 tokens: with the
    scaling the runtime allows (and by default plans for) factor x original positions; without it, or with
    llama3 (whose configs already give the extended length), max_position_embeddings stays the bound."""
    from swiftspec import InvalidRequestError

    yarn = runtime_config_text("qwen2", QWEN25_YARN, **{**QWEN_SHAPE, "max_position_embeddings": 32768})
    plain = runtime_config_text("qwen2", None, **{**QWEN_SHAPE, "max_position_embeddings": 32768})
    llama = runtime_config_text("llama", LLAMA31, **LLAMA_SHAPE)
    assert core.parse_model_config(yarn, "c")["context_limit"] == 131072
    assert core.parse_model_config(plain, "c")["context_limit"] == 32768
    assert core.parse_model_config(llama, "c")["context_limit"] == 131072  # its max_position_embeddings
    assert core.resolve_max_context(yarn, "c", 100000) == 100000
    assert core.resolve_max_context(yarn, "c", 0) == 131072
    with pytest.raises(InvalidRequestError, match="max_context 131073 exceeds .* 131072"):
        core.resolve_max_context(yarn, "c", 131073)
    with pytest.raises(InvalidRequestError, match="max_context 100000 exceeds .* 32768"):
        core.resolve_max_context(plain, "c", 100000)


# --------------------------------------------------------------------------- whole tiny models vs HF


def write_hf_folder(path: Path, config, seed: int = 0) -> Path:
    """A random-weight HF model folder (config.json, model.safetensors) plus a word-level
    tokenizer.json (the converter copies it; nothing here tokenizes)."""
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(path / "tokenizer.json"))
    return path


def hf_logits(hf_dir: Path, ids: list[int]) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def our_logits(ckpt: Path, ids: list[int]) -> np.ndarray:
    opts = core.ModelOptions()
    opts.max_context = 512
    return core.load_model(str(ckpt), "cpu", opts).forward(ids, logits="all")


def relative_error(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per position: ||ours - ref|| / ||ref|| over the vocabulary (as test_forward_vs_hf.py)."""
    return np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)


SCALED_MODELS = {
    "llama + llama3": (
        "llama",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
    ),
    "qwen2 + yarn (Qwen2.5's keys)": (
        "qwen2",
        {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    ),
    "llama + yarn, every option": (
        "llama",
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "truncate": False,
            "original_max_position_embeddings": ORIGINAL,
        },
    ),
    "qwen2 + yarn, attention_factor": (
        "qwen2",
        {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.25, "original_max_position_embeddings": ORIGINAL},
    ),
}


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return np.random.default_rng(7).integers(0, VOCAB, PROMPT).tolist()


@pytest.mark.parametrize("case", SCALED_MODELS)
def test_scaled_model_logits_match_hf_past_the_original_context(case, prompt, tmp_path):
    arch, scaling = SCALED_MODELS[case]
    hf_dir = write_hf_folder(tmp_path / "hf", hf_config(arch, scaling))
    saved = json.loads((hf_dir / "config.json").read_text())
    if "type" in scaling:  # written back the way Qwen2.5's config.json has it: a legacy rope_scaling object
        saved.pop("rope_parameters")
        saved["rope_theta"], saved["rope_scaling"] = 10000.0, scaling
        (hf_dir / "config.json").write_text(json.dumps(saved))
    ckpt = convert_hf(hf_dir, tmp_path / "ckpt", "float32", progress=False)

    ref = hf_logits(hf_dir, prompt)
    ours = our_logits(ckpt, prompt)
    assert ours.shape == ref.shape == (PROMPT, VOCAB)
    rel = relative_error(ours, ref)
    assert rel.max() < 1e-4, f"max relative error {rel.max():.2e} at position {rel.argmax()}"
    assert rel[ORIGINAL:].size == PROMPT - ORIGINAL
    assert (ours.argmax(axis=1) == ref.argmax(axis=1)).mean() > 0.98

    # The same weights with plain RoPE: far from HF past the original context, so the check above
    # sees the scaling.
    config = json.loads((ckpt / "config.json").read_text())
    config["rope_scaling"] = None
    (ckpt / "config.json").write_text(json.dumps(config))
    plain = relative_error(our_logits(ckpt, prompt), ref)
    assert plain[ORIGINAL:].max() > 1e-2, plain[ORIGINAL:].max()


def test_unscaled_model_logits_are_unchanged(prompt, tmp_path):
    """No scaling, spelled three ways (no key, rope_scaling default, transformers 5's rope_parameters):
    bit-identical logits, within 1e-4 of HF at every position; the cos/sin scale stays exactly 1."""
    hf_dir = write_hf_folder(tmp_path / "hf", hf_config("qwen2", None))
    ref = hf_logits(hf_dir, prompt)
    ckpt = convert_hf(hf_dir, tmp_path / "ckpt", "float32", progress=False)
    config = json.loads((ckpt / "config.json").read_text())
    assert config["rope_scaling"] is None
    logits = []
    for spelling in (
        {},
        {"rope_scaling": {"rope_type": "default"}},
        {
            "rope_scaling": None,
            "rope_theta": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": config["rope_theta"]},
        },
    ):
        (ckpt / "config.json").write_text(json.dumps({**config, **spelling}))
        assert core.rope_tables((ckpt / "config.json").read_text(), "c")["attention_scale"] == 1.0
        logits.append(our_logits(ckpt, prompt))
    assert np.array_equal(logits[0], logits[1]) and np.array_equal(logits[0], logits[2])
    rel = relative_error(logits[0], ref)
    assert rel.max() < 1e-4, f"max relative error {rel.max():.2e} at position {rel.argmax()}"
