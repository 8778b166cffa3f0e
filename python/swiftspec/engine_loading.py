"""What :class:`swiftspec.Engine` loads: its models' folders (resolved, converted or fetched), their
tokenizer, their placement, and the models themselves (:func:`load_engine_models`)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import NamedTuple

from swiftspec.errors import CheckpointError, InvalidRequestError
from swiftspec.models import resolve_checkpoint
from swiftspec.request import check_int
from swiftspec.tokenizer import Tokenizer

#: The warning of an Engine without a draft whose placement places the draft group (nothing applies it).
DRAFT_GROUP_IGNORED = "placement: the draft group is ignored: no draft model is loaded"


class EngineModels(NamedTuple):
    target_dir: Path
    draft_dir: Path | None
    tokenizer: Tokenizer
    placement: dict | None  # normalized (swiftspec.placement), or None
    target: object  # swiftspec_core.Model
    draft: object  # swiftspec_core.Model or None
    context_note: str  # one line when free memory capped the default context, else ""


def load_engine_models(
    target, draft, *, backend: str, dtype: str, max_context, max_tree, num_threads, placement
) -> EngineModels:
    """The models of ``Engine(target, draft, ...)`` (its arguments, documented there), loaded."""
    from swiftspec import swiftspec_core as core

    # 0 asks the runtime for each model's default (its max_position_embeddings, bounded by free memory).
    max_context = 0 if max_context is None else check_int("max_context", max_context, 1)
    max_tree = check_int("max_tree", max_tree, 1)
    # Threads beyond a few per core only cost memory; far beyond, the system refuses them.
    num_threads = check_int("num_threads", num_threads, 0, max(256, 8 * (os.cpu_count() or 1)))
    from swiftspec.placement import backend_problems, is_default_group, normalize

    if placement is not None:
        placement = normalize(placement)
        problems = backend_problems(placement, backend)
        if problems:
            raise InvalidRequestError(problems[0])
    if dtype == "int4":  # before a conversion (minutes) that the backend would refuse
        from swiftspec.placement import int4_problems

        if backend not in ("cpu", "cuda"):
            raise InvalidRequestError(f"dtype='int4' runs on the cpu and cuda backends, not {backend!r}")
        problems = int4_problems(placement, backend)
        if problems:
            raise InvalidRequestError(f"dtype='int4': {problems[0]}")
    if placement is not None and draft is None and not is_default_group(placement["draft"]):
        warnings.warn(DRAFT_GROUP_IGNORED, UserWarning, stacklevel=3)  # (after the refusals above)
    target_dir = resolve_checkpoint(target, dtype=dtype)
    draft_dir = resolve_checkpoint(draft, dtype=dtype) if draft is not None else None
    tokenizer = Tokenizer.from_checkpoint(target_dir)
    if draft_dir is not None:
        draft_tok = Tokenizer.from_checkpoint(draft_dir)
        if draft_tok.vocab_size != tokenizer.vocab_size:
            raise CheckpointError(
                f"{draft_dir}: the draft tokenizer has {draft_tok.vocab_size} tokens, the target's "
                f"({target_dir}) has {tokenizer.vocab_size}; speculative decoding needs one tokenizer"
            )
    options = core.ModelOptions()
    options.max_context, options.max_tree, options.num_threads = max_context, max_tree, num_threads
    try:
        # Both models at once: their contexts are planned together against the memory they share.
        target_model, draft_model, note = core.load_model_pair(
            str(target_dir),
            str(draft_dir) if draft_dir is not None else None,
            json.dumps(placement) if placement is not None else "{}",
            options,
            backend,
        )
    except MemoryError:
        raise InvalidRequestError(
            f"not enough memory to load the model(s) with max_context={max_context or 'default'}, "
            f"max_tree={max_tree}: the KV cache is allocated for all of it at load time; lower them"
        ) from None
    return EngineModels(target_dir, draft_dir, tokenizer, placement, target_model, draft_model, note)
