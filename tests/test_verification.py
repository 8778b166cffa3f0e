"""Verification (cpp/include/swiftspec/verification.h).

Greedy: semantics on a hand-made tree, and on a real draft tree the accepted path plus
bonus token equal the target's own greedy continuation.

Stochastic, lossless: chi-square goodness-of-fit tests that the tokens emitted by one
verification step follow the target's sampling distribution, at fixed positions of a
real prompt with the real Qwen2.5-Coder pair (distributions taken from the models'
logits, so thousands of verification trials cost seconds). Two schemes:
  * recursive rejection sampling (SpecInfer, ASPLOS'24 §4.2) over children drawn
    i.i.d. from the draft, depth 2: the first token against p_root, and the second
    token, given that the first was accepted as child c, against p_c;
  * target sampling (SpecExec, NeurIPS'24 §3.2) over the draft's deterministic top-k
    children, same two checks.
Significance level: ALPHA = 0.001 per test (the seeds are fixed, so each outcome is
deterministic; ALPHA is the rate at which a correct verifier would fail over random
seed choices). Negative controls: the test-only biased verifiers ('accept_first_child',
'no_residual' = bonus from p instead of the residual) must be rejected at the same
level — i.e. the test has the power to catch a real bug.
"""

import math

import numpy as np
import pytest
import torch

from swiftspec.datasets import prompt_messages
from swiftspec.swiftspec_core import ModelOptions, load_model, spec
from swiftspec.tokenizer import Tokenizer

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
DTYPE = "float32"
ALPHA = 1e-3
TRIALS = 4000


# ---------------------------------------------------------------- statistics
def chi_square_pvalue(counts: dict, expected_probs: dict, n: int, min_expected: float = 5.0):
    """Pearson chi-square goodness of fit of observed `counts` (outcome -> count, n in
    total) against `expected_probs` (outcome -> probability). Outcomes whose expected
    count is below `min_expected` are pooled into one 'other' bin (with any observed
    outcome missing from `expected_probs`, whose expected probability is 0). Returns
    (statistic, degrees of freedom, p-value)."""
    bins_obs, bins_exp = [], []
    other_obs, other_exp = 0, 0.0
    for k, p in expected_probs.items():
        e = n * p
        if e >= min_expected:
            bins_obs.append(counts.get(k, 0))
            bins_exp.append(e)
        else:
            other_obs += counts.get(k, 0)
            other_exp += e
    other_obs += sum(c for k, c in counts.items() if k not in expected_probs)
    if other_exp > 0 or other_obs > 0:
        if other_exp < min_expected and bins_exp:  # fold a tiny 'other' into the smallest bin
            j = int(np.argmin(bins_exp))
            bins_obs[j] += other_obs
            bins_exp[j] += other_exp
        else:
            bins_obs.append(other_obs)
            bins_exp.append(max(other_exp, 1e-300))
    obs, exp = np.array(bins_obs, float), np.array(bins_exp, float)
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    return stat, df, chi2_sf(stat, df)


def chi2_sf(stat: float, df: int) -> float:
    """Survival function of the chi-square distribution (regularised upper incomplete gamma)."""
    if df <= 0:
        return 1.0
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
        )
    )


def test_chi2_sf_matches_known_quantiles():
    # chi-square 0.999 quantiles: df=1: 10.828, df=5: 20.515, df=10: 29.588
    assert chi2_sf(10.828, 1) == pytest.approx(1e-3, rel=1e-3)
    assert chi2_sf(20.515, 5) == pytest.approx(1e-3, rel=1e-3)
    assert chi2_sf(29.588, 10) == pytest.approx(1e-3, rel=1e-3)


# ---------------------------------------------------------------- greedy
def test_greedy_semantics_on_handmade_tree():
    t = spec.TokenTree(0)
    a = t.add_child(0, 3, -0.1)  # 1
    t.add_child(0, 4, -0.2)  # 2
    c = t.add_child(a, 5, -0.1)  # 3
    t.add_child(c, 6, -0.1)  # 4
    vocab = 8
    logits = np.zeros((5, vocab), np.float32)
    logits[0, 3] = 1.0  # root -> 3 (node 1) accepted
    logits[1, 5] = 1.0  # node 1 -> 5 (node 3) accepted
    logits[3, 2] = 1.0  # node 3 -> 2: not a child: bonus 2
    logits[4, 1] = 1.0
    r = spec.verify_greedy(t, logits)
    assert r["accepted_path"] == [0, 1, 3]
    assert r["tokens"] == [3, 5, 2]
    assert r["bonus_token"] == 2 and r["accepted"] == 2
    logits[0] = 0.0  # all-equal logits: argmax ties go to the smallest id (0, not a child)
    r = spec.verify_greedy(t, logits)
    assert r["accepted_path"] == [0] and r["tokens"] == [0]


def test_top_k_verifiers_refuse_what_they_cannot_verify():
    """verify_top_k_sampling refused a tree with draws only when its walk reached the node (seed
    dependent: some seeds verified the tree); rows that are not largest first, hold NaN or a
    negative id, and a negative arg-max id, came back as tokens (the bonus -1, or the last id)."""
    from swiftspec import InvalidRequestError

    t = spec.TokenTree(5)
    a = t.add_child(0, 3, -0.1)
    t.add_child(a, 4, -0.1)
    t.set_expanded(a, [4])  # draws below the root
    ids = np.array([[3, 4, 9], [4, 1, 2], [1, 2, 3]], np.int32)
    logits = np.array([[0.0, -0.5, -1.0], [3.0, 1.0, 0.0], [1.0, 0.0, -1.0]], np.float32)
    for seed in range(20):  # about half the seeds walk 0 -> 1; the others stopped at the root (no error)
        with pytest.raises(InvalidRequestError, match="node 1 has expansion draws"):
            spec.verify_top_k_sampling(t, ids, logits, 1.0, seed=seed, target_rows=[0, 1, 2])

    tree = spec.TokenTree(5)
    tree.add_child(0, 3, -0.1)
    for bad_ids, bad_logits, needle in (
        (ids, np.ascontiguousarray(logits[:, ::-1]), "largest first without NaN"),
        (ids, np.where(logits > 2, np.nan, logits).astype(np.float32), "= nan"),
        (-ids, logits, r"ids\[0\] is -4"),
    ):
        with pytest.raises(InvalidRequestError, match=needle):
            spec.verify_top_k_sampling(tree, bad_ids, bad_logits, 1.0, seed=1, target_rows=[1, 1])
    r = spec.verify_top_k_sampling(tree, ids, logits, 1.0, seed=1, target_rows=[1, 1])
    assert r["tokens"][0] in (4, 1, 2) and r["accepted"] == 0

    with pytest.raises(InvalidRequestError, match="verify_greedy: arg-max id -1 of node 0 is negative"):
        spec.verify_greedy_argmax(tree, [-1, 2])
    assert spec.verify_greedy_argmax(tree, [3, 2])["tokens"] == [3, 2]


# ---------------------------------------------------------------- real models
@pytest.fixture(scope="module")
def models(checkpoint_dir):
    opts = ModelOptions()
    opts.max_context = 1024
    opts.max_tree = 64
    target = load_model(str(checkpoint_dir(TARGET, DTYPE)), "cpu", opts)
    draft = load_model(str(checkpoint_dir(DRAFT, DTYPE)), "cpu", opts)
    tok = Tokenizer.from_checkpoint(checkpoint_dir(TARGET, DTYPE))
    return target, draft, tok


def test_greedy_real_tree_equals_target_greedy_continuation(models, humaneval):
    target, draft, tok = models
    prompt = tok.encode_chat(prompt_messages("humaneval", humaneval[0]))
    target.truncate_committed(0)
    root = int(np.argmax(target.forward(prompt, logits="last")[0]))
    d = spec.DraftTree(draft, tree_budget=16, max_depth=6, branching=2)
    d.start(prompt, root)
    d.grow_to(16, 6)
    tree, _ = d.select(16, 6)
    cache = spec.TreeKvCache(target)
    row0, logits = cache.forward_nodes(tree, list(range(len(tree))), "all")
    assert row0 == 0 and logits.shape == (len(tree), target.config["vocab_size"])
    r = spec.verify_greedy(tree, logits)
    # reference: plain greedy decoding with the target
    target.truncate_committed(len(prompt))
    ref, tok_in = [], root
    for _ in range(len(r["tokens"])):
        tok_in = int(np.argmax(target.forward([tok_in], logits="last")[0]))
        ref.append(tok_in)
    assert r["tokens"] == ref
    assert r["accepted"] >= 1  # the pair agrees on at least the first token here
    cache.clear()


def distributions_at(models, prompt, children, temperature, top_k, top_p):
    """Target and draft sampling distributions at the root (the last prompt token, so
    the root predicts the first answer token) and at each candidate child: rows
    [root, *children]."""
    target, draft, _ = models
    for model in (target, draft):
        model.truncate_committed(0)
        model.forward(prompt[:-1], logits="none")
    tree = spec.TokenTree(prompt[-1])
    for c in children:
        tree.add_child(0, int(c), -1.0)
    rows, raw = {}, {}
    for name, model in (("p", target), ("q", draft)):
        cache = spec.TreeKvCache(model)
        _, logits = cache.forward_nodes(tree, list(range(len(tree))), "all")
        cache.clear()
        raw[name] = logits
        rows[name] = np.stack([spec.sampling_distribution(row, temperature, top_k, top_p) for row in logits])
    distributions_at.target_logits = raw["p"]  # the rows behind p (for the top-k sampling scheme)
    return prompt[-1], rows["p"], rows["q"]


@pytest.fixture(scope="module")
def position(models, mtbench):
    """A real position with entropy where the pair disagrees: the first answer token of
    MT-Bench question 81 (travel blog: target p('Title') = 0.51, draft q('Title') = 0.14 at
    temperature 1, top-k 10); candidate children = union of both models' supports."""
    target, draft, tok = models
    prompt = tok.encode_chat(prompt_messages("mtbench", mtbench[0]))
    T, K, P = 1.0, 10, 1.0
    root, p0, q0 = distributions_at(models, prompt, [], T, K, P)
    support = sorted(set(np.nonzero(p0[0])[0].tolist()) | set(np.nonzero(q0[0])[0].tolist()))
    root2, p, q = distributions_at(models, prompt, support, T, K, P)
    assert root2 == root
    row_of = {tok_id: i + 1 for i, tok_id in enumerate(support)}
    logits = distributions_at.target_logits
    top_ids = np.stack([np.asarray(spec.top_k_indices(row, K), dtype=np.int32) for row in logits])
    top_logits = np.ascontiguousarray(np.take_along_axis(logits, top_ids.astype(np.int64), axis=1), dtype=np.float32)
    return dict(
        root=root,
        p=np.ascontiguousarray(p),
        q=np.ascontiguousarray(q),
        row_of=row_of,
        temperature=T,
        top_k=K,
        top_p=P,
        top_ids=top_ids,
        top_logits=top_logits,
    )


def run_trials(pos, scheme, bias, trials, seed0):
    """`trials` verification steps on depth-2 trees at `pos`. scheme 'rejection': the root
    gets 3 i.i.d. draws from q_root, each child c 2 draws from q_c; scheme 'target': the
    root gets q_root's top-3, each child its top-2 (deterministic). Returns the list of
    (first token, second token or None when the first was the bonus)."""
    p, q, row_of = pos["p"], pos["q"], pos["row_of"]
    out = []
    for i in range(trials):
        tree = spec.TokenTree(pos["root"])
        trows, drows = [0], [0]
        if scheme == "rejection":
            draws = spec.draw_iid(q[0], 3, seed0 + 2 * i)
        else:
            draws = spec.top_k_indices(q[0], 3)
        for t in draws:
            if tree.find_child(0, t) < 0:
                tree.add_child(0, t, math.log(q[0, t]))
                trows.append(row_of[t])
                drows.append(row_of[t])
        tree.set_expanded(0, draws if scheme == "rejection" else [])
        for c in list(tree.children(0)):
            qc = q[row_of[tree.tokens[c]]]
            if scheme == "rejection":
                sub = spec.draw_iid(qc, 2, seed0 + 2 * i + 1 + 1000003 * c)
            else:
                sub = spec.top_k_indices(qc, 2)
            for t in sub:
                if tree.find_child(c, t) < 0:
                    tree.add_child(c, t, math.log(qc[t]))
                    # Depth-2 nodes only feed the third token, which these tests ignore:
                    # give them the root's rows (any valid distribution).
                    trows.append(0)
                    drows.append(0)
            tree.set_expanded(c, sub if scheme == "rejection" else [])
        if scheme == "target_top_k":  # TreeVerifier's path for top-k sampled requests: the rows' top-k only
            r = spec.verify_top_k_sampling(
                tree, pos["top_ids"], pos["top_logits"], 1.0, seed=seed0 + 7919 * i + 3, target_rows=trows
            )
        else:
            r = spec.verify_stochastic(
                tree,
                p,
                q if scheme == "rejection" else None,
                seed=seed0 + 7919 * i + 3,
                bias=bias,
                target_rows=trows,
                draft_rows=drows,
            )
        if scheme == "rejection" and bias == "none":  # depth-2 nodes have no draws: target sampling
            assert r["rejection_sampling_nodes"] >= 1
        if scheme.startswith("target") and bias == "none":
            assert r["rejection_sampling_nodes"] == 0 and r["target_sampling_nodes"] >= 1
        toks = r["tokens"]
        out.append((toks[0], toks[1] if r["accepted"] >= 1 else None))
    return out


def first_token_test(pos, outcomes):
    counts = {}
    for a, _ in outcomes:
        counts[a] = counts.get(a, 0) + 1
    p0 = pos["p"][0]
    expected = {int(t): float(p0[t]) for t in np.nonzero(p0)[0]}
    return chi_square_pvalue(counts, expected, len(outcomes))


def second_token_test(pos, outcomes, min_group=50):
    """Pooled chi-square over the first tokens c accepted at least `min_group` times:
    the second token given c against p_c."""
    stat, df = 0.0, 0
    groups = {}
    for a, b in outcomes:
        if b is not None:
            groups.setdefault(a, []).append(b)
    for c, seconds in groups.items():
        if len(seconds) < min_group:
            continue
        pc = pos["p"][pos["row_of"][c]]
        counts = {}
        for b in seconds:
            counts[b] = counts.get(b, 0) + 1
        s, d, _ = chi_square_pvalue(counts, {int(t): float(pc[t]) for t in np.nonzero(pc)[0]}, len(seconds))
        stat += s
        df += d
    return stat, df, chi2_sf(stat, df)


@pytest.mark.parametrize("scheme", ["rejection", "target", "target_top_k"])
def test_stochastic_verification_is_lossless(position, scheme):
    outcomes = run_trials(position, scheme, "none", TRIALS, seed0=12345)
    stat1, df1, pv1 = first_token_test(position, outcomes)
    stat2, df2, pv2 = second_token_test(position, outcomes)
    accepted = sum(b is not None for _, b in outcomes) / len(outcomes)
    print(
        f"{scheme}: first token chi2={stat1:.1f} df={df1} p={pv1:.3g}; second token chi2={stat2:.1f} "
        f"df={df2} p={pv2:.3g}; first-token acceptance {accepted:.3f}"
    )
    assert df1 >= 3 and df2 >= 3  # the position is not degenerate
    assert pv1 > ALPHA, f"first-token distribution differs from the target's (p={pv1:.3g})"
    assert pv2 > ALPHA, f"second-token distribution differs from the target's (p={pv2:.3g})"
    assert accepted > 0.3  # speculation actually happens at this position


@pytest.mark.parametrize(
    "scheme,bias", [("rejection", "accept_first_child"), ("rejection", "no_residual"), ("target", "accept_first_child")]
)
def test_negative_control_biased_verifier_is_caught(position, scheme, bias):
    outcomes = run_trials(position, scheme, bias, TRIALS, seed0=777)
    stat1, df1, pv1 = first_token_test(position, outcomes)
    stat2, df2, pv2 = second_token_test(position, outcomes)
    print(f"{scheme}/{bias}: first token chi2={stat1:.1f} df={df1} p={pv1:.3g}; second chi2={stat2:.1f} p={pv2:.3g}")
    assert min(pv1, pv2) < ALPHA, "the chi-square test failed to detect a biased verifier"


def test_rejection_sampling_small_vocab_distribution():
    """Rejection sampling on a 4-token vocabulary where the draft is far from the target
    (q puts 0.4 on a token the target never emits): 20000 steps with 2 i.i.d. draws each
    follow p, and the zero-probability token never appears."""
    p = np.array([0.5, 0.3, 0.2, 0.0], np.float32)
    q = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    vocab = len(p)
    n = 20000
    counts = np.zeros(vocab)
    for i in range(n):
        draws = spec.draw_iid(q, 2, 10_000 + i)
        t = spec.TokenTree(0)
        for d in draws:
            if t.find_child(0, d) < 0:
                t.add_child(0, d, math.log(q[d]))
        t.set_expanded(0, draws)
        rows = [0] * len(t)
        r = spec.verify_stochastic(t, p[None, :], q[None, :], seed=i, target_rows=rows, draft_rows=rows)
        counts[r["tokens"][0]] += 1
    stat, df, pv = chi_square_pvalue(
        {k: int(c) for k, c in enumerate(counts)}, {k: float(v) for k, v in enumerate(p) if v > 0}, n
    )
    assert counts[3] == 0  # a token the target gives no mass is never emitted
    assert pv > ALPHA, (counts / n, stat, df, pv)
