"""Top-k tree growth of a sampled request from each row's head, on the real models.

Top-k growth under sampling gives a node the `branching` most likely tokens of the request's sampling
distribution q (softmax at T, top-k, top-p, renormalised) with priority log q. It used to read every
drafted row whole ([vocab] fp32 to the host, then sampling_distribution): on the H200 that host work
was most of a sampled speculative request's time. Now the draft's pass returns each row's 64 best
logits and ln Z at T (Model.forward_top_k) and top_sampling_tokens_from_head takes the children from
them, reading a row only when the head cannot decide. The result must be bit-identical to the host
path (top_sampling_tokens of the whole row). The verifier of such a tree (target sampling) likewise
samples from the target rows' heads (sample_from_head), so the speculative output is the target-only
output of the same seed.
"""

from __future__ import annotations

import numpy as np
import pytest

from swiftspec.datasets import prompt_messages
from swiftspec.swiftspec_core import Engine, ModelOptions, load_model, spec
from swiftspec.tokenizer import Tokenizer

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
HEAD_K = 64


@pytest.fixture(scope="module")
def pair(checkpoint_dir):
    opts = ModelOptions()
    opts.max_context = 1024
    opts.max_tree = 40
    target = load_model(str(checkpoint_dir(TARGET, "bfloat16")), "cpu", opts)
    draft = load_model(str(checkpoint_dir(DRAFT, "bfloat16")), "cpu", opts)
    return target, draft, Tokenizer.from_checkpoint(checkpoint_dir(DRAFT, "bfloat16"))


@pytest.fixture(scope="module")
def prompts(pair, mtbench, humaneval):
    tok = pair[2]
    return [
        tok.encode_chat(prompt_messages(ds, rec))
        for ds, rec in (("mtbench", mtbench[3]), ("mtbench", mtbench[10]), ("humaneval", humaneval[5]))
    ]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.8), (1.0, 0, 0.95), (0.7, 0, 1.0), (0.7, 20, 0.8)])
def test_top_sampling_tokens_from_the_head_equal_the_host_path(pair, prompts, temperature, top_k, top_p):
    """Every fourth row of the draft's logits over three real prompts: the children from the row's head
    (ids, logits and ln Z at T from Model.forward_top_k, the pass growth runs) equal the host path's
    bitwise, tokens and q alike, and the head alone decides nearly all rows at T 0.7 / top-p 0.8."""
    _, draft, _ = pair
    rows = decided = 0
    for ids in prompts:
        draft.truncate_committed(0)
        logits = draft.forward(ids, logits="all")[::4]
        draft.truncate_committed(0)
        top_ids, top_logits, lse = draft.forward_top_k(
            ids, HEAD_K, True, logits="all", inv_temperature=1.0 / float(np.float32(temperature))
        )
        top_ids, top_logits, lse = top_ids[::4], top_logits[::4], lse[::4]
        vocab = logits.shape[1]
        for r in range(logits.shape[0]):
            for count in (2, 4):
                want = spec.top_sampling_tokens(logits[r], count, temperature, top_k, top_p)
                got = spec.top_sampling_tokens_from_head(
                    top_ids[r].tolist(),
                    top_logits[r].tolist(),
                    float(lse[r]),
                    vocab,
                    count,
                    temperature,
                    top_k,
                    top_p,
                    logits[r],
                )
                assert got[0] == want[0], (r, count)
                np.testing.assert_array_equal(np.asarray(got[1], np.float32), np.asarray(want[1], np.float32))
                assert 1 <= len(want[0]) <= count
                rows += 1
                decided += 0 if got[2] else 1
    assert rows >= 100
    if (temperature, top_p) == (0.7, 0.8):
        assert decided >= 0.9 * rows, (decided, rows)
    assert decided >= 0.5 * rows, (decided, rows)


def test_top_k_growth_of_a_sampled_request_reads_no_rows_and_keeps_its_children(pair, prompts):
    """A DraftTree grown with top-k growth at T 0.7 / top-p 0.8 on a real prompt reads (almost) no whole
    row, and every expanded node's children and log q are the host path's on the logits of plain
    (append-mode) decoding of its path."""
    _, draft, _ = pair
    ids = prompts[2]
    draft.truncate_committed(0)
    first = int(np.argmax(draft.forward(ids, logits="last")[0]))
    d = spec.DraftTree(
        draft, tree_budget=16, max_depth=6, branching=2, temperature=0.7, top_p=0.8, growth="top_k", seed=5
    )
    assert d.growth == "top_k"
    d.start(ids, first)
    d.grow_to(16, 6)
    t = d.tree
    t.check_invariants()
    expanded = [i for i in range(len(t)) if t.expanded(i)]
    assert len(expanded) == d.drafted_nodes >= 4
    assert d.whole_rows_read <= d.drafted_nodes // 4  # was every drafted row
    for i in expanded:
        draft.truncate_committed(len(ids))
        row = draft.forward(t.path_tokens(i), logits="last")[0]
        want_tokens, want_q = spec.top_sampling_tokens(row, 2, 0.7, 0, 0.8)
        kids = t.children(i)
        assert [t.tokens[k] for k in kids] == want_tokens, i
        for k, q in zip(kids, want_q):
            assert t.logprobs[k] == pytest.approx(min(0.0, float(np.log(np.float32(q)))), rel=1e-6, abs=1e-7)


def test_sampled_speculation_with_top_k_growth_emits_the_target_only_tokens(pair, prompts):
    """Target sampling of a draw-less tree draws each visited node's token with sample_from_head, the map
    of one uniform target-only decoding uses: same seed, same tokens, whatever the draft proposed. The
    verifier reads its heads from Model.forward_top_k (a tree of at most 64 nodes): few whole rows."""
    target, draft, _ = pair
    ids = prompts[1]
    engine = Engine(target, draft)
    ref = engine.generate(ids, max_new_tokens=16, mode="target", temperature=0.7, top_p=0.8, seed=3)["tokens"]
    out = spec.generate_serial(
        target, draft, ids, max_new_tokens=16, temperature=0.7, top_p=0.8, seed=3, growth="top_k", tree_budget=16
    )
    assert out["tokens"] == ref
    assert out["report"]["verification"] == "target_sampling"
    # one verification of a 16-node tree: only undecided visited rows come to the host
    v = spec.TreeVerifier(target, temperature=0.7, top_p=0.8, seed=3)
    root = v.start(ids)
    d = spec.DraftTree(draft, tree_budget=16, max_depth=6, branching=2, temperature=0.7, top_p=0.8, growth="top_k")
    d.start(ids, root)
    d.grow_to(16, 6)
    tree, to_draft = d.select(16, 6)
    assert len(tree) == 17
    r = v.verify(tree, d, to_draft)
    assert r["target_sampling_nodes"] >= 1
    assert v.whole_rows_read <= 1  # was all 17 rows


def test_auto_growth_is_top_k_for_sampled_requests_too(pair):
    """Growth 'auto' resolves to top-k growth for greedy and sampled requests alike: top-k growth with
    target sampling accepted more tokens per verification than sampled growth with recursive rejection
    sampling on the real pair (docs/sampling_speculation.md, "Measured"), and reads only row heads."""
    _, draft, _ = pair
    for kw in (dict(), dict(temperature=0.7, top_p=0.8), dict(temperature=1.0, top_k=20)):
        assert spec.DraftTree(draft, tree_budget=8, **kw).growth == "top_k", kw
    assert spec.DraftTree(draft, tree_budget=8, temperature=0.7, growth="sampled").growth == "sampled"
