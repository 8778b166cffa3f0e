"""Long-context workloads of ``swiftspec bench`` (``--context-tokens 512,4096,16384,32768``).

For each N the run measures a workload named ``ctxN`` (a data set of the run: its rows, aggregates,
output checks, ``--resume`` and ``--merge`` work as for MT-Bench and HumanEval) whose prompts are
exactly N tokens long, counted with the target's tokenizer and chat template. Prompt ``i`` is what a
coding assistant with files in its prompt sees: one user message (the chat template adds its default
system message)::

    Here are the files of my project:

    ```python
    # file: HumanEval/i.py
    <prompt of HumanEval problem i><its canonical solution>
    <its test>

    # file: HumanEval/i+1.py
    ...
    ```

    <CONTEXT_INSTRUCTION>

The files are the HumanEval problems in file order from problem ``i`` on, wrapping around after the
last (all 164 hold ~63K tokens, so up to that length no file repeats). The code is cut at a token
boundary such that the rendered, tokenized prompt is exactly N tokens (:func:`context_prompt`);
the instruction asks for a long answer, so ``--max-new-tokens 4096`` decodes that far.
"""

from __future__ import annotations

from swiftspec.bench.config import BenchConfigError

#: Data set name of the long-context workload of N prompt tokens.
CONTEXT_PREFIX = "ctx"
#: What the long-context prompts ask for after the files: a review that runs long.
CONTEXT_INSTRUCTION = (
    "Review the code above file by file, in order: for each function, say what it does, "
    "point out bugs and edge cases it misses, and suggest improvements."
)
_HEAD = "Here are the files of my project:\n\n```python\n"
_TAIL = "\n```\n\n" + CONTEXT_INSTRUCTION
#: The construction in one line, recorded in bench.json's settings.prompt_format.
CONSTRUCTION = (
    "ctxN: one user message of exactly N tokens (target tokenizer and chat template): the HumanEval "
    "problems from problem i on (prompt i of the workload), each as a file of its prompt, canonical "
    "solution and test, in one Python code block cut at a token boundary, then the instruction "
    f"{CONTEXT_INSTRUCTION!r} (swiftspec.bench.long_context)"
)


def workload_name(n_tokens: int) -> str:
    """The data set name of the long-context workload of ``n_tokens`` prompt tokens ("ctx4096")."""
    return f"{CONTEXT_PREFIX}{n_tokens}"


def context_tokens_of(name: str) -> int | None:
    """N of a long-context workload's name ("ctx4096" -> 4096), None for other data sets."""
    digits = name[len(CONTEXT_PREFIX) :] if name.startswith(CONTEXT_PREFIX) else ""
    return int(digits) if digits.isdigit() and not digits.startswith("0") else None


def context_workloads(datasets: list[str]) -> list[int]:
    """N of each long-context workload among ``datasets`` (data set names), in their order."""
    return [n for n in map(context_tokens_of, datasets) if n is not None]


def parse_context_tokens(values, flag: str = "context_tokens") -> list[int]:
    """The prompt lengths of the long-context workloads, ascending.

    ``values``: a comma-separated string ("512,4096") or a sequence of ints. Raises
    :class:`BenchConfigError` naming ``flag`` and the value for an empty list, an entry that is not
    an integer >= 1 or one given twice. (Whether N holds the prompt's frame, the chat template and
    the instruction, is checked once the tokenizer is loaded: :func:`context_prompt`.)
    """
    if isinstance(values, str):
        entries = [v.strip() for v in values.split(",")]
    else:
        try:
            entries = list(values)
        except TypeError:
            raise BenchConfigError(f"{flag} must be a list of integers, got {values!r}") from None
    if not entries or entries == [""]:
        raise BenchConfigError(f"{flag} is empty: give prompt lengths in tokens, e.g. 512,4096")
    out: list[int] = []
    for v in entries:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise BenchConfigError(f"{flag}: {v!r} is not an integer")
        try:
            n = int(v)
        except ValueError:
            raise BenchConfigError(f"{flag}: {v!r} is not an integer") from None
        if n < 1:
            raise BenchConfigError(f"{flag}: a prompt length must be >= 1 token, got {n}")
        if n in out:
            raise BenchConfigError(f"{flag} names {n} twice")
        out.append(n)
    return sorted(out)


def _file(record: dict, index: int) -> str:
    return f"# file: HumanEval/{index}.py\n{record['prompt']}{record['canonical_solution']}{record['test']}"


def _messages(code: str) -> list[dict]:
    return [{"role": "user", "content": _HEAD + code + _TAIL}]


class ContextPrompts:
    """Builds the prompts of the long-context workloads (construction: module docstring).

    Args:
        tokenizer: the target's :class:`swiftspec.tokenizer.Tokenizer` (its chat template counts).
        records: the HumanEval records (:func:`swiftspec.datasets.load_humaneval`).

    A prompt is cut at the token level: the tokens of the chat template's text before the code, the
    first tokens of the files (each file tokenized with the blank lines after it, once per run),
    and the tokens of the text after the code. That makes any length exact, which cutting the text
    cannot: a run of indentation before a word is one token, or two once a character of the word
    follows, so some lengths are skipped. The tokens where the code meets the text after it are
    therefore not always the ones tokenizing the prompt's text would give (that gives N or N + 1
    tokens); every configuration runs the same token ids.
    """

    def __init__(self, tokenizer, records: list[dict]):
        self._tok = tokenizer
        self._files = [_file(r, i) + "\n\n" for i, r in enumerate(records)]
        self._file_ids: list[list[int] | None] = [None] * len(records)
        marker = "\x00code\x00"
        head, tail = tokenizer.apply_chat_template(_messages(marker)).split(marker)
        self._head_ids, self._tail_ids = tokenizer.encode(head), tokenizer.encode(tail)
        #: tokens of a prompt around its code (chat template, head and instruction)
        self.frame_tokens = len(self._head_ids) + len(self._tail_ids)

    def prompt(self, n_tokens: int, start: int) -> tuple[list[dict], list[int]]:
        """Prompt ``start`` (the files begin with HumanEval problem ``start``) of ``n_tokens`` tokens.

        Returns ``(messages, prompt_ids)``: ``n_tokens`` token ids (list of int), and the chat
        messages whose text they spell (``tokenizer.decode(prompt_ids)`` is their rendering).

        Raises:
            BenchConfigError: ``n_tokens`` does not exceed the prompt's frame (the chat template, the
                head and the instruction), naming both numbers.
        """
        if n_tokens <= self.frame_tokens:
            raise BenchConfigError(
                f"--context-tokens {n_tokens}: a long-context prompt's frame (chat template and "
                f"instruction) alone is {self.frame_tokens} tokens; give at least "
                f"{self.frame_tokens + 1}"
            )
        want = n_tokens - self.frame_tokens
        code: list[int] = []
        j = start
        while len(code) < want:  # the files from `start` on, wrapping around after the last
            i = j % len(self._files)
            ids = self._file_ids[i]
            if ids is None:
                ids = self._file_ids[i] = self._tok.encode(self._files[i])
            code += ids
            j += 1
        code = code[:want]
        messages = _messages(self._tok.decode(code))
        return messages, self._head_ids + code + self._tail_ids
