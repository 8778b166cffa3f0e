"""The CUDA backend compiles for the H200 (sm_90a) with the machine's nvcc.

Nothing of it can run without a GPU; its checks and benchmarks run on the GPU machine
(tools/gpu_check.sh, docs/cuda_backend.md). This test keeps a CPU-only session or CI run from
landing CUDA code that does not compile: the core library with every kernel, the GPU check,
the benchmark and the memory-estimate check (~1-2 min on 2 cores). Skipped, with the reason,
where nvcc, cmake or ninja is not installed."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
TARGETS = ["swiftspec-cuda-check", "swiftspec-cuda-bench", "swiftspec-cuda-memory-check"]


def _json_include() -> Path:
    import nlohmann_json  # the test extra pins nlohmann-json (header-only)

    return Path(str(nlohmann_json.get_include()))


def test_cuda_backend_compiles_for_sm90a(tmp_path):
    missing = [tool for tool in ("nvcc", "cmake", "ninja") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)} (the CUDA build needs them)")
    build = tmp_path / "cuda-build"
    configure = subprocess.run(
        [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DSWIFTSPEC_CUDA=ON",
            "-DSWIFTSPEC_PYTHON=OFF",
            "-DSWIFTSPEC_CUDA_BENCH_CUBLAS=OFF",
            f"-DSWIFTSPEC_JSON_INCLUDE_DIR={_json_include()}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert configure.returncode == 0, configure.stdout[-4000:] + configure.stderr[-4000:]
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    compile_ = subprocess.run(
        ["ninja", "-C", str(build), "-j", jobs, *TARGETS], capture_output=True, text=True, timeout=1500
    )
    # ninja prints the failing command and nvcc's errors on stdout
    assert compile_.returncode == 0, compile_.stdout[-6000:] + compile_.stderr[-2000:]
    for target in TARGETS:
        assert (build / "cuda" / target).is_file(), f"{target} was not linked"
