"""Device placement of the draft group and the target group (SwiftSpec's disaggregation).

A placement says which devices each worker group runs on and with which tensor-parallel (TP)
degree. On the CPU backend a device is a set of cores: on a 2-core machine the natural
placement puts the draft on core 0 and the target on core 1, so the draft keeps growing the
token tree while the target verifies (``mode="async"``).

Accepted forms (``Engine(..., placement=...)``):

* ``"auto"``: the draft gets max(draft_tp, cores/4) cores, the target the rest;
* a dict ``{"draft": {"tp": 1, "cores": [0]}, "target": {"tp": 2, "cores": [[1], [2]]}}``
  (fields per group: ``tp``, ``cores`` (one list per rank, or one flat list split evenly),
  ``threads_per_rank``; for CUDA ``devices`` (the GPU of each rank: ``{"draft": {"devices": [1]},
  "target": {"tp": 2, "devices": [0, 1]}}`` puts the draft on its own GPU and the target
  tensor-parallel over two), ``sm_partition``, ``stream_priority``, ``gemm_engine``
  (``"wgmma"`` or ``"mma"``) and ``megakernel`` (``true``: single-token steps as one persistent
  kernel; tp 1; meant for the draft); for the draft group ``kv_window`` (``[sinks, recent]``: its
  attention reads the first ``sinks`` and the last ``recent`` committed keys, so its step cost
  stays flat at long contexts; the target verifies with its full KV; cpu backend for now); see
  ``cpp/include/swiftspec/placement.h``);
* the same as JSON text, or the path of a ``.json`` file holding it.

On one GPU (``backend="cuda"``) the groups can get disjoint SM partitions, each run through a CUDA
green context so the draft cannot slow the target: ``{"draft": {"sm_partition": [0, 16]},
"target": {"sm_partition": [16, 0]}}`` (``[first SM, SM count]``, count 0: up to the last SM; bounds
on multiples of 8 SMs on an H200; ``docs/green_contexts.md``). Without ``sm_partition`` both models
share all SMs on their own streams.

Errors (unknown fields, cores that do not exist, list sizes) raise
:class:`swiftspec.InvalidRequestError` naming the group and field.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from pathlib import Path

from swiftspec.errors import InvalidRequestError


def normalize(placement, *, target_tp: int | None = None, draft_tp: int | None = None) -> dict:
    """The validated placement as a dict ``{"draft": {...}, "target": {...}}``.

    ``target_tp`` / ``draft_tp``, when given, set the groups' TP degrees of an ``"auto"``
    placement (and must agree with an explicit one).
    """
    from swiftspec import swiftspec_core as core

    if isinstance(placement, str) and placement == "auto":
        text = core.placement_automatic(0, target_tp or 1, draft_tp or 1)
    elif isinstance(placement, dict):
        bad = _non_finite(placement, "placement")
        if bad is not None:
            raise InvalidRequestError(f"{bad[0]} must be a finite number, got {bad[1]!r}")
        try:
            text = json.dumps(placement, allow_nan=False, default=_as_int)
        except (TypeError, ValueError) as exc:  # a set, an object ...
            raise InvalidRequestError(
                f"placement must hold JSON values (numbers, strings, lists, objects): {exc}"
            ) from None
    elif isinstance(placement, (str, os.PathLike)):
        s = str(placement)
        if s.lstrip().startswith("{"):
            text = s
        else:
            path = Path(s).expanduser()
            if not path.is_file():
                raise InvalidRequestError(
                    f"placement {s!r} is neither 'auto', a JSON object, nor an existing .json file"
                )
            text = path.read_text(encoding="utf-8")
    else:
        raise InvalidRequestError(
            f"placement must be 'auto', a dict, JSON text or a path to a JSON file; got {type(placement).__name__}"
        )
    out = json.loads(core.placement_normalize(text))
    for group, tp in (("target", target_tp), ("draft", draft_tp)):
        if tp is not None and out[group]["tp"] != tp:
            raise InvalidRequestError(f"placement.{group}.tp is {out[group]['tp']} but {group}_tp={tp} was given")
    return out


def _non_finite(value, where: str):
    """The first NaN or infinity in a placement dict, as (its path, the value), or None: JSON has no
    such numbers, so they are named here instead of failing the runtime's parse."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if isinstance(value, dict):
        items = ((f"{where}.{k}", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, v in items:
        found = _non_finite(v, path)
        if found is not None:
            return found
    return None


def _as_int(value):
    """json.dumps' fallback: integer types that are not int (numpy's) as int; anything else is not
    JSON (TypeError, as json.dumps raises)."""
    if isinstance(value, numbers.Integral):
        return int(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def backend_problems(placement: dict | None, backend: str) -> list[str]:
    """What a normalized placement (None: the default) asks for that ``backend`` does not implement,
    as ``placement.<group>.<field>: <why>`` (empty when nothing): a draft's ``kv_window`` on the
    cuda backend (issue 27). The runtime's rule (``GroupPlacement::backend_problem``,
    ``cpp/include/swiftspec/placement.h``), which ``load_model_pair`` applies too; asked first so
    that nothing is loaded or converted for a run the backend would refuse."""
    from swiftspec import swiftspec_core as core

    return core.placement_backend_problems(json.dumps(placement or {}), backend)


def cuda_only_fields(placement: dict) -> list[str]:
    """The CUDA-only settings a normalized placement asks for, as ``placement.<group>.<field>``
    (empty when none): what a cpu-backend run has to refuse. The runtime's list
    (``GroupPlacement::cuda_only_fields``, ``cpp/include/swiftspec/placement.h``)."""
    from swiftspec import swiftspec_core as core

    return core.placement_cuda_only_fields(json.dumps(placement))


def int4_problems(placement: dict | None, backend: str) -> list[str]:
    """What a normalized placement (None: the default) asks for that int4 checkpoints cannot run
    with on ``backend``, as ``placement.<group>.<field>: <why>`` (empty when nothing): on cuda the
    decode megakernel and tp > 1 (issue 31). The runtime's rule (``int4_backend_problem``,
    ``cpp/include/swiftspec/model.h``), which its loaders apply too; asked first so that nothing is
    converted to int4 for a run the backend would refuse."""
    from swiftspec import swiftspec_core as core

    return core.placement_int4_problems(json.dumps(placement or {}), backend)


def is_default_group(group: dict) -> bool:
    """True when a normalized group places nothing (TP 1, no cores, no threads, no CUDA field, no
    kv_window;
    ``GroupPlacement::places_nothing``)."""
    from swiftspec import swiftspec_core as core

    return core.placement_group_places_nothing(json.dumps(group))


def load_models(
    target_dir,
    draft_dir,
    placement: dict,
    *,
    backend: str = "cpu",
    max_context: int = 0,
    max_tree: int = 256,
    num_threads: int = 0,
):
    """Loads the target (and draft, unless ``draft_dir`` is None) where ``placement`` says.
    ``max_context`` 0: each model's default (its max_position_embeddings), capped when the memory
    free does not hold both models at that length; their contexts are planned together
    (``swiftspec_core.load_model_pair``).

    Returns ``(target, draft)`` as ``swiftspec_core.Model`` objects (draft may be None).
    """
    from swiftspec import swiftspec_core as core

    options = core.ModelOptions()
    options.max_context = int(max_context)
    options.max_tree = int(max_tree)
    options.num_threads = int(num_threads)
    target, draft, _note = core.load_model_pair(
        str(target_dir), str(draft_dir) if draft_dir is not None else None, json.dumps(placement), options, backend
    )
    return target, draft
