"""The auto decode mode (issue 32) with a draft that never agrees with the target: a draft of the
target's vocabulary with random weights. The mode must fall back to target-only decoding within a
few rounds and speculate afterwards only in rare, short probes; its output stays the target's.
(The speed against target-only is measured by tools/bench_auto_mode.py, benchmarks/README.md.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

import swiftspec
from swiftspec.datasets import prompt_messages

TARGET = "qwen2.5-coder-1.5b-instruct"
NEW_TOKENS = 96


def random_draft(folder, vocab_size: int, tokenizer_from):
    """A 4-layer Llama-architecture draft of `vocab_size` tokens with random weights (float32,
    tied embeddings): a draft that costs a fraction of the target per step and agrees with it
    only by chance."""
    cfg = {
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    }
    rng = np.random.default_rng(32)
    h, i, q, kv = 512, 1536, 8 * 64, 2 * 64
    shapes = {"model.embed_tokens.weight": (vocab_size, h), "model.norm.weight": (h,)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    tensors = {
        k: (np.ones(s) if k.endswith("norm.weight") else rng.standard_normal(s) * 0.05).astype(np.float32)
        for k, s in shapes.items()
    }
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    manifest = {
        "format": "swiftspec-checkpoint",
        "format_version": 1,
        "dtype": "float32",
        "files": ["model.safetensors"],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def engine_with_a_random_draft(checkpoint_dir, tmp_path_factory):
    target = checkpoint_dir(TARGET, "bfloat16")
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    draft = random_draft(tmp_path_factory.mktemp("random-draft") / "draft", vocab, target)
    return swiftspec.Engine(str(target), str(draft), max_context=2048)


def test_auto_falls_back_to_target_only_with_a_draft_that_never_agrees(engine_with_a_random_draft, humaneval):
    engine = engine_with_a_random_draft
    prompt = prompt_messages("humaneval", humaneval[0])
    auto = engine.generate(prompt, max_new_tokens=NEW_TOKENS)  # the default mode: auto
    target = engine.generate(prompt, max_new_tokens=NEW_TOKENS, mode="target")
    assert auto.token_ids == target.token_ids
    rounds = auto.report["budget_per_round"]
    reasons = auto.report["round_reasons"]
    # measure target-only, then the start arm (budget 4 of 16); from then on target-only wins
    # ("best") and speculation runs only in probes of 3 rounds after 4, 8, 16, 32, ... target-only
    # rounds
    assert rounds[:2] == [0, 4]
    assert sum(auto.report["accepted_per_step"]) <= 2
    assert reasons["best"] >= len(rounds) - 2 - reasons.get("probe", 0) - reasons.get("limit", 0)
    assert reasons.get("probe", 0) <= 3 * 5 and reasons.get("refresh", 0) == 0
    assert sum(b > 0 for b in rounds) <= 1 + 3 * 5
    # target-only by the third round, or a round or two later when a busy machine disturbed the
    # single timing each arm has after rounds 0 and 1 (the per-round overheads are one sample)
    assert 0 in rounds[2:5], rounds[:8]


def test_the_next_request_starts_from_what_the_engine_measured(engine_with_a_random_draft, humaneval):
    """An engine hands each auto request's estimates to the next (SpeculationPolicy::Memory): after
    a request with a draft that never agrees, the next one measures nothing, starts target-only and
    probes no more often than the last one ended (every 64 target-only rounds or rarer after 96
    tokens), its output still target-only's."""
    engine = engine_with_a_random_draft
    engine.generate(prompt_messages("humaneval", humaneval[1]), max_new_tokens=NEW_TOKENS)  # measures, if first
    prompt = prompt_messages("humaneval", humaneval[2])
    second = engine.generate(prompt, max_new_tokens=NEW_TOKENS)
    assert second.token_ids == engine.generate(prompt, max_new_tokens=NEW_TOKENS, mode="target").token_ids
    reasons = second.report["round_reasons"]
    assert reasons.get("measure", 0) == 0, reasons
    assert second.report["budget_per_round"][0] == 0
    assert sum(b > 0 for b in second.report["budget_per_round"]) <= 3
