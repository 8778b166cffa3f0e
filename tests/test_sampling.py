"""Nucleus (top-p) sampling distributions against a full-sort reference, on real logits.

sampling_distribution used to rank the whole vocabulary for top-p alone (std::partial_sort of 152k
ids: 80 ms per token, more than a GPU decode step of the 1.5B model takes 40 times over); it now
ranks only the prefix of tokens above a probability threshold that already holds top_p of the mass.
The result must be bit-identical to the definition: rank every token (probability descending, ties
to the smaller id), keep the shortest prefix whose mass (summed in rank order, in double) reaches
top_p of the total (summed in id order), renormalise.
"""

from __future__ import annotations

import numpy as np
import pytest

from swiftspec.datasets import prompt_messages
from swiftspec.swiftspec_core import ModelOptions, load_model, spec
from swiftspec.tokenizer import Tokenizer

DRAFT = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def real_logits(checkpoint_dir, mtbench, humaneval):
    """Next-token logits of the 0.5B model at the first answer position of two real prompts, plus
    a flattened row (logits / 20: a nucleus of thousands of tokens) and a row with exact ties."""
    opts = ModelOptions()
    opts.max_context = 1024
    folder = checkpoint_dir(DRAFT, "bfloat16")
    model = load_model(str(folder), "cpu", opts)
    tok = Tokenizer.from_checkpoint(folder)
    rows = []
    for ds, rec in (("mtbench", mtbench[3]), ("humaneval", humaneval[5])):
        model.truncate_committed(0)
        rows.append(model.forward(tok.encode_chat(prompt_messages(ds, rec)))[0])
    rows.append(rows[0] / 20.0)
    tied = rows[1].copy()
    tied[tied > np.sort(tied)[-40]] = tied.max()  # the 39 best tokens tie
    rows.append(tied)
    return [np.ascontiguousarray(r, dtype=np.float32) for r in rows]


def nucleus_reference(base: np.ndarray, top_p: float) -> np.ndarray:
    """The definition, from the untruncated distribution `base` (float32)."""
    order = np.lexsort((np.arange(base.size), -base.astype(np.float64)))
    total = np.cumsum(base.astype(np.float64))[-1]  # id order, sequential
    cum = np.cumsum(base[order].astype(np.float64))  # rank order, sequential
    keep = int(np.argmax(cum >= np.float64(np.float32(top_p)) * total)) + 1
    out = np.zeros_like(base)
    out[order[:keep]] = (base[order[:keep]].astype(np.float64) / cum[keep - 1]).astype(np.float32)
    return out


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p_equals_the_full_sort_definition(real_logits, temperature, top_p):
    for row in real_logits:
        base = spec.sampling_distribution(row, temperature, 0, 1.0)
        got = spec.sampling_distribution(row, temperature, 0, top_p)
        want = nucleus_reference(base, top_p)
        np.testing.assert_array_equal(got, want)
        assert abs(float(got.sum(dtype=np.float64)) - 1.0) < 1e-5
        assert np.count_nonzero(got) >= 1


def test_top_p_with_top_k_keeps_the_top_k_semantics(real_logits):
    row = real_logits[2]  # flat: top-k binds before top-p
    got = spec.sampling_distribution(row, 1.0, 20, 0.9)
    assert 1 <= np.count_nonzero(got) <= 20
    kept = np.nonzero(got)[0]
    base = spec.sampling_distribution(row, 1.0, 0, 1.0)
    assert set(kept) <= set(np.argsort(-base, kind="stable")[:20].tolist())


def test_sampling_from_the_top_k_alone_follows_the_sampling_distribution(real_logits):
    """sample_from_top_k (what top-k sampled decoding and verification draw from, given only a
    row's k best logits) against sampling_distribution of the whole row: 20000 draws per setting,
    every token within 5 standard deviations, nothing outside the distribution's support."""
    for row in real_logits[:2]:
        for temperature, top_k, top_p in ((0.7, 10, 1.0), (1.0, 16, 0.9), (1.5, 40, 0.95)):
            ids = spec.top_k_indices(row, top_k)
            draws = np.asarray(
                spec.sample_from_top_k(ids, [float(row[i]) for i in ids], temperature, top_k, top_p, seed=11, n=20000)
            )
            p = spec.sampling_distribution(row, temperature, top_k, top_p)
            counts = np.bincount(draws, minlength=row.size)
            assert np.all(p[draws] > 0)
            expected = 20000 * p
            sigma = np.sqrt(np.maximum(expected * (1 - p), 1.0))
            assert np.all(np.abs(counts - expected) < 5 * sigma), (temperature, top_k, top_p)


def test_sample_from_top_k_refuses_entries_it_cannot_draw_from():
    """The k entries must be a row's min(top_k, vocab) best, largest first. Before: temperature 0
    drew the last id (0 * inf = NaN weight on the best one), unsorted or NaN logits the last id,
    entries beyond top_k were drawn, a negative id came back as a token, n < 0 gave []."""
    from swiftspec import InvalidRequestError, SwiftspecError

    ids, logits = [5, 3, 9], [2.0, 1.0, 0.5]
    bad = [
        (dict(temperature=0.0, top_k=3), "sample_from_top_k: temperature must be > 0"),
        (dict(temperature=1.0, top_k=0), "sample_from_top_k: 3 entries for top_k=0"),
        (dict(temperature=1.0, top_k=2), "sample_from_top_k: 3 entries for top_k=2"),
        (dict(temperature=1.0, top_k=3, n=-5), "sample_from_top_k: n must be >= 0, got -5"),
    ]
    for kwargs, needle in bad:
        with pytest.raises(InvalidRequestError, match=needle):
            spec.sample_from_top_k(ids, logits, **kwargs)
    for row_ids, row, needle in (
        ([1, 2, 3], [0.0, 100.0, 1000.0], r"largest first without NaN, got top_logits\[1\] = 100 after 0$"),
        ([1, 2, 3], [1.0, float("nan"), 0.0], r"got top_logits\[1\] = nan"),
        ([1, 2, 3], [float("nan"), 1.0, 0.0], r"got top_logits\[0\] = nan"),
        ([-1, 2, 3], [3.0, 1.0, 0.0], r"ids\[0\] is -1"),
        # a repeated id was drawn with its entries' weights summed
        (
            [4, 7, 4],
            [3.0, 1.0, 0.0],
            r"^sample_from_top_k: ids\[2\] repeats ids\[0\] = 4 \(a row's best entries "
            r"name each token once\)$",
        ),
    ):
        with pytest.raises(InvalidRequestError, match=needle):
            spec.sample_from_top_k(row_ids, row, 1.0, 3, n=10)
    for first in (float("inf"), float("-inf")):  # non-finite logits are the model's, not the request's
        with pytest.raises(SwiftspecError, match="the largest logit is -?inf") as info:
            spec.sample_from_top_k([1, 2, 3], [first, float("-inf"), float("-inf")], 1.0, 3)
        assert not isinstance(info.value, InvalidRequestError)
    # what stays valid: fewer entries than top_k (a vocabulary below top_k), -inf after the first,
    # exact ties, a temperature or top_p near float's smallest (the best token alone)
    assert set(spec.sample_from_top_k(ids, logits, 1.0, 40, seed=1, n=200)) == {5, 3, 9}
    assert set(spec.sample_from_top_k([4, 6, 8], [1.0, float("-inf"), float("-inf")], 1.0, 3, n=50)) == {4}
    assert set(spec.sample_from_top_k([4, 6, 8], [1.0, 1.0, 1.0], 1.0, 3, seed=2, n=300)) == {4, 6, 8}
    assert set(spec.sample_from_top_k(ids, logits, 1e-45, 3, n=50)) == {5}
    assert set(spec.sample_from_top_k(ids, logits, 1.0, 3, 1e-45, n=50)) == {5}
    assert spec.sample_from_top_k(ids, logits, 1.0, 3, n=0) == []


def test_an_empty_logits_row_is_refused_not_read():
    """sampling_distribution of an empty row read logits[0] (a segmentation fault from Python)."""
    from swiftspec import InvalidRequestError

    with pytest.raises(InvalidRequestError, match=r"sampling_distribution: the logits row is empty \(vocab 0\)"):
        spec.sampling_distribution(np.zeros(0, np.float32), 1.0, 0, 0.9)


# ---------------------------------------------------------------------------------------------
# sample_from_head: temperature / top-p alone from a row's 64 best logits and its normaliser at T
# (what target-only sampled decoding reads now: Model.forward_top_k(k=64, inv_temperature=1/T)),
# the whole row read only when the head does not decide.

HEAD_K = 64


def head_of(row: np.ndarray, temperature: float):
    """The row's HEAD_K best (ids, values) and ln sum exp(row / T) computed directly in float64
    (T rounded to fp32 as the runtime holds it)."""
    ids = spec.top_k_indices(row, HEAD_K)
    inv_t = 1.0 / float(np.float32(temperature))
    x = row.astype(np.float64)
    m = x.max()
    lse = m * inv_t + float(np.log(np.exp((x - m) * inv_t).sum()))
    return ids, [float(row[i]) for i in ids], lse, inv_t


def head_mass(row: np.ndarray, temperature: float) -> float:
    ids, vals, lse, inv_t = head_of(row, temperature)
    return float(np.exp(np.asarray(vals, np.float64) * inv_t - lse).sum())


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.8), (0.7, 0.95), (1.0, 1.0), (0.7, 1.0), (1.5, 0.95)])
def test_sample_from_head_draws_the_sampling_distribution(real_logits, temperature, top_p):
    """Stratified uniforms u_i = (i + 1/2) / N: every token of the draw is one interval of u, so its
    frequency is its probability to 1/N. Against sampling_distribution of the whole row, on the two
    real rows (peaked: the head decides most draws) and the flattened one (the tail is read): a draw
    that, say, redrew from the whole row on a tail u, or ignored the tail, is off by far more."""
    vocab = real_logits[0].size
    for row, n in ((real_logits[0], 20000), (real_logits[1], 20000), (real_logits[2], 1500)):
        if top_p < 1.0 and head_mass(row, temperature) < top_p:
            # Every draw reads the row (and ranks it for top-p, ~25 ms on the CI machine): the
            # frequencies still match to 1 / n, with n kept to what the suite's time allows.
            n = 400
        ids, vals, lse, _ = head_of(row, temperature)
        us = ((np.arange(n) + 0.5) / n).tolist()
        tokens, read = spec.sample_from_head(ids, vals, lse, vocab, temperature, top_p, us, row)
        p = spec.sampling_distribution(row, temperature, 0, top_p).astype(np.float64)
        freq = np.bincount(np.asarray(tokens), minlength=vocab) / n
        assert np.all(p[np.asarray(tokens)] > 0)
        assert np.max(np.abs(freq - p)) <= 1.0 / n + 1e-6, (temperature, top_p)
        # the head's share and the tail's, as masses
        in_head = np.isin(np.asarray(tokens), ids)
        assert abs(in_head.mean() - p[ids].sum()) <= len(ids) / n + 1e-6
        # the row was read exactly when the head did not decide
        c_k = head_mass(row, temperature)
        read = np.asarray(read)
        if top_p < 1.0:
            assert read.all() if c_k < top_p else not read.any(), (c_k, top_p)
        else:
            u = np.asarray(us)
            assert np.array_equal(read[np.abs(u - c_k) > 1e-7], (u >= c_k)[np.abs(u - c_k) > 1e-7])


def test_sample_from_head_reads_the_row_exactly_when_the_head_does_not_decide(real_logits):
    """Rows built from a real one (logits / s) whose 64 best hold just below and just above top_p of
    the mass: the whole row is needed (and read) exactly when they hold less; without a row given, such
    a draw raises instead of guessing. Temperature alone: a u past the head's mass C_k reads the row and
    draws from the tail (a token outside the head), a u below it never does."""
    from swiftspec import InvalidRequestError

    base = real_logits[0]
    vocab = base.size
    masses = {s: head_mass(base / s, 1.0) for s in (1.0, 2.0, 4.0, 6.0, 8.0, 12.0)}
    assert min(masses.values()) < 0.8 < max(masses.values())  # both sides of the cut are built
    for s, c_k in masses.items():
        row = np.ascontiguousarray(base / s, dtype=np.float32)
        ids, vals, lse, _ = head_of(row, 1.0)
        if abs(c_k - 0.8) < 1e-5:
            continue
        if c_k >= 0.8:
            tokens, read = spec.sample_from_head(ids, vals, lse, vocab, 1.0, 0.8, [0.3, 0.9])  # no row needed
            assert read == [False, False] and set(tokens) <= set(ids)
        else:
            with pytest.raises(InvalidRequestError, match="the whole row is needed"):
                spec.sample_from_head(ids, vals, lse, vocab, 1.0, 0.8, [0.3])
            tokens, read = spec.sample_from_head(ids, vals, lse, vocab, 1.0, 0.8, [0.3], row)
            assert read == [True]
        # temperature alone: u below C_k is the head's, u above it the tail's
        lo, hi = c_k * 0.5, c_k + (1 - c_k) * 0.5
        tokens, read = spec.sample_from_head(ids, vals, lse, vocab, 1.0, 1.0, [lo, hi], row)
        assert read == [False, True]
        assert tokens[0] in ids and tokens[1] not in ids
        with pytest.raises(InvalidRequestError, match="the whole row is needed"):
            spec.sample_from_head(ids, vals, lse, vocab, 1.0, 1.0, [hi])


def test_sample_from_head_refuses_bad_input(real_logits):
    from swiftspec import InvalidRequestError, SwiftspecError

    row = real_logits[1]
    vocab = row.size
    ids, vals, lse, _ = head_of(row, 0.7)
    for kwargs, needle in (
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(temperature=-1.0), "temperature must be a finite number >= 0"),
        (dict(temperature=0.7, top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(temperature=0.7, top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(temperature=0.7, top_k=40), "top_k=40 keeps fewer than the vocabulary"),
        (dict(temperature=0.7, us=[1.0]), r"u must be in \[0, 1\)"),
        (dict(temperature=0.7, log_normalizer=vals[0] / 0.7 - 1.0), "is below the largest logit / T"),
        (dict(temperature=0.7, vocab=10), r"k must be in \[1, vocab=10\]"),
    ):
        args = dict(ids=ids, top_logits=vals, log_normalizer=lse, vocab=vocab, top_p=1.0, us=[0.5], row=row)
        args.update(kwargs)
        with pytest.raises(InvalidRequestError, match=needle):
            spec.sample_from_head(**args)
    # NaN logits in the row read for the tail: the runtime's NaN error (the model's fault, not the request's)
    bad = row.copy()
    bad[[i for i in range(vocab) if i not in set(ids)][0]] = np.nan
    with pytest.raises(SwiftspecError, match="NaN") as info:
        spec.sample_from_head(ids, vals, lse, vocab, 0.7, 1.0, [0.999999999], bad)
    assert not isinstance(info.value, InvalidRequestError)


def test_sample_from_head_refuses_repeated_ids_and_non_finite_rows(real_logits):
    """What the head path drew silently before: a head naming one id twice (drawn with the summed
    weight of its entries: u = 0.6 gave the repeated id), a row read for the tail whose largest logit
    is -inf or +inf (every weight NaN: the last id of the vocabulary came back), and
    sampling_distribution of such a row (all NaN). Non-finite logits are the model's error, not the
    request's. Messages show numbers as they read back (std::to_string: "u ... got -0.000000" for
    -1e-300, "top_p ... got 1.000000" for 1.0000001)."""
    from swiftspec import InvalidRequestError, SwiftspecError

    row = real_logits[1]
    vocab = row.size
    ids, vals, lse, _ = head_of(row, 1.0)
    twice = list(ids)
    twice[1] = twice[0]
    with pytest.raises(
        InvalidRequestError,
        match=rf"^sample_from_head: ids\[1\] repeats ids\[0\] = {ids[0]} \(a row's "
        r"best entries name each token once\)$",
    ):
        spec.sample_from_head(twice, vals, lse, vocab, 1.0, 1.0, [0.6], row)
    for fill, shown in ((-np.inf, "-inf"), (np.inf, "inf")):
        bad = np.full(vocab, -np.inf, np.float32)
        bad[ids[0]] = fill
        # a normaliser the head cannot use (NaN): the row decides, at top_p 1 and below it
        for top_p in (1.0, 0.9):
            who = (
                "sample_from_head: the largest logit of the row"
                if top_p == 1.0
                else "sampling_distribution: the largest logit"
            )
            with pytest.raises(
                SwiftspecError, match=rf"^{who} is {shown} \(the model produced non-finite logits\)$"
            ) as info:
                spec.sample_from_head(ids, vals, float("nan"), vocab, 1.0, top_p, [0.5], bad)
            assert not isinstance(info.value, InvalidRequestError)
        with pytest.raises(
            SwiftspecError,
            match=rf"^sampling_distribution: the largest logit is {shown} \(the model "
            r"produced non-finite logits\)$",
        ):
            spec.sampling_distribution(bad, 1.0, 0, 1.0)
    for kwargs, needle in (
        (dict(us=[-1e-300]), "sample_from_head: u must be in [0, 1), got -1e-300"),
        (dict(top_p=1.0000001), "top_p must be in (0, 1], got 1.0000001"),
        (dict(temperature=-1e-30), "temperature must be a finite number >= 0, got -1e-30"),
    ):
        args = dict(
            ids=ids, top_logits=vals, log_normalizer=lse, vocab=vocab, temperature=1.0, top_p=1.0, us=[0.5], row=row
        )
        args.update(kwargs)
        with pytest.raises(InvalidRequestError) as info:
            spec.sample_from_head(**args)
        assert str(info.value) == needle
