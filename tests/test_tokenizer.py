"""Our tokenizer (built from GGUF metadata by the converter) against HF transformers' tokenizer
loaded from the same GGUF file, on every MT-Bench turn and every HumanEval prompt."""

from __future__ import annotations

import pytest

from swiftspec.datasets import prompt_messages
from swiftspec.errors import InvalidRequestError
from swiftspec.tokenizer import StreamDecoder, Tokenizer

QWEN_05 = "qwen2.5-coder-0.5b-instruct"
QWEN_15 = "qwen2.5-coder-1.5b-instruct"
SMOL = "smollm2-135m-instruct"

EDGE_TEXTS = [
    "",
    " ",
    "a",
    "Hello 123 world  \n\n x",
    "1234567 12 3.14159 -0.5e10",
    " leading space",
    "trailing  ",
    "\t\ttabs\r\nwindows\rmac",
    "naïve café 你好世界 😀🎉 ﬁ Ünïcödé ḽơᶉëᶆ",
    "don't I'LL we've THEY'RE",
    "<|im_end|> inside <tool_call> text <|endoftext|>",
    "a" * 300,
    "  \n  \n\n   x\n",
    "```python\nx = 1\n```",
]


def hf_tokenizer(gguf_path, name):
    from transformers import AutoTokenizer

    path = gguf_path(name)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def hf_chat_ids(hf, messages, **kwargs):
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def qwen(checkpoint_dir):
    return Tokenizer.from_checkpoint(checkpoint_dir(QWEN_05, "bfloat16"))


@pytest.fixture(scope="module")
def hf_qwen(gguf_path):
    return hf_tokenizer(gguf_path, QWEN_05)


@pytest.fixture(scope="module")
def texts(mtbench, humaneval):
    out = [t for r in mtbench for t in r["turns"]] + [r["prompt"] for r in humaneval]
    assert len(out) == 80 * 2 + 164
    return out


@pytest.fixture(scope="module")
def chats(mtbench, humaneval):
    out = [prompt_messages("mtbench", r, turn) for r in mtbench for turn in (0, 1)]
    out += [prompt_messages("humaneval", r) for r in humaneval]
    assert len(out) == 80 * 2 + 164
    return out


# --------------------------------------------------------------------------- Qwen (draft + target)


def test_qwen_ids_equal_hf_for_every_prompt(qwen, hf_qwen, texts):
    for text in texts + EDGE_TEXTS:
        ids = qwen.encode(text)
        assert ids == hf_qwen.encode(text, add_special_tokens=False), text[:80]
        assert qwen.decode(ids) == text
    assert qwen.encode(texts[0], add_special_tokens=True) == qwen.encode(texts[0])  # add_bos_token is false


def test_qwen_chat_template_equals_hf_for_every_prompt(qwen, hf_qwen, chats):
    for messages in chats:
        text = qwen.apply_chat_template(messages)
        assert text == hf_qwen.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = qwen.encode_chat(messages)
        assert ids == hf_chat_ids(hf_qwen, messages)
        assert qwen.decode(ids) == text
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    assert text.endswith("```<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_multi_turn_and_tools_equal_hf(qwen, hf_qwen, mtbench):
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": mtbench[0]["turns"][0]},
        {"role": "assistant", "content": "Aloha! <b>Hawaii</b> & more."},
        {"role": "user", "content": mtbench[0]["turns"][1]},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city, «quoted» & <escaped>?",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    for kwargs in ({}, {"tools": tools}):
        for add in (True, False):
            ours = qwen.apply_chat_template(conversation, add_generation_prompt=add, **kwargs)
            ref = hf_qwen.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add, **kwargs)
            assert ours == ref
    assert '"description": "Weather in a city, «quoted» & <escaped>?"' in ours  # tojson: no HTML escaping


def test_qwen_15b_shares_the_tokenizer_and_its_template_equals_hf(checkpoint_dir, gguf_path, qwen, chats):
    folder = checkpoint_dir(QWEN_15, "float32")
    small = checkpoint_dir(QWEN_05, "bfloat16")
    assert (folder / "tokenizer.json").read_bytes() == (small / "tokenizer.json").read_bytes()
    target = Tokenizer.from_checkpoint(folder)
    hf = hf_tokenizer(gguf_path, QWEN_15)
    for messages in chats:
        assert target.apply_chat_template(messages) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    # the two GGUF templates differ only in their tool-call instructions ("{" vs "{{"); both match HF
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    ours = target.apply_chat_template(chats[0], tools=tools)
    assert ours == hf.apply_chat_template(chats[0], tools=tools, tokenize=False, add_generation_prompt=True)
    assert ours != qwen.apply_chat_template(chats[0], tools=tools)
    assert target.eos_token_ids == qwen.eos_token_ids == [151645, 151643]


def test_qwen_special_tokens(qwen):
    assert qwen.eos_token_ids == [151645, 151643]
    assert qwen.bos_token_id == 151643
    assert qwen.vocab_size == 151936
    assert qwen.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert qwen.decode([151644, 872, 198, 6023, 151645], skip_special_tokens=True) == "user\nhi"
    assert qwen.encode("<tool_call>") == [151657]  # a user-defined added token: whole, but not special
    assert qwen.decode([151657, 151645], skip_special_tokens=True) == "<tool_call>"


# --------------------------------------------------------------------------- SmolLM2 (llama arch)


@pytest.fixture(scope="module")
def smol(checkpoint_dir):
    return Tokenizer.from_checkpoint(checkpoint_dir(SMOL, "bfloat16"))


@pytest.fixture(scope="module")
def hf_smol(gguf_path):
    return hf_tokenizer(gguf_path, SMOL)


def test_smollm2_follows_the_smollm_split_rule(smol, hf_smol):
    """tokenizer.ggml.pre = "smollm": llama.cpp (and SmolLM2's own tokenizer.json) split every digit
    off before the GPT-2 regex. HF's GGUF loader does not know this value and uses the plain GPT-2
    regex, so the two differ where whitespace precedes a digit; we follow the model's rule."""
    text = "x = (\n    0.5)"
    ours = [smol.id_to_token(i) for i in smol.encode(text)]
    theirs = hf_smol.convert_ids_to_tokens(hf_smol.encode(text, add_special_tokens=False))
    assert ours == ["x", "Ġ=", "Ġ(", "ĊĠĠĠĠ", "0", ".", "5", ")"]
    assert theirs == ["x", "Ġ=", "Ġ(", "ĊĠĠĠ", "Ġ", "0", ".", "5", ")"]


def test_smollm2_ids_equal_hf_with_the_smollm_rule(smol, hf_smol, texts, chats):
    """Same vocabulary, merges and special tokens as HF: with HF's tokenizer given the smollm split
    rule, ids agree on every prompt and every chat."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import pre_tokenizers

    reference = Backend.from_str(hf_smol.backend_tokenizer.to_str())  # a copy; the fixture stays as loaded
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    for text in texts + EDGE_TEXTS:
        ids = smol.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False).ids, text[:80]
        assert smol.decode(ids) == text
    for messages in chats:
        text = smol.apply_chat_template(messages)
        assert text == hf_smol.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert smol.encode_chat(messages) == reference.encode(text, add_special_tokens=False).ids
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert smol.eos_token_ids == [2, 0] and smol.bos_token_id == 1


# --------------------------------------------------------------------------- streaming


def test_stream_decoder_matches_decode(qwen, chats):
    multibyte = "😀 🎉 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 你好世界 ḽơᶉëᶆ 🦜🦜"
    ids = qwen.encode(multibyte)
    assert any("\ufffd" in qwen.decode([i]) for i in ids)  # some tokens hold partial characters
    streams = [ids] + [qwen.encode_chat(m) for m in chats[::16]]
    for ids in streams:
        decoder = qwen.stream_decoder()
        pieces = [decoder.push(i) for i in ids] + [decoder.flush()]
        assert "".join(pieces) == decoder.text == qwen.decode(ids)
        assert not any("\ufffd" in p for p in pieces)
    decoder = StreamDecoder(qwen, skip_special_tokens=True)
    ids = qwen.encode("<|im_start|>assistant\n🦜 ok<|im_end|>")
    assert "".join(decoder.push(i) for i in ids) + decoder.flush() == "assistant\n🦜 ok"


def test_stream_decoder_holds_back_incomplete_utf8(qwen):
    ids = qwen.encode("🦜")
    assert len(ids) == 2 and qwen.decode(ids[:1]) == "\ufffd"
    decoder = qwen.stream_decoder()
    assert decoder.push(ids[0]) == ""
    assert decoder.push(ids[1]) == "🦜"
    assert decoder.push(ids[:1]) == ""
    assert decoder.flush() == "\ufffd"  # a stream that ends mid-character shows the replacement char


class _FullRedecodeStream:
    """TextStream as it was before it became incremental (commit 05867e2): the whole output
    re-decoded on every push. It defines the behaviour the incremental one must reproduce."""

    def __init__(self, tokenizer, stop=()):
        self._tokenizer, self._stop, self._ids = tokenizer, list(stop), []
        self._emitted, self.text, self.stopped = 0, "", False

    def push(self, ids):
        if self.stopped:
            return ""
        self._ids.extend(int(t) for t in ids)
        full = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        for s in self._stop:
            cut = full.find(s)
            if cut != -1:
                self.stopped = True
                full = full[:cut]
        safe = len(full)
        if not self.stopped:
            while safe > 0 and full[safe - 1] == "\ufffd":
                safe -= 1
            for s in self._stop:
                for k in range(min(len(s) - 1, safe), 0, -1):
                    if full[safe - k : safe] == s[:k]:
                        safe -= k
                        break
        safe = max(safe, self._emitted)
        delta = full[self._emitted : safe]
        self._emitted = safe
        self.text = full[:safe]
        return delta

    def finish(self):
        if self.stopped:
            return ""
        full = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        delta = full[self._emitted :]
        self._emitted = len(full)
        self.text = full
        return delta


def _byte_token_ids(tok) -> list[int]:
    """The id of the one-byte token of each byte value 0..255 (byte-level BPE spells byte b as the
    character GPT-2's bytes_to_unicode maps it to)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return [tok.token_to_id(spelling[b]) for b in range(256)]


def _assert_streams_agree(tok, chunks, stops):
    """Pushes ``chunks`` (lists of ids) through TextStream and the full re-decoding reference with
    ``stops``; every push's piece, the text so far, stopped, and the final flush must be equal."""
    from swiftspec.text_stream import TextStream

    new, old = TextStream(tok, stops), _FullRedecodeStream(tok, stops)
    for i, chunk in enumerate(chunks):
        got, want = new.push(chunk), old.push(chunk)
        assert (got, new.stopped, new.text) == (want, old.stopped, old.text), (i, chunks, stops)
    assert new.finish() == old.finish() and new.text == old.text, (chunks, stops)
    return old


def test_text_stream_equals_full_redecoding_on_real_text(qwen, mtbench, humaneval):
    """Real text as the models write it (HumanEval solutions, MT-Bench turns and references, multi-byte
    text whose characters Qwen's tokens split), pushed 1-4 tokens at a time, with stop strings cut out of
    its own text across token boundaries: the incremental stream hands out exactly what re-decoding the
    whole output gave, piece by piece, and stops at the same token."""
    import random

    rng = random.Random(27)
    texts = [r["prompt"] + r["canonical_solution"] for r in humaneval[::4]]
    texts += [t for r in mtbench[::4] for t in r["turns"]] + [r["reference"][0] for r in mtbench if r.get("reference")]
    texts += ["😀 🎉 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 你好世界 ḽơᶉëᶆ 🦜🦜 naïve café " * 3, "<|im_start|>assistant\n🦜 ok<|im_end|> done"]
    stopped = 0
    for text in texts:
        ids = qwen.encode(text)
        chunks, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            chunks.append(ids[i : i + n])
            i += n
        shown = qwen.decode(ids, skip_special_tokens=True)
        for stops in (
            [],
            [shown[len(shown) // 2 : len(shown) // 2 + rng.randint(1, 8)], "never in the text"],
            ["\n\n", "def ", "return"],
            [shown[-3:]],
            [shown[5:7], shown[4:9]],
        ):
            ref = _assert_streams_agree(qwen, chunks, stops)
            stopped += ref.stopped
    assert stopped > len(texts)  # the stop strings did cut outputs


def test_text_stream_equals_full_redecoding_on_random_tokens(qwen):
    """Random token sequences of the real Qwen tokenizer: any id of the model's vocabulary (special and
    padding ids included), one-byte tokens that spell the UTF-8 bytes of 2-, 3- and 4-byte characters
    one token at a time, stray bytes that make invalid UTF-8, and ordinary words; stop strings taken
    across token boundaries (with multi-byte characters, U+FFFD, prefixes of one another). The incremental
    stream equals full re-decoding at every push."""
    import random

    rng = random.Random(29)
    byte_ids = _byte_token_ids(qwen)
    assert qwen.decode(byte_ids[0x41:0x42]) == "A" and qwen.decode([byte_ids[0xE4]]) == "\ufffd"
    assert qwen.decode([byte_ids[b] for b in "你".encode()]) == "你"
    words = qwen.encode(" the quick brown fox\n\ndef f(x):\n    return x\n")
    splits = 0
    for trial in range(300):
        ids = []
        for _ in range(rng.randint(5, 40)):
            kind = rng.random()
            if kind < 0.2:
                ids.append(rng.randrange(qwen.model_vocab_size))
            elif kind < 0.55:
                char = chr(
                    rng.choice(
                        [rng.randrange(0x80, 0x800), rng.randrange(0x800, 0xD800), rng.randrange(0x10000, 0x110000)]
                    )
                )
                ids += [byte_ids[b] for b in char.encode()]
                splits += 1
            elif kind < 0.7:
                ids.append(byte_ids[rng.randrange(0x80, 0x100)])
            else:
                ids.append(rng.choice(words))
        chunks, i = [], 0
        while i < len(ids):
            n = rng.choice([1, 1, 1, 2, 3, 5])
            chunks.append(ids[i : i + n])
            i += n
        shown = qwen.decode(ids, skip_special_tokens=True)
        stops = []
        for _ in range(rng.randint(0, 3)):
            at = rng.randrange(max(1, len(shown)))
            stops.append(shown[at : at + rng.randint(1, 6)] or "x")
        if trial % 10 == 0:
            stops.append("\ufffd")
        if stops and trial % 3 == 0:
            stops.append(stops[0][:1])  # a prefix of another stop string
        _assert_streams_agree(qwen, chunks, stops)
    assert splits > 1000


def test_text_stream_work_per_token_stays_flat(qwen, humaneval, monkeypatch):
    """A 20,000-token answer with stop strings: the tokens decoded per push (counted through the
    tokenizer) are as few for the last thousand tokens as for the first (re-decoding the whole output
    decoded ~19,000 per push there), and the CPU time of the last thousand pushes stays within 3x the
    first's (best of 3 runs; flat in fact, where re-decoding grew with the output)."""
    import time

    from swiftspec.text_stream import TextStream

    text = "\n\n".join(r["prompt"] + r["canonical_solution"] for r in humaneval) + " 😀🦜 你好"
    ids = qwen.encode(text)
    ids = (ids * (20_000 // len(ids) + 1))[:20_000]
    stops = ["<|never appears|>", "\n\n\n\n\n\n", "🦜🦜🦜"]
    full = qwen.decode(ids, skip_special_tokens=True)
    assert not any(s in full for s in stops)
    decoded: list[int] = []
    real_decode = qwen.decode

    def counting(token_ids, skip_special_tokens=False):
        decoded[-1] += len(token_ids)
        return real_decode(token_ids, skip_special_tokens)

    monkeypatch.setattr(qwen, "decode", counting)
    stream, pieces = TextStream(qwen, stops), []
    for t in ids:
        decoded.append(0)
        pieces.append(stream.push([t]))
    assert "".join(pieces) + stream.finish() == full and not stream.stopped
    assert max(decoded[-1000:]) <= 16 and sum(decoded[-1000:]) <= 1.5 * sum(decoded[:1000])
    assert sum(decoded) < 4 * len(ids)
    monkeypatch.undo()

    first, last = [], []
    for _ in range(3):
        stream = TextStream(qwen, stops)
        t0 = time.process_time()
        for t in ids[:1000]:
            stream.push([t])
        first.append(time.process_time() - t0)
        for t in ids[1000:-1000]:
            stream.push([t])
        t0 = time.process_time()
        for t in ids[-1000:]:
            stream.push([t])
        last.append(time.process_time() - t0)
    assert min(last) < 3 * min(first), (first, last)


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_named(qwen):
    with pytest.raises(InvalidRequestError, match="text to encode must be a str, got bytes"):
        qwen.encode(b"hi")
    with pytest.raises(InvalidRequestError, match="messages must be a list of dicts, got str"):
        qwen.apply_chat_template("hi")
    with pytest.raises(InvalidRequestError, match="messages is empty"):
        qwen.encode_chat([])
    with pytest.raises(InvalidRequestError, match=r"messages\[1\] must be a dict, got tuple"):
        qwen.apply_chat_template([{"role": "user", "content": "a"}, ("user", "b")])
    with pytest.raises(InvalidRequestError, match=r"messages\[0\] needs a string 'role', got None"):
        qwen.apply_chat_template([{"content": "a"}])
    with pytest.raises(InvalidRequestError, match=r"messages\[0\] needs a string 'content', got int"):
        qwen.apply_chat_template([{"role": "user", "content": 5}])
    with pytest.raises(InvalidRequestError) as info:
        qwen.apply_chat_template([{"role": "user"}])
    assert str(info.value) == "messages[0] has no 'content'; a message needs a string 'content'"
    # a role the template does not take rendered as nothing (Qwen2.5 drops the message) or as itself
    with pytest.raises(InvalidRequestError) as info:
        qwen.apply_chat_template([{"role": "system", "content": "a"}, {"role": "usr", "content": "hi"}])
    assert str(info.value) == (
        f"messages[1] has the role 'usr', which the chat template of {qwen.source} does not "
        "take (roles: system, user, assistant, tool)"
    )
    assert "<tool_response>\nok\n</tool_response>" in qwen.apply_chat_template(  # a role Qwen2.5's template tests for
        [{"role": "user", "content": "a"}, {"role": "tool", "content": "ok"}]
    )
    with pytest.raises(InvalidRequestError, match=r"token ids\[1\] is 151936, outside the vocabulary \[0, 151936\)"):
        qwen.decode([1, 151936])
    with pytest.raises(InvalidRequestError, match=r"token ids\[0\] is -1"):
        qwen.decode([-1])
    with pytest.raises(InvalidRequestError, match=r"token ids\[0\] is 'a', not an int"):
        qwen.decode(["a"])
    with pytest.raises(InvalidRequestError, match=r"token ids\[0\] is 1.5, not an int"):
        qwen.stream_decoder().push([1.5])


def test_padding_ids_of_a_padded_model_vocabulary_decode_to_nothing(tmp_path):
    """A model whose vocabulary is padded beyond its tokenizer's tokens (an HF Qwen2.5 folder: 151936
    rows, 151665 tokens) can emit a padding id: decode and the stream decoder render it as nothing
    (as HF does) instead of refusing the generation; ids beyond the model's vocabulary are refused."""
    import json

    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    backend = Backend(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10}))
    tok = Tokenizer.from_checkpoint(tmp_path)
    assert (tok.vocab_size, tok.model_vocab_size) == (3, 10)
    assert tok.decode([0, 7, 1]) == tok.decode([0, 1]) == "a b"
    stream = tok.stream_decoder()
    assert stream.push([0, 9]) + stream.push(1) + stream.flush() == "a b"
    with pytest.raises(InvalidRequestError, match=r"token ids\[0\] is 10, outside the vocabulary \[0, 10\)"):
        tok.decode([10])


def test_template_errors(checkpoint_dir):
    from tokenizers import Tokenizer as Backend

    backend = Backend.from_file(str(checkpoint_dir(QWEN_05, "bfloat16") / "tokenizer.json"))
    strict = Tokenizer(
        backend,
        {
            "chat_template": "{% if messages[0].role != 'user' %}"
            "{{ raise_exception('Conversations must start with a user message') }}"
            "{% endif %}{{ bos_token }}{{ messages[0].content }}",
            "bos_token": "<s>",
        },
        [],
    )
    assert strict.apply_chat_template([{"role": "user", "content": "x"}]) == "<s>x"
    with pytest.raises(InvalidRequestError, match="Conversations must start with a user message"):
        strict.apply_chat_template([{"role": "system", "content": "x"}])
    none = Tokenizer(backend, {}, [], source="somewhere")
    with pytest.raises(InvalidRequestError, match="the tokenizer of somewhere has no chat_template"):
        none.apply_chat_template([{"role": "user", "content": "x"}])
