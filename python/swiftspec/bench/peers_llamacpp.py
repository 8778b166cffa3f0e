"""The llama.cpp peers of ``swiftspec bench`` (``--peers llamacpp``), and llama.cpp's own
long-context benchmark (``llama-bench`` at depth).

``llamacpp:target`` runs ``llama-completion`` (plain greedy generation) and ``llamacpp:assisted``
runs ``llama-speculative-simple --spec-type draft-simple -md DRAFT`` (llama.cpp's speculative
decoding with a draft model, its default settings: drafts of up to 3 tokens), both from
:mod:`swiftspec.bench.llamacpp_build`'s build, one process per request, on the GGUF files as
they are: **llama.cpp runs the quantized weights** (the reference target is Q4_K_M), whatever
dtype swiftspec was asked to run (bf16: the same GGUF dequantized; int4: swiftspec's own
quantization). Greedy: ``--temp 0`` keeps only the most likely token. On the cuda backend every
layer goes to the GPU (``-ngl 99``); flash attention is on (``-fa on``), as in the issue's
``llama-bench -fa 1``; CPU threads: the bench's ``--threads`` (0: every usable CPU) for each model.

**Same prompt tokens.** llama.cpp takes a prompt as text. The runner's prompt ids (the chat
template rendered by swiftspec's tokenizer) are decoded back to their text, which llama.cpp
tokenizes with special tokens parsed and no BOS added (Qwen2.5's GGUF adds none). The ids
llama.cpp used are read back (``llama-completion --verbose-prompt``; the pieces of the prompt that
``llama-speculative-simple`` echoes) and compared: for the chat prompts of the data sets they are
the same ids. Prompt ids that are not their text's own tokenization (the long-context workloads cut
their code at a token boundary) reach llama.cpp as a tokenization of the same text that may differ
by a token near the cut: such requests are measured, their row records the tokens llama.cpp
processed (``peer_prompt_tokens``) and ``settings.llamacpp.<backend>.prompts_retokenized`` counts
them. A prompt llama.cpp reads as another text fails with :class:`LlamaCppPeerError` naming the
first differing position.

**Timing: llama.cpp's own clock.** Both programs run with ``--log-jsonl --log-timestamps``: every
piece of text they print (one per prompt token echoed, one per generated token) is a JSON line
stamped with llama.cpp's microsecond clock when the program printed it. TTFT is from the last
echoed prompt token (printed just before the prompt is processed) to the first new token; decode
time from the first new token to the last one counted (for a final end-of-generation token, which
``llama-speculative-simple`` does not print: to the line it prints as its loop ends). Model
loading and llama.cpp's warm-up run come before and are not counted. ``llama-speculative-simple``
stops only once it has more than ``-n`` tokens, its last draft overshooting by up to the draft
length, so its output is cut at ``max_new_tokens`` (the time then ends at the step that made the
last token kept). Its steps: ``n_predict - n_accept`` from its summary, their boundaries the
largest gaps between the print times of consecutive tokens (a step's tokens are printed
microseconds apart, steps are a forward pass apart). The numbers llama.cpp reports itself
(``encoded/decoded N tokens in T seconds``; ``prompt eval time``, ``eval time``) are kept in
:attr:`LlamaCppResult.reported`.

**Output ids.** The printed pieces are mapped back to token ids through the GGUF vocabulary
(``llama-completion -sp`` and ``llama-speculative-simple`` print special tokens as their text, so
``<|im_end|>`` maps to its id). The JSON log replaces bytes that are not valid UTF-8 by U+FFFD, so
the ~1 % of Qwen2.5's tokens that hold a fragment of a multi-byte character print ambiguously;
such a new token is given the smallest id that prints that way and counted in
:attr:`LlamaCppResult.unresolved` (bench.json: ``settings.llamacpp.<backend>.unresolved_pieces``).
``llama-speculative-simple`` does not print the end-of-generation token: when its summary counts
one more token than it printed, that token is taken as the tokenizer's first end-of-generation id
(``<|im_end|>`` for the Qwen2.5 chat template), also counted as unresolved.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from swiftspec.bench.peers_hf import PeerUnavailableError
from swiftspec.errors import SwiftspecError

#: Extra KV positions beyond prompt + new tokens (speculation verifies a few tokens past the end).
CONTEXT_MARGIN = 16


class LlamaCppPeerError(SwiftspecError, RuntimeError):
    """A llama.cpp run failed or printed something this module cannot read (the message quotes it)."""


@dataclass
class LlamaCppResult:
    """One llama.cpp request. Times in seconds (llama.cpp's log clock), ``emissions``: tokens
    accepted per step (the first is the first emission).

    Attributes:
        token_ids: the new tokens (an end-of-generation token included, as swiftspec counts it).
        prompt_ids: the prompt's token ids as llama.cpp tokenized its text: the ids asked for, or
            another tokenization of the same text (:func:`check_prompt`).
        unresolved: pieces whose id was inferred, not read (module docstring).
        reported: the numbers llama.cpp printed itself (e.g. ``{"decoded_tokens", "decode_s"}``).
    """

    token_ids: list[int]
    ttft_s: float
    decode_s: float
    wall_s: float
    emissions: list[int]
    prompt_ids: list[int]
    unresolved: int = 0
    reported: dict = field(default_factory=dict)

    @property
    def counted_tokens(self) -> int:
        return sum(self.emissions)


# --------------------------------------------------------------------- vocabulary
_BYTE_CHARS: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes-to-unicode table (byte-level BPE token spellings -> bytes)."""
    global _BYTE_CHARS
    if _BYTE_CHARS is None:
        bs = (
            list(range(ord("!"), ord("~") + 1))
            + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1))
        )
        cs = list(bs)
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_CHARS = {chr(c): b for b, c in zip(bs, cs)}
    return _BYTE_CHARS


def _lossy(data: bytes) -> str:
    """``data`` as the JSON log shows it: invalid UTF-8 replaced by U+FFFD (only whether a piece
    is lossy matters, see :class:`PieceVocabulary`)."""
    return data.decode("utf-8", errors="replace")


class PieceVocabulary:
    """Maps the text pieces llama.cpp prints back to token ids, from a GGUF file's vocabulary
    (``tokenizer.ggml.tokens``; byte-level BPE spellings for normal tokens, text for the rest).

    Raises:
        LlamaCppPeerError: the GGUF has no token list, or a tokenizer model other than byte-level
            BPE ("gpt2"), whose pieces this mapping would not know.
    """

    def __init__(self, gguf_path: str | Path):
        from gguf import GGUFReader

        reader = GGUFReader(str(gguf_path))
        tokens_field = reader.fields.get("tokenizer.ggml.tokens")
        model_field = reader.fields.get("tokenizer.ggml.model")
        types_field = reader.fields.get("tokenizer.ggml.token_type")
        if tokens_field is None or model_field is None:
            raise LlamaCppPeerError(
                f"{gguf_path}: no tokenizer.ggml.tokens / tokenizer.ggml.model in the GGUF metadata"
            )
        model = bytes(model_field.parts[model_field.data[0]]).decode()
        if model != "gpt2":
            raise LlamaCppPeerError(
                f"{gguf_path}: the llama.cpp peer maps printed pieces back to ids for byte-level BPE "
                f"vocabularies (tokenizer.ggml.model 'gpt2'), not {model!r}"
            )
        tokens = [bytes(tokens_field.parts[i]).decode("utf-8") for i in tokens_field.data]
        types = (
            [int(types_field.parts[i][0]) for i in types_field.data] if types_field is not None else [1] * len(tokens)
        )
        decoder = _byte_decoder()
        exact: dict[str, list[int]] = {}
        for i, (tok, kind) in enumerate(zip(tokens, types)):
            if kind == 1 and all(ch in decoder for ch in tok):  # a normal token: its bytes
                text = _lossy(bytes(decoder[ch] for ch in tok))
            else:  # control / user-defined tokens print as their text (with -sp)
                text = tok
            exact.setdefault(text, []).append(i)
        self._ids = {text: sorted(ids) for text, ids in exact.items()}
        self._text = {i: text for text, ids in exact.items() for i in ids}
        self.size = len(tokens)

    def prints(self, token_id: int) -> str | None:
        """The piece llama.cpp prints for ``token_id`` (as the JSON log shows it), or None."""
        return self._text.get(token_id)

    def lookup(self, piece: str) -> tuple[int, bool]:
        """``(id, exact)`` of a printed piece: exact when one token prints so; otherwise the smallest
        id of those that do (a fragment of a multi-byte character). Raises LlamaCppPeerError for a
        piece no token prints."""
        ids = self._ids.get(piece)
        if not ids:
            raise LlamaCppPeerError(f"llama.cpp printed the piece {piece!r}, which no token of the vocabulary prints")
        return ids[0], len(ids) == 1


# ------------------------------------------------------------------------ the log
@dataclass
class _Line:
    time_us: int
    level: str
    msg: str


def parse_log(stdout: str) -> list[_Line]:
    """The JSON lines of a ``--log-jsonl`` run (other lines, e.g. a CUDA driver's, are skipped)."""
    lines = []
    for raw in stdout.splitlines():
        if not raw.startswith("{"):
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "log" and isinstance(obj.get("msg"), str):
            lines.append(_Line(int(obj.get("time", 0)), str(obj.get("level")), obj["msg"]))
    return lines


def _tail_text(lines: list[_Line], stderr: str, n: int = 12) -> str:
    text = [ln.msg.rstrip("\n") for ln in lines if ln.level in ("error", "warn", "info")][-n:]
    return "\n".join(text + stderr.strip().splitlines()[-4:])


def _reported(lines: list[_Line], patterns: dict[str, str]) -> dict:
    out = {}
    for ln in lines:
        for key, pattern in patterns.items():
            m = re.search(pattern, ln.msg)
            if m:
                out[key] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    return out


_COMPLETION_REPORTED = {
    "prompt_eval_ms": r"prompt eval time =\s*([\d.]+) ms",
    "eval_ms": r"\seval time =\s*([\d.]+) ms",
    "eval_runs": r"\seval time =.*/\s*(\d+) runs",
}
_SPECULATIVE_REPORTED = {
    "encoded_tokens": r"encoded\s+(\d+) tokens",
    "encode_s": r"encoded\s+\d+ tokens in\s+([\d.]+) seconds",
    "decoded_tokens": r"decoded\s+(\d+) tokens",
    "decode_s": r"decoded\s+\d+ tokens in\s+([\d.]+) seconds",
    "n_draft": r"^n_draft\s*=\s*(\d+)",
    "n_predict": r"^n_predict\s*=\s*(\d+)",
    "n_drafted": r"^n_drafted\s*=\s*(\d+)",
    "n_accept": r"^n_accept\s*=\s*(\d+)",
}


def read_completion(
    lines: list[_Line], prompt_ids: list[int], max_new_tokens: int, vocab: PieceVocabulary
) -> tuple[list[int], list[int], int, float, float, list[int]]:
    """Reads a ``llama-completion --verbose-prompt -sp --log-jsonl --log-timestamps`` run: returns
    ``(prompt ids it used, new ids, unresolved, ttft_s, decode_s, emissions)``. Raises
    LlamaCppPeerError if the output is not as expected (quoted)."""
    used: list[int] = []
    n_prompt = None
    for ln in lines:
        m = re.match(r".*number of tokens in prompt = (\d+)", ln.msg)
        if m:
            n_prompt = int(m.group(1))
            continue
        m = re.match(r"^\s*(\d+) -> '", ln.msg)
        if n_prompt is not None and len(used) < n_prompt and m and ln.level == "info":
            used.append(int(m.group(1)))
    if n_prompt is None or len(used) != n_prompt:
        raise LlamaCppPeerError("llama-completion did not list the prompt's tokens (--verbose-prompt)")
    printed = [ln for ln in lines if ln.level == "none"]
    if len(printed) < n_prompt + 1:
        raise LlamaCppPeerError(f"llama-completion printed {len(printed)} pieces for a prompt of {n_prompt} tokens")
    generated = printed[n_prompt:]
    # After the tokens: " [end of text]\n" when an end-of-generation token came, then "\n\n".
    if generated and generated[-1].msg == "\n\n":
        generated = generated[:-1]
    if generated and generated[-1].msg == " [end of text]\n":
        generated = generated[:-1]
    ids, unresolved = [], 0
    for ln in generated:
        tid, exact = vocab.lookup(ln.msg)
        ids.append(tid)
        unresolved += not exact
    if not ids:
        raise LlamaCppPeerError("llama-completion generated no token")
    if len(ids) > max_new_tokens:
        raise LlamaCppPeerError(
            f"llama-completion generated {len(ids)} tokens, more than the {max_new_tokens} asked for"
        )
    t_prompt = printed[n_prompt - 1].time_us
    times = [ln.time_us for ln in generated]
    return used, ids, unresolved, (times[0] - t_prompt) / 1e6, (times[-1] - times[0]) / 1e6, [1] * len(ids)


def read_speculative(
    lines: list[_Line], prompt_ids: list[int], max_new_tokens: int, vocab: PieceVocabulary, eos_ids: list[int]
) -> tuple[list[int], list[int], int, float, float, list[int], dict]:
    """Reads a ``llama-speculative-simple --log-jsonl --log-timestamps`` run: returns ``(prompt ids
    it used, new ids, unresolved, ttft_s, decode_s, emissions, reported)``.

    The program prints "\\n\\n", the prompt's pieces, the new tokens' pieces (an end-of-generation
    token not), "\\n\\n" when its loop ends, then its summary. It stops only once it has more than
    ``-n`` tokens and its last draft may overshoot by up to the draft length, so the output is cut
    at ``max_new_tokens`` tokens: the decode time then ends at the step that made the last one kept.
    Steps: the summary's ``n_predict - n_accept``; their boundaries are the largest gaps between
    the print times of consecutive tokens (a forward pass, against microseconds inside a step).

    Raises:
        LlamaCppPeerError: the output is not laid out as expected, llama.cpp tokenized the prompt
            differently, or its counts disagree with what it printed (quoted).
    """
    reported = _reported(lines, _SPECULATIVE_REPORTED)
    for key in ("encoded_tokens", "n_predict", "n_accept"):
        if key not in reported:
            raise LlamaCppPeerError(f"llama-speculative-simple printed no summary ({key} missing)")
    n_prompt = reported["encoded_tokens"]
    end = next(i for i, ln in enumerate(lines) if re.search(r"encoded\s+\d+ tokens", ln.msg))
    printed = [ln for ln in lines[:end] if ln.level == "none"]
    if len(printed) < n_prompt + 2 or printed[0].msg != "\n\n" or printed[-1].msg != "\n\n":
        raise LlamaCppPeerError(
            f"llama-speculative-simple printed {len(printed)} pieces around a prompt of {n_prompt} "
            "tokens, not the expected layout"
        )
    prompt_pieces, generated, loop_end = printed[1 : n_prompt + 1], printed[n_prompt + 1 : -1], printed[-1]
    used = []
    for i, ln in enumerate(prompt_pieces):
        tid, exact_piece = vocab.lookup(ln.msg)
        if not exact_piece and i < len(prompt_ids) and vocab.prints(prompt_ids[i]) == ln.msg:
            tid = prompt_ids[i]  # an ambiguous piece that the expected token prints: as far as can be told, it
        used.append(tid)
    ids, times, exact = [], [], []
    for ln in generated:
        tid, known = vocab.lookup(ln.msg)
        ids.append(tid)
        times.append(ln.time_us)
        exact.append(known)
    n_predict = reported["n_predict"]
    if n_predict == len(ids) + 1:  # the end-of-generation token: not printed; the loop ended right after it
        ids.append(eos_ids[0])
        times.append(loop_end.time_us)
        exact.append(False)
    elif n_predict != len(ids):
        raise LlamaCppPeerError(f"llama-speculative-simple counted {n_predict} new tokens but printed {len(ids)}")
    steps = n_predict - reported["n_accept"]
    if not ids or not 1 <= steps <= len(ids):
        raise LlamaCppPeerError(
            f"llama-speculative-simple made {len(ids)} tokens in {steps} steps "
            f"(n_predict {n_predict}, n_accept {reported['n_accept']})"
        )
    emissions = _split_steps(times, steps)
    keep = min(len(ids), max_new_tokens)
    unresolved = exact[:keep].count(False)
    kept, left = [], keep
    for n in emissions:
        if left <= 0:
            break
        kept.append(min(n, left))
        left -= n
    return (
        used,
        ids[:keep],
        unresolved,
        (times[0] - prompt_pieces[-1].time_us) / 1e6,
        (times[keep - 1] - times[0]) / 1e6,
        kept,
        reported,
    )


def _split_steps(times: list[int], steps: int) -> list[int]:
    """Tokens per step for ``steps`` steps: the ``steps - 1`` largest gaps between consecutive print
    times are the step boundaries (the earlier gap first among equal ones)."""
    gaps = sorted(range(1, len(times)), key=lambda i: (-(times[i] - times[i - 1]), i))[: steps - 1]
    bounds = [0] + sorted(gaps) + [len(times)]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def check_prompt(used: list[int], prompt_ids: list[int], program: str, decode) -> bool:
    """Whether llama.cpp's prompt tokens ``used`` differ from ``prompt_ids``: False when equal; True
    when they are another tokenization of the same text (``decode(used) == decode(prompt_ids)``:
    ids that are not the text's own tokenization, e.g. a prompt cut at a token boundary, which
    llama.cpp, taking text, cannot be given).

    Raises:
        LlamaCppPeerError: the two spell different texts (e.g. special tokens not parsed), naming
            the first differing position.
    """
    if used == list(prompt_ids):
        return False
    if decode(used) == decode(prompt_ids):
        return True
    pos = next((i for i, (a, b) in enumerate(zip(used, prompt_ids)) if a != b), min(len(used), len(prompt_ids)))
    raise LlamaCppPeerError(
        f"{program} tokenized the prompt into {len(used)} tokens, swiftspec into {len(prompt_ids)}; they differ at "
        f"position {pos} ({used[pos] if pos < len(used) else 'end'} vs "
        f"{prompt_ids[pos] if pos < len(prompt_ids) else 'end'}) and spell different texts: the two tokenizers "
        "disagree on this text"
    )


# ------------------------------------------------------------------------ the peer
def gguf_source(model: str | None, checkpoint: str | Path | None) -> Path:
    """The GGUF file llama.cpp runs for a bench model: the reference model's file for a reference
    name (:func:`swiftspec.fetch.fetch_model`), the file itself for a ``.gguf`` path, and for a
    checkpoint folder the GGUF it was converted from (its manifest's ``source``: the reference
    model with that sha256, else the recorded path if that file still has it).

    Raises:
        PeerUnavailableError: no model, or a model that does not come from a GGUF file (an HF
            folder), or whose GGUF is no longer there (named).
    """
    from swiftspec.errors import FetchError
    from swiftspec.fetch import REFERENCE_MODELS, fetch_model

    if model is None:
        raise PeerUnavailableError("the llama.cpp peer needs a model")
    try:
        if model in REFERENCE_MODELS:
            return fetch_model(model)
        path = Path(model).expanduser()
        if path.is_file() and path.suffix.lower() == ".gguf":
            return path
        folder = Path(checkpoint) if checkpoint is not None else path
        try:
            source = json.loads((folder / "manifest.json").read_text(encoding="utf-8")).get("source") or {}
        except (OSError, ValueError, AttributeError):
            source = {}
        if source.get("kind") != "gguf":
            raise PeerUnavailableError(
                f"llama.cpp runs GGUF files; {model} is not one and was not converted from one "
                "(give the GGUF file or a reference model name)"
            )
        for name, spec in REFERENCE_MODELS.items():
            if spec.sha256 == source.get("sha256"):
                return fetch_model(name)
        recorded = Path(str(source.get("path")))
        from swiftspec._wheels import sha256_file

        if recorded.is_file() and sha256_file(recorded) == source.get("sha256"):
            return recorded
        raise PeerUnavailableError(
            f"llama.cpp runs GGUF files; {folder} was converted from {recorded}, which is no "
            "longer there as it was (give the GGUF file instead)"
        )
    except FetchError as exc:
        raise PeerUnavailableError(f"the llama.cpp peer's GGUF file: {exc}") from None


def _clean_env() -> dict:
    """This process's environment without llama.cpp's LLAMA_ARG_* overrides (they would change
    the options given on the command line)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}


class LlamaCppPeer:
    """llama.cpp target-only (``llama-completion``) and speculative (``llama-speculative-simple``)
    greedy generation of the same GGUF files, on the CPU or a CUDA GPU (module docstring).

    Args:
        build: the llama.cpp build (:func:`swiftspec.bench.llamacpp_build.ensure_llamacpp`); its
            backend decides where the models run ("cuda": all layers on the GPU).
        target_gguf, draft_gguf: the GGUF files (the draft: None for target-only only).
        tokenizer: swiftspec's tokenizer of the target (renders prompt ids as text; its
            end-of-generation ids).
        threads: CPU threads of each model (0: the CPUs this process may use).

    Raises:
        PeerUnavailableError: a GGUF file is missing, or its vocabulary cannot be mapped.
    """

    def __init__(self, build, target_gguf: str | Path, draft_gguf: str | Path | None, tokenizer, threads: int = 0):
        for what, path in (("target", target_gguf), ("draft", draft_gguf)):
            if path is not None and not Path(path).is_file():
                raise PeerUnavailableError(f"the llama.cpp peer's {what} GGUF {path} does not exist")
        self.build = build
        self.target_gguf = Path(target_gguf)
        self.draft_gguf = Path(draft_gguf) if draft_gguf is not None else None
        self.tokenizer = tokenizer
        self.threads = threads if threads > 0 else len(os.sched_getaffinity(0))
        try:
            self.vocab = PieceVocabulary(self.target_gguf)
        except LlamaCppPeerError as exc:
            raise PeerUnavailableError(str(exc)) from None
        self.unresolved = {"target": 0, "assisted": 0}
        self.retokenized = {"target": 0, "assisted": 0}
        self.n_draft: int | None = None

    def _device_args(self, assisted: bool) -> list[str]:
        args = ["-t", str(self.threads), "-fa", "on"] + (["-td", str(self.threads)] if assisted else [])
        if self.build.backend == "cuda":  # (a CPU build warns about -ngl: not given there)
            args += ["-ngl", "99"] + (["-ngld", "99"] if assisted else [])
        return args

    def command(self, prompt_file: Path, n_prompt: int, max_new_tokens: int, assisted: bool) -> list[str]:
        """The command line of one request (the prompt's text in ``prompt_file``, plus the one line
        end that ``-f`` drops). Greedy: ``--temp 0`` keeps only the most likely token."""
        ctx = n_prompt + max_new_tokens + CONTEXT_MARGIN
        common = [
            "-m",
            str(self.target_gguf),
            "-f",
            str(prompt_file),
            "--no-escape",
            "--temp",
            "0",
            "--seed",
            "0",
            "-c",
            str(ctx),
            "-b",
            str(max(2048, n_prompt)),
            "--log-jsonl",
            "--log-timestamps",
            "--log-colors",
            "off",
        ]
        if assisted:
            if self.draft_gguf is None:
                raise PeerUnavailableError("llamacpp:assisted needs a draft model")
            # it stops once it has more than -n tokens, its last draft overshooting by up to the draft length:
            # read_speculative cuts the output at max_new_tokens
            return [
                str(self.build.binary("llama-speculative-simple")),
                *common,
                "-md",
                str(self.draft_gguf),
                "--spec-type",
                "draft-simple",
                "-n",
                str(max_new_tokens - 1),
                *self._device_args(True),
            ]
        return [
            str(self.build.binary("llama-completion")),
            *common,
            "-n",
            str(max_new_tokens),
            "-no-cnv",
            "-sp",
            "--color",
            "off",
            "--verbose-prompt",
            *self._device_args(False),
        ]

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, assisted: bool, timeout_s: float | None = None
    ) -> LlamaCppResult:
        """Greedy generation of at most ``max_new_tokens`` tokens after ``prompt_ids`` (stopping
        after an end-of-generation token, included), target-only or with the draft.

        Raises:
            PeerUnavailableError: ``assisted`` without a draft; ``max_new_tokens`` < 2 for the
                speculative program (it always makes at least 2 tokens once it runs).
            LlamaCppPeerError: llama.cpp failed (its last lines quoted), made another text of the
                prompt (:func:`check_prompt`), or printed what this module cannot read.
        """
        if assisted and max_new_tokens < 2:
            raise PeerUnavailableError("llamacpp:assisted needs max_new_tokens >= 2")
        text = self.tokenizer.decode(prompt_ids)
        with tempfile.TemporaryDirectory(prefix="swiftspec-llamacpp-") as tmp:
            prompt_file = Path(tmp) / "prompt.txt"
            prompt_file.write_bytes(text.encode("utf-8") + b"\n")  # -f drops one final line end
            cmd = self.command(prompt_file, len(prompt_ids), max_new_tokens, assisted)
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(
                    cmd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=_clean_env(),
                    timeout=timeout_s,
                    stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                raise LlamaCppPeerError(f"{Path(cmd[0]).name} did not finish within {timeout_s} s") from None
            wall = time.perf_counter() - t0
        stdout = proc.stdout.decode("utf-8", errors="replace")
        stderr = proc.stderr.decode("utf-8", errors="replace")
        lines = parse_log(stdout)
        name = Path(cmd[0]).name
        if proc.returncode != 0:
            raise LlamaCppPeerError(f"{name} failed (exit code {proc.returncode}): {_tail_text(lines, stderr)}")
        eos = self.tokenizer.eos_token_ids
        try:
            if assisted:
                used, ids, unresolved, ttft, decode, emissions, reported = read_speculative(
                    lines, prompt_ids, max_new_tokens, self.vocab, eos
                )
                self.n_draft = reported.get("n_draft", self.n_draft)
            else:
                used, ids, unresolved, ttft, decode, emissions = read_completion(
                    lines, prompt_ids, max_new_tokens, self.vocab
                )
                reported = _reported(lines, _COMPLETION_REPORTED)
            if check_prompt(used, prompt_ids, name, self.tokenizer.decode):
                self.retokenized["assisted" if assisted else "target"] += 1
        except LlamaCppPeerError as exc:
            raise LlamaCppPeerError(f"{exc} ({name}; its last lines: {_tail_text(lines, stderr, 6)})") from None
        self.unresolved["assisted" if assisted else "target"] += unresolved
        return LlamaCppResult(
            token_ids=ids,
            ttft_s=ttft,
            decode_s=decode,
            wall_s=wall,
            emissions=emissions,
            prompt_ids=used,
            unresolved=unresolved,
            reported=reported,
        )

    def settings(self) -> dict:
        """What bench.json records about the peer (``settings.llamacpp.<backend>``)."""
        return {
            "llama_cpp_python": self.build.info.get("llama_cpp_python"),
            "backend": self.build.backend,
            "build": {k: self.build.info.get(k) for k in ("key", "cmake_args", "ggml_commit", "build_seconds")},
            "target_gguf": str(self.target_gguf),
            "draft_gguf": str(self.draft_gguf) if self.draft_gguf else None,
            "weights": "the GGUF files as stored (quantized), not the run's dtype",
            "programs": {"target": "llama-completion", "assisted": "llama-speculative-simple --spec-type draft-simple"},
            "draft_n_max": self.n_draft,
            "threads": self.threads,
            "gpu_layers": 99 if self.build.backend == "cuda" else 0,
            "flash_attention": "on",
            "timing": "llama.cpp's log timestamps (--log-jsonl --log-timestamps, microseconds): TTFT from the last "
            "echoed prompt token to the first new token, decode from the first to the last new token",
            "unresolved_pieces": dict(self.unresolved),
            "prompts_retokenized": dict(self.retokenized),
        }


# ------------------------------------------------------------- llama-bench at depth
#: The long-context recipe of issue 27: decode (128 tokens) after a context of these depths,
#: and prefill of prompts of these lengths.
DECODE_DEPTHS = (0, 4096, 16384, 32768)
PREFILL_TOKENS = (512, 4096, 16384)


def _ints(name: str, values, low: int) -> list[int]:
    out = list(values)
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in out):
        raise LlamaCppPeerError(f"{name} must be a non-empty list of integers >= {low}, got {values!r}")
    return out


def run_llama_bench(build, model_gguf: str | Path, args: list[str], timeout_s: float | None = None) -> list[dict]:
    """Runs ``llama-bench -m MODEL ARGS -o json`` and returns its JSON records (one per test).

    Raises:
        LlamaCppPeerError: llama-bench failed or timed out (its last lines quoted), or printed no
            JSON list.
    """
    cmd = [str(build.binary("llama-bench")), "-m", str(model_gguf), *args, "-o", "json"]
    try:
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=_clean_env(),
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise LlamaCppPeerError(f"llama-bench {' '.join(args)} did not finish within {timeout_s} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr.strip().splitlines() + proc.stdout.strip().splitlines())[-8:])
        raise LlamaCppPeerError(f"llama-bench {' '.join(args)} failed (exit code {proc.returncode}):\n{tail}")
    start = proc.stdout.find("[")
    try:
        records = json.loads(proc.stdout[start:]) if start >= 0 else None
    except ValueError:
        records = None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise LlamaCppPeerError(f"llama-bench {' '.join(args)} printed no JSON list of results: {proc.stdout[:300]!r}")
    return records


def long_context_bench(
    build,
    model_gguf: str | Path,
    *,
    decode_depths=DECODE_DEPTHS,
    n_gen: int = 128,
    prefill_tokens=PREFILL_TOKENS,
    threads: int = 0,
    repetitions: int = 5,
    timeout_s: float | None = None,
) -> dict:
    """llama.cpp's decode speed at depth and prefill speed (issue 27's recipe): ``llama-bench -p 0
    -n N_GEN -d DEPTHS`` and ``llama-bench -p PREFILL -n 0``, with all layers on the GPU of a cuda
    build (``-ngl 99``) and flash attention on (``-fa 1``).

    Args:
        build: a :class:`~swiftspec.bench.llamacpp_build.LlamaCppBuild`.
        model_gguf: the GGUF file (e.g. the reference target, Q4_K_M).
        decode_depths: context tokens already in the KV cache before the decode test.
        n_gen: tokens generated per decode test.
        prefill_tokens: prompt lengths of the prefill tests (empty: none).
        threads: CPU threads (0: llama-bench's default).
        repetitions: llama-bench ``-r`` (mean and standard deviation over them).
        timeout_s: limit per llama-bench run, seconds.

    Returns:
        ``{"kind": "llamacpp-long-context", "model", "build", "decode": [{"depth", "n_gen", "tok_s",
        "stddev_tok_s"}], "prefill": [{"n_prompt", "tok_s", "stddev_tok_s"}], "machine": {...},
        "raw": [llama-bench's records]}``; tok/s are llama-bench's ``avg_ts`` / ``stddev_ts``
        (tokens per second of the test: generated tokens over the decode time, prompt tokens over
        the prefill time).

    Raises:
        LlamaCppPeerError: bad arguments (named), or llama-bench failed (:func:`run_llama_bench`).
    """
    decode_depths = _ints("decode_depths", decode_depths, 0)
    prefill_tokens = list(prefill_tokens)
    if prefill_tokens:
        prefill_tokens = _ints("prefill_tokens", prefill_tokens, 1)
    for name, value, low in (("n_gen", n_gen, 1), ("threads", threads, 0), ("repetitions", repetitions, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise LlamaCppPeerError(f"{name} must be an integer >= {low}, got {value!r}")
    if not Path(model_gguf).is_file():
        raise LlamaCppPeerError(f"{model_gguf}: no such GGUF file")
    device = ["-ngl", "99" if build.backend == "cuda" else "0", "-fa", "1", "-r", str(repetitions)]
    if threads:
        device += ["-t", str(threads)]
    join = lambda xs: ",".join(map(str, xs))  # noqa: E731
    raw = run_llama_bench(
        build, model_gguf, ["-p", "0", "-n", str(n_gen), "-d", join(decode_depths), *device], timeout_s
    )
    if prefill_tokens:
        raw += run_llama_bench(build, model_gguf, ["-p", join(prefill_tokens), "-n", "0", *device], timeout_s)
    decode = [
        {"depth": r["n_depth"], "n_gen": r["n_gen"], "tok_s": r["avg_ts"], "stddev_tok_s": r["stddev_ts"]}
        for r in raw
        if r.get("n_gen", 0) > 0
    ]
    prefill = [
        {"n_prompt": r["n_prompt"], "depth": r["n_depth"], "tok_s": r["avg_ts"], "stddev_tok_s": r["stddev_ts"]}
        for r in raw
        if r.get("n_gen", 0) == 0 and r.get("n_prompt", 0) > 0
    ]
    if [d["depth"] for d in decode] != decode_depths or [p["n_prompt"] for p in prefill] != prefill_tokens:
        raise LlamaCppPeerError(
            f"llama-bench reported other tests than asked for: decode depths "
            f"{[d['depth'] for d in decode]}, prefill {[p['n_prompt'] for p in prefill]}"
        )
    first = raw[0]
    return {
        "kind": "llamacpp-long-context",
        "model": {
            "gguf": str(model_gguf),
            "type": first.get("model_type"),
            "size_bytes": first.get("model_size"),
            "n_params": first.get("model_n_params"),
        },
        "build": {k: build.info.get(k) for k in ("llama_cpp_python", "backend", "key", "ggml_commit", "cmake_args")},
        "settings": {
            "n_gpu_layers": first.get("n_gpu_layers"),
            "flash_attn": first.get("flash_attn"),
            "n_threads": first.get("n_threads"),
            "n_batch": first.get("n_batch"),
            "n_ubatch": first.get("n_ubatch"),
            "type_k": first.get("type_k"),
            "type_v": first.get("type_v"),
            "repetitions": repetitions,
            "backends": first.get("backends"),
        },
        "machine": {"cpu_info": first.get("cpu_info"), "gpu_info": first.get("gpu_info")},
        "decode": decode,
        "prefill": prefill,
        "raw": raw,
    }


def long_context_markdown(result: dict) -> str:
    """A Markdown table of :func:`long_context_bench`'s result."""
    m, s = result["model"], result["settings"]
    lines = [
        f"llama.cpp `llama-bench` ({result['build']['llama_cpp_python'] and 'llama-cpp-python ' + result['build']['llama_cpp_python']}"
        f", {result['build']['backend']}, ggml {result['build'].get('ggml_commit')}) on {m['type']} "
        f"(`{Path(m['gguf']).name}`); GPU: {result['machine']['gpu_info'] or 'none'}; CPU: "
        f"{result['machine']['cpu_info']}; -ngl {s['n_gpu_layers']}, flash attention {s['flash_attn']}, "
        f"{s['n_threads']} threads, {s['repetitions']} repetitions (mean ± standard deviation)",
        "",
        "| test | context before (depth) | tokens | tok/s |",
        "|---|---|---|---|",
    ]
    for d in result["decode"]:
        lines.append(f"| decode | {d['depth']} | {d['n_gen']} | {d['tok_s']:.1f} ± {d['stddev_tok_s']:.1f} |")
    for p in result["prefill"]:
        lines.append(f"| prefill | {p['depth']} | {p['n_prompt']} | {p['tok_s']:.1f} ± {p['stddev_tok_s']:.1f} |")
    return "\n".join(lines) + "\n"
