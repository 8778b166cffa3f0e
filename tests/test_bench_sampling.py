"""`swiftspec bench --temperature/--top-p/--top-k/--seed`: sampled decoding in the harness.

Under sampling every configuration samples (swiftspec's speculative modes run lossless
speculative sampling, the HF peers ``do_sample=True``), the request of prompt index i with seed
S + i. Outputs are not compared per request (lossless in distribution, not per seed); the merge
tests for sampled parts are in tests/test_bench_merge.py.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from swiftspec.bench import run_bench
from swiftspec.bench.config import BenchConfigError, check_sampling
from swiftspec.bench.schema import SCHEMA, SCHEMA_VERSION, consistency_problems, validate

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
SMALL = "smollm2-135m-instruct"
REASON = "sampled decoding: outputs are compared in distribution by tests, not per request"


# -------------------------------------------------------------- no models needed
@pytest.mark.parametrize(
    "argv,message",
    [
        (["--temperature", "-0.5"], "--temperature must be a finite number >= 0 (0: greedy decoding), got -0.5"),
        (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0: greedy decoding), got nan"),
        (["--temperature", "inf"], "--temperature must be a finite number >= 0 (0: greedy decoding), got inf"),
        (["--temperature", "hot"], "--temperature must be a number, got 'hot'"),
        (["--temperature", "1", "--top-p", "0"], "--top-p must be a number in (0, 1] (1: off), got 0.0"),
        (["--temperature", "1", "--top-p", "1.5"], "--top-p must be a number in (0, 1] (1: off), got 1.5"),
        (["--temperature", "1", "--top-p", "nan"], "--top-p must be a number in (0, 1] (1: off), got nan"),
        (["--temperature", "1", "--top-k", "-1"], "--top-k must be an integer >= 0 (0: off), got -1"),
        (["--temperature", "1", "--top-k", "2.5"], "--top-k must be an integer, got '2.5'"),
        # beyond 32 bits: every swiftspec configuration was 'not available' at its first request (after loading)
        (
            ["--temperature", "1", "--top-k", str(2**31)],
            "--top-k must be at most 2147483647 (a 32-bit count; any top-k of "
            "at least the vocabulary keeps every token), got 2147483648",
        ),
        # below float32's smallest normal number: the runtime read 1e-50 as 0 (greedy) while the result said sampled,
        # and the HF peer's logits / T overflowed (RuntimeError: probability tensor contains inf / nan)
        (
            ["--temperature", "1e-40"],
            "--temperature must be 0 (greedy decoding) or at least 1.1754944e-38 (the runtime "
            "samples in float32), got 1e-40",
        ),
        (["--temperature", "1", "--seed", "-3"], "--seed must be an integer >= 0, got -3"),
        (
            ["--temperature", "1", "--num-prompts", "3", "--seed", str(2**64 - 2)],
            f"--seed must be at most {2**64 - 3} (request i of a data set samples with seed + i, a 64-bit seed), "
            f"got {2**64 - 2}",
        ),
        (
            ["--top-p", "0.9"],
            "--top-p 0.9 has no effect under greedy decoding (--temperature 0); give --temperature > 0 "
            "to sample, or drop it",
        ),
        (
            ["--temperature", "0", "--top-k", "5", "--seed", "2"],
            "--top-k 5, --seed 2 have no effect under greedy decoding (--temperature 0); give --temperature > 0 to sample, "
            "or drop them",
        ),
    ],
)
def test_cli_sampling_options_bad_input_exits_2_with_one_line(argv, message, capsys, tmp_path):
    from swiftspec.cli import main

    assert main(["bench", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"swiftspec bench: error: {message}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(temperature=-1.0), "temperature must be a finite number >= 0 (0: greedy decoding), got -1.0"),
        (dict(temperature=float("nan")), "temperature must be a finite number >= 0 (0: greedy decoding), got nan"),
        (dict(temperature="0.5"), "temperature must be a finite number >= 0 (0: greedy decoding), got '0.5'"),
        (dict(temperature=0.5, top_p=0.0), "top_p must be a number in (0, 1] (1: off), got 0.0"),
        (dict(temperature=0.5, top_k=-2), "top_k must be an integer >= 0 (0: off), got -2"),
        (dict(temperature=0.5, seed=-1), "seed must be an integer >= 0, got -1"),
        (dict(temperature=0.5, seed=True), "seed must be an integer >= 0, got True"),
        (
            dict(top_p=0.9, top_k=40),
            "top_p=0.9, top_k=40 have no effect under greedy decoding (temperature 0); give "
            "temperature > 0 to sample, or drop them",
        ),
        (
            dict(seed=7),
            "seed=7 has no effect under greedy decoding (temperature 0); give temperature > 0 to sample, or drop it",
        ),
    ],
)
def test_run_bench_checks_sampling_before_loading_anything(kwargs, message, tmp_path):
    with pytest.raises(BenchConfigError) as e:
        run_bench(
            datasets=["humaneval"],
            num_prompts=1,
            max_new_tokens=4,
            configs="target",
            target="never-loaded",
            out_dir=tmp_path / "out",
            progress=False,
            **kwargs,
        )
    assert str(e.value) == message
    assert not (tmp_path / "out").exists()


def test_check_sampling_blocks():
    assert check_sampling() is None
    assert check_sampling(0.0, 1.0, 0, 0) is None
    assert check_sampling(1, 1, 0, 0) == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0}
    assert check_sampling(0.7, 0.95, 40, 11, num_prompts=20) == {
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 40,
        "seed": 11,
    }
    assert check_sampling(0.7, seed=2**64 - 20, num_prompts=20)["seed"] == 2**64 - 20  # the last one fits


def _settings_doc(**settings) -> dict:
    """The smallest schema-valid document with these settings' decoding fields."""
    base = {
        "datasets": ["humaneval"],
        "num_prompts": 1,
        "max_new_tokens": 4,
        "backend": "cpu",
        "dtype": "bfloat16",
        "threads": 0,
        "warmup": 0,
        "target": "t",
        "draft": None,
        "target_checkpoint": "/t",
        "draft_checkpoint": None,
        "max_context": 4096,
        "hf": None,
        "context_tokens": [],
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "swiftspec-bench",
        "created": "2026-11-30T10:00:00Z",
        "command": "x",
        "commit": {"sha": None, "short": None, "branch": None, "dirty": None, "dirty_files": []},
        "machine": {
            "hostname": "h",
            "os": "o",
            "cpu": {"model": "m", "logical_cpus": 1, "usable_cpus": 1},
            "memory_gib": 1.0,
            "gpus": [],
            "software": {},
            "load_average_start": None,
        },
        "settings": {**base, **settings},
        "configs": [
            {
                "name": "target",
                "engine": "swiftspec",
                "mode": "target",
                "backend": "cpu",
                "tree_budget": None,
                "max_depth": None,
                "branching": None,
                "target_tp": 1,
                "draft_tp": None,
                "shape": None,
                "speculative": False,
                "baseline": None,
                "reference": None,
                "status": "ok",
                "error": None,
            }
        ],
        "requests": [],
        "aggregates": [],
        "divergences": [],
        "wall_time_s": 1.0,
        "load_average_end": None,
        "interrupted": True,
    }


SAMPLING = {"temperature": 0.7, "top_p": 0.95, "top_k": 0, "seed": 0}


def test_schema_decoding_and_sampling_block():
    validate(_settings_doc())  # older documents: no decoding field, no sampling block
    validate(_settings_doc(decoding="greedy"))
    validate(_settings_doc(decoding="greedy", sampling=None))
    validate(_settings_doc(decoding="sampled", sampling=SAMPLING))
    for bad in (
        dict(decoding="sampled"),  # sampled without its settings
        dict(decoding="sampled", sampling=None),
        dict(decoding="greedy", sampling=SAMPLING),  # greedy with sampling settings
        dict(sampling=SAMPLING),
        dict(decoding="beam"),
        dict(decoding="sampled", sampling={**SAMPLING, "temperature": 0}),
        dict(decoding="sampled", sampling={**SAMPLING, "top_p": 1.5}),
        dict(decoding="sampled", sampling={**SAMPLING, "top_k": -1}),
        dict(decoding="sampled", sampling={k: v for k, v in SAMPLING.items() if k != "seed"}),
        dict(decoding="sampled", sampling={**SAMPLING, "min_p": 0.1}),
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate(_settings_doc(**bad))


# ------------------------------------------------------------------ real models
def _rows(doc) -> dict:
    return {(r["dataset"], r["prompt_index"], r["config"]): r for r in doc["requests"]}


def test_sampled_run_real_pair(checkpoint_dir, tmp_path):
    """A sampled run on the real 1.5B / 0.5B pair (1 prompt per data set, 8 new tokens):
    speedups and acceptance lengths as under greedy decoding, no output compared per request,
    bench.md says why; target-only decoding is reproducible under one seed (a second run,
    without the speculative configuration, gives the same tokens) and another seed changes it."""
    target, draft = str(checkpoint_dir(TARGET, "bfloat16")), str(checkpoint_dir(DRAFT, "bfloat16"))
    kw = dict(
        num_prompts=1,
        max_new_tokens=8,
        target=target,
        draft=draft,
        warmup=0,
        progress=False,
        temperature=1.0,
        command="pytest tests/test_bench_sampling.py",
    )
    out = tmp_path / "sampled"
    run_bench(datasets=["mtbench", "humaneval"], configs="target,serial:tree16", out_dir=out, seed=0, **kw)
    doc = json.loads((out / "bench.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert consistency_problems(doc) == []
    s = doc["settings"]
    assert s["decoding"] == "sampled"
    assert s["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0}
    assert doc["divergences"] == []
    rows = _rows(doc)
    assert set(rows) == {(d, 0, c) for d in ("mtbench", "humaneval") for c in ("target", "serial:tree16")}
    for r in rows.values():
        assert r["matches_reference"] is None
        assert r["new_tokens"] == len(r["token_ids"]) > 0 and all(isinstance(t, int) for t in r["token_ids"])
    for d in ("mtbench", "humaneval"):
        spec = rows[(d, 0, "serial:tree16")]
        assert spec["draft_steps"] > 0 and spec["acceptance_length"] >= 1
        assert spec["speedup"] is not None  # against target-only on the same prompt
    assert all(a["outputs_checked"] == 0 for a in doc["aggregates"])
    md = (out / "bench.md").read_text()
    assert "- decoding: sampled (temperature 1, top-p 1, top-k off, seed 0 + prompt index)" in md
    assert f"- not made: {REASON}" in md and "outputs equal" not in md
    identity = json.loads((out / "run_identity.json").read_text())
    assert (identity["temperature"], identity["top_p"], identity["top_k"], identity["seed"]) == (1.0, 1.0, 0, 0)

    # the same seed again (mtbench alone: its prefill is the short one): the same tokens
    again = run_bench(datasets=["mtbench"], configs="target", out_dir=None, seed=0, **kw)
    first = rows[("mtbench", 0, "target")]["token_ids"]
    assert _rows(again)[("mtbench", 0, "target")]["token_ids"] == first
    # another seed: another draw (at temperature 1, 8 tokens of a chat answer)
    other = run_bench(datasets=["mtbench"], configs="target", out_dir=None, seed=1, **kw)
    assert _rows(other)[("mtbench", 0, "target")]["token_ids"] != first


def test_top1_sampling_equals_greedy_in_swiftspec_and_the_hf_peers(checkpoint_dir, tmp_path):
    """Sampling from the top-1 token is greedy decoding: a run with temperature 1 and top_k 1
    gives every configuration's greedy tokens, which shows the sampling settings reach both
    swiftspec (target-only and speculative sampling) and the HF peers. The HF peer's sampling is
    reproducible under one seed and changes with another."""
    from swiftspec.bench.peers_hf import HFPeer

    small = str(checkpoint_dir(SMALL, "bfloat16"))
    kw = dict(
        datasets=["humaneval"],
        num_prompts=1,
        max_new_tokens=8,
        configs="target,serial:chain4",
        peers="hf",
        target=small,
        draft=small,
        warmup=0,
        threads=1,
        hf_threads=1,
        out_dir=None,
        progress=False,
        plots=False,
        command="pytest",
    )
    greedy = _rows(run_bench(**kw))
    top1 = run_bench(**kw, temperature=1.0, top_k=1, seed=5)
    assert top1["settings"]["hf"]["cpu"]["do_sample"] is True
    assert top1["settings"]["hf"]["cpu"]["sampling"]["top_k"] == 1
    sampled = _rows(top1)
    assert set(sampled) == set(greedy) and len(greedy) == 4
    for key, r in greedy.items():
        assert sampled[key]["token_ids"] == r["token_ids"], key

    from swiftspec.tokenizer import Tokenizer

    tok = Tokenizer.from_checkpoint(small)
    prompt = tok.encode_chat([{"role": "user", "content": "Write a haiku about the sea."}])
    peer = HFPeer(small, None, threads=1, sampling={"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0})
    draws = [peer.generate(prompt, 12, tok.eos_token_ids, assisted=False, seed=s).token_ids for s in (3, 3, 4)]
    assert draws[0] == draws[1] and draws[0] != draws[2]


def test_resume_refuses_other_sampling_settings(checkpoint_dir, tmp_path):
    """A resume must decode as the run it continues: another temperature is refused, naming it;
    a run_identity.json written before sampled decoding existed (no sampling fields) was greedy."""
    small = str(checkpoint_dir(SMALL, "bfloat16"))
    out = tmp_path / "run"
    kw = dict(
        datasets=["humaneval"],
        num_prompts=1,
        max_new_tokens=4,
        configs="target",
        target=small,
        warmup=0,
        threads=1,
        out_dir=out,
        progress=False,
        plots=False,
    )
    run_bench(**kw, temperature=0.5, seed=2)
    (out / "bench.json").unlink()
    with pytest.raises(BenchConfigError) as e:
        run_bench(**kw, temperature=0.8, seed=2, resume=True)
    assert str(e.value) == f"--resume: the run in {out} has temperature=0.5, this one 0.8; use a new --out folder"
    with pytest.raises(BenchConfigError, match=r"has temperature=0.5, this one 0.0;"):
        run_bench(**kw, resume=True)  # greedy
    with pytest.raises(BenchConfigError, match=r"has seed=2, this one 3;"):
        run_bench(**kw, temperature=0.5, seed=3, resume=True)
    # an older greedy run's identity (no sampling fields): resumable greedy, not sampled
    identity = json.loads((out / "run_identity.json").read_text())
    for key in ("temperature", "top_p", "top_k", "seed"):
        del identity[key]
    (out / "run_identity.json").write_text(json.dumps(identity))
    with pytest.raises(BenchConfigError, match=r"has temperature=0.0, this one 0.5;"):
        run_bench(**kw, temperature=0.5, seed=2, resume=True)
    doc = run_bench(**kw, resume=True)
    assert doc["settings"]["decoding"] == "greedy" and doc["settings"]["sampling"] is None


def test_numpy_sampling_values_are_numbers():
    """run_bench(temperature=np.float32(0.5), top_k=np.int64(5)) was refused ("top_k must be an integer
    >= 0 (0: off), got np.int64(5)"); the block holds Python numbers (JSON-serialisable), and a uint64
    seed near the top is bounded as an int (numpy's seed + i wraps around)."""
    import numpy as np

    block = check_sampling(np.float32(0.5), np.float64(0.75), np.int64(5), np.uint64(3), num_prompts=2)
    assert block == {"temperature": 0.5, "top_p": 0.75, "top_k": 5, "seed": 3}
    assert [type(v) for v in block.values()] == [float, float, int, int]
    with pytest.raises(BenchConfigError) as e:
        check_sampling(1.0, 1.0, 0, np.uint64(2**64 - 1), num_prompts=2)
    assert str(e.value) == (
        f"seed must be at most {2**64 - 2} (request i of a data set samples with seed + i, a "
        f"64-bit seed), got {2**64 - 1}"
    )


@pytest.mark.parametrize(
    "content,needle",
    [
        (
            "",
            "is not JSON (Expecting value: line 1 column 1 (char 0)); its run's settings are unknown: use a new --out "
            "folder",
        ),
        ("null", "holds null, not the settings of a run; use a new --out folder"),
        ("[0.5, 2]", "holds [0.5, 2], not the settings of a run; use a new --out folder"),
    ],
)
def test_resume_from_an_unreadable_run_identity_is_one_line(tmp_path, content, needle):
    """run_identity.json emptied (a kill while it was written) or edited into another JSON value:
    a JSONDecodeError / TypeError traceback before, after the models had loaded."""
    from swiftspec.bench.config import parse_config_list
    from swiftspec.bench.runner import BenchSettings, Runner

    settings = BenchSettings(
        datasets=["humaneval"],
        num_prompts=1,
        max_new_tokens=4,
        backend="cpu",
        dtype="bfloat16",
        threads=1,
        hf_threads=0,
        warmup=0,
        target="t",
        draft=None,
        max_context=None,
        sampling={"temperature": 0.5, "top_p": 1.0, "top_k": 0, "seed": 2},
    )
    runner = Runner(settings, parse_config_list("target", "cpu", "none"), tmp_path, progress=False)
    (tmp_path / "requests.jsonl").write_text("")
    (tmp_path / "run_identity.json").write_text(content)
    with pytest.raises(BenchConfigError) as e:
        runner._resumed_rows([])
    assert str(e.value) == f"--resume: {tmp_path / 'run_identity.json'} {needle}"


def test_request_seed_is_the_seed_plus_the_prompt_index(checkpoint_dir):
    """Each request of a data set samples with seed S + its prompt index: the run's rows equal
    Engine.generate with that seed (and not with S for the second prompt)."""
    from swiftspec.bench.runner import load_prompts
    from swiftspec.engine import Engine

    small = str(checkpoint_dir(SMALL, "bfloat16"))
    doc = run_bench(
        datasets=["humaneval"],
        num_prompts=2,
        max_new_tokens=8,
        configs="target",
        target=small,
        warmup=0,
        threads=1,
        out_dir=None,
        progress=False,
        temperature=1.0,
        seed=10,
    )
    rows = _rows(doc)
    engine = Engine(small, None, backend="cpu", num_threads=1)

    def draw(item, seed):
        ids = engine.tokenizer.encode_chat(item.messages)
        return list(engine.generate(ids, max_new_tokens=8, temperature=1.0, seed=seed, mode="target").token_ids)

    try:
        first, second = load_prompts(["humaneval"], 2, progress=False)
        assert rows[("humaneval", 0, "target")]["token_ids"] == draw(first, 10)
        assert rows[("humaneval", 1, "target")]["token_ids"] == draw(second, 11)
        assert rows[("humaneval", 1, "target")]["token_ids"] != draw(second, 10)
    finally:
        engine.close()
