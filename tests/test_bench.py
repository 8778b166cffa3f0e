"""The benchmark harness (issue 6): the CPU smoke run on the real pair, the HF peer path,
the configuration grammar and the CLI's handling of bad input.

These tests check that the harness measures and reports consistently; they assert nothing
about speed (performance is measured by `swiftspec bench` and tools/, never by timed tests).
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from swiftspec.bench import run_bench
from swiftspec.bench.config import BenchConfigError, parse_config, parse_config_list
from swiftspec.bench.report import first_difference, summarize
from swiftspec.bench.schema import SCHEMA, consistency_problems, validate

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
SMALL = "smollm2-135m-instruct"


def _load_and_check(out_dir) -> dict:
    """Reads bench.json back from disk, validates it against the schema and checks the numbers."""
    doc = json.loads((out_dir / "bench.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert consistency_problems(doc) == []
    for name in ("bench.md", "requests.jsonl", "tokens_per_s.png"):
        assert (out_dir / name).stat().st_size > 0, name
    return doc


# ------------------------------------------------------------------ real models
def test_cpu_smoke_run_real_pair(checkpoint_dir, tmp_path):
    """Issue 6 must-show: 2 prompts, 16 new tokens, the real 1.5B target and 0.5B draft."""
    target, draft = checkpoint_dir(TARGET, "bfloat16"), checkpoint_dir(DRAFT, "bfloat16")
    out = tmp_path / "bench"
    out.mkdir()
    (out / "bench.invalid.json").write_text("{}")  # an earlier attempt that failed validation
    run_bench(
        datasets=["mtbench", "humaneval"],
        num_prompts=1,
        max_new_tokens=16,
        configs="target,serial:tree16",
        target=str(target),
        draft=str(draft),
        warmup=0,
        out_dir=out,
        progress=False,
        command="pytest tests/test_bench.py",
    )
    doc = _load_and_check(out)
    rows = doc["requests"]
    assert len(rows) == 4  # 2 prompts x 2 configurations
    assert {(r["dataset"], r["config"]) for r in rows} == {
        (d, c) for d in ("mtbench", "humaneval") for c in ("target", "serial:tree16")
    }
    for r in rows:
        assert r["counted_tokens"] == r["new_tokens"] == len(r["token_ids"]) <= 16
        assert r["ttft_s"] > 0
        if r["verification_steps"]:
            assert r["acceptance_length"] >= 1
        if r["finish_reason"] == "length":
            assert r["new_tokens"] == 16
    spec = [r for r in rows if r["config"] == "serial:tree16"]
    assert all(r["matches_reference"] is not None for r in spec)  # each was checked against target
    assert all(r["draft_steps"] > 0 for r in spec)
    lossless = [d for d in doc["divergences"] if d["kind"] == "lossless"]
    assert [r["matches_reference"] for r in spec].count(False) == len(lossless)
    assert doc["commit"]["sha"] and doc["machine"]["cpu"]["usable_cpus"] >= 1
    md = (out / "bench.md").read_text()
    assert "| serial:tree16 |" in md and "## humaneval" in md
    assert "- HF assisted vs HF target-only: not run (no HF peer)" in md  # no peer: no count of 0
    assert not (out / "bench.invalid.json").exists()  # the stale file is gone once bench.json is valid


def test_hf_peer_and_unavailable_config(checkpoint_dir, tmp_path):
    """The HF peers (target-only and assisted generation) on the small model, used as its own
    draft, next to swiftspec; a draft TP degree the runtime cannot run is recorded as
    unavailable with --skip-unavailable."""
    small = str(checkpoint_dir(SMALL, "bfloat16"))
    out = tmp_path / "peer"
    run_bench(
        datasets=["humaneval"],
        num_prompts=1,
        max_new_tokens=8,
        configs="target,serial:chain4,serial:tree8:dtp2",
        peers="hf",
        target=small,
        draft=small,
        warmup=0,
        threads=1,
        hf_threads=1,
        out_dir=out,
        progress=False,
        skip_unavailable=True,
        command="pytest tests/test_bench.py",
    )
    doc = _load_and_check(out)
    status = {c["name"]: c for c in doc["configs"]}
    assert status["serial:tree8:dtp2"]["status"] == "unavailable"
    assert "TP degree" in status["serial:tree8:dtp2"]["error"]
    assert status["hf:assisted"]["baseline"] == "hf:target"
    assert status["hf:target"]["reference"] == "target"
    hf = {r["config"]: r for r in doc["requests"] if r["config"].startswith("hf:")}
    assert set(hf) == {"hf:target", "hf:assisted"}
    for r in hf.values():
        assert r["counted_tokens"] == r["new_tokens"] and r["ttft_s"] > 0
    assert hf["hf:target"]["verification_steps"] == hf["hf:target"]["new_tokens"] - 1
    assert doc["settings"]["hf"]["cpu"]["assisted"]["num_assistant_tokens"] is not None
    md = (out / "bench.md").read_text()
    peer_divs = sum(1 for d in doc["divergences"] if d["kind"] == "peer")
    assert f"- HF assisted vs HF target-only: {peer_divs} divergence(s)" in md


def test_int4_run_on_the_cpu_end_to_end(checkpoint_dir, tmp_path):
    """`swiftspec bench --dtype int4`: the reference 0.5B by name, converted to int4 (the cached
    folder of ``checkpoint_dir``), as target and draft, target-only at TP 1 and TP 2 (sharded at
    load time) and serial speculation; bench.json records int4 and passes its schema, speculation
    equals int4 target-only decoding."""
    from swiftspec.cli import main

    int4 = checkpoint_dir(DRAFT, "int4")  # converted once; the run resolves the name to this folder
    out = tmp_path / "int4"
    assert (
        main(
            [
                "bench",
                "--dtype",
                "int4",
                "--target",
                DRAFT,
                "--draft",
                DRAFT,
                "--datasets",
                "humaneval",
                "--num-prompts",
                "1",
                "--max-new-tokens",
                "8",
                "--configs",
                "target,target:tp2,serial:tree8",
                "--warmup",
                "0",
                "--threads",
                "1",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    doc = _load_and_check(out)
    s = doc["settings"]
    assert s["dtype"] == "int4" and s["target_checkpoint"] == s["draft_checkpoint"] == str(int4)
    assert s["hf"] is None
    rows = {r["config"]: r for r in doc["requests"]}
    assert sorted(rows) == ["serial:tree8", "target", "target:tp2"]
    assert all(len(r["token_ids"]) == 8 for r in rows.values())
    assert rows["serial:tree8"]["matches_reference"] is True and rows["serial:tree8"]["draft_steps"] > 0
    assert doc["divergences"] == []
    assert "int4, backend cpu" in (out / "bench.md").read_text()


def test_int4_target_folder_must_match_the_run_dtype(checkpoint_dir, tmp_path):
    """A checkpoint folder is used as it is: one of another dtype than the run's is refused before
    any engine loads, instead of being measured under the wrong dtype in bench.json."""
    with pytest.raises(
        BenchConfigError,
        match=r"the target checkpoint .*qwen2\.5-coder-0\.5b-instruct-int4 holds int4 "
        r"weights, but the run's dtype \(recorded in bench.json\) is bfloat16: "
        r"pass --dtype int4",
    ):
        run_bench(
            datasets=["humaneval"],
            num_prompts=1,
            max_new_tokens=4,
            configs="target",
            target=str(checkpoint_dir(DRAFT, "int4")),
            out_dir=tmp_path / "x",
            progress=False,
        )
    assert not (tmp_path / "x" / "requests.jsonl").exists()


def test_unavailable_config_fails_fast_without_skip(checkpoint_dir, tmp_path):
    small = str(checkpoint_dir(SMALL, "bfloat16"))
    from swiftspec.bench.runner import ConfigUnavailable

    with pytest.raises(ConfigUnavailable, match="serial:tree8:dtp2.*TP degree"):
        run_bench(
            datasets=["humaneval"],
            num_prompts=1,
            max_new_tokens=4,
            configs="target,serial:tree8:dtp2",
            target=small,
            draft=small,
            out_dir=tmp_path / "x",
            progress=False,
        )


def test_earlier_results_are_not_replaced_without_resume(tmp_path):
    (tmp_path / "bench.json").write_text("{}")
    with pytest.raises(BenchConfigError, match=r"holds the results of an earlier run \(bench.json\): pass --resume"):
        run_bench(
            datasets=["humaneval"],
            num_prompts=1,
            max_new_tokens=4,
            configs="target",
            target="never-loaded",
            out_dir=tmp_path,
            progress=False,
        )


def test_resume_keeps_measured_requests_and_measures_the_rest(checkpoint_dir, tmp_path):
    """An interrupted run (requests.jsonl cut after its first request, with a half-written line
    after it) resumed into the same folder keeps the measured request as it was and measures only
    the missing ones; a resume with other settings is refused, naming the setting."""
    small = str(checkpoint_dir(SMALL, "bfloat16"))
    out = tmp_path / "long"
    kw = dict(
        datasets=["mtbench", "humaneval"],
        num_prompts=1,
        max_new_tokens=4,
        configs="target,serial:chain4",
        target=small,
        draft=small,
        warmup=0,
        threads=1,
        out_dir=out,
        progress=False,
        plots=False,
    )
    full = run_bench(**kw)
    assert len(full["requests"]) == 4
    lines = (out / "requests.jsonl").read_text().splitlines()
    kept = json.loads(lines[0])
    (out / "requests.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    (out / "bench.json").unlink()
    with pytest.raises(BenchConfigError, match="max_new_tokens=4, this one 5"):
        run_bench(**dict(kw, max_new_tokens=5), resume=True)
    cut = (out / "requests.jsonl").read_text()
    (out / "requests.jsonl").write_text('{"tokens_per_s": 1.0}\n' + cut)
    with pytest.raises(BenchConfigError, match="line 1 is not a request row"):
        run_bench(**kw, resume=True)
    (out / "requests.jsonl").write_text(cut)
    resumed = run_bench(**kw, resume=True)
    rows = resumed["requests"]
    assert len(rows) == 4
    assert {(r["dataset"], r["config"]) for r in rows} == {(r["dataset"], r["config"]) for r in full["requests"]}
    same = [
        r
        for r in rows
        if (r["dataset"], r["prompt_index"], r["config"]) == (kept["dataset"], kept["prompt_index"], kept["config"])
    ]
    assert len(same) == 1 and same[0]["wall_s"] == kept["wall_s"]  # kept, not measured again
    # one row a line: the first row measured after the resume starts a line of its own, not the cut one's
    on_disk = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert sorted((r["dataset"], r["config"], r["wall_s"]) for r in on_disk) == sorted(
        (r["dataset"], r["config"], r["wall_s"]) for r in rows
    )
    for a, b in zip(
        sorted(rows, key=lambda r: (r["dataset"], r["config"])),
        sorted(full["requests"], key=lambda r: (r["dataset"], r["config"])),
    ):
        assert a["token_ids"] == b["token_ids"]
    with pytest.raises(BenchConfigError, match="resume needs an output folder"):
        run_bench(**dict(kw, out_dir=None), resume=True)


# -------------------------------------------------------------- no models needed
def _measured(config, wall_s=0.9):
    """What a request of ``config`` measures in these tests (4 tokens, consistent numbers)."""
    return dict(
        token_ids=[7, 8, 9, 10],
        counted_tokens=4,
        first_emission_tokens=1,
        finish_reason="length",
        ttft_s=0.5,
        decode_s=0.3,
        verification_steps=3 if config.mode == "target" else 1,
        draft_steps=None if config.mode == "target" else 4,
        acceptance_length=1.0 if config.mode == "target" else 3.0,
        target_time_s=None,
        draft_time_s=None,
        wall_s=wall_s,
    )


class _Tokens:
    """The tokenizer Runner.run needs: every prompt is 5 tokens."""

    vocab_size = 100

    def encode_chat(self, messages):
        return [1, 2, 3, 4, 5]


def _bench_runner(tmp_path, reject=(), **kw):
    """A runner over --out ``tmp_path`` (target and serial:chain4, one humaneval prompt of 5 tokens,
    max_new_tokens 4) whose requests measure :func:`_measured` with wall_s 2.0, the runtime
    rejecting the configurations named in ``reject``; returns the runner and its prompts."""
    from swiftspec.bench.runner import BenchSettings, PromptItem, Runner
    from swiftspec.errors import InvalidRequestError

    configs = parse_config_list("target,serial:chain4", "cpu", None)
    settings = BenchSettings(datasets=["humaneval"], num_prompts=1, max_new_tokens=4, target="t", draft="d")
    runner = Runner(settings, configs, tmp_path, progress=False, **{"log": lambda msg: None, **kw})

    def run_one(config, prompt_ids, max_new_tokens, seed=0):
        if config.name in reject:
            raise InvalidRequestError(f"{config.mode} decoding is not in this build")
        return _measured(config, wall_s=2.0)

    runner._run_one = run_one
    items = [PromptItem("humaneval", 0, "HumanEval/0", [], prompt_ids=[1, 2, 3, 4, 5])]
    return runner, items


def _interrupted_run(tmp_path, rows_edit=None, **kw):
    """A runner (:func:`_bench_runner`, ``kw`` passed on) over an --out folder that an interrupted
    run left with its two rows (wall_s 0.9), the first edited by ``rows_edit(row)``; returns the
    runner and this run's prompts."""
    from swiftspec.bench.runner import make_row

    runner, items = _bench_runner(tmp_path, **kw)
    rows = [make_row(items[0], c, _measured(c)) for c in runner.configs]
    lines = [json.dumps(r) for r in rows]
    if rows_edit is not None:
        lines[0] = rows_edit(rows[0])
    (tmp_path / "run_identity.json").write_text(json.dumps(runner._run_identity()))
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    return runner, items


def _set(**fields):
    return lambda row: json.dumps({**row, **fields})


def _drop(field):
    return lambda row: json.dumps({k: v for k, v in row.items() if k != field})


@pytest.mark.parametrize(
    "edit,needle",
    [
        # type, presence and range: a traceback or a silently wrong report at the end of the run before
        (_set(ttft_s="0.5"), "line 1: ttft_s: '0.5' is not of type 'number'"),
        (_drop("decode_s"), "line 1: field decode_s is missing"),
        (_set(new_tokens=-4), "line 1: new_tokens: -4 is less than the minimum of 0"),
        (_set(tokens_per_s=1e308), "line 1: tokens_per_s: 1e+308 is greater than the maximum of 1000000000000.0"),
        (
            lambda row: json.dumps(row).replace('"wall_s": 0.9', '"wall_s": NaN'),
            "line 1: wall_s is NaN (a row holds finite numbers only)",
        ),
        (_set(token_ids=[7, 8, 9]), "line 1: humaneval[0] target: new_tokens 4, counted 4, returned 3"),
        # token ids: the report decodes them (divergence text), which raised at the end of the run
        (
            _set(token_ids=[7, 8, 9, 2**40]),
            "line 1: token_ids/3: 1099511627776 is greater than the maximum of 2147483647",
        ),
        (_set(token_ids=[7, 8, 9, -1]), "line 1: token_ids/3: -1 is less than the minimum of 0"),
        (
            lambda row: json.dumps(row).replace("[7, 8, 9, 10]", "[7, 8, 9, 10.0]"),
            "line 1: token_ids/3: 10.0 is not of type 'integer'",
        ),
        (
            lambda row: json.dumps(row).replace('"new_tokens": 4', '"new_tokens": 4e0'),
            "line 1: new_tokens: 4.0 is not of type 'integer'",
        ),
        (lambda row: json.dumps(row).replace("[7, 8, 9, 10]", "[7, 8, 9, 1" + "0" * 5000 + "]"), "line 1 is not JSON"),
        (lambda row: "[1, 2]", "line 1 is not a request row (no dataset, prompt_index or config)"),
        # rows this run does not measure, or whose prompt is another now
        (_set(prompt_index=3), "line 1: humaneval[3] target is not a request of this run (prompt not measured"),
        (
            _set(config="serial:tree16"),
            "line 1: humaneval[0] serial:tree16 is not a request of this run (configuration not measured",
        ),
        (
            _set(prompt_tokens=6, prefill_tokens_per_s=12.0),
            "line 1: prompt humaneval[0] is HumanEval/0 of 6 tokens there, HumanEval/0 of 5 tokens "
            "now (another data set file or chat template?)",
        ),
        (_set(config="serial:chain4"), "line 2 repeats the request humaneval[0] serial:chain4 of line 1"),
    ],
)
def test_resumed_rows_are_checked_naming_the_line_and_field(tmp_path, edit, needle):
    runner, items = _interrupted_run(tmp_path, edit)
    with pytest.raises(BenchConfigError) as e:
        runner._resumed_rows(items)
    message = str(e.value)
    assert message.startswith(f"--resume: {tmp_path / 'requests.jsonl'} {needle}"), message
    assert "\n" not in message


def test_resumed_rows_as_measured_are_kept(tmp_path):
    runner, items = _interrupted_run(tmp_path)
    rows = runner._resumed_rows(items)
    assert [(r["config"], r["acceptance_length"]) for r in rows] == [("target", 1.0), ("serial:chain4", 3.0)]


def test_resumed_token_ids_are_in_the_vocabulary(tmp_path):
    """With the target's tokenizer loaded, a token id beyond its vocabulary (which the report could
    not decode) is refused naming the line, like the schema's bound [0, 2**31)."""
    runner, items = _interrupted_run(tmp_path, _set(token_ids=[7, 8, 9, 100]))
    runner.tokenizer = _Tokens()  # vocabulary [0, 100)
    with pytest.raises(BenchConfigError) as e:
        runner._resumed_rows(items)
    assert str(e.value) == (
        f"--resume: {tmp_path / 'requests.jsonl'} line 1: token_ids/3: 100 is outside the "
        "vocabulary of the target's tokenizer [0, 100) (an edited file?)"
    )


def test_resume_after_a_cut_last_line_writes_one_row_a_line(tmp_path):
    """A kill cut the last row as it was written (no line end): the resumed run drops it (saying so
    and how many rows it kept), measures that request again on a line of its own, and a second
    interruption of the same kind resumes as well; nothing measured is lost."""
    logs = []
    runner, items = _interrupted_run(tmp_path, log=logs.append)
    path = tmp_path / "requests.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n" + second[: len(second) // 2])
    runner.tokenizer = _Tokens()
    runner.run(items, resume=True)
    assert (
        f"--resume: 1 request already measured in {path}, kept; its last line (line 2, {len(second) // 2} "
        "characters without a line end) is a row cut by the interruption: dropped, that request is measured "
        "again" in logs
    )
    text = path.read_text()
    assert text.endswith("\n")
    rows = [json.loads(line) for line in text.splitlines()]
    assert [(r["config"], r["wall_s"]) for r in rows] == [("target", 0.9), ("serial:chain4", 2.0)]
    assert rows[0] == json.loads(first)  # kept as it was measured
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    # interrupted again, this time within the first row's write: only the cut text is dropped
    path.write_text(text[:20])
    runner, items = _bench_runner(tmp_path)
    runner.tokenizer = _Tokens()
    runner.run(items, resume=True)
    assert [(r["config"], r["wall_s"]) for r in map(json.loads, path.read_text().splitlines())] == [
        ("target", 2.0),
        ("serial:chain4", 2.0),
    ]


@pytest.mark.parametrize(
    "measured,message",
    [
        (1, "interrupted after 1 request; writing what was measured"),
        (0, "interrupted after 0 requests; writing what was measured"),
    ],
)
def test_interrupted_run_counts_its_requests(tmp_path, measured, message):
    logs = []
    runner, items = _bench_runner(tmp_path, log=logs.append)
    runner.tokenizer = _Tokens()
    runner._warmup = lambda items: None
    measure = runner._run_one
    calls = []

    def run_one(config, *args, **kwargs):
        calls.append(config.name)
        if len(calls) > measured:
            raise KeyboardInterrupt
        return measure(config, *args, **kwargs)

    runner._run_one = run_one
    assert len(runner.run(items)) == measured and runner.interrupted
    assert message in logs


def test_resume_keeps_a_whole_last_row_that_lost_only_its_line_end(tmp_path):
    runner, items = _interrupted_run(tmp_path)
    path = tmp_path / "requests.jsonl"
    path.write_text(path.read_text().rstrip("\n"))
    runner.tokenizer = _Tokens()
    runner.run(items, resume=True)  # nothing left to measure
    assert path.read_text().endswith("\n")  # the next resumed row would start a line of its own
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["config"], r["wall_s"]) for r in rows] == [("target", 0.9), ("serial:chain4", 0.9)]


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("when", ["load", "probe"])
def test_resume_refuses_a_configuration_with_rows_that_the_runtime_now_rejects(tmp_path, skip, when):
    """Rows measured before of a configuration rejected now (while loading, or by its first request)
    are neither kept next to the status "unavailable" nor dropped: the resume stops before measuring,
    --skip-unavailable or not, and requests.jsonl stays as it was."""
    from swiftspec.bench.runner import ConfigUnavailable

    runner, items = _interrupted_run(
        tmp_path, reject=("serial:chain4",) if when == "probe" else (), skip_unavailable=skip
    )
    if when == "load":
        runner.status["serial:chain4"] = ("unavailable", "backend cpu could not load the models: no memory")
    runner.tokenizer = _Tokens()
    path = tmp_path / "requests.jsonl"
    before = path.read_text()
    with pytest.raises(ConfigUnavailable) as e:
        runner.run(items, resume=True)
    reason = (
        "backend cpu could not load the models: no memory"
        if when == "load"
        else "the runtime rejected it: serial decoding is not in this build"
    )
    assert str(e.value) == (
        f"--resume: configuration serial:chain4 is not available now ({reason}), but the "
        f"interrupted run measured 1 of its requests (kept in {path}): resume where the runtime "
        "accepts it, or measure without it in a new --out folder"
    )
    assert path.read_text() == before


def test_resume_skips_a_rejected_configuration_without_rows(tmp_path):
    runner, items = _interrupted_run(tmp_path, reject=("serial:chain4",), skip_unavailable=True)
    path = tmp_path / "requests.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n")  # interrupted before serial:chain4's first row
    runner.tokenizer = _Tokens()
    rows = runner.run(items, resume=True)
    assert runner.status["serial:chain4"] == (
        "unavailable",
        "the runtime rejected it: serial decoding is not in this build",
    )
    assert [(r["config"], r["wall_s"]) for r in rows] == [("target", 0.9)]


@pytest.mark.parametrize(
    "text,needle",
    [
        # a kill cuts only the last line, before its line end: any other line that is not JSON was edited
        ('{"dataset": "huma\n{}\n', "line 1 is not JSON"),
        ('ROW\n{"dataset": "huma\n', "line 2 is not JSON"),
        ('{"dataset": "huma\n\xff\xfe\n', "line 1 is not JSON"),
    ],
)
def test_resume_refuses_a_line_a_kill_cannot_have_cut(tmp_path, text, needle):
    runner, items = _interrupted_run(tmp_path)
    path = tmp_path / "requests.jsonl"
    text = text.replace("ROW", path.read_text().splitlines()[0])
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(BenchConfigError) as e:
        runner._resumed_rows(items)
    assert str(e.value) == f"--resume: {path} {needle}"
    assert path.read_bytes() == text.encode("latin-1")  # untouched


def test_resume_refuses_rows_whose_run_identity_is_missing(tmp_path):
    runner, items = _interrupted_run(tmp_path)
    (tmp_path / "run_identity.json").unlink()
    before = (tmp_path / "requests.jsonl").read_text()
    with pytest.raises(BenchConfigError) as e:
        runner._resumed_rows(items)
    assert str(e.value) == (
        f"--resume: {tmp_path / 'requests.jsonl'} holds measured rows but "
        f"{tmp_path / 'run_identity.json'} is missing: its run's settings are unknown; use a new "
        "--out folder"
    )
    assert (tmp_path / "requests.jsonl").read_text() == before


@pytest.mark.parametrize(
    "token,name,budget,branching,depth",
    [
        ("target", "target", None, None, None),
        ("serial:chain", "serial:chain4", 4, 1, 4),
        ("serial:chain6", "serial:chain6", 6, 1, 6),
        ("serial", "serial:tree16", 16, 2, 8),
        ("serial:tree32:b4:d6", "serial:tree32:b4:d6", 32, 4, 6),
        ("serial:tree16:b2:d8", "serial:tree16", 16, 2, 8),
        ("async:tree64:tp2@cuda", "async:tree64:tp2@cuda", 64, 2, 8),
        ("async:tree16:sm16@cuda", "async:tree16:sm16@cuda", 16, 2, 8),
        ("hf:assisted", "hf:assisted", None, None, None),
        ("hf:target@cuda", "hf:target@cuda", None, None, None),
    ],
)
def test_config_grammar(token, name, budget, branching, depth):
    c = parse_config(token)
    assert (c.name, c.tree_budget, c.branching, c.max_depth) == (name, budget, branching, depth)
    assert parse_config(c.name).name == c.name


@pytest.mark.parametrize(
    "token",
    [
        "",
        "foo",
        "serial:chain0",
        "serial:chain4:b2",
        "serial:tree16:x3",
        "target:tree4",
        "serial@gpu",
        "serial:tree16:b2:b3",
        "hf:assisted@tpu",
    ],
)
def test_config_grammar_rejects(token):
    with pytest.raises(BenchConfigError):
        parse_config(token)


def test_config_sm_partition_option():
    from swiftspec.bench.config import engine_key, engine_placement

    c = parse_config("async:tree16:sm24", "cuda")
    assert (c.name, c.draft_sms, engine_key(c)) == ("async:tree16:sm24", 24, "cuda:sm24")
    assert engine_key(parse_config("async:tree16", "cuda")) == "cuda"
    assert engine_placement(c) == {"draft": {"sm_partition": [0, 24]}, "target": {"sm_partition": [24, 0]}}
    assert engine_placement(parse_config("async:tree16", "cuda")) is None
    h = parse_config("async:tree16:hp", "cuda")
    assert (h.name, h.target_priority, engine_key(h)) == ("async:tree16:hp", True, "cuda:hp")
    assert engine_placement(h) == {"draft": {}, "target": {"stream_priority": -1000}}
    with pytest.raises(BenchConfigError, match="needs the cuda backend"):
        parse_config("async:tree16:hp", "cpu")
    with pytest.raises(BenchConfigError, match="needs the cuda backend"):
        parse_config("async:tree16:sm16", "cpu")
    with pytest.raises(BenchConfigError, match="smN"):
        parse_config("async:tree16:sm0@cuda")
    with pytest.raises(BenchConfigError, match="takes no shape and only the options"):
        parse_config("target:sm8@cuda")
    with pytest.raises(BenchConfigError, match="takes no shape and only the options"):
        parse_config("target:tp2:sm8@cuda")


def test_target_tp_option_and_its_baseline():
    from swiftspec.bench.config import find_baseline

    configs = parse_config_list("target,target:tp2,serial:tree16:tp2,serial:tree16,serial:tree16:tp4")
    by = {c.name: c for c in configs}
    assert by["target:tp2"].target_tp == 2 and by["target:tp2"].is_reference
    assert find_baseline(by["serial:tree16:tp2"], configs).name == "target:tp2"
    assert find_baseline(by["serial:tree16"], configs).name == "target"
    assert find_baseline(by["serial:tree16:tp4"], configs).name == "target"  # no TP-4 target: the first one
    assert find_baseline(by["target:tp2"], configs) is None
    from swiftspec.bench.runner import reference_config

    assert reference_config(by["serial:tree16:tp2"], configs).name == "target:tp2"
    assert reference_config(by["serial:tree16:tp4"], configs) is None  # another TP degree: no output check
    with pytest.raises(BenchConfigError, match="only the options tpN"):
        parse_config("target:b2")
    with pytest.raises(BenchConfigError, match="target TP degree"):
        parse_config("target:tp0")


def test_config_draft_gpu_option():
    from swiftspec.bench.config import engine_key, engine_placement

    c = parse_config("async:tree16:dg1@cuda")
    assert (c.name, c.draft_gpu, engine_key(c)) == ("async:tree16:dg1@cuda", 1, "cuda:dg1")
    assert engine_placement(c) == {"draft": {"devices": [1]}, "target": {"devices": [0]}}
    t = parse_config("async:tree16:tp2:dg1:dmma@cuda")
    assert (t.name, engine_key(t)) == ("async:tree16:tp2:dg1:dmma@cuda", "cuda:tp2:dg1:dmma")
    assert engine_placement(t) == {
        "draft": {"devices": [1], "gemm_engine": "mma"},
        "target": {"tp": 2, "devices": [0, 1]},
    }
    with pytest.raises(BenchConfigError, match="dmma picks a CUDA GEMM engine; it needs the cuda backend"):
        parse_config("async:tree16:dmma", "cpu")
    assert parse_config("async:tree16:dg0:sm16", "cuda").name == "async:tree16:sm16:dg0"
    with pytest.raises(BenchConfigError, match="dg1 puts the draft on a GPU; it needs the cuda backend"):
        parse_config("async:tree16:dg1", "cpu")
    with pytest.raises(BenchConfigError, match="option 'dg' given twice"):
        parse_config("async:tree16:dg1:dg2@cuda")


def test_config_list_adds_peers_and_drops_duplicates():
    names = [c.name for c in parse_config_list("target,serial:chain,serial:chain4", peers="hf")]
    assert names == ["target", "serial:chain4", "hf:target", "hf:assisted"]


def test_summary_and_first_difference():
    s = summarize([1.0, 2.0, None, 3.0, 4.0])
    assert s["n"] == 4 and s["mean"] == 2.5 and s["p50"] == 2.5 and s["min"] == 1 and s["max"] == 4
    assert summarize([None]) is None
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_schema_rejects_bad_rows():
    with pytest.raises(jsonschema.ValidationError):
        validate({"schema_version": 1, "kind": "swiftspec-bench"})


def test_schema_bounds_token_ids():
    from swiftspec.bench.runner import PromptItem, make_row
    from swiftspec.bench.schema import request_row_problem

    item = PromptItem("humaneval", 0, "HumanEval/0", [], prompt_ids=[1, 2, 3, 4, 5])
    row = make_row(item, parse_config("target", "cpu"), _measured(parse_config("target", "cpu")))
    assert request_row_problem(row) is None
    assert request_row_problem({**row, "token_ids": [7, 8, 9, 2**31 - 1]}) is None
    assert request_row_problem({**row, "token_ids": [7, 8, 9, 2**31]}) == (
        "token_ids/3: 2147483648 is greater than the maximum of 2147483647"
    )


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--configs", "serial:tree0"], "'serial:tree0'"),
        (["--configs", "warp:tree4"], "'warp'"),
        (["--num-prompts", "0"], "--num-prompts"),
        (["--num-prompts", "many"], "'many'"),
        (["--max-new-tokens", "-3"], "--max-new-tokens"),
        (["--datasets", "gsm8k"], "'gsm8k'"),
        (["--backend", "tpu"], "'tpu'"),
        (["--peers", "vllm"], "'vllm'"),
        (["--dtype", "int3"], "--dtype must be bfloat16, float32 or int4, got 'int3'"),
        # int4: no HF peers, and on cuda neither the megakernel nor TP; refused before any model is
        # converted or loaded
        (
            ["--dtype", "int4", "--backend", "cuda", "--configs", "target,target:mk"],
            "--dtype int4: configuration target:mk runs its target on cuda with megakernel: int4 weights run on "
            "the cuda backend's layered step",
        ),
        (
            ["--dtype", "int4", "--configs", "target,async:tree16:dmk@cuda"],
            "--dtype int4: configuration async:tree16:dmk@cuda runs its draft on cuda with megakernel: ",
        ),
        (
            ["--dtype", "int4", "--configs", "target:tp2@cuda"],
            "--dtype int4: configuration target:tp2@cuda runs its target on cuda with tp 2: int4 weights run on "
            "one GPU",
        ),
        (
            ["--dtype", "int4", "--peers", "hf"],
            "--dtype int4: the HF transformers peers (hf:target, hf:assisted) cannot load swiftspec's int4 checkpoints",
        ),
        (["--context-tokens", "0"], "--context-tokens: a prompt length must be >= 1 token, got 0"),
        (["--context-tokens", "4k"], "--context-tokens: '4k' is not an integer"),
        (["--context-tokens", "512,4096,512"], "--context-tokens names 512 twice"),
        (["--context-tokens", ""], "--context-tokens is empty: give prompt lengths in tokens, e.g. 512,4096"),
        (["--datasets", "ctx512"], "unknown data set 'ctx512'"),
        (["--merge", "a,b", "--out", "m", "--context-tokens", "512"], "it takes no run options (got --context-tokens)"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(argv, needle, capsys):
    from swiftspec.cli import main

    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_cli_prints_schema(capsys):
    from swiftspec.cli import main

    assert main(["bench", "--print-schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "swiftspec bench result"


def test_commit_info_of_a_checkout_and_from_the_environment(tmp_path, monkeypatch):
    """The record's commit: the checkout's sha and dirty state; SWIFTSPEC_COMMIT (a copy on the
    GPU machine has no .git) overrides; None outside a checkout."""
    import subprocess

    from swiftspec.bench.machine import commit_info

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (repo / "a.txt").write_text("1")
    subprocess.run(git + ["add", "a.txt"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    sha = subprocess.run(git[:3] + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.delenv("SWIFTSPEC_COMMIT", raising=False)
    info = commit_info(repo)
    assert info["sha"] == sha and info["short"] == sha[:10] and info["dirty"] is False
    (repo / "a.txt").write_text("2")
    info = commit_info(repo)
    assert info["dirty"] is True and info["dirty_files"] == ["a.txt"]
    assert commit_info(tmp_path)["sha"] is None and commit_info(tmp_path)["dirty"] is None  # no checkout
    monkeypatch.setenv("SWIFTSPEC_COMMIT", "0123456789abcdef")
    assert commit_info(repo)["short"] == "0123456789" and commit_info(repo)["dirty"] is None


def test_config_draft_window_options():
    """``wN`` / ``wsN``: the draft's attention window (placement kv_window), its canonical name,
    engine key and errors."""
    from swiftspec.bench.config import engine_key, engine_placement

    c = parse_config("serial:tree16:w1024", "cpu")
    assert (c.name, c.draft_window, c.draft_sinks, engine_key(c)) == ("serial:tree16:w1024", 1024, 4, "cpu:w1024")
    assert engine_placement(c) == {"draft": {"kv_window": [4, 1024]}, "target": {}}
    s = parse_config("async:tree16:ws8:w64", "cpu")
    assert (s.name, engine_key(s)) == ("async:tree16:w64:ws8", "cpu:w64ws8")
    assert engine_placement(s)["draft"]["kv_window"] == [8, 64]
    assert parse_config("auto:tree16:w512:ws4", "cpu").name == "auto:tree16:w512"
    assert parse_config("serial:tree16", "cpu").draft_window is None
    with pytest.raises(BenchConfigError, match="ws8 sets the sinks of a draft window; add wN"):
        parse_config("serial:tree16:ws8", "cpu")
    with pytest.raises(BenchConfigError, match="option 'w' given twice"):
        parse_config("serial:tree16:w8:w16", "cpu")
    with pytest.raises(BenchConfigError, match="target-only decoding takes no shape"):
        parse_config("target:w64", "cpu")


def test_config_megakernel_options():
    """``dmk`` / ``mk``: the draft's / target's decode megakernel (CUDA), their placement, engine
    key and output reference (target:mk is checked against the plain target)."""
    from swiftspec.bench.config import engine_key, engine_placement, find_baseline
    from swiftspec.bench.runner import reference_config

    d = parse_config("async:tree16:dmk@cuda")
    assert (d.name, d.draft_megakernel, engine_key(d)) == ("async:tree16:dmk@cuda", True, "cuda:dmk")
    assert engine_placement(d) == {"draft": {"megakernel": True}, "target": {}}
    t = parse_config("target:mk", "cuda")
    assert (t.name, t.target_megakernel, engine_key(t)) == ("target:mk", True, "cuda:mk")
    assert engine_placement(t) == {"draft": {}, "target": {"megakernel": True}}
    assert parse_config("target:tp2:mk", "cuda").name == "target:tp2:mk"
    assert parse_config("target:mk:tp2", "cuda").name == "target:tp2:mk"
    plain = parse_config("target", "cuda")
    configs = [t, plain, d]
    assert find_baseline(d, configs) == plain  # speculation is compared with the exact target
    assert reference_config(t, configs) == plain
    assert reference_config(plain, configs) is None
    with pytest.raises(BenchConfigError, match="mk runs the CUDA decode megakernel; it needs the cuda backend"):
        parse_config("target:mk", "cpu")
    with pytest.raises(BenchConfigError, match="dmk runs the CUDA decode megakernel; it needs the cuda backend"):
        parse_config("async:tree16:dmk", "cpu")
    with pytest.raises(BenchConfigError, match="mk applies to target-only decoding"):
        parse_config("async:tree16:mk", "cuda")
    with pytest.raises(BenchConfigError, match="option 'dmk' given twice"):
        parse_config("async:tree16:dmk:dmk", "cuda")
    # auto:...:mk: auto's target-only rounds on the megakernel, verification on the layered path
    a = parse_config("auto:tree16:mk:dmk", "cuda")
    assert (a.name, a.target_megakernel, a.draft_megakernel, engine_key(a)) == (
        "auto:tree16:dmk:mk",
        True,
        True,
        "cuda:dmk:mk",
    )
    assert engine_placement(a) == {"draft": {"megakernel": True}, "target": {"megakernel": True}}
    with pytest.raises(BenchConfigError, match="mk applies to target-only decoding"):
        parse_config("auto:tree16:mk:mk", "cuda")
    with pytest.raises(BenchConfigError, match="mk runs the CUDA decode megakernel; it needs the cuda backend"):
        parse_config("auto:tree16:mk", "cpu")
    with pytest.raises(BenchConfigError, match="got 'mk'"):
        parse_config("target:mk:mk", "cuda")
    with pytest.raises(BenchConfigError, match="got 'tree16'"):
        parse_config("target:tree16", "cuda")


def test_default_max_context_follows_the_model_limit(checkpoint_dir, tmp_path):
    """Without --max-context the bench uses each model's default (its max_position_embeddings,
    bounded by free memory) and records the resolved value; it used to pass 4096, which a model
    with a smaller limit refuses."""
    small = checkpoint_dir(SMALL, "bfloat16")
    limited = tmp_path / "small-1024"
    limited.mkdir()
    for f in small.iterdir():
        if f.name != "config.json":
            (limited / f.name).symlink_to(f)
    config = json.loads((small / "config.json").read_text())
    (limited / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    doc = run_bench(
        datasets=["humaneval"],
        num_prompts=1,
        max_new_tokens=4,
        configs="target",
        target=str(limited),
        warmup=0,
        out_dir=tmp_path / "bench",
        progress=False,
        plots=False,
    )
    assert doc["settings"]["max_context"] == 1024
    assert doc["requests"][0]["new_tokens"] >= 1
    doc = run_bench(
        datasets=["humaneval"],
        num_prompts=1,
        max_new_tokens=4,
        configs="target",
        target=str(small),
        warmup=0,
        out_dir=None,
        progress=False,
    )
    assert doc["settings"]["max_context"] == 8192  # what SmolLM2 was trained for
    from swiftspec.bench.runner import ConfigUnavailable

    with pytest.raises(ConfigUnavailable, match="max_context 2000 exceeds the model's max_position_embeddings 1024"):
        run_bench(
            datasets=["humaneval"],
            num_prompts=1,
            max_new_tokens=4,
            configs="target",
            target=str(limited),
            warmup=0,
            max_context=2000,
            out_dir=None,
            progress=False,
        )


@pytest.mark.parametrize(
    "out, message",
    [
        ("/proc/swiftspec-bench", "--out /proc/swiftspec-bench: cannot create the folder (No such file or directory)"),
        ("FILE/sub", "--out FILE/sub: cannot create the folder (Not a directory)"),
    ],
)
def test_an_out_folder_that_cannot_be_made_is_refused_before_loading(tmp_path, out, message):
    """It was a FileNotFoundError / NotADirectoryError traceback once the models had loaded and
    warmed up (the folder was first made when the first row was written)."""
    (tmp_path / "FILE").write_text("a file")
    out = out.replace("FILE", str(tmp_path / "FILE"))
    with pytest.raises(BenchConfigError) as info:
        run_bench(
            datasets=["humaneval"],
            num_prompts=1,
            max_new_tokens=4,
            configs="target",
            target="never-loaded",
            out_dir=out,
            progress=False,
        )
    assert str(info.value) == message.replace("FILE", str(tmp_path / "FILE"))


def test_a_result_file_that_is_a_folder_is_refused_before_loading(tmp_path):
    """--resume with requests.jsonl a folder was an IsADirectoryError traceback after the models loaded."""
    (tmp_path / "requests.jsonl").mkdir()
    for resume in (False, True):
        with pytest.raises(BenchConfigError) as info:
            run_bench(
                datasets=["humaneval"],
                num_prompts=1,
                max_new_tokens=4,
                configs="target",
                target="never-loaded",
                out_dir=tmp_path,
                progress=False,
                resume=resume,
            )
        assert str(info.value) == f"--out {tmp_path}: {tmp_path / 'requests.jsonl'} exists and is not a file"


def test_an_empty_requests_file_is_not_an_earlier_run(tmp_path):
    """A run that stopped before measuring (a configuration the runtime rejected) leaves an empty
    requests.jsonl; the folder was then refused as holding 'the results of an earlier run' unless
    resumed with the same settings (the rejected ones)."""
    from swiftspec.bench.api import _check_out

    (tmp_path / "requests.jsonl").write_text("")
    (tmp_path / "run_identity.json").write_text("{}")
    _check_out(tmp_path, "pass --resume")  # no error
    (tmp_path / "requests.jsonl").write_text("\n")
    with pytest.raises(BenchConfigError, match=r"holds the results of an earlier run \(requests.jsonl\)"):
        _check_out(tmp_path, "pass --resume")


@pytest.mark.parametrize("tail", ["\x00\xff\xfe", "hello", "\u00e9{"])
def test_resume_refuses_text_appended_after_the_last_row(tmp_path, tail):
    """A last line without its line end that is not JSON was dropped as 'cut by a kill' whatever it
    held; a cut row starts with '{' and is ASCII (json.dumps), so other text is named as an edit."""
    runner, items = _interrupted_run(tmp_path)
    path = tmp_path / "requests.jsonl"
    before = path.read_bytes()
    path.write_bytes(before + tail.encode("latin-1"))
    with pytest.raises(BenchConfigError) as e:
        runner._resumed_rows(items)
    assert str(e.value) == f"--resume: {path} line 3 is not JSON"
    assert path.read_bytes() == before + tail.encode("latin-1")  # untouched
    path.write_bytes(before + b'{"dataset": "huma')  # a cut row: dropped, the two whole rows kept
    assert len(runner._resumed_rows(items)) == 2


# ------------------------------------------------------------------ long-context workloads
def test_long_context_workloads_on_the_cpu(checkpoint_dir, tmp_path):
    """--context-tokens 256,600 on the real small model (its own draft): one workload ctxN per N with
    prompts of exactly N tokens, TTFT, prefill and decode tokens/s per N in bench.json, bench.md and
    context.png, speculative outputs checked against target-only at each N; a resume after a cut keeps
    the measured rows and measures the rest, a resume with other N is refused."""
    from swiftspec.cli import main

    small = str(checkpoint_dir(SMALL, "bfloat16"))
    out = tmp_path / "ctx"
    argv = [
        "bench",
        "--context-tokens",
        "600,256",
        "--num-prompts",
        "1",
        "--max-new-tokens",
        "4",
        "--configs",
        "target,serial:chain4",
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
        "--no-progress",
    ]
    assert main(argv) == 0
    doc = _load_and_check(out)
    s = doc["settings"]
    assert s["datasets"] == ["ctx256", "ctx600"] and s["context_tokens"] == [256, 600]
    assert s["max_context"] == 8192  # the model's default (what it was trained for) holds 600 + 4
    assert "swiftspec.bench.long_context" in s["prompt_format"]
    rows = doc["requests"]
    assert sorted((r["dataset"], r["config"]) for r in rows) == [
        ("ctx256", "serial:chain4"),
        ("ctx256", "target"),
        ("ctx600", "serial:chain4"),
        ("ctx600", "target"),
    ]
    for r in rows:
        assert r["prompt_tokens"] == int(r["dataset"][3:]) and r["prompt_id"] == "HumanEval/0+"
        assert r["prefill_tokens_per_s"] == pytest.approx(r["prompt_tokens"] / r["ttft_s"])
        assert r["new_tokens"] == 4 or r["finish_reason"] == "stop"
    assert all(r["matches_reference"] is True for r in rows if r["config"] == "serial:chain4")
    aggs = {(a["dataset"], a["config"]): a for a in doc["aggregates"]}
    for n in (256, 600):
        a = aggs[(f"ctx{n}", "target")]
        assert a["prompt_tokens"]["mean"] == n and a["prefill_tokens_per_s"]["n"] == 1
        assert a["outputs_checked"] == 0 and aggs[(f"ctx{n}", "serial:chain4")]["outputs_checked"] == 1
    md = (out / "bench.md").read_text()
    assert "## Long context" in md and "## ctx256" not in md and "## all" in md
    for n in (256, 600):
        assert f"| {n} | target | 1 |" in md and f"| {n} | serial:chain4 | 1 |" in md
    assert (out / "context.png").stat().st_size > 0 and "![context](context.png)" in md

    # an interrupted run that measured all but ctx256 target: its rows are kept, that one is measured; a
    # resume with other workloads is refused
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert [(json.loads(line)["dataset"], json.loads(line)["config"]) for line in lines][0] == ("ctx256", "target")
    (out / "requests.jsonl").write_text("\n".join(lines[1:]) + "\n")
    (out / "bench.json").unlink()
    assert main([*argv[:2], "600", *argv[3:], "--resume"]) == 2
    assert (out / "requests.jsonl").read_text() == "\n".join(lines[1:]) + "\n"
    assert main([*argv, "--resume"]) == 0
    resumed = _load_and_check(out)
    before = {(r["dataset"], r["config"]): r for r in rows}
    after = {(r["dataset"], r["config"]): r for r in resumed["requests"]}
    assert after.keys() == before.keys()
    assert [k for k in after if after[k]["wall_s"] != before[k]["wall_s"]] == [("ctx256", "target")]  # others kept
    assert all(after[k]["token_ids"] == before[k]["token_ids"] for k in after)


def test_long_context_prompts_are_exactly_n_tokens_of_humaneval_code(checkpoint_dir, humaneval):
    """The construction with the reference target's tokenizer and chat template: every N is exactly N
    token ids; they spell the messages rendered by the chat template; the code is the HumanEval files
    (prompt, canonical solution, test) from problem i on, wrapping around after the last; the messages
    tokenized again give N tokens give or take the one where the code meets the instruction."""
    from swiftspec.bench.long_context import CONTEXT_INSTRUCTION, ContextPrompts
    from swiftspec.tokenizer import Tokenizer

    tok = Tokenizer.from_checkpoint(checkpoint_dir(TARGET, "bfloat16"))
    prompts = ContextPrompts(tok, humaneval)
    frame = prompts.frame_tokens

    def files(start):
        return "".join(
            f"# file: HumanEval/{i % 164}.py\n{humaneval[i % 164]['prompt']}"
            f"{humaneval[i % 164]['canonical_solution']}{humaneval[i % 164]['test']}\n\n"
            for i in range(start, start + 164)
        )

    for n in (frame + 1, 256, 600, 4096, 32768):
        messages, ids = prompts.prompt(n, 3)
        assert len(ids) == n
        assert tok.decode(ids) == tok.apply_chat_template(messages)
        content = messages[0]["content"]
        head, code_and_tail = content.split("```python\n", 1)
        code, tail = code_and_tail.rsplit("\n```\n\n", 1)
        assert head == "Here are the files of my project:\n\n" and tail == CONTEXT_INSTRUCTION
        assert files(3).startswith(code) and (n == frame + 1 or code.startswith("# file: HumanEval/3.py"))
        assert abs(len(tok.encode_chat(messages)) - n) <= 1
    assert 90 < code.count("# file: HumanEval/") < 164  # 32768 tokens: over half of the files, none twice
    code = prompts.prompt(4096, 162)[0][0]["content"].split("```python\n", 1)[1].rsplit("\n```\n\n", 1)[0]
    assert files(162).startswith(code) and "\n\n# file: HumanEval/163.py\n" in code  # then wrapping around:
    assert "\n\n# file: HumanEval/0.py\n" in code and "\n\n# file: HumanEval/1.py\n" in code
    assert prompts.prompt(600, 3) == prompts.prompt(600, 3) and prompts.prompt(600, 4)[1] != prompts.prompt(600, 3)[1]
    with pytest.raises(
        BenchConfigError,
        match=rf"--context-tokens {frame}: a long-context prompt's frame \(chat "
        rf"template and instruction\) alone is {frame} tokens; give at least "
        rf"{frame + 1}",
    ):
        prompts.prompt(frame, 0)


def test_the_context_holds_the_longest_prompt_plus_the_new_tokens(checkpoint_dir):
    """Runner.context_needed, from the real small model's config.json (trained for 8192 tokens, its
    default context): the default when it holds the longest prompt plus max_new_tokens, --max-context
    when given; a prompt beyond either is refused naming the prompt, both lengths and the runtime's
    reason."""
    from swiftspec.bench.runner import BenchSettings, PromptItem, Runner

    small = str(checkpoint_dir(SMALL, "bfloat16"))

    def needed(prompt_tokens, max_new, max_context=None, configs="target,serial:chain4"):
        settings = BenchSettings(
            datasets=["humaneval", "ctx8192"],
            num_prompts=1,
            max_new_tokens=max_new,
            target=small,
            draft=small,
            max_context=max_context,
        )
        runner = Runner(settings, parse_config_list(configs), progress=False, log=lambda msg: None)
        runner.target_checkpoint = runner.draft_checkpoint = small
        items = [
            PromptItem("humaneval", 0, "HumanEval/0", [], prompt_ids=[1] * 100),
            PromptItem("ctx8192", 0, "HumanEval/0+", [], prompt_ids=[1] * prompt_tokens, context_tokens=8192),
        ]
        return runner.context_needed(items)

    assert needed(600, 64) is None and needed(50, 4096) is None  # 8192: the default holds it
    assert needed(8000, 192) is None  # (up to its last token)
    assert needed(600, 64, max_context=700) == 700
    with pytest.raises(BenchConfigError) as info:
        needed(600, 200, max_context=700)
    assert str(info.value) == (
        "ctx8192[0] is a prompt of 600 tokens; with --max-new-tokens 200 it needs a context of "
        "800 tokens, more than --max-context 700"
    )
    with pytest.raises(BenchConfigError) as info:
        needed(8192, 4)
    assert str(info.value).startswith(
        "ctx8192[0] is a prompt of 8192 tokens; with --max-new-tokens 4 it needs a context of 8196 tokens, more than "
        f"the target model takes: max_context 8196 exceeds the model's max_position_embeddings 8192 ({small}"
    )
    assert needed(8192, 4, configs="hf:target") is None  # no swiftspec engine: nothing to size


def test_a_long_context_prompt_beyond_the_context_is_refused_before_loading(checkpoint_dir, tmp_path):
    """A workload whose prompt plus --max-new-tokens does not fit --max-context, or the model's trained
    length, is refused before any model loads or anything is measured, naming both lengths; so is an N
    that does not exceed the prompt's frame."""
    small = str(checkpoint_dir(SMALL, "bfloat16"))
    kw = dict(datasets=[], num_prompts=1, max_new_tokens=8, configs="target", target=small, warmup=0, progress=False)
    with pytest.raises(
        BenchConfigError,
        match=r"^ctx600\[0\] is a prompt of 600 tokens; with --max-new-tokens 8 it "
        r"needs a context of 608 tokens, more than --max-context 512$",
    ):
        run_bench(**kw, context_tokens=[256, 600], max_context=512, out_dir=tmp_path / "a")
    with pytest.raises(
        BenchConfigError,
        match=r"^ctx8192\[0\] is a prompt of 8192 tokens; with --max-new-tokens 8 "
        r"it needs a context of 8200 tokens, more than the target model takes: "
        r"max_context 8200 exceeds the model's max_position_embeddings 8192",
    ):
        run_bench(**kw, context_tokens="8192", out_dir=tmp_path / "b")
    with pytest.raises(
        BenchConfigError,
        match=r"--context-tokens 20: a long-context prompt's frame \(chat template "
        r"and instruction\) alone is \d+ tokens; give at least \d+",
    ):
        run_bench(**kw, context_tokens=[20], out_dir=tmp_path / "c")
    with pytest.raises(
        BenchConfigError,
        match="^--num-prompts 165 exceeds the 164 HumanEval problems the prompts of "
        "the long-context workload ctx256 begin with$",
    ):
        run_bench(**dict(kw, num_prompts=165), context_tokens=[256], out_dir=tmp_path / "d")
    for name in ("a", "b", "c", "d"):
        assert not (tmp_path / name / "requests.jsonl").exists()
    with pytest.raises(BenchConfigError, match="no data sets given"):
        run_bench(**kw, out_dir=None)
