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
            draws = np.asarray(spec.sample_from_top_k(ids, [float(row[i]) for i in ids], temperature, top_k,
                                                      top_p, seed=11, n=20000))
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
            ([1, 2, 3], [0.0, 100.0, 1000.0], r"largest first without NaN, got top_logits\[1\] = 100.000000 after 0"),
            ([1, 2, 3], [1.0, float("nan"), 0.0], r"got top_logits\[1\] = nan"),
            ([1, 2, 3], [float("nan"), 1.0, 0.0], r"got top_logits\[0\] = nan"),
            ([-1, 2, 3], [3.0, 1.0, 0.0], r"ids\[0\] is -1")):
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
