"""cuda/scripts/mk_trace_gaps.py on a recorded megakernel trace (H200, run 21, call 2): it
reproduces the handoff gaps that benchmarks/README.md cites, and names the file it
cannot read."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "cuda" / "scripts" / "mk_trace_gaps.py"
# (benchmarks/gpu/run21/call2-6eae8ec/ until the raw outputs left the tree, commit e56efde)
TRACE = ROOT / "tests" / "data" / "recorded" / "run21_mk_trace_qwen2.5-0.5b.csv.gz"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_recorded_trace_gaps():
    out = run(TRACE)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert "24 layers, 132 CTAs" in out.stdout.splitlines()[0]
    # QKV: a CTA's own end of the previous layer's down op -> its arrival at the QKV wait,
    # median / p90 / max in us, over layers 2..22 and the 72 CTAs with QKV rows.
    assert "end -> arrive  2.82 /  3.58 /  4.61" in lines["qkv"]
    assert "(n=1512)" in lines["qkv"]
    assert "end -> arrive  1.28 /  1.54 /  1.79" in lines["gate_up"]
    assert "(n=2772)" in lines["gate_up"]


def test_bad_inputs_are_named(tmp_path):
    missing = tmp_path / "nope.csv"
    out = run(missing)
    assert out.returncode == 1 and str(missing) in out.stderr and "No such file" in out.stderr
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    out = run(wrong)
    assert out.returncode == 1 and str(wrong) in out.stderr and "not a megakernel trace CSV" in out.stderr
    out = run()
    assert out.returncode == 2 and "usage:" in out.stderr.lower()
