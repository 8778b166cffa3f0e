"""Target-only greedy references for losslessness checks (issues 3, 4, 6).

Checking that speculative decoding is lossless means comparing its greedy output with the
target's own greedy output. Decoding that reference costs one target step per token; on a
batch-invariant backend it can instead be confirmed in one batched pass (below).
"""

from __future__ import annotations

import numpy as np


def teacher_forced_reference(model, prompt_ids, candidate, max_new_tokens: int, stop_token_ids=()) -> list[int] | None:
    """Target-only greedy output, confirmed from one teacher-forced target pass, or None.

    Target-only greedy decoding is the unique sequence whose every token is the argmax of the
    target's logits given the prompt and the tokens before it. One forward pass of `model`
    (the target, fresh committed KV) over prompt + candidate[:-1] gives those logits for every
    position at once; on a batch-invariant backend (the CPU backend, cpp/backend/cpu/kernels.h)
    each row is bit-identical to the decode step's, so when every row's argmax (first maximum,
    as sampling.cpp) is the candidate's next token, and the candidate ended where decoding would
    (max_new_tokens reached, or its last token is one of `stop_token_ids`, the request's stop
    tokens), the candidate IS the target-only output. Returns it then; None when any position
    disagrees (the caller decodes instead).
    Leaves the model's committed KV empty.

    model: a loaded target (swiftspec_core model, any TP degree); prompt_ids: the prompt's
    token ids (non-empty list of int); candidate: new token ids (list of int); stop_token_ids:
    the ids that end the request (iterable of int).
    Raises whatever model.forward raises for ids outside the vocabulary or past max_context.
    """
    n = len(candidate)
    stops = set(stop_token_ids)
    if n == 0 or n > max_new_tokens or any(t in stops for t in candidate[:-1]):
        return None  # decoding would have stopped earlier
    if n < max_new_tokens and candidate[-1] not in stops:
        return None  # decoding would have gone on
    model.truncate_committed(0)
    if len(prompt_ids) > 1:
        model.forward(list(prompt_ids[:-1]), logits="none")
    logits = np.asarray(model.forward([prompt_ids[-1]] + list(candidate[:-1]), logits="all"))
    model.truncate_committed(0)
    return list(candidate) if np.array_equal(logits.argmax(axis=1), np.asarray(candidate)) else None
