"""The user's own prompts for ``swiftspec bench --prompts FILE.jsonl`` (issue 29).

One request per line, in one of three shapes every tool of the field writes:

* ``{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}``: the
  OpenAI chat format; the last message is the user's (the model answers it). ``content`` is a
  string or a list of ``{"type": "text", "text": "..."}`` parts (joined).
* ``{"prompt": "..."}``: one user message.
* ``{"conversations": [{"from": "human" | "gpt" | "system", "value": "..."}, ...]}``: a
  ShareGPT record; its first human turn is the request (after the record's system turn, if it
  opens with one), as the ShareGPT-based serving benchmarks take it.

An optional ``"id"`` (string or integer) names the prompt in the results; otherwise its line
number does. Blank lines are skipped. The measured data set is named ``file:<file name>``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from swiftspec.bench.config import BenchConfigError

#: The data set name prefix of a prompt file.
PREFIX = "file:"
#: A prompt file larger than this is refused before it is read (a benchmark measures hundreds of
#: requests, not a training corpus).
MAX_BYTES = 256 << 20
_ROLES = ("system", "user", "assistant")
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}


@dataclass
class PromptFile:
    """A prompt file read and checked: ``name`` (``file:<file name>``), ``path`` (resolved),
    ``sha256`` of its bytes, and ``records``: (prompt id, chat messages) per request, in file order."""

    name: str
    path: Path
    sha256: str
    records: list[tuple[str, list[dict]]]

    def block(self) -> dict:
        """What the result's ``settings.prompt_file`` records of it."""
        return {"dataset": self.name, "path": str(self.path), "sha256": self.sha256, "records": len(self.records)}


def _text(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(p, dict) for p in value):
        parts = []
        for j, part in enumerate(value):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BenchConfigError(
                    f'{where}[{j}]: only text parts ({{"type": "text", "text": "..."}}) can be measured'
                )
            parts.append(part["text"])
        return "".join(parts)
    raise BenchConfigError(f"{where}: expected a string (or a list of text parts), got {type(value).__name__}")


def _messages(record: dict, where: str) -> list[dict]:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise BenchConfigError(f"{where}: field 'messages' must be a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        at = f"{where}: field 'messages[{i}]'"
        if not isinstance(m, dict):
            raise BenchConfigError(f"{at} must be an object with 'role' and 'content'")
        role = m.get("role")
        if role not in _ROLES:
            raise BenchConfigError(f"{at}.role is {role!r} (expected one of {', '.join(_ROLES)})")
        if "content" not in m:
            raise BenchConfigError(f"{at} has no 'content'")
        out.append({"role": role, "content": _text(m["content"], f"{at}.content")})
    if out[-1]["role"] != "user":
        raise BenchConfigError(
            f"{where}: field 'messages': the last message is the {out[-1]['role']}'s; "
            "a request ends with the user's message"
        )
    return out


def _sharegpt(record: dict, where: str) -> list[dict]:
    turns = record["conversations"]
    if not isinstance(turns, list) or not turns:
        raise BenchConfigError(f"{where}: field 'conversations' must be a non-empty list of turns")
    system = []
    for i, t in enumerate(turns):
        at = f"{where}: field 'conversations[{i}]'"
        if not isinstance(t, dict) or not isinstance(t.get("from"), str) or "value" not in t:
            raise BenchConfigError(f"{at} must be an object with 'from' and 'value'")
        role = _SHAREGPT_ROLES.get(t["from"].lower())
        if role is None:
            raise BenchConfigError(f"{at}.from is {t['from']!r} (expected human, gpt or system)")
        if role == "system" and i == 0:
            system = [{"role": "system", "content": _text(t["value"], f"{at}.value")}]
        elif role == "user":
            return system + [{"role": "user", "content": _text(t["value"], f"{at}.value")}]
    raise BenchConfigError(f"{where}: field 'conversations' has no human turn")


def parse_record(line: str, where: str) -> tuple[str | None, list[dict]]:
    """One line of a prompt file: (its ``id`` or None, its chat messages). ``where`` ("FILE:LINE")
    begins every error. Raises :class:`BenchConfigError` naming the field for a line that is not a
    JSON object, has none or several of messages / prompt / conversations, or a malformed one."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise BenchConfigError(f"{where}: not a JSON object: {str(exc)[:200]}") from None
    if not isinstance(record, dict):
        raise BenchConfigError(f"{where}: not a JSON object (a {type(record).__name__})")
    kinds = [k for k in ("messages", "prompt", "conversations") if k in record]
    if len(kinds) != 1:
        raise BenchConfigError(
            f"{where}: a record has exactly one of 'messages' (OpenAI chat), 'prompt' or "
            f"'conversations' (ShareGPT); this one has {', '.join(map(repr, kinds)) or 'none'}"
        )
    pid = record.get("id")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, (str, int))):
        raise BenchConfigError(f"{where}: field 'id' must be a string or an integer, got {type(pid).__name__}")
    if kinds[0] == "messages":
        messages = _messages(record, where)
    elif kinds[0] == "prompt":
        messages = [{"role": "user", "content": _text(record["prompt"], f"{where}: field 'prompt'")}]
    else:
        messages = _sharegpt(record, where)
    if not any(m["content"].strip() for m in messages if m["role"] == "user"):
        raise BenchConfigError(f"{where}: field '{kinds[0]}': the user's message is empty")
    return (None if pid is None else str(pid)), messages


def read_prompt_file(path: str | Path) -> PromptFile:
    """Reads and checks a whole prompt file before anything loads.

    Returns a :class:`PromptFile`. Raises :class:`BenchConfigError` "<path>: ..." for a missing
    file, one that is not a regular file, over :data:`MAX_BYTES`, not UTF-8, without any record,
    or with two records of one id; "<path>:<line>: ..." naming the field for a malformed record
    (:func:`parse_record`).
    """
    p = Path(path)
    if not p.exists():
        raise BenchConfigError(f"--prompts {path}: no such file")
    if not p.is_file():
        raise BenchConfigError(f"--prompts {path}: not a regular file")
    size = p.stat().st_size
    if size > MAX_BYTES:
        raise BenchConfigError(
            f"--prompts {path}: {size} bytes, more than the {MAX_BYTES >> 20} MiB a prompt file may have"
        )
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BenchConfigError(f"--prompts {path}: not UTF-8 text ({exc})") from None
    records: list[tuple[str, list[dict]]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        pid, messages = parse_record(line, where)
        pid = pid if pid is not None else f"line{lineno}"
        if pid in seen:
            raise BenchConfigError(f"{where}: id {pid!r} was already used on line {seen[pid]}")
        seen[pid] = lineno
        records.append((pid, messages))
    if not records:
        raise BenchConfigError(f"--prompts {path}: no records (one JSON object per line)")
    return PromptFile(PREFIX + p.name, p.resolve(), hashlib.sha256(data).hexdigest(), records)
