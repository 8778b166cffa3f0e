"""Every script in tools/ starts and prints its usage: its imports resolve against the
installed package (a renamed helper breaks a tool no test otherwise runs)."""

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = sorted(p for p in (Path(__file__).resolve().parent.parent / "tools").glob("*.py") if not p.name.startswith("_"))


def test_tools_are_found():
    assert {"check_lossless.py", "bench_acceptance.py", "convert_weights.py", "fetch_models.py"} <= {
        p.name for p in TOOLS
    }


@pytest.mark.parametrize("tool", TOOLS, ids=[p.stem for p in TOOLS])
def test_tool_prints_usage(tool):
    out = subprocess.run([sys.executable, str(tool), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout.lower()
