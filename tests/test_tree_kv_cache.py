"""Tree KV bookkeeping (cpp/include/swiftspec/tree_kv_cache.h) with the real models.

* The tree-mode batch: pending chain first, then nodes at base_position + depth,
  attending (pending slots, ancestors in depth order, own slot last); slot accounting;
  errors naming the violated rule.
* Property test: random sequences of grow / verify / commit / reject (random partial
  growth, random subtree budgets, random accepted paths, bonus tokens that sometimes are
  kept children so the draft re-roots and keeps K/V, sometimes fresh tokens so an
  unprocessed accepted leaf becomes a pending token) leave both models' caches equal,
  bit for bit, to recomputing from scratch: the committed K/V of target and draft equal
  an append-mode prefill of the committed tokens, and every kept draft tree node's K/V
  equals append-mode decoding of its path.
"""

import numpy as np
import pytest

from swiftspec import InvalidRequestError
from swiftspec.swiftspec_core import ModelOptions, load_model, spec
from swiftspec.tokenizer import Tokenizer

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
DTYPE = "float32"


@pytest.fixture(scope="module")
def models(checkpoint_dir):
    opts = ModelOptions()
    opts.max_context = 512
    opts.max_tree = 48
    target = load_model(str(checkpoint_dir(TARGET, DTYPE)), "cpu", opts)
    draft = load_model(str(checkpoint_dir(DRAFT, DTYPE)), "cpu", opts)
    tok = Tokenizer.from_checkpoint(checkpoint_dir(TARGET, DTYPE))
    return target, draft, tok


def test_build_batch_layout_and_errors(models):
    _, draft, _ = models
    draft.truncate_committed(0)
    draft.forward([151644, 872, 198, 9707], logits="none")  # 4 committed tokens
    cache = spec.TreeKvCache(draft)
    assert cache.capacity == 48 and cache.free_slots == 48 and cache.base_position == 4
    t = spec.TokenTree(100)
    a = t.add_child(0, 101, -0.1)
    b = t.add_child(0, 102, -0.2)
    c = t.add_child(a, 103, -0.3)
    batch = cache.build_batch(t, [0, a, b, c])
    assert batch["tokens"] == [100, 101, 102, 103]
    assert batch["positions"] == [4, 5, 5, 6]
    s = batch["tree_slots"]
    assert len(set(s)) == 4
    assert batch["attend_offsets"] == [0, 1, 3, 5, 8]
    assert batch["attend_slots"] == [s[0], s[0], s[1], s[0], s[2], s[0], s[1], s[3]]
    # forward the root and a; c's parent is then processed, b is not yet
    row0, logits = cache.forward_nodes(t, [0, a], "all")
    assert row0 == 0 and logits.shape == (2, draft.config["vocab_size"])
    assert cache.processed(0) and cache.processed(a) and not cache.processed(b)
    assert cache.free_slots == 46 and cache.processed_count == 2
    with pytest.raises(InvalidRequestError, match="already has K/V"):
        cache.build_batch(t, [a])
    d = t.add_child(b, 104, -0.1)
    with pytest.raises(InvalidRequestError, match="parent 2 has no K/V and is not listed before it"):
        cache.build_batch(t, [d])
    with pytest.raises(InvalidRequestError, match="listed twice"):
        cache.build_batch(t, [b, b])
    # commit root -> a -> c where c is unprocessed: root, a committed; c becomes pending
    assert cache.commit_path(t, [0, a, c]) == 2
    assert draft.committed_len == 6 and cache.pending_tokens == [103]
    cache.remap([-1] * len(t))
    assert cache.free_slots == 48 and cache.processed_count == 0
    t.reset(105)  # the bonus token after c
    assert cache.base_position == 7
    batch = cache.build_batch(t, [0])
    ps, rs = batch["tree_slots"]
    assert batch["tokens"] == [103, 105] and batch["positions"] == [6, 7]
    assert batch["attend_offsets"] == [0, 1, 3] and batch["attend_slots"] == [ps, ps, rs]
    row0, logits = cache.forward_nodes(t, [0], "all")
    assert row0 == 1 and logits.shape[0] == 2  # the pending row comes first
    assert cache.pending_tokens == [] and draft.committed_len == 7 and cache.free_slots == 47
    with pytest.raises(InvalidRequestError, match="must start at the root"):
        cache.commit_path(t, [1])
    # two commits without a forward pass in between: the pending chain grows
    t2 = spec.TokenTree(106)
    cache.remap([-1] * len(t))
    assert cache.free_slots == 48
    x = t2.add_child(0, 107, -0.1)
    assert cache.commit_path(t2, [0, x]) == 0 and cache.pending_tokens == [106, 107]
    cache.remap([-1] * len(t2))
    t2.reset(108)
    assert cache.commit_path(t2, [0]) == 0 and cache.pending_tokens == [106, 107, 108]
    t2.reset(109)
    assert cache.base_position == draft.committed_len + 3
    row0, logits = cache.forward_nodes(t2, [0], "all")
    assert row0 == 3 and logits.shape[0] == 4 and draft.committed_len == 10 and cache.pending_tokens == []
    small = spec.TokenTree(1)
    for i in range(60):
        small.add_child(0, 200 + i, -1.0)
    with pytest.raises(InvalidRequestError, match="more tree slots than are free"):
        cache.build_batch(small, list(range(1, 60)))


def all_layers_kv(model, reader):
    return [reader(layer) for layer in range(model.config["num_layers"])]


def check_committed(model, committed_tokens):
    """Committed K/V of `model` == an append-mode prefill of `committed_tokens`, bit for
    bit. Leaves the model with the same (recomputed) committed K/V."""
    assert model.committed_len == len(committed_tokens)
    before = all_layers_kv(model, model.read_committed_kv)
    model.truncate_committed(0)
    model.forward(committed_tokens, logits="none")
    after = all_layers_kv(model, model.read_committed_kv)
    for layer in range(model.config["num_layers"]):
        for got, ref, name in ((before[layer][0], after[layer][0], "K"), (before[layer][1], after[layer][1], "V")):
            if not np.array_equal(got, ref):
                row = int(np.nonzero((got != ref).any(axis=1))[0][0])
                raise AssertionError(
                    f"committed {name} of layer {layer} differs from recomputation first at "
                    f"position {row} (max |diff| {np.abs(got - ref).max():.3g})"
                )


def check_tree_slots(model, kept):
    """For each (slot, path_tokens) in `kept`: the K/V in tree slot `slot` == the last row
    of append-mode decoding of path_tokens after the model's committed tokens."""
    base = model.committed_len
    for slot, path in kept:
        model.forward(list(path), logits="none")
        for layer in range(model.config["num_layers"]):
            k_ref, v_ref = model.read_committed_kv(layer)
            k_got, v_got = model.read_tree_kv(layer, [slot])
            assert np.array_equal(k_got[0], k_ref[-1]), f"tree slot {slot} K of layer {layer} differs"
            assert np.array_equal(v_got[0], v_ref[-1]), f"tree slot {slot} V of layer {layer} differs"
        model.truncate_committed(base)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_grow_verify_commit_reject_equals_recompute(models, mtbench, seed):
    """Six random rounds; kept draft tree nodes are checked after every round, the
    committed regions of both models at the end (a wrong committed entry stays wrong)."""
    target, draft, tok = models
    rng = np.random.default_rng(seed)
    prompt = tok.encode(mtbench[seed]["turns"][0])[:24]
    budget = int(rng.choice([4, 8, 12]))
    depth = int(rng.integers(2, 6))
    branching = int(rng.integers(2, 4))
    d = spec.DraftTree(
        draft, tree_budget=budget, max_depth=depth, branching=branching, expand_width=int(rng.integers(1, 4))
    )
    verifier_cache = spec.TreeKvCache(target)
    target.truncate_committed(0)
    first = int(np.argmax(target.forward(prompt, logits="last")[0]))
    d.start(prompt, first)
    committed = list(prompt)  # tokens whose K/V both models must hold (draft: some may be pending)
    kept_total, pending_seen = 0, 0
    for _ in range(6):
        # grow: either to the budget or a random number of draft steps
        if rng.random() < 0.5:
            d.grow_to(budget, depth)
        else:
            for _ in range(int(rng.integers(1, 4))):
                d.grow_step(depth)
        tree, to_draft = d.select(int(rng.integers(1, budget + 1)), depth)
        # verify: one target tree-mode forward over the whole subtree
        verifier_cache.forward_nodes(tree, list(range(len(tree))), "none")
        # a random accepted path from the root
        path = [0]
        while tree.children(path[-1]) and rng.random() < 0.75:
            path.append(int(rng.choice(tree.children(path[-1]))))
        # bonus: a child of the last accepted node in the draft tree (re-root keeps its
        # subtree) or a token that is not (fresh root)
        dtree = d.tree
        last = to_draft[path[-1]]
        kids = dtree.children(last)
        if kids and rng.random() < 0.6:
            bonus = dtree.tokens[int(rng.choice(kids))]
        else:
            bonus = int(rng.integers(0, 151000))
            while dtree.find_child(last, bonus) >= 0:
                bonus += 1
        # commit the accepted path, reject (free) the rest
        assert verifier_cache.commit_path(tree, path) == len(path)
        verifier_cache.clear()
        assert verifier_cache.free_slots == verifier_cache.capacity
        kept_total += d.advance([tree.tokens[i] for i in path[1:]], bonus)
        committed += tree.path_tokens(path[-1])
        pending = d.cache.pending_tokens
        pending_seen += len(pending)
        t = d.tree
        t.check_invariants()
        assert t.tokens[0] == bonus
        assert target.committed_len == len(committed)
        assert draft.committed_len + len(pending) == len(committed)
        assert committed[draft.committed_len :] == pending
        assert d.cache.free_slots + d.cache.processed_count == d.cache.capacity  # no leaked slot
        check_tree_slots(
            draft, [(d.cache.slot(i), pending + t.path_tokens(i)) for i in range(len(t)) if d.cache.processed(i)]
        )
    check_committed(target, committed)
    check_committed(draft, committed[: draft.committed_len])
    print(
        f"seed {seed}: budget {budget} depth {depth} branching {branching}: kept nodes {kept_total}, "
        f"pending tokens {pending_seen}"
    )
    assert kept_total + pending_seen > 0  # the interesting paths were exercised
