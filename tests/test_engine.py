"""The Python Engine and the C++ embedding example on a real model: prompts as
text / chat / ids, streaming, stop strings, cancellation, and the C++ program
decoding the same tokens as Python."""

import subprocess

import pytest

from swiftspec import InvalidRequestError
from swiftspec.datasets import prompt_messages
from swiftspec.engine import Engine
from swiftspec.paths import binary

NAME = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def engine(checkpoint_dir):
    return Engine(checkpoint_dir(NAME, "bfloat16"), max_context=1024)


def test_prompt_kinds_agree(engine, humaneval):
    messages = prompt_messages("humaneval", humaneval[2])
    ids = engine.tokenizer.encode_chat(messages)
    text = engine.tokenizer.apply_chat_template(messages)
    a = engine.generate(messages, max_new_tokens=12)
    b = engine.generate(ids, max_new_tokens=12)
    c = engine.generate(text, max_new_tokens=12)
    assert a.prompt_token_ids == b.prompt_token_ids == c.prompt_token_ids == ids
    assert a.token_ids == b.token_ids == c.token_ids
    assert len(a.token_ids) == 12 and a.finish_reason == "length"
    assert a.text == engine.tokenizer.decode(a.token_ids, skip_special_tokens=True)
    assert a.ttft_s > 0 and a.decode_s > 0 and a.tokens_per_s > 0
    assert a.stats["new_tokens"] == 12 and a.stats["verification_steps"] == 11


def test_stream_concatenates_to_generate(engine, mtbench):
    messages = prompt_messages("mtbench", mtbench[5])
    full = engine.generate(messages, max_new_tokens=24)
    pieces = list(engine.stream(messages, max_new_tokens=24))
    assert len(pieces) > 1
    assert "".join(pieces) == full.text


def test_stop_string_cuts_text(engine, humaneval):
    messages = prompt_messages("humaneval", humaneval[0])
    full = engine.generate(messages, max_new_tokens=40)
    assert len(full.text) > 10
    stop = full.text[5:9]
    cut = engine.generate(messages, max_new_tokens=40, stop=stop)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    assert len(cut.token_ids) < len(full.token_ids)


def test_streamed_pieces_and_stops_equal_full_redecoding_on_a_real_output(engine):
    """A real answer with multi-byte characters (CJK, emoji: tokens that split them): the pieces
    Engine.stream yields, with and without stop strings (one inside a multi-byte run, one spanning
    tokens), are those of re-decoding the whole output on every token (the TextStream before it became
    incremental)."""
    from test_tokenizer import _FullRedecodeStream

    messages = [
        {
            "role": "user",
            "content": "Write 'good morning' in Chinese, Japanese and Korean, each followed "
            "by a sunrise emoji, one per line.",
        }
    ]
    out = engine.generate(messages, max_new_tokens=48)
    tok = engine.tokenizer
    wide = [i for i, ch in enumerate(out.text) if ord(ch) > 0x2E80]
    assert len(wide) > 4 and any("\ufffd" in tok.decode([t]) for t in out.token_ids)
    for stops in ([], [out.text[wide[2] : wide[2] + 2]], [out.text[3:9], "never in it"]):
        ref = _FullRedecodeStream(tok, stops)
        expected = [ref.push([t]) for t in out.token_ids if not ref.stopped] + [ref.finish()]
        pieces = list(engine.stream(messages, max_new_tokens=48, stop=stops))
        assert pieces == [p for p in expected if p] and "".join(pieces) == ref.text
        assert ref.stopped == bool(stops)


def test_cancel_from_callback_and_engine_stays_usable(engine, humaneval):
    messages = prompt_messages("humaneval", humaneval[1])
    seen = []

    def on_text(delta):
        seen.append(delta)
        return len(seen) < 3

    cancelled = engine.generate(messages, max_new_tokens=50, on_text=on_text)
    assert cancelled.finish_reason == "cancelled" and len(cancelled.token_ids) < 50
    again = engine.generate(messages, max_new_tokens=8)
    reference = engine.generate(messages, max_new_tokens=50)
    assert again.token_ids == reference.token_ids[:8]
    assert cancelled.token_ids == reference.token_ids[: len(cancelled.token_ids)]


def test_closing_a_stream_cancels(engine, mtbench):
    stream = engine.stream(prompt_messages("mtbench", mtbench[0]), max_new_tokens=200)
    first = next(stream)
    assert isinstance(first, str)
    stream.close()  # cancels the request; the engine lock is released
    assert len(engine.generate("def add(a, b):", max_new_tokens=4).token_ids) == 4


@pytest.mark.parametrize("top_k", [0, 40])
def test_sampling_is_seeded(engine, top_k):
    """top_k=40: target-only decoding samples from each step's 40 best logits (Model.forward_top_k)."""
    kw = dict(max_new_tokens=16, temperature=0.8, top_p=0.9, top_k=top_k)
    a = engine.generate("Once upon a time", seed=7, **kw)
    b = engine.generate("Once upon a time", seed=7, **kw)
    c = engine.generate("Once upon a time", seed=8, **kw)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_a_top_k_of_the_whole_vocabulary_is_no_top_k(engine):
    """top_k >= vocab keeps every token, as sampling_distribution treats it: the same seeded tokens as
    top_k=0 (before: each step ranked all 152k logits, 0.7 s on this machine, and drew in rank order)."""
    kw = dict(max_new_tokens=8, temperature=0.8, top_p=0.9, seed=5)
    vocab = engine.target_model.config["vocab_size"]
    want = engine.generate("Once upon a time", top_k=0, **kw).token_ids
    assert engine.generate("Once upon a time", top_k=vocab, **kw).token_ids == want
    assert engine.generate("Once upon a time", top_k=10**6, **kw).token_ids == want


@pytest.mark.parametrize(
    "prompt,pattern",
    [
        ("", "non-empty"),
        ([], "non-empty"),
        ([{"role": "user"}], "content"),
        ([1, -5], "outside the vocabulary"),
        (3.14, "prompt must be"),
    ],
)
def test_bad_prompts(engine, prompt, pattern):
    with pytest.raises(InvalidRequestError, match=pattern):
        engine.generate(prompt, max_new_tokens=2)


def test_bad_parameters(engine):
    with pytest.raises(InvalidRequestError, match="stop must be"):
        engine.generate("hi", stop=[""])
    with pytest.raises(InvalidRequestError, match="needs a draft model"):
        engine.generate("hi", mode="serial")
    with pytest.raises(InvalidRequestError, match="tree_budget"):
        engine.generate("hi", tree_budget=10**6)
    with pytest.raises(InvalidRequestError, match="max_new_tokens must be an integer"):
        engine.generate("hi", max_new_tokens=2.5)


def test_cpp_example_decodes_like_python(engine, checkpoint_dir, humaneval):
    ids = engine.tokenizer.encode_chat(prompt_messages("humaneval", humaneval[4]))
    expected = engine.generate(ids, max_new_tokens=10).token_ids
    proc = subprocess.run(
        [
            str(binary("swiftspec-decode")),
            "--checkpoint",
            str(checkpoint_dir(NAME, "bfloat16")),
            "--tokens",
            ",".join(map(str, ids)),
            "--max-new-tokens",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert [int(t) for t in proc.stdout.split()] == expected
    assert "new_tokens=10" in proc.stderr
