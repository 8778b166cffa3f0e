"""`swiftspec bench --merge`: several finished bench runs combined into one result.

The parts are built the way a run builds its document (rows from ``runner.make_row``, the
configuration blocks from ``runner.configs_block``, the document from ``report.build_document``)
with made-up measurements, so no model is loaded. The reference for a merge is the same rows
measured in one run: merging the parts must give the same speedups, output checks and
aggregates.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest

from swiftspec.bench.api import merge_bench, merge_documents, read_part
from swiftspec.bench.config import BenchConfigError, parse_config
from swiftspec.bench.long_context import context_tokens_of, context_workloads
from swiftspec.bench.report import build_document, write_json
from swiftspec.bench.runner import PromptItem, configs_block, make_row
from swiftspec.bench.schema import consistency_problems, validate

NEW = 8
PROMPTS = 2
DATASETS = ("humaneval", "mtbench")
ALL_CONFIGS = ("target", "serial:tree16", "hf:target", "hf:assisted")
#: Decode seconds per configuration: 7 decode tokens each, so TPOT = decode_s / 7.
DECODE_S = {
    "target": 0.7,
    "serial:tree16": 0.35,
    "hf:target": 1.4,
    "hf:assisted": 0.7,
    "llamacpp:target": 0.56,
    "llamacpp:assisted": 0.7,
}


def _tokens(dataset: str, index: int, config: str) -> list[int]:
    ids = [10 * index + k + (100 if dataset == "mtbench" else 0) for k in range(NEW)]
    if (dataset, index, config) == ("mtbench", 1, "hf:target"):
        ids[3] = 999  # HF target-only differs from swiftspec target-only here (implementation)
    if (dataset, index, config) == ("humaneval", 1, "hf:assisted"):
        ids[5] = 998  # HF assisted differs from HF target-only here (peer)
    return ids


def _row(dataset: str, index: int, config: str, tokens: list[int] | None = None) -> dict:
    c = parse_config(config, "cuda")
    ids = tokens if tokens is not None else _tokens(dataset, index, config)
    steps = 2 if c.speculative else len(ids) - 1
    n = context_tokens_of(dataset)  # a long-context workload's prompts have exactly its N tokens
    item = PromptItem(dataset, index, f"{dataset}/{index}", [], prompt_ids=list(range(n or 5 + index)))
    return make_row(
        item,
        c,
        dict(
            token_ids=ids,
            counted_tokens=len(ids),
            first_emission_tokens=1,
            finish_reason="length",
            ttft_s=0.01,
            decode_s=DECODE_S[config],
            verification_steps=steps,
            draft_steps=6 if c.speculative else None,
            acceptance_length=(len(ids) - 1) / steps,
            target_time_s=None,
            draft_time_s=None,
            wall_s=0.02,
        ),
    )


def _machine(gpus=("NVIDIA H200",)) -> dict:
    return {
        "hostname": "box",
        "os": "Linux 6",
        "cpu": {"model": "Xeon", "logical_cpus": 16, "usable_cpus": 16},
        "memory_gib": 128.0,
        "gpus": [{"name": g, "memory_mib": 143771} for g in gpus],
        "software": {},
        "load_average_start": [0.1, 0.1, 0.1],
    }


def _doc(
    configs,
    datasets,
    *,
    rows=None,
    max_new=NEW,
    created="2026-11-30T10:00:00Z",
    wall=60.0,
    machine=None,
    command="swiftspec bench",
    hf_threads=None,
    sampling=None,
) -> dict:
    """A run's document, as run_bench builds it (made-up measurements). ``sampling``: a sampled
    run's sampling block; without it the settings have no sampling block (as before sampled
    decoding existed)."""
    parsed = [parse_config(c, "cuda") for c in configs]
    if rows is None:
        rows = [_row(ds, i, c) for ds in datasets for i in range(PROMPTS) for c in configs]
    hf = {"cuda": {"dtype": "bfloat16", "torch_threads": hf_threads}} if any(c.engine == "hf" for c in parsed) else None
    settings = {
        "datasets": list(datasets),
        "num_prompts": PROMPTS,
        "max_new_tokens": max_new,
        "backend": "cuda",
        "dtype": "bfloat16",
        "threads": 0,
        "warmup": 1,
        "target": "tgt",
        "draft": "drf",
        "target_checkpoint": "/nonexistent/tgt",
        "draft_checkpoint": "/nonexistent/drf",
        "max_context": 4096 if any(c.engine == "swiftspec" for c in parsed) else None,
        "hf": hf,
        "prompt_format": "chat",
        "decoding": "sampled" if sampling else "greedy",
        "context_tokens": context_workloads(datasets),
    }
    if sampling:
        settings["sampling"] = dict(sampling)
    doc = build_document(
        created=created,
        command=command,
        commit={"sha": "abc", "short": "abc", "branch": "main", "dirty": False, "dirty_files": []},
        machine=machine or _machine(),
        settings=settings,
        configs=configs_block(parsed, {c.name: ("ok", None) for c in parsed}),
        rows=rows,
        wall_time_s=wall,
        load_average_end=[1.0, 1.0, 1.0],
    )
    validate(doc)
    assert consistency_problems(doc) == []
    return doc


def _write(folder, doc):
    folder.mkdir(parents=True)
    write_json(doc, folder / "bench.json")
    return folder


def _three_parts(tmp_path):
    """Ours (swiftspec, both data sets) and the HF peers as one part per data set."""
    return [
        _write(tmp_path / "ours", _doc(["target", "serial:tree16"], DATASETS, wall=100.0)),
        _write(
            tmp_path / "peers-humaneval",
            _doc(["hf:target", "hf:assisted"], ["humaneval"], hf_threads=8, created="2026-11-30T10:01:00Z", wall=200.0),
        ),
        _write(
            tmp_path / "peers-mtbench",
            _doc(["hf:target", "hf:assisted"], ["mtbench"], hf_threads=8, created="2026-11-30T10:00:30Z", wall=30.0),
        ),
    ]


def test_merge_equals_one_run(tmp_path):
    parts = _three_parts(tmp_path)
    out = tmp_path / "merged"
    doc = merge_bench(parts, out, plots=False, command="swiftspec bench --merge x --out y")
    single = _doc(ALL_CONFIGS, DATASETS)
    assert len(doc["requests"]) == 2 * 2 * 4
    assert doc["requests"] == single["requests"]  # same rows, speedups, checks, in a run's order
    assert doc["configs"] == single["configs"]
    assert doc["aggregates"] == single["aggregates"]
    assert doc["divergences"] == single["divergences"]
    kinds = sorted((d["kind"], d["dataset"], d["prompt_index"], d["position"]) for d in doc["divergences"])
    # hf:target's changed token also makes hf:assisted (which kept the swiftspec tokens) differ from it
    assert kinds == [("implementation", "mtbench", 1, 3), ("peer", "humaneval", 1, 5), ("peer", "mtbench", 1, 3)]
    hf_target = {c["name"]: c for c in doc["configs"]}["hf:target"]
    assert hf_target["reference"] == "target"  # its reference was measured in another part
    # provenance: created = the earliest start; wall time = first start to last end (10:01:00 + 200 s)
    assert doc["created"] == "2026-11-30T10:00:00Z" and doc["wall_time_s"] == 260.0
    assert [p["folder"] for p in doc["merge"]["parts"]] == [str(p) for p in parts]
    assert doc["merge"]["parts"][1]["configs"] == ["hf:target", "hf:assisted"]
    assert doc["merge"]["parts"][2]["datasets"] == ["mtbench"] and doc["merge"]["parts"][0]["wall_time_s"] == 100.0
    assert doc["command"] == "swiftspec bench --merge x --out y"
    s = doc["settings"]
    assert (
        s["datasets"] == ["humaneval", "mtbench"] and s["max_context"] == 4096 and s["hf"]["cuda"]["torch_threads"] == 8
    )
    on_disk = json.loads((out / "bench.json").read_text())
    validate(on_disk)
    assert consistency_problems(on_disk) == []
    assert on_disk == json.loads(json.dumps(doc))
    jsonl = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(jsonl) == 16 and all(r["speedup"] is None for r in jsonl)  # as a run writes them
    md = (out / "bench.md").read_text()
    assert "merged from 3 runs" in md and "`" + str(parts[1]) + "`: humaneval; hf:target, hf:assisted" in md
    assert "- HF target-only vs swiftspec target-only (different kernels): 1 divergence(s)" in md
    assert "- HF assisted vs HF target-only: 2 divergence(s)" in md


def test_speedup_and_lossless_check_against_a_baseline_in_another_part(tmp_path):
    bad = _tokens("mtbench", 0, "serial:tree16")
    bad[6] = 777
    spec_rows = [
        _row(ds, i, "serial:tree16", bad if (ds, i) == ("mtbench", 0) else None)
        for ds in DATASETS
        for i in range(PROMPTS)
    ]
    spec = _doc(["serial:tree16"], DATASETS, rows=spec_rows)
    assert all(r["speedup"] is None for r in spec["requests"])  # alone: no baseline
    parts = [(tmp_path / "a", _doc(["target"], DATASETS)), (tmp_path / "b", spec)]
    doc = merge_documents(parts, command="merge")
    cfg = {c["name"]: c for c in doc["configs"]}["serial:tree16"]
    assert cfg["baseline"] == "target" and cfg["reference"] == "target"
    rows = [r for r in doc["requests"] if r["config"] == "serial:tree16"]
    assert [r["speedup"] for r in rows] == pytest.approx([2.0] * 4)  # TPOT 0.1 s / 0.05 s
    assert [r["matches_reference"] for r in rows] == [True, True, False, True]
    assert [(d["kind"], d["dataset"], d["prompt_index"], d["position"], d["token"]) for d in doc["divergences"]] == [
        ("lossless", "mtbench", 0, 6, 777)
    ]
    agg = {(a["dataset"], a["config"]): a for a in doc["aggregates"]}
    assert agg[("all", "serial:tree16")]["speedup"]["mean"] == pytest.approx(2.0)
    assert agg[("all", "serial:tree16")]["outputs_checked"] == 4 and agg[("all", "serial:tree16")]["divergences"] == 1
    validate(doc)
    assert consistency_problems(doc) == []


def test_consistency_of_a_merge_counts_rows_per_part(tmp_path):
    parts = [(tmp_path / "a", _doc(["target"], DATASETS)), (tmp_path / "b", _doc(["hf:target"], ["humaneval"]))]
    doc = merge_documents(parts, command="merge")
    assert consistency_problems(doc) == []  # hf:target ran only on humaneval: no mtbench rows expected
    doc["requests"] = [
        r
        for r in doc["requests"]
        if (r["dataset"], r["config"]) != ("humaneval", "hf:target") or r["prompt_index"] != 0
    ]
    assert consistency_problems(doc) == ["humaneval hf:target: 1 rows, expected 2"]


def test_merge_of_a_merge_keeps_the_original_parts(tmp_path):
    a, b, c = _three_parts(tmp_path)
    first = tmp_path / "first"
    merge_bench([a, b], first, plots=False)
    doc = merge_bench([first, c], tmp_path / "second", plots=False)
    assert [p["folder"] for p in doc["merge"]["parts"]] == [str(a), str(b), str(c)]
    assert doc["aggregates"] == _doc(ALL_CONFIGS, DATASETS)["aggregates"]


def test_mismatched_max_new_tokens_is_named(tmp_path):
    a = _write(tmp_path / "a", _doc(["target"], DATASETS))
    b = _write(tmp_path / "b", _doc(["hf:target"], DATASETS, max_new=16))
    with pytest.raises(BenchConfigError) as e:
        merge_bench([a, b], tmp_path / "out", plots=False)
    assert str(e.value) == (
        f"--merge: the parts disagree on max_new_tokens: 8 in {a}, 16 in {b}; "
        "merge only runs with the same max_new_tokens"
    )
    assert not (tmp_path / "out").exists()


def test_duplicate_row_is_named(tmp_path):
    a = _write(tmp_path / "a", _doc(["target", "serial:tree16"], DATASETS))
    b = _write(tmp_path / "b", _doc(["target", "hf:target"], ["mtbench"]))
    with pytest.raises(
        BenchConfigError, match=rf"mtbench\[0\] target is measured in both {re.escape(str(a))} and {re.escape(str(b))};"
    ):
        merge_bench([a, b], tmp_path / "out", plots=False)


def test_other_machine_is_named(tmp_path):
    a = _write(tmp_path / "a", _doc(["target"], DATASETS))
    b = _write(tmp_path / "b", _doc(["hf:target"], DATASETS, machine=_machine(("NVIDIA H100",))))
    with pytest.raises(
        BenchConfigError,
        match=rf"different machines: GPUs .*H200.* in {re.escape(str(a))}, .*H100.* in {re.escape(str(b))};",
    ):
        merge_bench([a, b], tmp_path / "out", plots=False)


def test_missing_invalid_and_interrupted_parts(tmp_path):
    good = _write(tmp_path / "good", _doc(["target"], DATASETS))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BenchConfigError, match=rf"^--merge: {re.escape(str(empty))} has no bench.json \("):
        merge_bench([good, empty], tmp_path / "out", plots=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bench.json").write_text('{"kind": "swiftspec-bench",')
    with pytest.raises(BenchConfigError, match=rf"^--merge: {re.escape(str(broken))}/bench.json is not valid JSON"):
        merge_bench([good, broken], tmp_path / "out", plots=False)
    partial = _doc(["hf:target"], DATASETS)
    partial["interrupted"] = True
    stopped = _write(tmp_path / "stopped", partial)
    with pytest.raises(BenchConfigError, match=rf"^--merge: {re.escape(str(stopped))} holds an interrupted run"):
        merge_bench([good, stopped], tmp_path / "out", plots=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "edit,needle",
    [
        # Python's json reads NaN / Infinity; a run never writes them, and the merged file was not JSON
        (
            lambda d: d["requests"][1].__setitem__("ttft_s", float("nan")),
            "has NaN at requests/1/ttft_s; a bench result holds finite numbers only (an edited file?)",
        ),
        (
            lambda d: d["machine"]["cpu"].__setitem__("logical_cpus", float("-inf")),
            "has -Infinity at machine/cpu/logical_cpus; a bench result holds finite numbers only (an edited file?)",
        ),
        # datetime overflow (an OverflowError traceback before)
        (
            lambda d: d.__setitem__("wall_time_s", 1e300),
            "records wall_time_s 1e+300 from created "
            "'2026-11-30T10:00:00Z': the run would end after the year 9999 (an edited file?)",
        ),
        (
            lambda d: d.__setitem__("created", "9999-12-31T23:59:59Z"),
            "records wall_time_s 60.0 from created "
            "'9999-12-31T23:59:59Z': the run would end after the year 9999 (an edited file?)",
        ),
        # values nested deeper than a run writes: copying / writing the merge overflowed Python's recursion
        (
            lambda d: d["settings"].__setitem__("prompt_format", json.loads("[" * 600 + "]" * 600)),
            "has values nested more than 32 levels deep under settings/prompt_format (an edited file?)",
        ),
        # finite but beyond any measurement: the aggregates' sums overflowed into Infinity (bench.json then
        # held it, not JSON) and a tiny TPOT's speedup did too
        (
            lambda d: d["requests"][1].__setitem__("ttft_s", 1e308),
            "does not match the bench schema at "
            "requests/1/ttft_s: 1e+308 is greater than the maximum of 1000000000000.0",
        ),
        (
            lambda d: d["requests"][2].__setitem__("tpot_s", 1e-300),
            "does not match the bench schema at requests/2/tpot_s: 1e-300 is less than the minimum of 1e-12",
        ),
        # one part listing a row twice was 'measured in both b and b'
        (
            lambda d: d["requests"].append(copy.deepcopy(d["requests"][0])),
            "has two rows humaneval[0] hf:target (an edited file?)",
        ),
    ],
)
def test_hand_edited_part_is_one_line_naming_it(tmp_path, capsys, edit, needle):
    a = _write(tmp_path / "a", _doc(["target"], DATASETS))
    doc = _doc(["hf:target"], DATASETS)
    edit(doc)
    b = _write(tmp_path / "b", doc)
    rc, cap = _cli(["--merge", f"{a},{b}", "--out", str(tmp_path / "m"), "--no-plots"], capsys)
    err = [line for line in cap.err.strip().splitlines() if not line.startswith("[bench]")]
    assert rc == 2 and len(err) == 1, cap.err
    assert err[0] in (
        f"swiftspec bench: error: --merge: {b} {needle}",
        f"swiftspec bench: error: --merge: {b}/bench.json {needle}",
    ), err[0]
    assert not (tmp_path / "m").exists()


def test_wall_times_that_would_overflow_their_sum_are_named(tmp_path):
    """Parts whose created is not a run's timestamp have their wall times added: two finite 1e308s
    made the merged wall_time_s Infinity (written into bench.json, not JSON)."""
    docs = []
    for configs in (["target"], ["hf:target"]):
        d = _doc(configs, DATASETS)
        d["created"], d["wall_time_s"] = "yesterday", 1e308
        docs.append(d)
    a, b = _write(tmp_path / "a", docs[0]), _write(tmp_path / "b", docs[1])
    with pytest.raises(BenchConfigError) as e:
        merge_bench([a, b], tmp_path / "out", plots=False)
    assert str(e.value) == (
        f"--merge: {a} records wall_time_s 1e+308, beyond any run (at most 1e+12 s; an edited file?)"
    )
    assert not (tmp_path / "out").exists()
    docs[0]["wall_time_s"] = docs[1]["wall_time_s"] = 30.0  # the sum, when it is a run's
    c, d = _write(tmp_path / "c", docs[0]), _write(tmp_path / "d", docs[1])
    assert merge_bench([c, d], tmp_path / "out", plots=False)["wall_time_s"] == 60.0


def test_deeply_nested_or_unwritable_is_one_line(tmp_path, capsys):
    a = _write(tmp_path / "a", _doc(["target"], DATASETS))
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "bench.json").write_text("[" * 100000)  # RecursionError traceback before
    rc, cap = _cli(["--merge", f"{a},{deep}", "--out", str(tmp_path / "m")], capsys)
    assert rc == 2 and cap.err.strip().splitlines()[-1] == (
        f"swiftspec bench: error: --merge: {deep}/bench.json is not a bench result (nested too deeply to read)"
    )
    b = _write(tmp_path / "b", _doc(["hf:target"], DATASETS))
    out = a / "bench.json" / "merged"  # below a file: a NotADirectoryError traceback before
    rc, cap = _cli(["--merge", f"{a},{b}", "--out", str(out), "--no-plots"], capsys)
    assert rc == 2 and cap.err.strip().splitlines()[-1] == (
        f"swiftspec bench: error: --out {out}: cannot create the folder (Not a directory)"
    )


def test_one_folder_named_twice_through_a_symlink_or_relative_path(tmp_path, monkeypatch):
    a = _write(tmp_path / "a", _doc(["target"], DATASETS))
    (tmp_path / "link").symlink_to(a)
    monkeypatch.chdir(tmp_path)
    for other in ("link", "./a/", str(a)):
        with pytest.raises(BenchConfigError, match=rf"^--merge names {re.escape(str(Path(other)))} twice$"):
            merge_bench(["a", other], "out", plots=False)
    with pytest.raises(BenchConfigError, match=r"^--out link is one of the --merge folders; give a new folder$"):
        merge_bench(["a", _write(tmp_path / "b", _doc(["hf:target"], DATASETS))], "link", plots=False)
    # a symlink loop, as a part or as --out: a RuntimeError traceback from Path.resolve before
    # (Python 3.13's resolve() no longer raises on a loop: the part is then 'not a folder')
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    with pytest.raises(BenchConfigError) as e:
        merge_bench(["l1", "a"], "out", plots=False)
    assert "\n" not in str(e.value) and "l1" in str(e.value)  # one line naming the path, on every Python
    if sys.version_info >= (3, 13):
        return
    assert str(e.value).startswith("--merge l1: cannot resolve the path (Symlink loop from ")
    with pytest.raises(BenchConfigError) as e:
        merge_bench(["a", "b"], "l1", plots=False)
    assert str(e.value).startswith("--out l1: cannot resolve the path (Symlink loop from ")


def test_out_must_be_new(tmp_path):
    a, b, c = _three_parts(tmp_path)
    with pytest.raises(BenchConfigError, match=r"holds the results of an earlier run \(bench.json\): give another"):
        merge_bench([a, b], c, plots=False)
    with pytest.raises(BenchConfigError, match=r"is one of the --merge folders"):
        merge_bench([a, b], a, plots=False)
    with pytest.raises(BenchConfigError, match=r"names .* twice"):
        merge_bench([a, a], tmp_path / "out", plots=False)


def _cli(argv, capsys):
    from swiftspec.cli import main

    rc = main(["bench", *argv])
    return rc, capsys.readouterr()


def test_cli_merge_writes_the_result(tmp_path, capsys):
    parts = _three_parts(tmp_path)
    out = tmp_path / "merged"
    rc, cap = _cli(["--merge", ",".join(map(str, parts)), "--out", str(out)], capsys)
    assert rc == 0, cap.err
    assert "## all" in cap.out
    for name in ("bench.json", "bench.md", "requests.jsonl", "tokens_per_s.png", "speedup.png"):
        assert (out / name).stat().st_size > 0, name


def test_cli_merge_exits_1_on_a_lossless_divergence(tmp_path, capsys):
    bad = _tokens("humaneval", 1, "serial:tree16")
    bad[2] = 5
    rows = [
        _row(ds, i, "serial:tree16", bad if (ds, i) == ("humaneval", 1) else None)
        for ds in DATASETS
        for i in range(PROMPTS)
    ]
    a = _write(tmp_path / "a", _doc(["target"], DATASETS))
    b = _write(tmp_path / "b", _doc(["serial:tree16"], DATASETS, rows=rows))
    rc, cap = _cli(["--merge", f"{a},{b}", "--out", str(tmp_path / "m"), "--no-plots"], capsys)
    assert rc == 1
    assert (
        "1 speculative output(s) differ from target-only decoding; first: humaneval humaneval/1 serial:tree16 "
        "at token 2" in cap.err
    )


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--configs", "target"], "it takes no run options (got --configs)"),
        (["--datasets", "mtbench", "--resume"], "(got --datasets, --resume)"),
        ([], "--merge needs --out"),
    ],
)
def test_cli_merge_bad_input_exits_2_with_one_line(tmp_path, capsys, extra, needle):
    a, b, _ = _three_parts(tmp_path)
    out = [] if needle.startswith("--merge needs --out") else ["--out", str(tmp_path / "m")]
    rc, cap = _cli(["--merge", f"{a},{b}", *out, *extra], capsys)
    err = cap.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "m").exists()


def test_cli_merge_of_a_missing_part_exits_2(tmp_path, capsys):
    a, _, _ = _three_parts(tmp_path)
    rc, cap = _cli(["--merge", f"{a},{tmp_path / 'nope'}", "--out", str(tmp_path / "m")], capsys)
    err = [line for line in cap.err.strip().splitlines() if not line.startswith("[bench]")]
    assert rc == 2 and err == [f"swiftspec bench: error: --merge: {tmp_path / 'nope'} is not a folder"]


def test_a_config_recorded_differently_is_named(tmp_path):
    a = _doc(["target", "hf:target"], ["humaneval"])
    b = _doc(["hf:assisted"], ["mtbench"])
    b = copy.deepcopy(b)
    b["configs"][0]["backend"] = "cpu"  # an older bench recorded the HF peers' backend wrongly
    with pytest.raises(
        BenchConfigError,
        match=r"configuration hf:assisted in .*b records backend='cpu', but the "
        r"name parses to backend='cuda'",
    ):
        merge_documents([(tmp_path / "a", a), (tmp_path / "b", b)], command="merge")


def test_megakernel_target_differences_are_implementation_not_lossless(tmp_path):
    """target:mk (the decode megakernel) against plain target-only is two kernels of one model
    (another summation order): its differences are informational, while a speculative run's are
    broken losslessness (the CLI's exit 1)."""
    from swiftspec.bench.report import markdown

    DECODE_S["target:mk"] = 0.5
    try:
        rows = []
        for ds in DATASETS:
            for i in range(PROMPTS):
                for c in ("target", "target:mk", "serial:tree16"):
                    ids = _tokens(ds, i, c)
                    if (ds, i, c) in (("humaneval", 0, "target:mk"), ("mtbench", 1, "serial:tree16")):
                        ids[4] = 777
                    rows.append(_row(ds, i, c, ids))
        doc = _doc(["target", "target:mk", "serial:tree16"], DATASETS, rows=rows)
    finally:
        del DECODE_S["target:mk"]
    kinds = sorted((d["kind"], d["config"], d["dataset"]) for d in doc["divergences"])
    assert kinds == [("implementation", "target:mk", "humaneval"), ("lossless", "serial:tree16", "mtbench")]
    text = markdown(doc)
    assert "swiftspec speculation vs swiftspec target-only (must be identical): 1 divergence(s)" in text
    assert (
        "target:mk / auto:...:mk (target-only steps on the decode megakernel) vs swiftspec target-only" in text
        and "order: near-ties may resolve the other way): 1 divergence(s)" in text
    )


def test_auto_megakernel_differences_are_implementation_not_lossless():
    """auto:...:mk runs its target-only rounds on the decode megakernel: against the layered
    target its differences are two kernels' (near-ties), not broken losslessness; plain auto's are."""
    from swiftspec.bench.config import parse_config
    from swiftspec.bench.report import _divergence_kind

    target = parse_config("target", "cuda").to_dict()
    assert _divergence_kind(parse_config("auto:tree16:mk", "cuda").to_dict(), target) == "implementation"
    assert _divergence_kind(parse_config("auto:tree16", "cuda").to_dict(), target) == "lossless"
    assert _divergence_kind(parse_config("async:tree16:dmk", "cuda").to_dict(), target) == "lossless"


# ------------------------------------------------------------------ sampled decoding
SAMPLED = {"temperature": 0.7, "top_p": 0.95, "top_k": 0, "seed": 3}


def _differing_spec_rows():
    """serial:tree16 rows that differ from target-only on one request (a lossless divergence
    under greedy decoding; expected under sampled decoding)."""
    bad = _tokens("humaneval", 1, "serial:tree16")
    bad[2] = 5
    return [
        _row(ds, i, "serial:tree16", bad if (ds, i) == ("humaneval", 1) else None)
        for ds in DATASETS
        for i in range(PROMPTS)
    ]


def test_merge_of_sampled_parts_compares_no_outputs_and_exits_0(tmp_path, capsys):
    """The parts of test_cli_merge_exits_1_on_a_lossless_divergence, sampled: speedups across
    the parts as under greedy decoding, no output compared per request, exit 0, and bench.md says
    why."""
    a = _write(tmp_path / "a", _doc(["target"], DATASETS, sampling=SAMPLED))
    b = _write(tmp_path / "b", _doc(["serial:tree16"], DATASETS, rows=_differing_spec_rows(), sampling=SAMPLED))
    out = tmp_path / "m"
    rc, cap = _cli(["--merge", f"{a},{b}", "--out", str(out), "--no-plots"], capsys)
    assert rc == 0, cap.err
    doc = json.loads((out / "bench.json").read_text())
    validate(doc)
    assert consistency_problems(doc) == []
    assert doc["settings"]["decoding"] == "sampled" and doc["settings"]["sampling"] == SAMPLED
    assert doc["divergences"] == []
    spec = [r for r in doc["requests"] if r["config"] == "serial:tree16"]
    assert [r["matches_reference"] for r in spec] == [None] * 4
    assert [r["speedup"] for r in spec] == pytest.approx([2.0] * 4)  # TPOT 0.1 s / 0.05 s, across the parts
    assert all(a["outputs_checked"] == 0 for a in doc["aggregates"])
    md = (out / "bench.md").read_text()
    assert "- decoding: sampled (temperature 0.7, top-p 0.95, top-k off, seed 3 + prompt index)" in md
    assert "- not made: sampled decoding: outputs are compared in distribution by tests, not per request" in md
    assert "outputs equal" not in md and "divergence(s)" not in md
    doc["requests"][1]["matches_reference"] = False  # a sampled document claiming a per-request check
    assert consistency_problems(doc) == [
        "sampled decoding, yet outputs were compared per request (1 rows with "
        "matches_reference, 0 checked, 0 divergences)"
    ]


def test_merge_refuses_a_sampled_and_a_greedy_part(tmp_path):
    a = _write(tmp_path / "a", _doc(["target"], DATASETS))  # greedy, no sampling block (an older document)
    b = _write(tmp_path / "b", _doc(["serial:tree16"], DATASETS, sampling=SAMPLED))
    with pytest.raises(BenchConfigError) as e:
        merge_bench([a, b], tmp_path / "out", plots=False)
    assert str(e.value) == (
        f"--merge: the parts disagree on decoding: 'greedy' in {a}, 'sampled' in {b}; "
        "merge only runs with the same decoding"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field,other", [("temperature", 1.0), ("top_p", 1.0), ("top_k", 20), ("seed", 4)])
def test_merge_refuses_parts_of_other_sampling_settings(tmp_path, field, other):
    a = _write(tmp_path / "a", _doc(["target"], DATASETS, sampling=SAMPLED))
    b = _write(tmp_path / "b", _doc(["serial:tree16"], DATASETS, sampling={**SAMPLED, field: other}))
    with pytest.raises(BenchConfigError) as e:
        merge_documents([(a, read_part(a)), (b, read_part(b))], command="merge")
    assert str(e.value) == (
        f"--merge: the parts disagree on sampling.{field}: {SAMPLED[field]!r} in {a}, "
        f"{other!r} in {b}; merge only runs with the same sampling.{field}"
    )


def _with_settings(doc: dict, **settings) -> dict:
    doc["settings"].update(settings)
    return doc


def test_merge_refuses_parts_of_another_warmup(tmp_path):
    """A part without warm-up measured each configuration's first request cold: it merged quietly."""
    a = _write(tmp_path / "a", _doc(["target"], DATASETS))
    b = _write(tmp_path / "b", _with_settings(_doc(["hf:target"], DATASETS), warmup=0))
    with pytest.raises(BenchConfigError) as e:
        merge_bench([a, b], tmp_path / "out", plots=False)
    assert (
        str(e.value)
        == f"--merge: the parts disagree on warmup: 1 in {a}, 0 in {b}; merge only runs with the same warmup"
    )
    assert not (tmp_path / "out").exists()


def test_merge_refuses_swiftspec_parts_of_other_threads_but_not_a_peers_only_part(tmp_path):
    """swiftspec's threads per model change its times: two parts measuring swiftspec with 2 and 4
    threads merged quietly (a speedup across them mixed the two). A part of the HF peers alone
    records the default threads, which ran nothing: it may differ."""
    a = _write(tmp_path / "a", _with_settings(_doc(["target"], DATASETS), threads=2))
    b = _write(tmp_path / "b", _with_settings(_doc(["serial:tree16"], DATASETS), threads=4))
    with pytest.raises(BenchConfigError) as e:
        merge_bench([a, b], tmp_path / "out", plots=False)
    assert (
        str(e.value)
        == f"--merge: the parts disagree on threads: 2 in {a}, 4 in {b}; merge only runs with the same threads"
    )
    peers = _write(tmp_path / "peers", _with_settings(_doc(["hf:target"], DATASETS), threads=0))
    doc = merge_bench([a, peers], tmp_path / "out", plots=False)
    assert doc["settings"]["threads"] == 2


def test_merge_refuses_hf_peer_parts_of_other_peer_settings(tmp_path):
    """The HF peers' torch threads or library versions change their times: parts of the peers with
    8 and 4 torch threads merged quietly (the first part's block was recorded for both)."""
    ours = _write(tmp_path / "ours", _doc(["target", "serial:tree16"], DATASETS))
    he = _write(tmp_path / "he", _doc(["hf:target", "hf:assisted"], ["humaneval"], hf_threads=8))
    mt = _write(tmp_path / "mt", _doc(["hf:target", "hf:assisted"], ["mtbench"], hf_threads=4))
    with pytest.raises(BenchConfigError) as e:
        merge_bench([ours, he, mt], tmp_path / "out", plots=False)
    assert str(e.value) == (
        f"--merge: the parts disagree on hf.cuda.torch_threads: 8 in {he}, 4 in {mt}; merge only "
        "runs with the same hf.cuda.torch_threads"
    )
    newer = _doc(["hf:target", "hf:assisted"], ["mtbench"], hf_threads=8)
    newer["settings"]["hf"]["cuda"]["transformers"] = "4.99.0"
    with pytest.raises(BenchConfigError, match=r"disagree on hf\.cuda\.transformers: None in .*he, '4\.99\.0' in "):
        merge_bench([ours, he, _write(tmp_path / "newer", newer)], tmp_path / "out", plots=False)
    same = _write(tmp_path / "same", _doc(["hf:target", "hf:assisted"], ["mtbench"], hf_threads=8))
    doc = merge_bench([ours, he, same], tmp_path / "out", plots=False)
    assert doc["settings"]["hf"] == {"cuda": {"dtype": "bfloat16", "torch_threads": 8}}


def test_merge_of_long_context_parts_equals_one_run(tmp_path):
    """Long-context workloads measured in parts (one N per part, the peers in a third) merge as if they
    were one run: the data sets and settings.context_tokens are the union, speedups, output checks and
    aggregates (prefill tokens/s among them) are those of the single run; bench.md has the Long context
    table per N."""
    parts = [
        _write(tmp_path / "ctx256", _doc(["target", "serial:tree16"], ["ctx256"])),
        _write(tmp_path / "ctx4096", _doc(["target", "serial:tree16"], ["ctx4096"])),
        _write(tmp_path / "peers", _doc(["hf:target", "hf:assisted"], ["ctx256", "ctx4096"], hf_threads=8)),
    ]
    doc = merge_bench(parts, tmp_path / "merged", plots=True, command="merge")
    single = _doc(ALL_CONFIGS, ["ctx256", "ctx4096"])
    assert doc["settings"]["datasets"] == ["ctx256", "ctx4096"] and doc["settings"]["context_tokens"] == [256, 4096]
    assert doc["requests"] == single["requests"] and doc["aggregates"] == single["aggregates"]
    aggs = {(a["dataset"], a["config"]): a for a in doc["aggregates"]}
    assert aggs[("ctx4096", "target")]["prefill_tokens_per_s"]["mean"] == pytest.approx(4096 / 0.01)
    assert aggs[("ctx4096", "serial:tree16")]["speedup"]["mean"] == pytest.approx(2.0)
    md = (tmp_path / "merged" / "bench.md").read_text()
    assert "## Long context" in md and "| 4096 | serial:tree16 | 2 |" in md and "| 256 | hf:assisted | 2 |" in md
    assert (tmp_path / "merged" / "context.png").stat().st_size > 0


def test_long_context_numbers_are_checked():
    """A long-context row whose prompt is not N tokens, a prefill rate that is not prompt tokens / TTFT,
    and settings.context_tokens that are not the workloads among the data sets are named."""
    doc = _doc(["target"], ["ctx256", "humaneval"])
    doc["requests"][0]["prompt_tokens"] = 255
    doc["requests"][0]["prefill_tokens_per_s"] = 255 / doc["requests"][0]["ttft_s"]
    doc["requests"][-1]["prefill_tokens_per_s"] *= 2
    doc["settings"]["context_tokens"] = [256, 512]
    problems = consistency_problems(doc)
    assert problems[:2] == [
        "humaneval[1] target: prefill tokens/s x TTFT = 12.000000, expected 6 prompt tokens",
        "settings.context_tokens [256, 512] are not the long-context workloads among the data "
        "sets ['ctx256', 'humaneval']",
    ]
    assert problems[2] == "ctx256[0] target: 255 prompt tokens, the workload's prompts have 256"


def _llamacpp_block(threads=16, unresolved=(0, 0), assisted=True) -> dict:
    return {
        "llama_cpp_python": "0.3.36",
        "backend": "cuda",
        "threads": threads,
        "gpu_layers": 99,
        "target_gguf": "/m/t.gguf",
        "draft_gguf": "/m/d.gguf" if assisted else None,
        "draft_n_max": 3 if assisted else None,
        "unresolved_pieces": {"target": unresolved[0], "assisted": unresolved[1]},
    }


def test_merge_of_llamacpp_peer_parts(tmp_path):
    """The llama.cpp peers measured in parts of their own: their speedups against llamacpp:target, their
    target-only output checked against swiftspec's target of another part; the settings block agreed on
    (threads) with the counts of inferred ids added up and the draft's fields from the part that ran it."""
    ours = _write(tmp_path / "ours", _doc(["target", "serial:tree16"], DATASETS))
    lc_doc = _doc(["llamacpp:target", "llamacpp:assisted"], ["humaneval"])
    lc_doc["settings"]["llamacpp"] = {"cuda": _llamacpp_block(unresolved=(1, 2))}
    lc = _write(tmp_path / "lc", lc_doc)
    lc2_doc = _doc(["llamacpp:target"], ["mtbench"])
    lc2_doc["settings"]["llamacpp"] = {"cuda": _llamacpp_block(unresolved=(3, 0), assisted=False)}
    lc2 = _write(tmp_path / "lc2", lc2_doc)
    doc = merge_bench([ours, lc, lc2], tmp_path / "out", plots=False)
    block = doc["settings"]["llamacpp"]["cuda"]
    assert block["unresolved_pieces"] == {"target": 4, "assisted": 2}
    assert (block["draft_gguf"], block["draft_n_max"], block["threads"]) == ("/m/d.gguf", 3, 16)
    configs = {c["name"]: c for c in doc["configs"]}
    assert configs["llamacpp:assisted"]["baseline"] == "llamacpp:target"
    assert configs["llamacpp:target"]["reference"] == "target"
    rows = {(r["dataset"], r["prompt_index"], r["config"]): r for r in doc["requests"]}
    assert rows[("humaneval", 0, "llamacpp:assisted")]["speedup"] == pytest.approx(0.56 / 0.7 * 7 / 7)
    assert rows[("mtbench", 0, "llamacpp:target")]["matches_reference"] is True
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "| llamacpp:target † | 4 |" in md and "llama.cpp peer on cuda †" in md
    other_doc = _doc(["llamacpp:target"], ["mtbench"])
    other_doc["settings"]["llamacpp"] = {"cuda": _llamacpp_block(threads=8, assisted=False)}
    other = _write(tmp_path / "other", other_doc)
    with pytest.raises(BenchConfigError) as e:
        merge_bench([ours, lc, other], tmp_path / "out2", plots=False)
    assert str(e.value) == (
        f"--merge: the parts disagree on llamacpp.cuda.threads: 16 in {lc}, 8 in {other}; merge only "
        "runs with the same llamacpp.cuda.threads"
    )
