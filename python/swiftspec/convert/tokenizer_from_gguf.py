"""Building ``tokenizer.json`` / ``tokenizer_config.json`` from a GGUF file's tokenizer metadata.

A GGUF stores its tokenizer as metadata: ``tokenizer.ggml.model`` (the algorithm), ``.pre``
(the pre-tokenizer, i.e. how text is split before BPE), ``.tokens``, ``.token_type``,
``.merges``, special token ids and ``tokenizer.chat_template``. We rebuild an equivalent
Hugging Face ``tokenizers`` tokenizer:

* model ``gpt2`` -> byte-level BPE: the tokens (already spelled in the GPT-2 byte alphabet) and
  merges as given, no unknown token, a ByteLevel decoder, no normalizer. (The original Qwen2
  ``tokenizer.json`` applies NFC normalization; llama.cpp and HF's own GGUF loader do not, and
  neither do we, so ids equal HF-from-GGUF exactly; the two differ only on non-NFC input.)
* token types CONTROL (3) become special added tokens (``<|im_end|>`` ...), USER_DEFINED (4)
  plain added tokens (``<tool_call>``), both matched whole in the input, not normalized.
* ``tokenizer.ggml.pre`` picks the split rule, the same rule llama.cpp applies for that value:

  - ``qwen2``, ``deepseek-r1-qwen``: the Qwen2 regex (single digits, letters with one
    leading non-letter, ...), then byte-level mapping without GPT-2's regex.
  - ``llama-bpe`` (Llama-3): the Llama-3 regex (digits in groups of up to 3); BPE with
    ``ignore_merges`` (a whole pre-token that is in the vocabulary is one token), as Llama-3's
    own tokenizer.json and llama.cpp do.
  - ``smollm``: every digit on its own, then the GPT-2 regex (SmolLM2's own tokenizer.json and
    llama.cpp's rule for this value).
  - ``gpt2``: the GPT-2 regex.

  Any other value raises :class:`CheckpointError` naming it: guessing a split rule would give
  silently wrong ids.
* ``add_bos_token`` / ``add_eos_token`` from ``tokenizer.ggml.add_{bos,eos}_token`` (absent ->
  false, as for byte-level BPE in HF) become a template post-processor, applied when a caller
  encodes with ``add_special_tokens=True``.

End-of-generation ids (:func:`end_token_ids`): ``tokenizer.ggml.eos_token_id``, then
``eot_token_id`` / ``eom_token_id`` when present, then every CONTROL token of the vocabulary
whose text is a known end marker (``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``,
``<|eom_id|>``, ``<|end_of_text|>``, ``<|end|>``, ``<｜end▁of▁sentence｜>``). For the Qwen2.5
instruct GGUFs this gives ``[151645 <|im_end|>, 151643 <|endoftext|>]``, the same pair as
Qwen's own generation_config.json; for SmolLM2 ``[2 <|im_end|>, 0 <|endoftext|>]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import CheckpointError
from .gguf_file import GGUFModelFile

# gguf.TokenType values
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_END_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)


@dataclass(frozen=True)
class _PreTokenizerRule:
    kind: str  # "split_regex" | "bytelevel_regex" | "digits_then_bytelevel"
    regex: str | None = None
    ignore_merges: bool = False


#: tokenizer.ggml.pre value -> how to split text before BPE
PRE_TOKENIZER_RULES: dict[str, _PreTokenizerRule] = {
    "qwen2": _PreTokenizerRule("split_regex", _QWEN2_SPLIT),
    "deepseek-r1-qwen": _PreTokenizerRule("split_regex", _QWEN2_SPLIT),
    "llama-bpe": _PreTokenizerRule("split_regex", _LLAMA3_SPLIT, ignore_merges=True),
    "smollm": _PreTokenizerRule("digits_then_bytelevel"),
    "gpt2": _PreTokenizerRule("bytelevel_regex"),
}


@lru_cache(maxsize=1)
def byte_alphabet() -> tuple[str, ...]:
    """The GPT-2 byte-level alphabet: ``byte_alphabet()[b]`` is the character standing for byte ``b``.

    Printable Latin-1 bytes (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for themselves; the
    other 68 bytes, in increasing order, take the code points 256, 257, ... (so space, 0x20, is
    ``Ġ`` U+0120).
    """
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return tuple(chars)


@dataclass(frozen=True)
class GGUFTokenizerInfo:
    """What the converter needs to know about the tokenizer besides the files it writes."""

    tokens: list[str]
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    unk_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    chat_template: str | None


def read_tokenizer_info(g: GGUFModelFile) -> GGUFTokenizerInfo:
    """Read and check the tokenizer metadata of ``g``. Raises :class:`CheckpointError` naming the field."""
    model = g.require("tokenizer.ggml.model", str)
    if model != "gpt2":
        raise CheckpointError(f"{g.path}: tokenizer.ggml.model is {model!r}; only 'gpt2' (byte-level BPE) is supported")
    tokens = g.require("tokenizer.ggml.tokens", list)
    types = g.get("tokenizer.ggml.token_type")
    if types is not None and len(types) != len(tokens):
        raise CheckpointError(f"{g.path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")

    def token_id(key: str) -> int | None:
        value = g.get(key)
        if value is None:
            return None
        if not isinstance(value, int) or not 0 <= value < len(tokens):
            raise CheckpointError(f"{g.path}: {key} is {value!r}, not a token id below {len(tokens)}")
        return value

    eos = token_id("tokenizer.ggml.eos_token_id")
    if eos is None:
        raise CheckpointError(f"{g.path}: required metadata field 'tokenizer.ggml.eos_token_id' is missing")
    return GGUFTokenizerInfo(
        tokens=tokens,
        bos_token_id=token_id("tokenizer.ggml.bos_token_id"),
        eos_token_ids=end_token_ids(g, tokens, types),
        pad_token_id=token_id("tokenizer.ggml.padding_token_id"),
        unk_token_id=token_id("tokenizer.ggml.unknown_token_id"),
        add_bos_token=bool(g.get("tokenizer.ggml.add_bos_token", False)),
        add_eos_token=bool(g.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=g.get("tokenizer.chat_template"),
    )


def end_token_ids(g: GGUFModelFile, tokens: list[str], types: list[int] | None) -> list[int]:
    """Token ids that end generation (see the module docstring for the rule), primary eos first."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = g.get(key)
        if isinstance(value, int) and 0 <= value < len(tokens):
            ids.append(value)
    if types is not None:
        control = {tok: i for i, (tok, t) in enumerate(zip(tokens, types)) if t == _CONTROL}
        ids.extend(control[m] for m in _END_MARKERS if m in control)
    return list(dict.fromkeys(ids))


def build_tokenizer(g: GGUFModelFile, info: GGUFTokenizerInfo):
    """A ``tokenizers.Tokenizer`` equivalent to the GGUF's tokenizer (rules in the module docstring).

    Raises :class:`CheckpointError` for an unknown ``tokenizer.ggml.pre``, malformed merges,
    duplicate tokens, or a vocabulary the built tokenizer does not reproduce id for id.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    pre = g.get("tokenizer.ggml.pre", "gpt2")
    rule = PRE_TOKENIZER_RULES.get(pre)
    if rule is None:
        raise CheckpointError(
            f"{g.path}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer swiftspec does not know; "
            f"supported: {', '.join(sorted(PRE_TOKENIZER_RULES))}"
        )

    tokens = info.tokens
    types = g.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    alphabet = byte_alphabet()
    in_alphabet = set(alphabet)
    vocab: dict[str, int] = {}
    for i, (tok, kind) in enumerate(zip(tokens, types)):
        # A normal token is spelled in the byte alphabet; one that is not (a writer bug in some
        # files) is respelled from its UTF-8 bytes. Added tokens keep their text: they are
        # matched in raw input and must map back to their own id.
        if kind not in (_CONTROL, _USER_DEFINED) and not set(tok) <= in_alphabet:
            tok = "".join(alphabet[b] for b in tok.encode("utf-8"))
        if tok in vocab:
            raise CheckpointError(f"{g.path}: tokenizer.ggml.tokens holds {tok!r} twice (ids {vocab[tok]} and {i})")
        vocab[tok] = i

    merges = []
    for i, m in enumerate(g.get("tokenizer.ggml.merges") or []):
        parts = m.split(" ")
        if len(parts) != 2:
            raise CheckpointError(f"{g.path}: tokenizer.ggml.merges entry {m!r} is not two tokens separated by a space")
        # The BPE model needs both parts and their concatenation in the vocabulary (the tokenizers
        # library raised a bare Exception "Token `e` out of vocabulary" for a fuzzed GGUF).
        for part in (parts[0], parts[1], parts[0] + parts[1]):
            if part not in vocab:
                raise CheckpointError(
                    f"{g.path}: tokenizer.ggml.merges entry {i} ({m!r}) needs the token {part!r}, "
                    "which tokenizer.ggml.tokens does not hold"
                )
        merges.append((parts[0], parts[1]))

    try:
        tk = Tokenizer(
            BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                unk_token=None,
                fuse_unk=False,
                byte_fallback=False,
                ignore_merges=rule.ignore_merges,
            )
        )
    except Exception as exc:  # the library's own checks, past the ones above
        raise CheckpointError(f"{g.path}: tokenizer.ggml.tokens / merges do not make a BPE tokenizer: {exc}") from None
    tk.normalizer = None
    if rule.kind == "split_regex":
        assert rule.regex is not None  # (a split_regex rule has one)
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(rule.regex), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    elif rule.kind == "digits_then_bytelevel":
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True),
            ]
        )
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()

    named = {i for i in (info.bos_token_id, info.unk_token_id, info.pad_token_id) if i is not None}
    named.update(info.eos_token_ids)
    special = [
        AddedToken(tokens[i], special=True, normalized=False)
        for i, t in enumerate(types)
        if t == _CONTROL or i in named
    ]
    plain = [
        AddedToken(tokens[i], special=False, normalized=False)
        for i, t in enumerate(types)
        if t == _USER_DEFINED and i not in named
    ]
    tk.add_special_tokens(special)
    tk.add_tokens(plain)

    bos = tokens[info.bos_token_id] if info.add_bos_token and info.bos_token_id is not None else None
    eos = tokens[info.eos_token_ids[0]] if info.add_eos_token else None
    if bos is not None or eos is not None:

        def wrap(seq: str, type_id: int) -> list[str]:
            return ([f"{bos}:{type_id}"] if bos else []) + [f"{seq}:{type_id}"] + ([f"{eos}:{type_id}"] if eos else [])

        used = [(bos, info.bos_token_id)] if bos else []
        used += [(eos, info.eos_token_ids[0])] if eos else []
        tk.post_processor = processors.TemplateProcessing(
            single=wrap("$A", 0), pair=wrap("$A", 0) + wrap("$B", 1), special_tokens=used
        )

    if tk.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise CheckpointError(
            f"{g.path}: the rebuilt tokenizer has {tk.get_vocab_size(with_added_tokens=True)} ids, "
            f"the GGUF lists {len(tokens)} tokens"
        )
    for t in special + plain:
        if tk.token_to_id(t.content) != vocab.get(t.content):
            raise CheckpointError(f"{g.path}: added token {t.content!r} did not keep its id")
    return tk


def tokenizer_config(info: GGUFTokenizerInfo, model_max_length: int) -> dict:
    """The ``tokenizer_config.json`` dict (HF keys) for ``info``."""

    def text(i: int | None) -> str | None:
        return info.tokens[i] if i is not None else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(info.bos_token_id),
        "eos_token": text(info.eos_token_ids[0]),
        "pad_token": text(info.pad_token_id),
        "unk_token": text(info.unk_token_id),
        "add_bos_token": info.add_bos_token,
        "add_eos_token": info.add_eos_token,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    if info.chat_template is not None:
        config["chat_template"] = info.chat_template
    return config
