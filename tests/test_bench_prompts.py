"""`swiftspec bench --prompts FILE.jsonl` (issue 29): the user's own prompts in the OpenAI chat,
plain-prompt and ShareGPT shapes, made from the real prompt sets, measured end to end on a real
model; each malformed record named by its line and field before anything loads."""

from __future__ import annotations

import json

import pytest

from swiftspec.bench import run_bench
from swiftspec.bench.config import BenchConfigError
from swiftspec.bench.prompt_file import parse_record, read_prompt_file
from swiftspec.cli import main
from swiftspec.datasets import prompt_messages

SMALL = "smollm2-135m-instruct"
SYSTEM = "You are a careful assistant. Answer briefly."


def _write(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_the_three_shapes_give_the_same_chat_messages(mtbench, humaneval, tmp_path):
    first, code = mtbench[0]["turns"][0], prompt_messages("humaneval", humaneval[0])[0]["content"]
    path = _write(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": first},
            "",  # blank lines are skipped
            {
                "id": "he0",
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": code[:40]}, {"type": "text", "text": code[40:]}],
                    },
                ],
            },
            {
                "id": 7,
                "conversations": [
                    {"from": "system", "value": SYSTEM},
                    {"from": "human", "value": first},
                    {"from": "gpt", "value": "An answer."},
                    {"from": "human", "value": "A second question."},
                ],
            },
        ],
    )
    pf = read_prompt_file(path)
    assert pf.name == "file:mixed.jsonl" and len(pf.sha256) == 64
    assert pf.records == [
        ("line1", [{"role": "user", "content": first}]),
        ("he0", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": code}]),
        ("7", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]),
    ]


@pytest.mark.parametrize(
    "line, needle",
    [
        ("not json", "x.jsonl:3: not a JSON object: Expecting value"),
        ("[1, 2]", r"x.jsonl:3: not a JSON object \(a list\)"),
        ('{"text": "hi"}', "x.jsonl:3: a record has exactly one of 'messages' .* this one has none"),
        ('{"prompt": "a", "messages": []}', "this one has 'messages', 'prompt'"),
        ('{"messages": []}', "x.jsonl:3: field 'messages' must be a non-empty list"),
        ('{"messages": [{"role": "tool", "content": "x"}]}', r"field 'messages\[0\]'.role is 'tool'"),
        ('{"messages": [{"role": "user"}]}', r"field 'messages\[0\]' has no 'content'"),
        ('{"messages": [{"role": "user", "content": 3}]}', r"'messages\[0\]'.content: expected a string"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
            r"'messages\[0\]'.content\[0\]: only text parts",
        ),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
            "the last message is the assistant's",
        ),
        ('{"prompt": "   "}', "field 'prompt': the user's message is empty"),
        ('{"prompt": "q", "id": [1]}', "field 'id' must be a string or an integer"),
        ('{"conversations": [{"from": "gpt", "value": "a"}]}', "field 'conversations' has no human turn"),
        ('{"conversations": [{"from": "robot", "value": "a"}]}', r"'conversations\[0\]'.from is 'robot'"),
        ('{"conversations": [{"value": "a"}]}', r"'conversations\[0\]' must be an object with 'from' and 'value'"),
        ('{"prompt": "b", "id": "a"}', "x.jsonl:3: id 'a' was already used on line 2"),
        ("[" * 5000 + "]" * 5000, "x.jsonl:3: not a JSON object"),
    ],
)
def test_a_malformed_record_is_named_by_line_and_field(tmp_path, line, needle):
    path = _write(tmp_path / "x.jsonl", ['{"prompt": "a question"}', '{"prompt": "another", "id": "a"}', line])
    with pytest.raises(BenchConfigError, match=needle):
        read_prompt_file(path)


def test_files_that_are_not_prompt_files(tmp_path):
    with pytest.raises(BenchConfigError, match="--prompts .*nothing.jsonl: no such file"):
        read_prompt_file(tmp_path / "nothing.jsonl")
    with pytest.raises(BenchConfigError, match="not a regular file"):
        read_prompt_file(tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(BenchConfigError, match="empty.jsonl: no records"):
        read_prompt_file(tmp_path / "empty.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(BenchConfigError, match="latin1.jsonl: not UTF-8"):
        read_prompt_file(tmp_path / "latin1.jsonl")
    with pytest.raises(BenchConfigError, match="where: a record has exactly one"):
        parse_record("{}", "where")


def test_more_prompts_than_records_is_refused_before_loading(tmp_path):
    path = _write(tmp_path / "two.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(BenchConfigError, match="--num-prompts 3 exceeds the 2 records of .*two.jsonl"):
        run_bench(
            datasets=[],
            prompts=path,
            num_prompts=3,
            max_new_tokens=4,
            configs="target",
            target="never-loaded",
            progress=False,
        )
    assert main(["bench", "--prompts", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_bench_on_sharegpt_and_openai_files_of_real_prompts(checkpoint_dir, mtbench, humaneval, tmp_path):
    """A ShareGPT file of MT-Bench first turns and an OpenAI-messages file of HumanEval prompts, run
    through the CLI on a real model with a speculative configuration: the prompts are the data set
    ``file:<name>``, tokenized exactly as the same messages from the prompt sets are, the ids kept,
    the speculative outputs checked against target-only decoding."""
    small = str(checkpoint_dir(SMALL, "bfloat16"))
    sharegpt = _write(
        tmp_path / "sharegpt.jsonl",
        [
            {
                "id": rec["question_id"],
                "conversations": [
                    {"from": "human", "value": rec["turns"][0]},
                    {"from": "gpt", "value": "(an earlier answer)"},
                ],
            }
            for rec in mtbench[:2]
        ],
    )
    openai = _write(
        tmp_path / "openai.jsonl",
        [{"id": rec["task_id"], "messages": prompt_messages("humaneval", rec)} for rec in humaneval[:2]],
    )
    docs = {}
    for path in (sharegpt, openai):
        out = tmp_path / ("out-" + path.rsplit("/", 1)[1])
        rc = main(
            [
                "bench",
                "--prompts",
                path,
                "--max-new-tokens",
                "8",
                "--configs",
                "target,serial:chain3",
                "--target",
                small,
                "--draft",
                small,
                "--warmup",
                "0",
                "--threads",
                "1",
                "--out",
                str(out),
                "--no-plots",
                "--no-progress",
            ]
        )
        assert rc == 0
        docs[path] = json.loads((out / "bench.json").read_text())
    # the same prompts as data sets, to compare the tokenized prompts with
    ref = run_bench(
        datasets=["mtbench", "humaneval"],
        num_prompts=2,
        max_new_tokens=1,
        configs="target",
        target=small,
        warmup=0,
        threads=1,
        progress=False,
    )
    ref_tokens = {(r["dataset"], r["prompt_index"]): r["prompt_tokens"] for r in ref["requests"]}
    for path, dataset, name in (
        (sharegpt, "mtbench", "file:sharegpt.jsonl"),
        (openai, "humaneval", "file:openai.jsonl"),
    ):
        doc = docs[path]
        assert doc["settings"]["datasets"] == [name] and doc["settings"]["num_prompts"] == 2  # all records
        assert doc["settings"]["prompt_file"]["records"] == 2 and doc["settings"]["prompt_file"]["dataset"] == name
        rows = doc["requests"]
        assert sorted((r["prompt_index"], r["config"]) for r in rows) == [
            (i, c) for i in range(2) for c in ("serial:chain3", "target")
        ]
        records = mtbench if dataset == "mtbench" else humaneval
        key = "question_id" if dataset == "mtbench" else "task_id"
        for r in rows:
            assert r["dataset"] == name
            assert r["prompt_id"] == str(records[r["prompt_index"]][key])
            assert r["prompt_tokens"] == ref_tokens[(dataset, r["prompt_index"])]
            if r["config"] == "serial:chain3":
                assert r["matches_reference"] is True
