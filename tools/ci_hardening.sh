#!/usr/bin/env bash
# CI's hardening steps (issue 28), run by .ci/run after the test suite:
#   1. a short fuzz campaign over the loaders (fuzz/run.sh: 10 s per C++ target, 20 s of the
#      converter under atheris), from the committed seeds;
#   2. the AddressSanitizer + UndefinedBehaviorSanitizer build of the runtime over the C++ tests
#      and the loader tests (tools/run_asan.sh).
# About 6 minutes on 2 idle cores (benchmarks/README.md, "Fuzzing the loaders"). Installs what it
# needs when missing: clang-14 with libFuzzer (Debian) and atheris (PyPI), both pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
if ! command -v clang++-14 > /dev/null || [ ! -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ]; then
  echo "== installing clang-14 and libclang-rt-14-dev (libFuzzer)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq > /dev/null
  apt-get install -y -qq --no-install-recommends clang-14=1:14.0.6-12 libclang-rt-14-dev=1:14.0.6-12 > /dev/null
fi
python3 -c "import atheris" 2> /dev/null || python3 -m pip install --quiet atheris==3.0.0
t1=$(date +%s)
echo "== fuzz campaign"
fuzz/run.sh --seconds "${CI_FUZZ_SECONDS:-10}" --python-seconds "${CI_FUZZ_PYTHON_SECONDS:-20}"
t2=$(date +%s)
echo "== ASan + UBSan"
tools/run_asan.sh
t3=$(date +%s)
echo "hardening: installs $((t1 - t0)) s, fuzzing $((t2 - t1)) s, sanitizers $((t3 - t2)) s, total $((t3 - t0)) s"
