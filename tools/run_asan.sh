#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run of the runtime (issue 28), next to the
# ThreadSanitizer one (tools/run_tsan.sh): the C++ tests and the Python tests that drive the
# loaders and the runtime's data structures, through a build of the package with
# -DSWIFTSPEC_SANITIZE=ON. Any finding fails the run (halt_on_error; UB does not recover).
#
#   tools/run_asan.sh                   # build build/asan, run the default sets
#   tools/run_asan.sh --cpp-only        # only the C++ tests
#
# The build is `pip install . --no-deps --target build/asan-site` with its own build folder
# (build/asan), so it never touches an installed swiftspec; later runs rebuild incrementally.
# Python runs with the GCC ASan runtime preloaded (the interpreter is not instrumented) and leak
# detection off (the interpreter keeps its objects until exit).
# Environment: ASAN_CPP_TESTS, ASAN_PY_TESTS (space-separated) replace the default sets.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=build/asan-site
mkdir -p build
echo "== ASan+UBSan build (build/asan)"
python3 -m pip install . --no-deps --quiet --target "$SITE" --upgrade \
  -C build-dir=build/asan -C cmake.define.SWIFTSPEC_SANITIZE=ON -C install.strip=false > build/asan.log 2>&1 || { tail -50 build/asan.log; exit 1; }

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=0:strict_string_checks=1:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# Stacks with function names and lines: unstripped binaries (install.strip=false) and clang-14's
# symbolizer, where tools/ci_hardening.sh put it.
for s in llvm-symbolizer llvm-symbolizer-14; do
  if command -v "$s" > /dev/null; then export ASAN_SYMBOLIZER_PATH="$(command -v "$s")"; break; fi
done

# The C++ tests without the real models (the model tests take minutes under ASan; TSan covers
# the threaded ones with them).
CPP_TESTS=${ASAN_CPP_TESTS:-"async_channel async_allreduce async_worker_group async_tp_plan async_timeline async_send_policy
  json_errors async_placement forward_batch int4_ sample_from_head top_sampling_tokens verify_stochastic"}
echo "== C++ tests: $SITE/swiftspec/bin/swiftspec-cpp-tests"
# shellcheck disable=SC2086
ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=1" "$SITE/swiftspec/bin/swiftspec-cpp-tests" $CPP_TESTS

[ "${1:-}" = "--cpp-only" ] && exit 0
# Loaders (every bad-input test), token tree, tree KV cache, verification: the runtime's
# parsers and data structures through the binding, on tiny checkpoints. The tests on the real
# models (markers real_model, slow: tests/conftest.py) are left out: under ASan they take most of
# an hour on 2 cores, and the plain suite runs them.
PY_TESTS=${ASAN_PY_TESTS:-"tests/test_bad_input.py tests/test_bad_input_files.py tests/test_token_tree.py
  tests/test_tree_kv_cache.py tests/test_verification.py"}
echo "== Python tests under ASan: $PY_TESTS"
# libstdc++ preloaded too: loaded later (with the extension), its __cxa_throw is not the one ASan's
# interceptor resolved at start ("CHECK failed: ... real___cxa_throw != 0" on the first C++ throw).
# shellcheck disable=SC2086
LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)" PYTHONPATH="$SITE" \
  python3 -m pytest -q -x -p no:cacheprovider -m "not (real_model or slow or browser)" $PY_TESTS
