"""tools/gpu_megakernel_ab.sh (the megakernel A/B on the GPU machine), run here against a stand-in
bench binary that prints recorded H200 outputs (run 23, call 2): its table carries each variant's
decode and trace numbers, a failed variant is reported with its exit status (a hung one is cut
after MK_AB_TIMEOUT_S and the next runs), and a missing
binary or no variant is refused with a message that names what is wrong."""

import os
import re
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu_megakernel_ab.sh"
# (benchmarks/gpu/run23/call2-0f935ad/ until the raw outputs left the tree, commit e56efde)
RECORDED = ROOT / "tests" / "data" / "recorded"


def fake_build(tmp_path: Path) -> Path:
    """A build dir whose swiftspec-cuda-bench prints a recorded log chosen by its flags."""
    bench = tmp_path / "build" / "cuda" / "swiftspec-cuda-bench"
    bench.parent.mkdir(parents=True)
    bench.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> "{tmp_path}/args"\n'
        'case "$*" in\n'
        f'  *"--mk-attn-prewait 0"*) cat "{RECORDED}/run23_prewait0.log";;\n'
        '  *--broken*) echo "CUDA error: an illegal memory access"; exit 3;;\n'
        "  *--hang*) sleep 30;;\n"
        # the lines run 24 added beside the trace (plan, ring waits) must not become rows
        '  *) echo "megakernel traced plan qwen2.5-0.5b  megakernel ctas=132 slots=4x53760 cooperative";\n'
        '     echo "megakernel ring  qwen2.5-0.5b  waits (us per layer): qkv bytes 0.10|0.20";\n'
        f'     cat "{RECORDED}/run23_bench.log";;\n'
        "esac\n"
    )
    bench.chmod(bench.stat().st_mode | stat.S_IXUSR)
    return bench.parent.parent


def run(tmp_path, build, *variants, shapes=None):
    env = dict(os.environ, OUT=str(tmp_path / "out"), BUILD_DIR=str(build))
    if shapes:
        env["MK_AB_SHAPES"] = shapes
    return subprocess.run(["bash", str(SCRIPT), *variants], capture_output=True, text=True, env=env, timeout=60)


def test_table_of_recorded_runs(tmp_path):
    build = fake_build(tmp_path)
    out = run(tmp_path, build, "", "--mk-attn-prewait 0", "--broken", shapes="qwen2.5-0.5b,qwen2.5-1.5b")
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        m = re.match(
            r"variant (\d+): \[(.*)\]\s+(\S+)\s+decode\s+(\S+) ms\s+traced\s+(\S+) us\s+layer\s+(\S+) us", line
        )
        if m:
            rows[(int(m[1]), m[3])] = (m[2], m[4], m[5], m[6])
    # variant 1 = the defaults (bench.log), variant 2 = no prewait (prewait0.log), each shape asked for
    assert rows[(1, "qwen2.5-0.5b")] == ("", "0.5858", "580.6", "21.29")
    assert rows[(1, "qwen2.5-1.5b")] == ("", "1.2191", "1224.7", "39.52")
    assert rows[(2, "qwen2.5-0.5b")] == ("--mk-attn-prewait 0", "0.5958", "591.4", "21.72")
    assert len([line for line in out.stdout.splitlines() if line.startswith("variant")]) == len(rows) == 6
    assert "==== variant 3 failed (exit 3)" in out.stdout
    log = (tmp_path / "out" / "mk_ab.log").read_text()
    assert "an illegal memory access" in log and log.count("==== variant") == 4
    args = (tmp_path / "args").read_text().splitlines()
    assert all(
        a.startswith("--megakernel-only --no-gemm --megakernel-trace --shapes qwen2.5-0.5b,qwen2.5-1.5b") for a in args
    )
    assert args[1].endswith("--mk-attn-prewait 0")


def test_a_hung_variant_is_cut_and_the_next_runs(tmp_path):
    build = fake_build(tmp_path)
    env = dict(os.environ, OUT=str(tmp_path / "out"), BUILD_DIR=str(build), MK_AB_TIMEOUT_S="1")
    out = subprocess.run(["bash", str(SCRIPT), "--hang", ""], capture_output=True, text=True, env=env, timeout=25)
    assert out.returncode == 0, out.stderr
    assert "==== variant 1 failed (exit 124)" in out.stdout
    assert re.search(r"variant 2: \[\]\s+qwen2.5-0.5b\s+decode\s+0.5858 ms", out.stdout)


def test_refuses_without_binary_or_variants(tmp_path):
    out = run(tmp_path, tmp_path / "nowhere", "")
    assert out.returncode == 2 and "swiftspec-cuda-bench is missing" in out.stderr and "gpu_check.sh" in out.stderr
    out = run(tmp_path, fake_build(tmp_path))
    assert out.returncode == 2 and "at least one variant" in out.stderr
