"""The draft's attention window (attention sinks plus recent keys; ModelOptions.kv_window_sinks /
kv_window_recent, placement ``{"draft": {"kv_window": [sinks, recent]}}``; issue 27): which keys a
row attends, that tree rows keep batch invariance under it, its bounds, that only a draft takes it,
and that a windowed draft keeps greedy speculation exactly target-only on a real long prompt."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file
from tiny_checkpoint import TINY_CONFIG, TINY_MANIFEST, tiny_tensors

import swiftspec.swiftspec_core as core
from swiftspec import Engine
from swiftspec.errors import InvalidRequestError

# The tiny model has 2 layers: the last row's output depends on the tokens at most 2 windows back
# (layer 1 attends the recent keys, whose layer-0 states attended the recent keys before them).
LAYERS = TINY_CONFIG["num_hidden_layers"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    save_file(tiny_tensors(), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(TINY_CONFIG))
    (path / "manifest.json").write_text(json.dumps(TINY_MANIFEST))
    return path


def _model(tiny, sinks=0, recent=0):
    o = core.ModelOptions()
    o.num_threads = 1
    o.kv_window_sinks, o.kv_window_recent = sinks, recent
    return core.load_model(str(tiny), "cpu", o)


def _tokens(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(3, TINY_CONFIG["vocab_size"], n)]


def test_window_wider_than_the_context_is_full_attention(tiny):
    toks = _tokens(40)
    full = _model(tiny).forward(toks, logits="all")
    wide = _model(tiny, sinks=4, recent=40).forward(toks, logits="all")
    assert np.array_equal(full, wide)


def test_window_leaves_out_the_middle_keys(tiny):
    sinks, recent, n = 3, 5, 40
    toks = _tokens(n)
    last = _model(tiny, sinks, recent).forward(toks, logits="last")
    # Tokens between the sinks and what the last row can reach through its layers: ignored.
    reach = n - 1 - LAYERS * recent
    middle = list(toks)
    for p in range(sinks, reach):
        middle[p] = (middle[p] + 7) % (TINY_CONFIG["vocab_size"] - 3) + 3
    assert np.array_equal(last, _model(tiny, sinks, recent).forward(middle, logits="last"))
    # A sink token and a recent token are attended.
    for p in (1, n - 2):
        changed = list(toks)
        changed[p] = (changed[p] + 7) % (TINY_CONFIG["vocab_size"] - 3) + 3
        assert not np.array_equal(last, _model(tiny, sinks, recent).forward(changed, logits="last")), p
    # Under full attention the middle tokens count.
    assert not np.array_equal(_model(tiny).forward(toks, logits="last"), _model(tiny).forward(middle, logits="last"))


def test_tree_rows_equal_decoding_under_a_window(tiny):
    sinks, recent = 2, 6
    prefix = _tokens(30, seed=1)
    chain = _tokens(4, seed=2)
    decoded = _model(tiny, sinks, recent)
    decoded.forward(prefix, logits="last")
    rows = [decoded.forward([t], positions=[30 + i], logits="last") for i, t in enumerate(chain)]
    tree = _model(tiny, sinks, recent)
    tree.forward(prefix, logits="last")
    # The chain as a tree batch: node i in slot i, attending slots 0..i.
    offsets = [0]
    slots: list[int] = []
    for i in range(len(chain)):
        slots += list(range(i + 1))
        offsets.append(len(slots))
    out = tree.forward(
        chain,
        positions=[30 + i for i in range(len(chain))],
        logits="all",
        tree_slots=list(range(len(chain))),
        attend_offsets=offsets,
        attend_slots=slots,
    )
    for i, row in enumerate(rows):
        assert np.array_equal(out[i], row.reshape(-1)), i


@pytest.mark.parametrize(
    "sinks, recent, match",
    [
        (-1, 8, "kv_window_sinks must be in"),
        (0, -5, "kv_window_recent must be in"),
        (0, (1 << 20) + 1, "kv_window_recent must be in"),
        (4, 0, "needs a window"),
    ],
)
def test_window_bounds_are_checked(tiny, sinks, recent, match):
    with pytest.raises(InvalidRequestError, match=match):
        _model(tiny, sinks, recent)


def test_engine_refuses_a_windowed_target(tiny):
    """The window is a draft's: an engine over a target model loaded with one (the core API; the
    placement refuses it earlier) would emit other tokens than the full target."""
    with pytest.raises(InvalidRequestError, match="target model attends an attention window"):
        core.Engine(_model(tiny, 0, 8), _model(tiny))
    core.Engine(_model(tiny), _model(tiny, 0, 8)).close()  # (a windowed draft is the point)


def test_cuda_backend_refuses_a_window(tiny):
    o = core.ModelOptions()
    o.kv_window_recent = 64
    with pytest.raises(InvalidRequestError, match="cuda backend does not implement"):
        core.load_model(str(tiny), "cuda", o)


@pytest.mark.parametrize(
    "placement, match",
    [
        ({"target": {"kv_window": [4, 64]}}, "target.kv_window: the target attends its full KV"),
        ({"draft": {"kv_window": [4]}}, r"draft.kv_window must be \[sinks, recent\]"),
        ({"draft": {"kv_window": [4, -1]}}, r"draft.kv_window \[4, -1\]: .*kv_window_recent must be in"),
        ({"draft": {"kv_window": "wide"}}, r"draft.kv_window must be \[sinks, recent\]"),
        ({"draft": {"kv_window": [4.5, 64]}}, "draft.kv_window sinks must be an integer, got 4.5"),
        ({"draft": {"kv_window": [4, 2**40]}}, "draft.kv_window recent is out of range"),
    ],
)
def test_placement_window_errors_name_the_group(placement, match):
    from swiftspec.placement import normalize

    with pytest.raises(InvalidRequestError, match=match):
        normalize(placement)


def test_placement_window_round_trips():
    from swiftspec.placement import is_default_group, normalize

    p = normalize({"draft": {"kv_window": [4, 64]}})
    assert p["draft"]["kv_window"] == [4, 64]
    assert not is_default_group(p["draft"])
    assert "kv_window" not in p["target"]


def test_windowed_draft_keeps_greedy_output_on_a_long_prompt(checkpoint_dir, humaneval):
    """The 0.5B drafting for itself through a window of 4 sinks + 64 recent keys, on a real prompt of
    600 tokens: its proposals differ from the target's (acceptance below the full-attention
    self-draft's), and serial greedy output is token for token the target's."""
    from swiftspec.bench.long_context import ContextPrompts
    from swiftspec.tokenizer import Tokenizer

    model = checkpoint_dir("qwen2.5-coder-0.5b-instruct")
    _, ids = ContextPrompts(Tokenizer.from_checkpoint(model), humaneval).prompt(600, 0)
    tree = dict(tree_budget=8, max_depth=4, branching=2)
    full = Engine(model, model, max_context=1024, max_tree=64)
    windowed = Engine(model, model, max_context=1024, max_tree=64, placement={"draft": {"kv_window": [4, 64]}})
    ref = full.generate(ids, max_new_tokens=24, mode="target")
    same = full.generate(ids, max_new_tokens=24, mode="serial", **tree)
    out = windowed.generate(ids, max_new_tokens=24, mode="serial", **tree)
    assert same.token_ids == ref.token_ids and out.token_ids == ref.token_ids
    assert 1.0 <= out.stats["acceptance_length"] < same.stats["acceptance_length"]
