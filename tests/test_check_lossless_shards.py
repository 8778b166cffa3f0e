"""tools/check_lossless.py run in shards (issues 3 and 4): the shards of a resumed run cover
every prompt the earlier records lack exactly once, and --merge writes one report from the
shards' records without loading a model (counting a differing output as a failure)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "check_lossless.py"
spec = importlib.util.spec_from_file_location("check_lossless", TOOL)
check_lossless = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_lossless)


def record(dataset, index, equal=True, acceptance=3.0):
    cfg = {
        "equal": equal,
        "first_difference": None if equal else 7,
        "new_tokens": 128,
        "acceptance_length": acceptance,
        "verification_steps": 40,
        "draft_steps": 120,
        "decode_s": 1.0,
        "target_s": 0.5,
        "draft_s": 0.5,
        "divergence": None,
    }
    return {
        "dataset": dataset,
        "index": index,
        "id": str(index),
        "prompt_tokens": 50,
        "reference_tokens": 128,
        "reference_finish": "length",
        "reference_from": "prefill",
        "target_only_decode_s": None,
        "configs": {"tree16": cfg},
    }


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_shards_cover_the_missing_prompts_once():
    prompts = [("mtbench", i, str(i), [1]) for i in range(80)] + [("humaneval", i, str(i), [1]) for i in range(40)]
    skip = {("mtbench", i): {} for i in range(77)}
    shards = [check_lossless.select_prompts(prompts, skip, k, 3) for k in range(3)]
    keys = [(p[0], p[1]) for s in shards for p in s]
    assert sorted(keys) == sorted((p[0], p[1]) for p in prompts[77:])
    assert len(set(keys)) == len(keys) == 43
    assert [len(s) for s in shards] == [15, 14, 14]


@pytest.mark.parametrize("text", ["3/2", "a/b", "1", "0/0"])
def test_bad_shard_is_rejected_naming_it(text):
    with pytest.raises(SystemExit, match=f"--shard '{text}'"):
        check_lossless.parse_shard(text)


def run_merge(tmp_path, *files):
    out = tmp_path / "merged"
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--mode",
            "async",
            "--configs",
            "tree16:16:8:2",
            "--dtype",
            "bfloat16",
            "--merge",
            *map(str, files),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    return proc, out


def test_merge_reports_all_records_in_prompt_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [record("mtbench", i, acceptance=2.0) for i in range(3)])
    b = write_jsonl(
        tmp_path / "b.jsonl", [record("humaneval", 1, acceptance=5.0), record("mtbench", 3, acceptance=2.0)]
    )
    proc, out = run_merge(tmp_path, b, a)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.with_suffix(".json").read_text())
    assert [(r["dataset"], r["index"]) for r in result["records"]] == [
        ("mtbench", 0),
        ("mtbench", 1),
        ("mtbench", 2),
        ("mtbench", 3),
        ("humaneval", 1),
    ]
    assert result["summary"]["tree16"]["equal"] == 5 and result["summary"]["tree16"]["total"] == 5
    assert result["summary"]["tree16"]["mean_acceptance_length"] == pytest.approx(13.0 / 5)
    assert "| tree16 | 16 | 8 | 2 | 5/5 | 2.60 |" in out.with_suffix(".md").read_text()


def test_merge_fails_on_a_differing_output(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [record("mtbench", 0), record("mtbench", 1, equal=False)])
    proc, out = run_merge(tmp_path, a)
    assert proc.returncode == 1
    assert "mtbench#1@7" in out.with_suffix(".md").read_text()


def test_merge_rejects_records_of_another_mode(tmp_path):
    rec = record("mtbench", 0)
    rec["configs"] = {"serial:tree16": rec["configs"]["tree16"]}
    proc, _ = run_merge(tmp_path, write_jsonl(tmp_path / "a.jsonl", [rec]))
    assert proc.returncode != 0 and "no result for 'tree16'" in proc.stderr


def test_merge_refuses_records_of_other_settings(tmp_path):
    rec = record("mtbench", 0)
    rec["settings"] = {
        "mode": "async",
        "configs": "tree16:16:8:2",
        "backend": "cpu",
        "dtype": "float32",
        "target_tp": 1,
        "max_new_tokens": 128,
    }
    proc, _ = run_merge(tmp_path, write_jsonl(tmp_path / "a.jsonl", [rec]))
    assert (
        proc.returncode != 0
        and "mtbench#0 was checked with dtype='float32', this --merge says 'bfloat16'" in proc.stderr
    )


def test_merge_names_a_missing_or_broken_file(tmp_path):
    proc, _ = run_merge(tmp_path, tmp_path / "nope.jsonl")
    assert proc.returncode != 0 and "nope.jsonl does not exist" in proc.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    proc, _ = run_merge(tmp_path, bad)
    assert proc.returncode != 0 and "bad.jsonl:1 is not a check_lossless record" in proc.stderr


JOBS_SCRIPT = TOOL.parent / "lossless_cpu_jobs.sh"


@pytest.mark.parametrize(
    "env,message",
    [
        ({"LOSSLESS_JOBS": "1:async:x:2"}, "LOSSLESS_JOBS item '1:async:x:2' must be TP:MODES:SHARDS:CORES"),
        ({"LOSSLESS_JOBS": "1:async:2:64"}, "LOSSLESS_JOBS needs more than the"),
        ({"LOSSLESS_CORES": "100000"}, "LOSSLESS_CORES=100000 but only"),
    ],
)
def test_jobs_script_names_bad_settings(tmp_path, env, message):
    import os

    proc = subprocess.run(
        ["bash", str(JOBS_SCRIPT), "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "LOSSLESS_DIR": str(tmp_path), **env},
    )
    assert proc.returncode != 0 and message in proc.stdout + proc.stderr


def test_jobs_script_resume_folder_without_records_is_refused(tmp_path):
    import os

    proc = subprocess.run(
        ["bash", str(JOBS_SCRIPT), "start"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "LOSSLESS_DIR": str(tmp_path / "w"),
            "LOSSLESS_JOBS": "1:async:1:1",
            "LOSSLESS_RESUME_FROM": str(tmp_path),
        },
    )
    assert proc.returncode != 0 and f"LOSSLESS_RESUME_FROM={tmp_path} holds no lossless_cpu_tp*.jsonl" in proc.stdout


def test_merge_reports_the_megakernel_mode(tmp_path):
    """--mode megakernel (target-only decoding with the CUDA decode megakernel, key
    target:megakernel) is reported with its divergences and their top-2 logit gaps."""
    gap = {
        "top1": 5,
        "top2": 9,
        "top2_gap": 0.0625,
        "reference_token": 5,
        "speculative_token": 9,
        "reference_minus_speculative": 0.0625,
    }
    recs = []
    for i, equal in enumerate([True, False]):
        r = record("mtbench", i)
        cfg = r["configs"].pop("tree16")
        cfg.update(
            equal=equal, first_difference=None if equal else 3, divergence=None if equal else gap, acceptance_length=1.0
        )
        r["configs"]["target:megakernel"] = cfg
        recs.append(r)
    out = tmp_path / "mk"
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--mode",
            "megakernel",
            "--backend",
            "cuda",
            "--dtype",
            "bfloat16",
            "--merge",
            str(write_jsonl(tmp_path / "mk.jsonl", recs)),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr  # one output differs
    report = json.loads(out.with_suffix(".json").read_text())
    s = report["summary"]["target:megakernel"]
    assert (s["mode"], s["equal"], s["total"], s["tree_budget"]) == ("megakernel", 1, 2, None)
    assert s["divergences"][0]["position"] == 3
    assert "0.0625" in out.with_suffix(".md").read_text()


def test_megakernel_mode_needs_the_cuda_backend():
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--mode", "megakernel", "--merge", "x.jsonl"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--mode megakernel runs the CUDA decode megakernel" in proc.stderr
