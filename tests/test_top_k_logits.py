"""Model.forward_top_k: each logits row's k best entries and its log-normalizer, without the
[rows, vocab] logits (what greedy decoding, greedy verification and top-k tree growth read).

The CPU backend's forward_top_k is the host reference (select_top_k_logits over forward()'s
rows); the CUDA backend's GPU selection is checked against the same reference on the GPU
machine (swiftspec-cuda-check, "forward_top_k == top-k of forward() logits"). Real model
(Qwen2.5-Coder 0.5B, bf16) and a real MT-Bench prompt.
"""

from __future__ import annotations

import numpy as np
import pytest

from swiftspec import InvalidRequestError
from swiftspec.datasets import prompt_messages
from swiftspec.swiftspec_core import ModelOptions, load_model, spec
from swiftspec.tokenizer import Tokenizer

DRAFT = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def model_and_prompt(checkpoint_dir, mtbench):
    opts = ModelOptions()
    opts.max_context = 512
    opts.max_tree = 32
    folder = checkpoint_dir(DRAFT, "bfloat16")
    model = load_model(str(folder), "cpu", opts)
    tok = Tokenizer.from_checkpoint(folder)
    ids = tok.encode_chat(prompt_messages("mtbench", mtbench[0]))
    return model, ids[:40]


def reference_top_k(logits: np.ndarray, k: int):
    """Top-k ids per row by (value descending, id ascending), their values, ln sum exp (float64)."""
    rows = logits.shape[0]
    ids = np.empty((rows, k), dtype=np.int32)
    for r in range(rows):
        order = np.lexsort((np.arange(logits.shape[1]), -logits[r].astype(np.float64)))
        ids[r] = order[:k]
    vals = np.take_along_axis(logits, ids.astype(np.int64), axis=1)
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    return ids, vals, lse


@pytest.mark.parametrize("k", [1, 2, 8, 1000, 151936])  # large k: the host path's partial sort
def test_append_rows_equal_the_top_k_of_forward(model_and_prompt, k):
    model, ids = model_and_prompt
    model.truncate_committed(0)
    full = model.forward(ids, logits="all")
    model.truncate_committed(0)
    top_ids, top_vals, lse = model.forward_top_k(ids, k, log_normalizer=True, logits="all")
    assert model.committed_len == len(ids)
    want_ids, want_vals, want_lse = reference_top_k(full, k)
    assert top_ids.shape == (len(ids), k) and top_ids.dtype == np.int32
    np.testing.assert_array_equal(top_ids, want_ids)
    np.testing.assert_array_equal(top_vals, want_vals)  # exactly the logits forward() returns
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)
    # the distribution is peaked: the first id is the model's greedy choice and carries real mass
    assert np.all(lse >= top_vals[:, 0])


def test_last_row_without_normalizer(model_and_prompt):
    model, ids = model_and_prompt
    model.truncate_committed(0)
    last = model.forward(ids)[0]
    model.truncate_committed(0)
    top_ids, top_vals, lse = model.forward_top_k(ids, 1)
    assert lse is None
    assert top_ids.shape == (1, 1) and int(top_ids[0, 0]) == int(np.argmax(last))
    assert top_vals[0, 0] == last.max()


def test_tree_rows_and_greedy_verification_from_the_argmax(model_and_prompt):
    model, ids = model_and_prompt
    model.truncate_committed(0)
    model.forward(ids, logits="none")
    base = model.committed_len
    # root + two children + a grandchild, in tree slots 3, 0, 1, 2
    tokens, parents = [ids[-1], 1, 2, 3], [-1, 0, 0, 1]
    depth = [0, 1, 1, 2]
    slots = [3, 0, 1, 2]
    offsets, attend = [0], []
    for i in range(4):
        chain, j = [], i
        while j >= 0:
            chain.append(slots[j])
            j = parents[j]
        attend += chain[::-1]
        offsets.append(len(attend))
    kw = dict(
        positions=[base + d for d in depth], logits="all", tree_slots=slots, attend_offsets=offsets, attend_slots=attend
    )
    full = model.forward(tokens, **kw)
    top_ids, top_vals, _ = model.forward_top_k(tokens, 3, **kw)
    assert model.committed_len == base  # tree mode commits nothing
    want_ids, want_vals, _ = reference_top_k(full, 3)
    np.testing.assert_array_equal(top_ids, want_ids)
    np.testing.assert_array_equal(top_vals, want_vals)
    # a tree whose first child is the target's greedy token: both verifiers accept it
    tree = spec.TokenTree(tokens[0])
    child = tree.add_child(0, int(want_ids[0, 0]), -0.1)
    tree.add_child(0, int(want_ids[0, 1]), -1.0)
    tree.add_child(child, 7, -2.0)
    rows = [0, 0, 0, 0]  # any rows: only the root's decides here (node 1's row is the next step)
    by_logits = spec.verify_greedy(tree, np.ascontiguousarray(full[rows]))
    by_argmax = spec.verify_greedy_argmax(tree, [int(top_ids[r, 0]) for r in rows])
    assert by_argmax == by_logits
    assert by_argmax["accepted_path"][:2] == [0, child]


def test_bad_k_is_refused_before_the_pass(model_and_prompt):
    model, ids = model_and_prompt
    model.truncate_committed(0)
    vocab = model.config["vocab_size"]
    for k in (0, -1, vocab + 1):
        with pytest.raises(InvalidRequestError, match=r"k must be in \[1, vocab=151936\]"):
            model.forward_top_k(ids[:3], k)
        assert model.committed_len == 0
    with pytest.raises(InvalidRequestError, match="2 arg-max ids for a tree of 1 nodes"):
        spec.verify_greedy_argmax(spec.TokenTree(5), [1, 2])


def test_host_selection_skips_nan_and_keeps_id_order_on_ties():
    v = np.array([0.5, np.nan, 2.0, 2.0, -np.inf, 2.0, np.nan], dtype=np.float32)
    assert spec.top_k_indices(v, 4) == [2, 3, 5, 0]
    assert spec.top_k_indices(np.full(3, np.nan, dtype=np.float32), 2) == []


def test_host_selection_of_a_large_k_equals_the_full_ranking():
    """k > 256 ranks by a partial sort (inserting into a sorted list was O(n k): 0.7 s for a 152k row
    at k = vocab, per sampled token with top_k >= vocab); same order, NaN skipped, ties by id."""
    rng = np.random.default_rng(3)
    v = rng.integers(-50, 50, size=20000).astype(np.float32)  # many exact ties
    v[[5, 77, 19999]] = np.nan
    v[[6, 8]] = -np.inf
    v[[100, 9000]] = -0.0
    finite = np.flatnonzero(~np.isnan(v))
    want = finite[np.lexsort((finite, -v[finite].astype(np.float64)))]
    for k in (257, 5000, 19997, 20000, 10**6):
        got = spec.top_k_indices(v, k)
        assert got == want[:k].tolist(), k
    assert len(spec.top_k_indices(v, 20000)) == 19997  # the 3 NaN are never selected
    assert spec.top_k_indices(np.full(300, np.nan, dtype=np.float32), 299) == []


def test_log_normalizer_at_a_temperature_and_reading_a_row_back(model_and_prompt, checkpoint_dir):
    """forward_top_k(inv_temperature=1/T): ln sum exp(logits / T) of each row (what sample_from_head
    reads), the selection unchanged, inv_temperature=1 bit-identical to the default; read_logits_row(r)
    returns forward()'s row r bit for bit, and refuses a row out of range, a pass that kept none (k = 1
    without normaliser), one replaced by a later forward(), and a model that ran no forward_top_k."""
    model, ids = model_and_prompt
    model.truncate_committed(0)
    full = model.forward(ids, logits="all")
    base = model.forward_top_k
    model.truncate_committed(0)
    ids1, vals1, lse1 = base(ids, 64, log_normalizer=True, logits="all")
    for temperature in (0.7, 1.5, 0.05):
        inv_t = 1.0 / float(np.float32(temperature))
        model.truncate_committed(0)
        top_ids, top_vals, lse = model.forward_top_k(ids, 64, log_normalizer=True, logits="all", inv_temperature=inv_t)
        np.testing.assert_array_equal(top_ids, ids1)
        np.testing.assert_array_equal(top_vals, vals1)
        x = full.astype(np.float64)
        m = x.max(axis=1, keepdims=True)
        want = (m * inv_t + np.log(np.exp((x - m) * inv_t).sum(axis=1, keepdims=True)))[:, 0]
        np.testing.assert_allclose(lse, want, rtol=1e-12)
        assert not np.allclose(lse, lse1)  # a different normaliser than T = 1's
        for r in (0, len(ids) // 2, len(ids) - 1):
            np.testing.assert_array_equal(model.read_logits_row(r).view(np.uint32), full[r].view(np.uint32))
    model.truncate_committed(0)
    _, _, lse_one = model.forward_top_k(ids, 64, log_normalizer=True, logits="all", inv_temperature=1.0)
    np.testing.assert_array_equal(lse_one, lse1)
    with pytest.raises(InvalidRequestError, match=r"read_logits_row: row 40 is outside \[0, rows=40\)"):
        model.read_logits_row(len(ids))
    with pytest.raises(InvalidRequestError, match=r"row -1 is outside"):
        model.read_logits_row(-1)
    model.truncate_committed(0)
    model.forward_top_k(ids, 1)
    with pytest.raises(InvalidRequestError, match=r"k = 1 without log-normalizer\) kept no logits"):
        model.read_logits_row(0)
    model.truncate_committed(0)
    model.forward_top_k(ids, 1, log_normalizer=True)  # the last row only
    np.testing.assert_array_equal(model.read_logits_row(0), full[-1])
    model.truncate_committed(0)
    model.forward(ids)
    with pytest.raises(InvalidRequestError, match="a later pass of this model replaced"):
        model.read_logits_row(0)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        model.truncate_committed(0)
        with pytest.raises(InvalidRequestError, match="inv_temperature must be a finite number > 0"):
            model.forward_top_k(ids, 4, log_normalizer=True, inv_temperature=bad)
        assert model.committed_len == 0  # refused before the pass
    opts = ModelOptions()
    opts.max_context = 64
    fresh = load_model(str(checkpoint_dir(DRAFT, "bfloat16")), "cpu", opts)
    with pytest.raises(InvalidRequestError, match="no forward_top_k has run on this model yet"):
        fresh.read_logits_row(0)
