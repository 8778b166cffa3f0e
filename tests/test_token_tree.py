"""Token tree (cpp/include/swiftspec/token_tree.h): structure, tree attention mask,
positions, best prefix-closed subtree selection, sub-tree extraction and re-rooting;
and a draft tree grown by the real draft model whose every log-probability matches
plain decoding of the node's path."""

import math

import numpy as np
import pytest

from swiftspec import InvalidRequestError
from swiftspec.swiftspec_core import ModelOptions, load_model, spec

DRAFT = "qwen2.5-coder-0.5b-instruct"


def random_tree(rng, size, root_token=7, max_children=4, zero_prob=0.1):
    """A random prefix-closed tree with distinct sibling tokens and logprobs <= 0
    (some exactly 0, to exercise ties)."""
    t = spec.TokenTree(root_token)
    while len(t) < size:
        parent = int(rng.integers(0, len(t)))
        if len(t.children(parent)) >= max_children:
            continue
        token = int(rng.integers(0, 50))
        if t.find_child(parent, token) >= 0:
            continue
        lp = 0.0 if rng.random() < zero_prob else float(-rng.exponential(1.0))
        t.add_child(parent, token, lp)
    return t


def brute_force_best(t, budget, max_depth, node_limit=None):
    """Top `budget` non-root nodes by (cum_logprob desc, index asc) among depth <= max_depth (and
    index < node_limit)."""
    cand = [i for i in range(1, node_limit or len(t)) if t.depths[i] <= max_depth]
    cand.sort(key=lambda i: (-t.cum_logprobs[i], i))
    return sorted([0] + cand[:budget])


def test_structure_mask_positions():
    t = spec.TokenTree(100)
    a = t.add_child(0, 11, -0.5)
    b = t.add_child(0, 12, -1.5)
    c = t.add_child(a, 13, -0.25)
    d = t.add_child(c, 14, 0.0)
    assert (a, b, c, d) == (1, 2, 3, 4)
    assert t.tokens == [100, 11, 12, 13, 14]
    assert t.parents == [-1, 0, 0, 1, 3]
    assert t.depths == [0, 1, 1, 2, 3]
    assert t.cum_logprobs == pytest.approx([0.0, -0.5, -1.5, -0.75, -0.75])
    assert t.max_depth == 3
    assert t.path_to(4) == [0, 1, 3, 4]
    assert t.path_tokens(4) == [100, 11, 13, 14]
    assert t.positions(40) == [40, 41, 41, 42, 43]
    expect = np.array(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]], dtype=np.uint8
    )
    np.testing.assert_array_equal(t.attention_mask(), expect)
    offsets, values = t.ancestors_csr()
    assert offsets == [0, 1, 3, 5, 8, 12]
    assert values == [0, 0, 1, 0, 2, 0, 1, 3, 0, 1, 3, 4]
    t.check_invariants()


def test_add_child_rejects_bad_input():
    t = spec.TokenTree(1)
    t.add_child(0, 5, -0.1)
    with pytest.raises(InvalidRequestError, match="already has a child with token 5"):
        t.add_child(0, 5, -0.2)
    with pytest.raises(InvalidRequestError, match="parent 9 out of range"):
        t.add_child(9, 6, -0.2)
    with pytest.raises(InvalidRequestError, match="logprob must be <= 0"):
        t.add_child(0, 6, 0.5)
    with pytest.raises(InvalidRequestError, match="token must be >= 0"):
        t.add_child(0, -3, -0.1)
    with pytest.raises(InvalidRequestError, match="is not the token of one of its children"):
        t.set_expanded(0, [5, 8])


@pytest.mark.parametrize("seed", range(20))
def test_select_best_is_top_b_and_prefix_closed(seed):
    rng = np.random.default_rng(seed)
    t = random_tree(rng, int(rng.integers(1, 80)))
    t.check_invariants()
    for budget in (0, 1, 3, 8, 16, 64, 200):
        for max_depth in (0, 1, 2, 4, 100):
            got = t.select_best(budget, max_depth)
            assert got == brute_force_best(t, budget, max_depth)
            chosen = set(got)
            assert all(t.parents[i] in chosen for i in got if i != 0)  # prefix-closed
    # The tree as it stood with its first n nodes (a growing tree only appends): the auto mode's
    # counterfactual trees of smaller arms.
    for n in sorted({1, 2, len(t) // 2 or 1, len(t)}):
        for budget in (1, 3, 16):
            assert t.select_best(budget, 100, n) == brute_force_best(t, budget, 100, n)


@pytest.mark.parametrize("seed", range(10))
def test_subtree_keeps_structure(seed):
    rng = np.random.default_rng(100 + seed)
    t = random_tree(rng, 40)
    nodes = t.select_best(15, 3)
    s, new_to_old = t.subtree(nodes)
    s.check_invariants()
    assert new_to_old == nodes
    for new, old in enumerate(new_to_old):
        assert s.tokens[new] == t.tokens[old]
        assert s.depths[new] == t.depths[old]
        assert s.cum_logprobs[new] == t.cum_logprobs[old]
        if new:
            assert new_to_old[s.parents[new]] == t.parents[old]
    with pytest.raises(InvalidRequestError, match="must contain the root"):
        t.subtree([1, 2])
    child_of_1 = t.children(1)
    if child_of_1:
        with pytest.raises(InvalidRequestError, match="prefix-closed"):
            t.subtree([0, child_of_1[0]])


def test_subtree_drops_draws_unless_whole_tree():
    t = spec.TokenTree(3)
    t.add_child(0, 10, math.log(0.5))
    t.add_child(0, 11, math.log(0.25))
    t.set_expanded(0, [10, 11, 10])
    whole, _ = t.subtree([0, 1, 2])
    assert whole.draws(0) == [10, 11, 10]
    part, _ = t.subtree([0, 1])
    assert part.draws(0) == []  # a value-dependent subset is no longer an i.i.d. sample
    assert part.children(0) == [1]


@pytest.mark.parametrize("seed", range(10))
def test_reroot_keeps_subtree_and_rebases(seed):
    rng = np.random.default_rng(200 + seed)
    t = random_tree(rng, 50)
    before = t.copy()
    new_root = int(rng.integers(1, len(t)))
    old_to_new = t.reroot(new_root)
    t.check_invariants()
    assert len(old_to_new) == len(before)
    # kept = new_root and its descendants, in the old order
    kept = [i for i in range(len(before)) if new_root in before.path_to(i)]
    assert [i for i, n in enumerate(old_to_new) if n >= 0] == kept
    assert [old_to_new[i] for i in kept] == list(range(len(kept)))
    base_depth, base_cum = before.depths[new_root], before.cum_logprobs[new_root]
    for old in kept:
        new = old_to_new[old]
        assert t.tokens[new] == before.tokens[old]
        assert t.depths[new] == before.depths[old] - base_depth
        assert t.cum_logprobs[new] == pytest.approx(before.cum_logprobs[old] - base_cum, abs=1e-12)
        # same token path below the new root
        assert t.path_tokens(new) == before.path_tokens(old)[base_depth:]
    assert t.logprobs[0] == 0.0 and t.parents[0] == -1


def test_reroot_clears_draws():
    t = spec.TokenTree(3)
    a = t.add_child(0, 10, -0.1)
    t.set_expanded(0, [10])
    t.add_child(a, 20, -0.2)
    t.set_expanded(a, [20, 20])
    t.reroot(a)
    assert t.tokens == [10, 20]
    assert t.draws(0) == []
    assert t.expanded(0)


@pytest.fixture(scope="module")
def draft_model(checkpoint_dir):
    opts = ModelOptions()
    opts.max_context = 512
    opts.max_tree = 64
    return load_model(str(checkpoint_dir(DRAFT, "float32")), "cpu", opts)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def test_real_draft_tree_matches_plain_decoding(draft_model, checkpoint_dir, humaneval):
    """Grow a best-first tree (top-k, width 1) with the real draft on a real prompt,
    then check every node's draft log-probability against plain append-mode decoding
    of its path, and the best-first order: no unexpanded node is more probable than
    an expanded one."""
    from swiftspec.datasets import prompt_messages
    from swiftspec.tokenizer import Tokenizer

    tok = Tokenizer.from_checkpoint(checkpoint_dir(DRAFT, "float32"))
    prompt = tok.encode_chat(prompt_messages("humaneval", humaneval[2]))
    draft_model.truncate_committed(0)
    first = int(np.argmax(draft_model.forward(prompt, logits="last")[0]))
    d = spec.DraftTree(draft_model, tree_budget=12, max_depth=4, branching=3, expand_width=1)
    d.start(prompt, first)
    d.grow_to(12, 4)
    t = d.tree
    t.check_invariants()
    assert t.tokens[0] == first
    assert d.selectable_nodes(4) >= 12
    expanded = [i for i in range(len(t)) if t.expanded(i)]
    assert d.steps == len(expanded)  # width 1: one node per draft forward pass
    frontier = [i for i in range(len(t)) if not t.expanded(i) and t.depths[i] < 4]
    assert max(t.cum_logprobs[i] for i in frontier) <= min(t.cum_logprobs[i] for i in expanded) + 1e-9
    # Reference: decode each expanded node's path in append mode after the prompt.
    for i in expanded:
        draft_model.truncate_committed(len(prompt))
        logits = draft_model.forward(t.path_tokens(i), logits="last")[0]
        ref = log_softmax(logits)
        kids = t.children(i)
        assert [t.tokens[k] for k in kids] == [int(x) for x in np.argsort(-logits, kind="stable")[:3]]
        for k in kids:
            assert t.logprobs[k] == pytest.approx(ref[t.tokens[k]], abs=1e-5)
