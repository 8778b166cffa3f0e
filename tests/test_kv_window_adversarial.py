"""The draft's attention window (placement ``{"draft": {"kv_window": [sinks, recent]}}``) under a
careless or hostile user, through the public API (swiftspec.Engine, the placement, the CLI, the
bench configurations), on a tiny random-weight model (seconds, no reference model).

What holds (and is checked here beyond tests/test_kv_window.py): greedy output is target-only's in
every decode mode, at every window (recent 1, no sinks, windows wider than the context, the
largest allowed), for 1-token prompts and for prompts and generations crossing the window's edge;
a seeded sampled request is target-only's token for token; tensor-parallel drafts and targets;
bad window values are refused naming the field and the value.

And the refusals at the edges (each found by an adversarial pass, 2026-12-07): a window on the cuda
backend is refused before anything loads (CLI, bench configuration), a NaN or an integer beyond
2**64 is named as what it is, numpy integers are taken as integers, and an Engine without a draft
warns that the draft group is ignored.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from safetensors.numpy import save_file
from tiny_checkpoint import TINY_CONFIG, TINY_MANIFEST, tiny_tensors

from swiftspec import Engine
from swiftspec.errors import InvalidRequestError

VOCAB = TINY_CONFIG["vocab_size"]
CONTEXT = 256
FULL_WINDOW = 1 << 20  # kMaxKvWindow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny 2-layer llama (vocabulary 64) with its matrices scaled by 3, so greedy decoding does
    not settle on one repeated token, and a word-level tokenizer (Engine needs one)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    path = tmp_path_factory.mktemp("tiny-window")
    cfg = dict(TINY_CONFIG, max_position_embeddings=CONTEXT)
    tensors = {k: (v * 3 if v.ndim > 1 else v) for k, v in tiny_tensors(cfg).items()}
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "manifest.json").write_text(json.dumps(TINY_MANIFEST))
    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path / "tokenizer.json"))
    return path


def _engine(tiny, window=None, **placement):
    if window is not None:
        placement.setdefault("draft", {})["kv_window"] = window
    return Engine(tiny, tiny, max_context=CONTEXT, num_threads=1, max_tree=64, placement=placement or None)


def _tokens(n, seed=0):
    # ids 3.. : 2 is the eos token, which would stop the prompt's continuation at once
    return [int(t) for t in np.random.default_rng(seed).integers(3, VOCAB, n)]


@pytest.fixture(scope="module")
def reference(tiny):
    return Engine(tiny, max_context=CONTEXT, num_threads=1)


# ----------------------------------------------------------------------- what holds (coverage)
@pytest.mark.parametrize("window", [[0, 1], [1, 1], [3, 5], [300, 300], [FULL_WINDOW, FULL_WINDOW]])
def test_windowed_self_draft_keeps_greedy_output_in_every_mode(tiny, reference, window):
    """A self-draft through the window: greedy output is target-only's in serial, async and auto
    modes, for a 1-token prompt, a prompt inside the window and one far past it, with generations
    crossing the window's edge and filling the context to its last slot."""
    engine = _engine(tiny, window)
    cases = [(1, 40), (4, 12), (90, 60), (CONTEXT - 20, 20)]
    for plen, n in cases:
        ids = _tokens(plen, seed=plen)
        want = reference.generate(ids, max_new_tokens=n, mode="target").token_ids
        assert len(set(want)) > 3  # (a model that repeats one token would prove nothing)
        for mode in ("serial", "async", "auto"):
            for shape in (
                dict(tree_budget=16, max_depth=8, branching=2),
                dict(tree_budget=4, max_depth=4, branching=1),
            ):
                got = engine.generate(ids, max_new_tokens=n, mode=mode, **shape)
                assert got.token_ids == want, (window, plen, n, mode, shape)
    engine.close()


def test_window_is_applied_by_the_engine_and_a_wide_one_is_full_attention(tiny):
    """Not accepted-and-ignored: a self-draft attending 1 key proposes worse than the full-attention
    self-draft; one wider than the context proposes exactly what the full-attention one does."""
    ids = _tokens(120, seed=3)
    kw = dict(max_new_tokens=60, mode="serial", tree_budget=8, max_depth=8, branching=1)
    full = _engine(tiny).generate(ids, **kw).stats
    wide = _engine(tiny, [2, CONTEXT + 1]).generate(ids, **kw).stats
    narrow = _engine(tiny, [0, 1]).generate(ids, **kw).stats
    for key in ("acceptance_length", "draft_steps", "verification_steps"):
        assert wide[key] == full[key], key
    assert narrow["acceptance_length"] < full["acceptance_length"]


@pytest.mark.parametrize("mode", ["serial", "async", "auto"])
def test_windowed_draft_keeps_a_seeded_sampled_output(tiny, reference, mode):
    """Target sampling draws each token from the target's distribution with target-only's uniform
    (docs/sampling_speculation.md), so a seeded sampled request is target-only's token for token,
    whatever the draft's window."""
    engine = _engine(tiny, [0, 2])
    ids = _tokens(50, seed=5)
    for temperature, top_k, top_p in [(0.7, 0, 1.0), (1.5, 20, 0.9)]:
        kw = dict(max_new_tokens=40, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
        want = reference.generate(ids, mode="target", **kw).token_ids
        assert engine.generate(ids, mode=mode, **kw).token_ids == want


def test_window_with_tensor_parallel_groups(tiny, reference):
    """A window on a TP-2 draft (cpu backend) masks as on a TP-1 one, next to a TP-2 target."""
    ids = _tokens(80, seed=7)
    want = reference.generate(ids, max_new_tokens=40, mode="target").token_ids
    tp1 = _engine(tiny, [2, 4])
    tp2 = _engine(tiny, [2, 4], draft={"tp": 2}, target={"tp": 2})
    for mode in ("serial", "async", "auto"):
        assert tp2.generate(ids, max_new_tokens=40, mode=mode).token_ids == want, mode

    def last_logits(engine):
        engine.draft_model.truncate_committed(0)  # (a request leaves its KV behind)
        return np.asarray(engine.draft_model.forward(ids, logits="last"))

    a, b, full = last_logits(tp1), last_logits(tp2), last_logits(_engine(tiny, draft={"tp": 2}))
    assert np.allclose(a, b, atol=1e-4) and not np.allclose(b, full, atol=1e-2)


@pytest.mark.parametrize(
    "window, match",
    [
        ([True, 64], "sinks must be an integer, got true"),
        ([4, False], "recent must be an integer, got false"),
        ([4, 64.0], "recent must be an integer, got 64.0"),
        ([4, 1e20], "recent is out of range: 1e\\+20"),  # (integral: the parser cannot tell 1e20 from 10**20)
        ([4, 1.5e3], "recent must be an integer, got 1500.0"),
        (["4", 64], 'sinks must be an integer, got "4"'),
        ([[4], 64], "sinks must be an integer, got an array"),
        ([4, None], "recent must be an integer, got null"),
        ([4, 2**31], "recent is out of range: 2147483648"),
        ([4, 2**31 - 1], r"\[4, 2147483647\]: .*kv_window_recent must be in \[0, 1048576\]"),
        ([FULL_WINDOW + 1, 1], "kv_window_sinks must be in"),
        ([4, 64, 1], r" must be \[sinks, recent\]"),
        ({"sinks": 4, "recent": 64}, r" must be \[sinks, recent\]"),
        (None, r" must be \[sinks, recent\]"),
    ],
)
def test_bad_window_values_are_refused_naming_field_and_value(tiny, window, match):
    """Refused by Engine (before anything is loaded), naming placement.draft.kv_window and the value:
    nothing coerced (true -> 1, 64.0 -> 64) or wrapped (2**31 -> negative)."""
    with pytest.raises(InvalidRequestError, match="placement.draft.kv_window.*" + match):
        Engine(tiny, tiny, max_context=CONTEXT, placement={"draft": {"kv_window": window}})


def test_zero_window_is_full_attention_and_normalizes_away():
    from swiftspec.placement import is_default_group, normalize

    p = normalize({"draft": {"kv_window": [0, 0]}, "target": {"kv_window": [0, 0]}})
    assert "kv_window" not in p["draft"] and is_default_group(p["draft"]) and is_default_group(p["target"])


# ------------------------------------------------------------------ what failed (expected behaviour)
def test_cli_refuses_a_draft_window_on_cuda_before_loading(monkeypatch, capsys):
    """A draft window on --backend cuda is refused by the CLI's checks, before the Engine loads
    anything (the runtime's rule, GroupPlacement::backend_problem), naming the field and the backend."""
    import swiftspec.engine
    from swiftspec.cli import main

    loaded = []

    class RecordLoad:
        def __init__(self, *args, **kwargs):
            loaded.append(kwargs)
            raise InvalidRequestError("stopped at loading")

    monkeypatch.setattr(swiftspec.engine, "Engine", RecordLoad)
    placement = json.dumps({"draft": {"kv_window": [4, 64]}})
    assert main(["generate", "--backend", "cuda", "--target", "t", "--draft", "d", "--placement", placement, "hi"]) == 2
    err = capsys.readouterr().err
    assert not loaded, "the engine was asked to load the models"
    assert "kv_window" in err and "cuda" in err


def test_bench_configuration_refuses_a_window_on_cuda():
    """``serial:tree16:w64@cuda`` is refused when the configuration is parsed, as ``sm16`` on the cpu
    backend is, naming w64 and the backend."""
    from swiftspec.bench.config import BenchConfigError, parse_config

    with pytest.raises(BenchConfigError, match="w64.*cuda|cuda.*w64"):
        parse_config("serial:tree16:w64@cuda")


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_window_in_a_dict_is_named(value):
    """A NaN or an infinity in a placement dict is named with its field, not passed on as JSON that
    the runtime's parser then calls invalid."""
    from swiftspec.placement import normalize

    with pytest.raises(InvalidRequestError) as info:
        normalize({"draft": {"kv_window": [value, 64]}})
    msg = str(info.value)
    assert "not valid JSON" not in msg, msg
    assert "kv_window" in msg and ("nan" in msg.lower() or "inf" in msg.lower()), msg


@pytest.mark.parametrize("big", [2**64, 10**30, -(2**63) - 1])
def test_integer_beyond_64_bits_is_out_of_range_not_a_non_integer(big):
    """An integer beyond 64 bits (which the JSON parser holds as a double) is out of range, as any
    integer too large, not "not an integer"."""
    from swiftspec.placement import normalize

    with pytest.raises(InvalidRequestError, match="placement.draft.kv_window recent is out of range"):
        normalize({"draft": {"kv_window": [4, big]}})


def test_engine_without_a_draft_does_not_silently_take_a_draft_window(tiny):
    """Engine(target, placement={"draft": {"kv_window": ...}}) without a draft warns that the draft
    group is ignored (the CLI says the same in its words)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            engine = Engine(tiny, max_context=CONTEXT, num_threads=1, placement={"draft": {"kv_window": [4, 64]}})
        except InvalidRequestError as exc:
            assert "draft" in str(exc)
            return
    assert any("draft" in str(w.message) for w in caught), f"accepted silently; engine.placement = {engine.placement}"


def test_numpy_integers_are_window_integers(tiny, reference):
    """numpy integers in a placement dict are integers (as for max_new_tokens): the window applies
    and greedy output stays the target's."""
    prompt = _tokens(12, seed=7)
    ref = reference.generate(prompt, max_new_tokens=24, temperature=0).token_ids
    engine = _engine(tiny, [np.int64(2), np.int32(8)])
    assert engine.placement["draft"]["kv_window"] == [2, 8]
    out = engine.generate(prompt, max_new_tokens=24, temperature=0, mode="serial").token_ids
    assert out == ref
