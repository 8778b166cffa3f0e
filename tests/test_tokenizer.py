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
    "", " ", "a", "Hello 123 world  \n\n x", "1234567 12 3.14159 -0.5e10", " leading space", "trailing  ",
    "\t\ttabs\r\nwindows\rmac", "naïve café 你好世界 😀🎉 ﬁ Ünïcödé ḽơᶉëᶆ", "don't I'LL we've THEY'RE",
    "<|im_end|> inside <tool_call> text <|endoftext|>", "a" * 300, "  \n  \n\n   x\n", "```python\nx = 1\n```",
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
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city, «quoted» & <escaped>?",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
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
            messages, tokenize=False, add_generation_prompt=True)
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
    from tokenizers import Tokenizer as Backend, pre_tokenizers

    reference = Backend.from_str(hf_smol.backend_tokenizer.to_str())  # a copy; the fixture stays as loaded
    reference.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
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
    assert str(info.value) == (f"messages[1] has the role 'usr', which the chat template of {qwen.source} does not "
                               "take (roles: system, user, assistant, tool)")
    assert "<tool_response>\nok\n</tool_response>" in qwen.apply_chat_template(  # a role Qwen2.5's template tests for
        [{"role": "user", "content": "a"}, {"role": "tool", "content": "ok"}])
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

    from tokenizers import Tokenizer as Backend, models, pre_tokenizers, decoders

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
    strict = Tokenizer(backend, {"chat_template": "{% if messages[0].role != 'user' %}"
                                 "{{ raise_exception('Conversations must start with a user message') }}"
                                 "{% endif %}{{ bos_token }}{{ messages[0].content }}", "bos_token": "<s>"}, [])
    assert strict.apply_chat_template([{"role": "user", "content": "x"}]) == "<s>x"
    with pytest.raises(InvalidRequestError, match="Conversations must start with a user message"):
        strict.apply_chat_template([{"role": "system", "content": "x"}])
    none = Tokenizer(backend, {}, [], source="somewhere")
    with pytest.raises(InvalidRequestError, match="the tokenizer of somewhere has no chat_template"):
        none.apply_chat_template([{"role": "user", "content": "x"}])
