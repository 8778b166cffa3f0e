"""Lossless greedy speculation (issue 3): serial tree generation with the real
Qwen2.5-Coder pair (0.5B draft, 1.5B target) produces exactly the target-only greedy
tokens, for a chain and for trees, on real MT-Bench and HumanEval prompts; limits (stop
tokens, max_new_tokens, cancellation) cut the same sequence at the same place; stochastic
requests are reproducible from their seed and report the verification scheme they used;
bad tree parameters are rejected naming the field.

The full check (80 MT-Bench first turns + 40 HumanEval, 128 new tokens) is
tools/check_lossless.py; this is its CI-sized version.
"""

import re

import numpy as np
import pytest

from swiftspec import InvalidRequestError
from swiftspec.datasets import prompt_messages
from swiftspec.swiftspec_core import Engine, ModelOptions, load_model, spec
from swiftspec.tokenizer import Tokenizer

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
DTYPE = "bfloat16"  # exactness rests on batch invariance, which holds in any dtype
NEW_TOKENS = 32
PROMPTS = [("mtbench", 0), ("mtbench", 5), ("humaneval", 0), ("humaneval", 3)]
# (tree_budget, max_depth, branching): the chain and two trees
SHAPES = {"chain": (6, 6, 1), "tree16": (16, 6, 2), "tree32-wide": (32, 5, 4)}
CASES = [(k, "chain") for k in PROMPTS] + [(k, "tree16") for k in PROMPTS] + [(("humaneval", 3), "tree32-wide")]


@pytest.fixture(scope="module")
def pair(checkpoint_dir):
    opts = ModelOptions()
    opts.max_context = 1024
    opts.max_tree = 64
    target = load_model(str(checkpoint_dir(TARGET, DTYPE)), "cpu", opts)
    draft = load_model(str(checkpoint_dir(DRAFT, DTYPE)), "cpu", opts)
    tok = Tokenizer.from_checkpoint(checkpoint_dir(TARGET, DTYPE))
    return Engine(target, draft), target, draft, tok


@pytest.fixture(scope="module")
def prompts(pair, mtbench, humaneval):
    _, _, _, tok = pair
    sets = {"mtbench": mtbench, "humaneval": humaneval}
    return {(name, i): tok.encode_chat(prompt_messages(name, sets[name][i])) for name, i in PROMPTS}


@pytest.fixture(scope="module")
def reference(pair, prompts):
    """Target-only greedy tokens of every prompt."""
    engine = pair[0]
    return {
        key: engine.generate(ids, max_new_tokens=NEW_TOKENS, mode="target")["tokens"] for key, ids in prompts.items()
    }


@pytest.mark.parametrize("key,shape", CASES, ids=[f"{s}-{n}{i}" for (n, i), s in CASES])
def test_greedy_speculation_equals_target_only(pair, prompts, reference, key, shape):
    engine = pair[0]
    budget, depth, branching = SHAPES[shape]
    out = engine.generate(
        prompts[key], max_new_tokens=NEW_TOKENS, mode="serial", tree_budget=budget, max_depth=depth, branching=branching
    )
    ref = reference[key]
    st = out["stats"]
    first_diff = next((i for i, (a, b) in enumerate(zip(out["tokens"], ref)) if a != b), None)
    assert out["tokens"] == ref, f"first difference at new token {first_diff}"
    assert st["new_tokens"] == len(ref) and st["finish_reason"] in ("length", "stop")
    assert st["verification_steps"] >= 1 and st["draft_steps"] >= 1
    assert st["verification_steps"] < len(ref)  # speculation accepted something
    assert st["acceptance_length"] > 1.0
    assert 0 < st["target_time"] and 0 < st["draft_time"]
    assert st["target_time"] + st["draft_time"] <= st["decode_time"] * 1.01 + 1e-3
    print(
        f"{key} {shape}: acceptance length {st['acceptance_length']:.2f}, "
        f"{st['verification_steps']} verifications, {st['draft_steps']} draft steps"
    )


@pytest.mark.parametrize("key", PROMPTS, ids=[f"{n}{i}" for n, i in PROMPTS])
def test_greedy_auto_mode_equals_target_only(pair, prompts, reference, key):
    """The auto mode (issue 32) mixes target-only rounds and trees of several budgets in one
    request: its output is still target-only's, token for token, and its report accounts for every
    round (the engine's first auto request measures target-only, then the start arm, budget 4;
    later requests start from what the earlier ones measured)."""
    engine = pair[0]
    budget, depth, branching = SHAPES["tree16"]
    out = engine.generate(
        prompts[key], max_new_tokens=NEW_TOKENS, mode="auto", tree_budget=budget, max_depth=depth, branching=branching
    )
    ref = reference[key]
    first_diff = next((i for i, (a, b) in enumerate(zip(out["tokens"], ref)) if a != b), None)
    assert out["tokens"] == ref, f"first difference at new token {first_diff}"
    rep, st = out["report"], out["stats"]
    rounds = rep["budget_per_round"]
    assert set(rounds) <= {0, 1, 2, 4, 8, budget}
    measured = rep["round_reasons"].get("measure", 0)
    assert measured in (0, 2) and (measured == 0 or rounds[:2] == [0, 4])
    assert len(rounds) == st["verification_steps"] == len(rep["accepted_per_step"])
    assert sum(rep["round_reasons"].values()) == len(rounds)
    # every round emits its accepted tokens and one more: together, the request's tokens
    assert sum(rep["accepted_per_step"]) + len(rounds) + 1 == len(ref)
    # the draft catches up with the tokens of target-only rounds before a speculative one
    sat_out = any(b > 0 and 0 in rounds[:i] for i, b in enumerate(rounds))
    assert (rep["caught_up_tokens"] >= 1) == sat_out
    print(f"{key}: rounds {rounds}")


def test_teacher_forced_reference_confirms_target_only_output(pair, prompts, reference):
    """tools/check_lossless.py --reference prefill: one batched target pass over the prompt and
    the target-only tokens confirms them (batch invariance); any changed token, a truncated
    sequence that did not stop, or an empty one is not confirmed."""
    from swiftspec.bench.greedy_reference import teacher_forced_reference

    _, target, _, _ = pair
    key = ("humaneval", 3)
    ids, ref = prompts[key], reference[key]
    assert len(ref) == NEW_TOKENS
    assert teacher_forced_reference(target, ids, ref, NEW_TOKENS) == ref
    for pos in (0, NEW_TOKENS // 2, NEW_TOKENS - 1):
        wrong = list(ref)
        wrong[pos] = (wrong[pos] + 1) % 1000
        assert teacher_forced_reference(target, ids, wrong, NEW_TOKENS) is None
    assert teacher_forced_reference(target, ids, ref[:-1], NEW_TOKENS) is None  # did not stop there
    j = max(i for i, t in enumerate(ref) if t not in ref[:i])  # a token's first occurrence
    assert teacher_forced_reference(target, ids, ref[: j + 1], NEW_TOKENS, stop_token_ids=[ref[j]]) == ref[: j + 1]
    if j + 1 < len(ref):  # past a stop token: decoding would have stopped at it
        assert teacher_forced_reference(target, ids, ref[: j + 2], NEW_TOKENS, stop_token_ids=[ref[j]]) is None
    assert teacher_forced_reference(target, ids, [], NEW_TOKENS) is None
    assert target.committed_len == 0


def test_forced_sampled_growth_also_exact_when_greedy(pair, prompts, reference):
    """The explicit-options entry point with a forced growth rule (sampled growth from a
    greedy request: one-hot draft distributions, so a chain) and a forced expansion width
    gives the same greedy output, and reports greedy verification."""
    _, target, draft, _ = pair
    key = ("humaneval", 0)
    for growth in ("sampled",):
        out = spec.generate_serial(
            target,
            draft,
            prompts[key],
            max_new_tokens=NEW_TOKENS,
            tree_budget=12,
            max_depth=6,
            branching=3,
            growth=growth,
            expand_width=2,
        )
        assert out["tokens"] == reference[key], growth
        assert out["report"]["verification"] == "greedy"
        assert out["report"]["growth"] == growth
        assert sum(out["report"]["accepted_per_step"]) + out["stats"]["verification_steps"] >= NEW_TOKENS - 1


def test_limits_cut_the_same_sequence(pair, prompts, reference):
    engine = pair[0]
    key = ("mtbench", 0)
    ref = reference[key]
    # max_new_tokens smaller than what one verification can accept
    out = engine.generate(prompts[key], max_new_tokens=3, mode="serial", tree_budget=16, max_depth=8, branching=2)
    assert out["tokens"] == ref[:3] and out["stats"]["finish_reason"] == "length"
    # a stop token in the middle of the reference output
    stop = ref[10]
    cut = ref.index(stop) + 1
    out = engine.generate(prompts[key], max_new_tokens=NEW_TOKENS, mode="serial", stop_token_ids=[stop])
    assert out["tokens"] == ref[:cut] and out["stats"]["finish_reason"] == "stop"
    # cancellation from the streaming callback after at least 7 tokens
    streamed = []

    def on_tokens(toks):
        streamed.extend(toks)
        return len(streamed) < 7

    out = engine.generate(prompts[key], max_new_tokens=NEW_TOKENS, mode="serial", on_tokens=on_tokens)
    assert out["stats"]["finish_reason"] == "cancelled"
    assert out["tokens"] == streamed == ref[: len(streamed)] and len(streamed) >= 7


@pytest.mark.parametrize(
    "growth,scheme,top_k",
    [("sampled", "rejection_sampling", 0), ("top_k", "target_sampling", 0), ("top_k", "target_sampling", 20)],
)
def test_stochastic_generation_is_seeded_and_reports_scheme(pair, prompts, growth, scheme, top_k):
    """top_k=20 with top-k growth: the verifier samples from each row's 20 best logits
    (Model.forward_top_k, sample_from_top_k) instead of the [n, vocab] distributions."""
    _, target, draft, _ = pair
    ids = prompts[("mtbench", 5)]
    kw = dict(
        max_new_tokens=8,
        temperature=0.8,
        top_p=0.95,
        top_k=top_k,
        tree_budget=8,
        max_depth=4,
        branching=2,
        growth=growth,
    )
    a = spec.generate_serial(target, draft, ids, seed=11, **kw)
    b = spec.generate_serial(target, draft, ids, seed=11, **kw)
    c = spec.generate_serial(target, draft, ids, seed=12, **kw)
    assert a["tokens"] == b["tokens"]
    assert len(a["tokens"]) == 8 or a["stats"]["finish_reason"] == "stop"
    assert a["tokens"] != c["tokens"]  # different seeds: a different sample (at T=0.8, 8 tokens)
    rep = a["report"]
    assert rep["growth"] == growth
    assert rep["verification"] == scheme
    if growth == "sampled":
        assert rep["rejection_sampling_nodes"] >= a["stats"]["verification_steps"] - 1  # last tree may be a lone root
        assert rep["target_sampling_nodes"] == 0
    else:
        assert rep["rejection_sampling_nodes"] == 0 and rep["target_sampling_nodes"] >= 1


def test_a_top_k_of_the_whole_vocabulary_verifies_like_no_top_k(pair, prompts):
    """top_k >= vocab keeps every token: the verifier samples the [n, vocab] distributions as for
    top_k=0, with the same seeded tokens (before: it ranked every row's 152k logits, 0.7 s a row, and
    drew in rank order)."""
    _, target, draft, _ = pair
    ids = prompts[("mtbench", 5)]
    kw = dict(
        max_new_tokens=8, temperature=0.8, top_p=0.95, tree_budget=8, max_depth=4, branching=2, growth="top_k", seed=11
    )
    want = spec.generate_serial(target, draft, ids, top_k=0, **kw)["tokens"]
    assert spec.generate_serial(target, draft, ids, top_k=target.config["vocab_size"], **kw)["tokens"] == want


def test_bad_tree_parameters_are_rejected(pair, prompts):
    engine, target, draft, _ = pair
    ids = prompts[("humaneval", 0)]
    with pytest.raises(
        InvalidRequestError, match="tree_budget 64 needs 65 tree slots but the target has max_tree = 64"
    ):
        engine.generate(ids, max_new_tokens=4, mode="serial", tree_budget=64)
    with pytest.raises(InvalidRequestError, match="branching must be >= 1, got 0"):
        engine.generate(ids, max_new_tokens=4, mode="serial", branching=0)
    with pytest.raises(InvalidRequestError, match="max_depth must be >= 1, got -2"):
        engine.generate(ids, max_new_tokens=4, mode="serial", max_depth=-2)
    with pytest.raises(InvalidRequestError, match="expand_width must be >= 0"):
        spec.generate_serial(target, draft, ids, max_new_tokens=4, expand_width=-1)
    with pytest.raises(InvalidRequestError, match="growth must be 'auto', 'top_k' or 'sampled'"):
        spec.generate_serial(target, draft, ids, max_new_tokens=4, growth="beam")
    with pytest.raises(
        InvalidRequestError, match=re.escape("exceeds the context of 1024 tokens (the target's max_context)")
    ):
        spec.generate_serial(target, draft, ids, max_new_tokens=1024)
    # still usable afterwards
    out = engine.generate(ids, max_new_tokens=4, mode="serial")
    assert len(out["tokens"]) == 4 and np.all(np.array(out["tokens"]) >= 0)
