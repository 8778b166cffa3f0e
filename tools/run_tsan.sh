#!/usr/bin/env bash
# ThreadSanitizer run of the runtime's threaded code (issue 4): channels, the in-process
# communicator, worker groups, the tensor-parallel CPU model and the asynchronous engine.
#
#   tools/run_tsan.sh                 # build build/tsan and run the default test set
#   tools/run_tsan.sh async_channel   # only the tests whose names contain these words
#
# Builds the C++ test executable with -DSWIFTSPEC_TSAN=ON (no Python module) and runs it with
# halt_on_error: any data race fails the run, printed with both stacks. The model tests use the
# real models from the user cache (~/.cache/swiftspec, or $SWIFTSPEC_CACHE):
#   SWIFTSPEC_TEST_SMALL  SmolLM2-135M (bf16): the async stress test, TP-2 target + draft
#   SWIFTSPEC_TEST_DRAFT  Qwen2.5-Coder-0.5B (bf16): the TP model against the plain CPU model
# Fetch them first with `python tools/fetch_models.py` (or run the pytest suite once).
# Environment: BUILD_DIR (build/tsan), JOBS (nproc), SWIFTSPEC_TEST_STRESS_REQUESTS (16).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build/tsan}
cmake -S . -B "$BUILD_DIR" -G Ninja -DSWIFTSPEC_TSAN=ON -DSWIFTSPEC_PYTHON=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$BUILD_DIR.cmake.log" 2>&1 || { cat "$BUILD_DIR.cmake.log"; exit 1; }
cmake --build "$BUILD_DIR" --target swiftspec-cpp-tests -j "${JOBS:-$(nproc)}"

if [ $# -eq 0 ]; then
  set -- async_channel async_allreduce async_worker_group async_timeline async_placement async_tp_plan async_send_policy \
    async_engine_stress tp1_model_bit_identical
fi
export SWIFTSPEC_TEST_STRESS_REQUESTS=${SWIFTSPEC_TEST_STRESS_REQUESTS:-16}
# halt_on_error: the first race fails the run; second_deadlock_stack: full lock-order reports.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
echo "ThreadSanitizer: $BUILD_DIR/swiftspec-cpp-tests $*"
"$BUILD_DIR/swiftspec-cpp-tests" "$@"
