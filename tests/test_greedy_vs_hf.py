"""Greedy generation of the 1.5B target equals HF transformers' greedy
generation, token for token (issue #2): 64 new tokens on 5 HumanEval prompts,
chat template applied the same way (HF's tokenizer renders it for HF)."""

import pytest
import torch

from swiftspec.datasets import prompt_messages
from swiftspec.engine import Engine

NAME = "qwen2.5-coder-1.5b-instruct"
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def hf_model_and_tokenizer(hf_causal_lm):
    return hf_causal_lm(NAME)


@pytest.fixture(scope="module")
def engine(checkpoint_dir):
    return Engine(checkpoint_dir(NAME, "float32"), max_context=1024)


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4])
def test_greedy_equals_hf_generate(index, engine, hf_model_and_tokenizer, humaneval):
    hf, hf_tok = hf_model_and_tokenizer
    messages = prompt_messages("humaneval", humaneval[index])
    hf_ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if hasattr(hf_ids, "keys"):
        hf_ids = hf_ids["input_ids"]
    ours = engine.generate(messages, max_new_tokens=NEW_TOKENS, mode="target")
    assert ours.prompt_token_ids == list(hf_ids)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([hf_ids]),
            attention_mask=torch.ones(1, len(hf_ids), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=engine.tokenizer.eos_token_ids,
            pad_token_id=engine.tokenizer.eos_token_ids[0],
        )
    hf_new = out[0, len(hf_ids) :].tolist()
    assert ours.token_ids == hf_new
    assert len(ours.token_ids) == NEW_TOKENS or ours.finish_reason == "stop"
