"""The llama.cpp peer (issue 29 ``--peers llamacpp``; issue 27's long-context recipe): its build from
the llama-cpp-python sdist (once, cached), the bench with llama.cpp next to swiftspec on the real
pair, llama-bench at depth, and the errors of each.

The build of llama.cpp's CPU backend happens once per machine (``<cache>/llamacpp``, several
minutes on 2 cores; later runs reuse it). These tests assert what the harness measures and how it
reports it, never speeds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from swiftspec.bench import llamacpp_build as lb
from swiftspec.bench import peers_llamacpp as lc
from swiftspec.bench import run_bench
from swiftspec.bench.config import BenchConfigError, parse_config, parse_config_list
from swiftspec.bench.schema import SCHEMA, consistency_problems

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
SMALL = "smollm2-135m-instruct"
TOOLS = Path(__file__).resolve().parent.parent / "tools"


# ------------------------------------------------------------------ no build needed
def test_config_grammar_and_peers_list():
    c = parse_config("llamacpp:assisted@cuda")
    assert (c.name, c.engine, c.mode, c.backend, c.speculative) == (
        "llamacpp:assisted@cuda",
        "llamacpp",
        "assisted",
        "cuda",
        True,
    )
    names = [c.name for c in parse_config_list("target,serial:tree16", peers="hf,llamacpp")]
    assert names == ["target", "serial:tree16", "hf:target", "hf:assisted", "llamacpp:target", "llamacpp:assisted"]
    configs = parse_config_list("target", peers="llamacpp")
    from swiftspec.bench.config import find_baseline
    from swiftspec.bench.runner import reference_config

    by = {c.name: c for c in configs}
    assert find_baseline(by["llamacpp:assisted"], configs) is by["llamacpp:target"]
    assert reference_config(by["llamacpp:assisted"], configs) is by["llamacpp:target"]
    assert reference_config(by["llamacpp:target"], configs) is by["target"]  # implementation check
    with pytest.raises(BenchConfigError, match="'vllm' in --peers \\(expected hf, llamacpp or none\\)"):
        parse_config_list("target", peers="llamacpp,vllm")
    with pytest.raises(BenchConfigError, match="llamacpp:tree"):
        parse_config("llamacpp:tree")


def test_sampled_decoding_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(BenchConfigError, match="llama.cpp peers .* greedy decoding only"):
        run_bench(
            datasets=["mtbench"],
            num_prompts=1,
            max_new_tokens=4,
            configs="target",
            peers="llamacpp",
            temperature=0.7,
            out_dir=tmp_path / "out",
            progress=False,
        )
    assert not (tmp_path / "out").exists()


def test_sdist_errors_name_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv(lb.SDIST_ENV, str(tmp_path / "missing.tar.gz"))
    with pytest.raises(lb.LlamaCppBuildError, match=r"\$SWIFTSPEC_LLAMACPP_SDIST .*missing.tar.gz: no such file"):
        lb.find_sdist(cache=tmp_path)
    other = tmp_path / "other.tar.gz"
    other.write_bytes(b"not the sdist")
    with pytest.raises(
        lb.LlamaCppBuildError,
        match=f"other.tar.gz: sha256 [0-9a-f]{{64}}, but the llama-cpp-python 0.3.36 sdist has {lb.SDIST_SHA256}",
    ):
        lb.find_sdist(other, cache=tmp_path)
    folder = tmp_path / "llama_cpp_python-0.3.35"
    folder.mkdir()
    (folder / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.35\n")
    with pytest.raises(lb.LlamaCppBuildError, match="not the unpacked llama-cpp-python 0.3.36 sdist .*'0.3.35'"):
        lb.find_sdist(folder, cache=tmp_path)


def test_no_network_for_the_sdist_says_how_to_give_one(tmp_path, monkeypatch):
    """pip cannot reach any index (none configured, no local wheels): one error naming the env var."""
    monkeypatch.delenv(lb.SDIST_ENV, raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(lb.LlamaCppBuildError) as info:
        lb.find_sdist(cache=tmp_path / "cache", progress=False)
    message = str(info.value)
    assert "could not download the llama-cpp-python 0.3.36 sdist with pip" in message
    assert "SWIFTSPEC_LLAMACPP_SDIST" in message
    assert not any((tmp_path / "cache" / "llamacpp").glob("*.tar.gz"))


def test_missing_build_tools_are_one_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    for var in ("CC", "CXX", "CUDACXX"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(
        lb.LlamaCppBuildError, match="building llama.cpp needs cmake, which is not on PATH: pip install cmake"
    ):
        lb.ensure_llamacpp("cpu", cache=tmp_path)
    with pytest.raises(lb.LlamaCppBuildError, match="backend must be cpu or cuda, got 'rocm'"):
        lb.ensure_llamacpp("rocm", cache=tmp_path)


def _fake_sdist(root: Path, cmakelists: str) -> Path:
    folder = root / "llama_cpp_python-0.3.36"
    (folder / "vendor" / "llama.cpp").mkdir(parents=True)
    (folder / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.36\n")
    (folder / "vendor" / "llama.cpp" / "CMakeLists.txt").write_text(cmakelists)
    return folder


def test_a_failed_build_is_one_error_with_the_log_and_leaves_no_build(tmp_path):
    sdist = _fake_sdist(
        tmp_path, 'cmake_minimum_required(VERSION 3.14)\nproject(x C CXX)\nmessage(FATAL_ERROR "no llama here")\n'
    )
    cache = tmp_path / "cache"
    with pytest.raises(lb.LlamaCppBuildError) as info:
        lb.ensure_llamacpp("cpu", sdist=sdist, cache=cache, progress=False)
    message = str(info.value)
    assert message.startswith("configuring llama.cpp failed (backend cpu); the end of the log:")
    assert "no llama here" in message
    key = lb.build_key("cpu")
    assert message.rstrip().endswith(str(cache / "llamacpp" / f"{key}.failed.log"))
    assert [p.name for p in (cache / "llamacpp").iterdir() if not p.name.startswith(".")] == [f"{key}.failed.log"]
    assert lb.cached_build("cpu", cache) is None
    assert not any(p.name.endswith(".build") for p in (cache / "llamacpp").iterdir())


def test_a_build_without_the_programs_is_refused(tmp_path):
    """CMake succeeds but the targets are not llama.cpp's: the build names what is missing."""
    sdist = _fake_sdist(
        tmp_path,
        "cmake_minimum_required(VERSION 3.14)\nproject(x C)\n"
        "add_custom_target(llama-bench)\nadd_custom_target(llama-speculative-simple)\n"
        "add_custom_target(llama-completion)\n",
    )
    with pytest.raises(lb.LlamaCppBuildError, match=r"the llama.cpp build made no .*/bin/llama-bench"):
        lb.ensure_llamacpp("cpu", sdist=sdist, cache=tmp_path / "cache", progress=False)


def test_a_finished_build_is_kept_with_its_record_and_reused(tmp_path):
    """The whole build path on a stand-in source whose three programs build in a second: the programs
    land in <cache>/llamacpp/<key>/bin with build.json and the log; a second call builds nothing."""
    sdist = _fake_sdist(
        tmp_path,
        "cmake_minimum_required(VERSION 3.14)\nproject(x C)\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        'message(STATUS "ggml commit:  abc1234")\n'
        "foreach(t llama-bench llama-speculative-simple llama-completion)\n"
        "  add_executable(${t} main.c)\nendforeach()\n",
    )
    (sdist / "vendor" / "llama.cpp" / "main.c").write_text("int main(void) { return 0; }\n")
    cache = tmp_path / "cache"
    build = lb.ensure_llamacpp("cpu", sdist=sdist, cache=cache, jobs=1, progress=False)
    assert build.root == cache / "llamacpp" / lb.build_key("cpu")
    assert sorted(p.name for p in build.bin_dir.iterdir()) == sorted(lb.TARGETS)
    info = json.loads((build.root / "build.json").read_text())
    assert info == build.info and info["ggml_commit"] == "abc1234" and info["jobs"] == 1
    assert (
        info["source"] == str(sdist)
        and info["build_seconds"] >= 0
        and info["cmake_args"][0] == "-DCMAKE_BUILD_TYPE=Release"
    )
    assert (
        "add_executable" not in (build.root / "build.log").read_text()
        and "[exit code 0]" in (build.root / "build.log").read_text()
    )
    assert sorted(p.name for p in (cache / "llamacpp").iterdir()) == sorted(
        [build.root.name, f".{build.root.name}.lock"]
    )
    (sdist / "vendor" / "llama.cpp" / "CMakeLists.txt").write_text("this would not configure")
    assert lb.ensure_llamacpp("cpu", sdist=sdist, cache=cache, progress=False).info == info  # kept, not rebuilt
    assert lb.cached_build("cpu", cache).root == build.root


def _log(*entries) -> list:
    """JSON log lines as llama.cpp writes them with --log-jsonl --log-timestamps."""
    return lc.parse_log(
        "\n".join(json.dumps({"type": "log", "time": t, "level": level, "msg": msg}) for t, level, msg in entries)
        + "\nnot json\n"
    )


class _Vocab:
    """A stand-in vocabulary: piece "tN" is token N; "\ufffd" is ambiguous (ids 900, 901)."""

    def lookup(self, piece):
        if piece == "\ufffd":
            return 900, False
        if piece == "<|im_end|>":
            return 2, True
        if not piece.startswith("t"):
            raise lc.LlamaCppPeerError(
                f"llama.cpp printed the piece {piece!r}, which no token of the vocabulary prints"
            )
        return int(piece[1:]), True

    def prints(self, token_id):
        return "\ufffd" if token_id in (900, 901) else f"t{token_id}"


def test_reading_llama_completion_output():
    lines = _log(
        (10, "info", "main: number of tokens in prompt = 2\n"),
        (11, "info", "    50 -> 'a'\n"),
        (12, "info", "    51 -> 'b'\n"),
        (1000, "none", "t50"),
        (1001, "none", "t51"),
        (31000, "none", "t7"),
        (51000, "none", "\ufffd"),
        (71000, "none", "<|im_end|>"),
        (71001, "none", " [end of text]\n"),
        (71002, "none", "\n\n"),
        (71003, "info", "eval time = ..."),
    )
    used, ids, unresolved, ttft, decode, emissions = lc.read_completion(lines, [50, 51], 8, _Vocab())
    assert used == [50, 51] and ids == [7, 900, 2] and unresolved == 1
    assert ttft == pytest.approx((31000 - 1001) / 1e6) and decode == pytest.approx((71000 - 31000) / 1e6)
    assert emissions == [1, 1, 1]
    assert lc.read_completion(lines, [50, 52], 8, _Vocab())[0] == [50, 51]  # what llama.cpp used (checked later)
    with pytest.raises(lc.LlamaCppPeerError, match="generated 3 tokens, more than the 2 asked for"):
        lc.read_completion(lines, [50, 51], 2, _Vocab())
    with pytest.raises(lc.LlamaCppPeerError, match="did not list the prompt's tokens"):
        lc.read_completion(lines[3:], [50, 51], 8, _Vocab())


def _speculative_log(generated, n_predict, n_accept, loop_end_us):
    return _log(
        (5, "none", "\n\n"),
        (6, "none", "t50"),
        (7, "none", "\ufffd"),
        *generated,
        (loop_end_us, "none", "\n\n"),
        (90000, "info", "encoded    2 tokens in    0.010 seconds, speed:  200.000 t/s\n"),
        (90001, "info", f"decoded    {n_predict} tokens in    0.070 seconds, speed:   71.000 t/s\n"),
        (90002, "info", "n_draft   = 3\n"),
        (90003, "info", f"n_predict = {n_predict}\n"),
        (90004, "info", "n_drafted = 6\n"),
        (90005, "info", f"n_accept  = {n_accept}\n"),
        (90006, "none", "\n\n"),
    )


def test_reading_llama_speculative_simple_output():
    """Steps are the largest gaps between print times; the unprinted end token is counted from the
    summary; output past max_new_tokens (the last draft overshoots) is cut, with its time."""
    steps = [
        (20000, "none", "t7"),
        (20003, "none", "t8"),  # step 1: 2 tokens
        (40000, "none", "t9"),
        (40001, "none", "t10"),
        (40002, "none", "t11"),
    ]  # step 2: 3 tokens
    # the prompt's second piece is ambiguous; the expected id prints that way, so it is taken as it
    used, ids, unresolved, ttft, decode, emissions, rep = lc.read_speculative(
        _speculative_log(steps, 5, 3, 40010), [50, 901], 8, _Vocab(), [2]
    )
    assert used == [50, 901] and ids == [7, 8, 9, 10, 11] and unresolved == 0 and emissions == [2, 3]
    assert ttft == pytest.approx((20000 - 7) / 1e6) and decode == pytest.approx((40002 - 20000) / 1e6)
    assert rep["n_draft"] == 3 and rep["n_predict"] == 5
    # the end token came alone in a third step: the loop's "\n\n" at 60000 is its time
    _, ids, unresolved, _, decode, emissions, _ = lc.read_speculative(
        _speculative_log(steps, 6, 3, 60000), [50, 901], 8, _Vocab(), [2, 3]
    )
    assert ids == [7, 8, 9, 10, 11, 2] and unresolved == 1 and emissions == [2, 3, 1]
    assert decode == pytest.approx((60000 - 20000) / 1e6)
    # cut at 3 tokens: the second step keeps 1 of its 3, the time ends there
    _, ids, unresolved, _, decode, emissions, _ = lc.read_speculative(
        _speculative_log(steps, 6, 3, 60000), [50, 901], 3, _Vocab(), [2]
    )
    assert ids == [7, 8, 9] and unresolved == 0 and emissions == [2, 1]
    assert decode == pytest.approx((40000 - 20000) / 1e6)
    with pytest.raises(lc.LlamaCppPeerError, match="counted 7 new tokens but printed 5"):
        lc.read_speculative(_speculative_log(steps, 7, 3, 40010), [50, 901], 8, _Vocab(), [2])
    # an ambiguous prompt piece that the expected id does not print stays the smallest id printing so
    assert lc.read_speculative(_speculative_log(steps, 5, 3, 40010), [50, 51], 8, _Vocab(), [2])[0] == [50, 900]
    with pytest.raises(lc.LlamaCppPeerError, match="not the expected layout"):
        lc.read_speculative(_speculative_log([], 5, 3, 40010)[1:], [50, 901], 8, _Vocab(), [2])


def test_prompt_tokens_are_the_same_or_the_same_text():
    """llama.cpp takes text: the same ids, or another tokenization of the same text (recorded), pass;
    another text is an error naming the position."""
    texts = {(1, 2, 3): "abc", (1, 23): "abc", (1, 2, 4): "abd"}
    decode = lambda ids: texts[tuple(ids)]  # noqa: E731
    assert lc.check_prompt([1, 2, 3], [1, 2, 3], "llama-completion", decode) is False
    assert lc.check_prompt([1, 23], [1, 2, 3], "llama-completion", decode) is True
    with pytest.raises(
        lc.LlamaCppPeerError,
        match="llama-completion tokenized the prompt into 3 tokens, swiftspec into "
        "3; they differ at position 2 \\(4 vs 3\\) and spell different texts",
    ):
        lc.check_prompt([1, 2, 4], [1, 2, 3], "llama-completion", decode)


def test_long_context_bench_checks_its_arguments(tmp_path):
    build = lb.LlamaCppBuild(tmp_path, "cpu", {})
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for kwargs, needle in (
        ({"decode_depths": []}, "decode_depths must be a non-empty list"),
        ({"decode_depths": [0, -1]}, "decode_depths must be .* >= 0"),
        ({"prefill_tokens": [0]}, "prefill_tokens must be .* >= 1"),
        ({"n_gen": 0}, "n_gen must be an integer >= 1"),
        ({"repetitions": 1.5}, "repetitions must be an integer >= 1"),
    ):
        with pytest.raises(lc.LlamaCppPeerError, match=needle):
            lc.long_context_bench(build, gguf, **kwargs)
    with pytest.raises(lc.LlamaCppPeerError, match="nope.gguf: no such GGUF file"):
        lc.long_context_bench(build, tmp_path / "nope.gguf")


def test_gguf_source_of_models(checkpoint_dir, gguf_path, tmp_path):
    """Reference names, GGUF paths and checkpoint folders converted from GGUF resolve to the GGUF;
    a folder not converted from one is refused by name."""
    from swiftspec.bench.peers_hf import PeerUnavailableError

    assert lc.gguf_source(TARGET, None) == gguf_path(TARGET)
    assert lc.gguf_source(str(gguf_path(DRAFT)), None) == gguf_path(DRAFT)
    small = checkpoint_dir(SMALL, "bfloat16")
    assert lc.gguf_source(str(small), small) == gguf_path(SMALL)
    other = tmp_path / "hf-folder"
    shutil.copytree(small, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["source"] = {"kind": "hf", "path": "/x", "sha256": None}
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PeerUnavailableError, match="llama.cpp runs GGUF files; .*hf-folder is not one"):
        lc.gguf_source(str(other), other)


# ------------------------------------------------------------------ the real build
def _load_and_check(out_dir) -> dict:
    doc = json.loads((out_dir / "bench.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert consistency_problems(doc) == []
    for name in ("bench.md", "requests.jsonl", "tokens_per_s.png", "speedup.png", "acceptance.png"):
        assert (out_dir / name).stat().st_size > 0, name
    return doc


def test_the_build_is_made_once_and_kept(llamacpp_cpu_build):
    b = llamacpp_cpu_build
    assert b.root.name == lb.build_key("cpu") and b.root.name.startswith("0.3.36-cpu-")
    for name in lb.TARGETS:
        assert os.access(b.binary(name), os.X_OK), name
    info = json.loads((b.root / "build.json").read_text())
    assert info["llama_cpp_python"] == "0.3.36" and info["backend"] == "cpu" and info["build_seconds"] > 0
    assert {"-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DBUILD_SHARED_LIBS=OFF"} <= set(info["cmake_args"])
    assert "-DGGML_CUDA=ON" not in info["cmake_args"] and (b.root / "build.log").stat().st_size > 0
    again = lb.ensure_llamacpp("cpu", cache=b.root.parent.parent, progress=False)  # cached: no download, no build
    assert again.root == b.root and again.info == info
    out = subprocess.run([str(b.binary("llama-completion")), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "version" in (out.stdout + out.stderr)


def test_the_peer_sees_swiftspecs_prompt_tokens(llamacpp_cpu_build, checkpoint_dir, gguf_path):
    """The chat template rendered by swiftspec reaches llama.cpp as the same token ids, in both programs,
    and 16 new tokens come back from each."""
    from swiftspec.tokenizer import Tokenizer

    tok = Tokenizer.from_checkpoint(checkpoint_dir(TARGET, "bfloat16"))
    ids = tok.encode_chat(
        [
            {
                "role": "user",
                "content": "Write a Python function that tells whether a number is "
                "prime.\nUse `math.isqrt`; no \\n escapes.",
            }
        ]
    )
    peer = lc.LlamaCppPeer(llamacpp_cpu_build, gguf_path(TARGET), gguf_path(DRAFT), tok, threads=2)
    for assisted in (False, True):
        r = peer.generate(ids, 16, assisted=assisted)
        assert r.prompt_ids == ids
        assert len(r.token_ids) == r.counted_tokens == 16 and r.unresolved == 0
        assert r.ttft_s > 0 and r.decode_s > 0 and r.emissions[0] >= 1
        assert tok.decode(r.token_ids).strip()  # some text
        if assisted:
            assert r.reported["n_draft"] == 3 and 1 <= len(r.emissions) <= 16
        else:
            assert r.emissions == [1] * 16 and r.reported["eval_runs"] == 15


def test_bench_with_the_llamacpp_peers_on_the_real_pair(llamacpp_cpu_build, checkpoint_dir, tmp_path):
    """Issue 29 must-show on the CPU: 2 prompts, 16 new tokens, llama.cpp target-only and speculative
    next to swiftspec's target, in the same tables and plots."""
    target, draft = checkpoint_dir(TARGET, "bfloat16"), checkpoint_dir(DRAFT, "bfloat16")
    out = tmp_path / "bench"
    run_bench(
        datasets=["mtbench", "humaneval"],
        num_prompts=1,
        max_new_tokens=16,
        configs="target",
        peers="llamacpp",
        target=str(target),
        draft=str(draft),
        warmup=0,
        threads=2,
        out_dir=out,
        progress=False,
        command="pytest tests/test_llamacpp_peer.py",
    )
    doc = _load_and_check(out)
    status = {c["name"]: c for c in doc["configs"]}
    assert [c["status"] for c in doc["configs"]] == ["ok", "ok", "ok"]
    assert (status["llamacpp:assisted"]["baseline"], status["llamacpp:assisted"]["reference"]) == (
        "llamacpp:target",
        "llamacpp:target",
    )
    assert (status["llamacpp:target"]["engine"], status["llamacpp:target"]["reference"]) == ("llamacpp", "target")
    rows = {(r["dataset"], r["config"]): r for r in doc["requests"]}
    assert len(rows) == len(doc["requests"]) == 6
    from swiftspec.tokenizer import Tokenizer

    tok = Tokenizer.from_checkpoint(target)
    for ds in ("mtbench", "humaneval"):
        ours = rows[(ds, "target")]
        for name in ("llamacpp:target", "llamacpp:assisted"):
            r = rows[(ds, name)]
            # the first MT-Bench and HumanEval prompts need far more than 16 tokens: none stops early
            assert r["finish_reason"] == "length" and r["new_tokens"] == r["counted_tokens"] == 16
            assert r["prompt_tokens"] == ours["prompt_tokens"] > 20
            assert r["ttft_s"] > 0 and r["tokens_per_s"] > 0 and r["decode_s"] > 0
            assert r["matches_reference"] is not None and tok.decode(r["token_ids"]).strip()
        t, a = rows[(ds, "llamacpp:target")], rows[(ds, "llamacpp:assisted")]
        assert t["verification_steps"] == 15 and t["acceptance_length"] == 1
        assert a["verification_steps"] >= 1 and a["acceptance_length"] >= 1 and a["speedup"] > 0
    block = doc["settings"]["llamacpp"]["cpu"]
    assert block["llama_cpp_python"] == "0.3.36" and block["build"]["key"] == llamacpp_cpu_build.root.name
    assert block["target_gguf"].endswith("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") and block["threads"] == 2
    assert block["draft_n_max"] == 3 and block["unresolved_pieces"] == {"target": 0, "assisted": 0}
    md = (out / "bench.md").read_text()
    assert "| llamacpp:target † | 2 |" in md and "| llamacpp:assisted † | 2 |" in md
    assert "runs the GGUF files' own quantized weights" in md
    assert "- llama.cpp speculative vs llama.cpp target-only:" in md


def test_llama_bench_at_depth_tool(llamacpp_cpu_build, gguf_path, tmp_path):
    """tools/llamacpp_bench.py: llama-bench's decode at depth and prefill, parsed into JSON and Markdown
    (tiny depths and the small model here; the GPU run uses issue 27's 0..32768)."""
    small = gguf_path(SMALL)
    out = tmp_path / "lc"
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "llamacpp_bench.py"),
            "--model",
            str(small),
            "--depths",
            "0,64",
            "--n-gen",
            "4",
            "--prefill",
            "32",
            "--repetitions",
            "1",
            "--threads",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "llamacpp_long_context.json").read_text())
    assert [(d["depth"], d["n_gen"]) for d in result["decode"]] == [(0, 4), (64, 4)]
    assert [(p["n_prompt"], p["depth"]) for p in result["prefill"]] == [(32, 0)]
    assert all(x["tok_s"] > 0 for x in result["decode"] + result["prefill"])
    assert result["build"]["key"] == llamacpp_cpu_build.root.name and len(result["raw"]) == 3
    assert result["settings"]["n_gpu_layers"] == 0 and result["settings"]["n_threads"] == 2
    md = (out / "llamacpp_long_context.md").read_text()
    assert "| decode | 64 | 4 |" in md and "| prefill | 0 | 32 |" in md and md in proc.stdout
    bad = subprocess.run(
        [sys.executable, str(TOOLS / "llamacpp_bench.py"), "--model", str(small), "--depths", "0,x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --depths must be comma-separated integers, got '0,x'"


def test_packed_source_configures_offline(llamacpp_cpu_build, tmp_path, monkeypatch):
    """The small source archive for a machine without network: unpacked, it is an sdist folder the
    build accepts, and CMake configures it with the build's options (nothing it needs was left out)."""
    monkeypatch.delenv(lb.SDIST_ENV, raising=False)
    packed = lb.pack_source(tmp_path / "src.tar.gz", cache=llamacpp_cpu_build.root.parent.parent)
    assert 1e6 < packed.stat().st_size < 12e6
    import tarfile

    with tarfile.open(packed) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path, filter="data")
    src = "llama_cpp_python-0.3.36/vendor/llama.cpp"
    assert f"{src}/ggml/src/ggml-cuda/CMakeLists.txt" in names and f"{src}/tools/llama-bench/llama-bench.cpp" in names
    assert not any(n.startswith((f"{src}/models/", f"{src}/docs/")) for n in names)
    folder = lb.find_sdist(tmp_path / "llama_cpp_python-0.3.36")
    proc = subprocess.run(
        ["cmake", "-S", str(folder / "vendor" / "llama.cpp"), "-B", str(tmp_path / "b"), *lb._cmake_args("cpu")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_prompt_cut_at_a_token_boundary_is_measured_as_its_text(llamacpp_cpu_build, checkpoint_dir, gguf_path):
    """A long-context prompt (--context-tokens) whose ids are not its text's own tokenization reaches
    llama.cpp as text, which it tokenizes a token shorter: measured, and counted as retokenized."""
    from swiftspec.bench.long_context import ContextPrompts
    from swiftspec.datasets import load_humaneval
    from swiftspec.tokenizer import Tokenizer

    tok = Tokenizer.from_checkpoint(checkpoint_dir(DRAFT, "bfloat16"))
    _, ids = ContextPrompts(tok, load_humaneval(progress=False)).prompt(512, 1)
    assert len(ids) == 512 and tok.encode(tok.decode(ids)) != ids  # this one does not round-trip
    peer = lc.LlamaCppPeer(llamacpp_cpu_build, gguf_path(DRAFT), None, tok, threads=2)
    r = peer.generate(ids, 4, assisted=False)
    assert r.prompt_ids == tok.encode(tok.decode(ids)) and len(r.prompt_ids) == 511
    assert len(r.token_ids) == 4 and peer.settings()["prompts_retokenized"] == {"target": 1, "assisted": 0}
