"""The rows an interrupted ``swiftspec bench`` run already measured, read back for ``--resume``
(:meth:`swiftspec.bench.runner.Runner._resumed_rows`, which documents the checks)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from swiftspec.bench.config import SAMPLING_DEFAULTS, BenchConfigError

if TYPE_CHECKING:
    from swiftspec.bench.runner import PromptItem, Runner


def resumed_rows(runner: Runner, items: list[PromptItem]) -> list[dict]:
    """:meth:`Runner._resumed_rows` of ``runner``."""
    from swiftspec.bench.runner import _count as runner_count
    from swiftspec.bench.schema import request_row_problem, row_consistency_problems

    assert runner.out_dir is not None  # run() resumes only into an out_dir
    ident_path = runner.out_dir / "run_identity.json"
    jsonl_path = runner.out_dir / "requests.jsonl"
    runner._resume_cut = None
    if jsonl_path.is_file() and not ident_path.is_file() and jsonl_path.stat().st_size > 0:
        # measured rows of unknown settings: neither kept nor replaced (a run writes
        # run_identity.json before its first row)
        raise BenchConfigError(
            f"--resume: {jsonl_path} holds measured rows but {ident_path} is missing: its "
            "run's settings are unknown; use a new --out folder"
        )
    if not ident_path.is_file() or not jsonl_path.is_file():
        runner.log(f"--resume: nothing to resume in {runner.out_dir}; starting afresh")
        return []
    try:
        recorded = json.loads(ident_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # e.g. emptied by a kill while written
        raise BenchConfigError(
            f"--resume: {ident_path} is not JSON ({exc}); its run's settings are unknown: use a new --out folder"
        ) from None
    if not isinstance(recorded, dict):
        raise BenchConfigError(
            f"--resume: {ident_path} holds {json.dumps(recorded)[:40]}, not the settings of "
            "a run; use a new --out folder"
        )
    before = {**SAMPLING_DEFAULTS, **recorded}
    now = runner._run_identity()
    # decoding first (greedy vs sampled is named by temperature), then the rest by name
    for setting in list(SAMPLING_DEFAULTS) + sorted((set(before) | set(now)) - set(SAMPLING_DEFAULTS)):
        if before.get(setting) != now.get(setting):
            raise BenchConfigError(
                f"--resume: the run in {runner.out_dir} has {setting}={before.get(setting)!r}, "
                f"this one {now.get(setting)!r}; use a new --out folder"
            )
    planned = {(i.dataset, i.index): i for i in items}
    modes = {c.name: c.mode for c in runner.configs}
    rows = []
    seen: dict[tuple, int] = {}
    # Lines end in "\n" only (json.dumps escapes every other line break); bytes that are not
    # UTF-8 (an edited file) fail as "not JSON" below instead of as a traceback here.
    text = jsonl_path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the file ends with a line end (or is empty): no cut line
    else:
        # No line end: the last write was cut by a kill, or stopped just before its line end
        # (a whole row: kept). Any other line that is not JSON is an edit, named below.
        try:
            json.loads(lines[-1])
        except (ValueError, RecursionError):
            # A cut row is a prefix of one json.dumps wrote: "{" first, ASCII only. Other text (bytes
            # appended by hand, a mangled edit) is named as not JSON below, not dropped as a cut.
            if lines[-1].startswith("{") and lines[-1].isascii():
                runner._resume_cut = lines.pop()
    # The model's vocabulary (it may emit padding ids beyond the tokens); None: not loaded (the runner's tests)
    vocab = getattr(runner.tokenizer, "model_vocab_size", getattr(runner.tokenizer, "vocab_size", None))
    for n, line in enumerate(lines):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError; an integer of over 4300 digits; deep nesting
            raise BenchConfigError(f"--resume: {jsonl_path} line {n + 1} is not JSON") from None
        where = f"--resume: {jsonl_path} line {n + 1}"
        # JSON values: their types are checked (request_row_problem) before they are used below
        key: tuple[Any, Any, Any] | None = (
            (row.get("dataset"), row.get("prompt_index"), row.get("config")) if isinstance(row, dict) else None
        )
        if key is None or None in key:
            raise BenchConfigError(f"{where} is not a request row (no dataset, prompt_index or config)")
        # A row is kept as it was measured: its type, range and internal agreement are checked
        # here (an edited line would otherwise be a traceback or a wrong report at the end).
        problem = request_row_problem(row)
        if problem is None and vocab is not None:  # the report decodes them (divergence text)
            bad = next((i for i, t in enumerate(row["token_ids"]) if t >= vocab), None)
            if bad is not None:
                problem = (
                    f"token_ids/{bad}: {row['token_ids'][bad]} is outside the vocabulary of the "
                    f"target's tokenizer [0, {vocab})"
                )
        if problem is None:
            problems = row_consistency_problems(row, runner.settings.max_new_tokens, modes.get(key[2]))
            problem = problems[0] if problems else None
        if problem is not None:
            raise BenchConfigError(f"{where}: {problem} (an edited file?)")
        item = planned.get(key[:2])
        if item is None or key[2] not in modes:
            raise BenchConfigError(
                f"{where}: {key[0]}[{key[1]}] {key[2]} is not a request of this run "
                f"({'prompt' if item is None else 'configuration'} not measured; an edited "
                "file?)"
            )
        if (row["prompt_id"], row["prompt_tokens"]) != (item.prompt_id, len(item.prompt_ids)):
            raise BenchConfigError(
                f"{where}: prompt {key[0]}[{key[1]}] is {row['prompt_id']} of "
                f"{row['prompt_tokens']} tokens there, {item.prompt_id} of "
                f"{len(item.prompt_ids)} tokens now (another data set file or chat "
                "template?); use a new --out folder"
            )
        if key in seen:
            raise BenchConfigError(
                f"{where} repeats the request {key[0]}[{key[1]}] {key[2]} of line {seen[key]} (an edited file?)"
            )
        seen[key] = n + 1
        rows.append(row)
    runner.log(
        f"--resume: {runner_count(len(rows), 'request')} already measured in {jsonl_path}, kept"
        + (
            f"; its last line (line {len(lines) + 1}, {len(runner._resume_cut)} characters without a line "
            "end) is a row cut by the interruption: dropped, that request is measured again"
            if runner._resume_cut is not None
            else ""
        )
    )
    return rows
