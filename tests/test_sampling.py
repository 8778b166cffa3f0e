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
