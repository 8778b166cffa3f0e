#!/usr/bin/env bash
# int4-weight GEMM run (issue 31), one command on the GPU machine (repo root), well inside its
# 10-minute limit:
#   1. configures + builds swiftspec-cuda-check and swiftspec-cuda-int4-bench (sm_90a; CUTLASS
#      headers from a carried .whl/nvidia_cutlass-*.whl or an installed nvidia-cutlass), unless
#      PREBUILT programs load;
#   2. swiftspec-cuda-check --int4-only: the int4 skinny GEMM against an fp64 product of the same
#      int4 values at the 0.5B / 1.5B / 8B projection shapes, M in {1, 2, 16, 33, 64}, batch
#      invariance bitwise, refused inputs; then tiny models with int4 projections (the model's
#      int4 path: loading, the epilogues, the norm weights on the activations) against the fp32
#      reference over their dequantized weights, exactness bitwise, refused options;
#   3. swiftspec-cuda-int4-bench: each projection at M = 1 / 16 / 64, int4 against its byte limit
#      (int4 words + group metadata + activations / the copy bandwidth of the same run) and
#      against the bf16 skinny GEMM of the same run; with INT4_MODEL_STEPS=1 also the whole decode
#      step of random bf16 and int4 models per shape (--model-steps), each against its byte limit;
#   4. swiftspec-cuda-memory-check --int4 $INT4_GROUP: the memory estimate of int4 models (random
#      weights) against what they take, at the 0.5B / 1.5B / 8B shapes (when the program is there).
# Writes under $OUT: build.log check_int4.log check_int4.json int4_bench.log int4_bench.json
#   memory_int4.log;
# prints the failures and the bench's per-layer table last.
# env: OUT (default /tmp/swiftspec-int4), COMMIT, BUILD_DIR (build/gpu-int4), JOBS (nproc),
#      INT4_SHAPES (qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b), INT4_MS (1,16,64), BENCH_ARGS (more
#      swiftspec-cuda-int4-bench flags, e.g. --sweep), SKIP_CHECK=1, SKIP_BENCH=1, SKIP_MEMORY=1,
#      INT4_GROUP (32), INT4_MODEL_STEPS=1,
#      PREBUILT (a .tar.xz of swiftspec-cuda-check and swiftspec-cuda-int4-bench built elsewhere:
#      tar -cJf int4.tar.xz -C <build>/cuda swiftspec-cuda-check swiftspec-cuda-int4-bench
#      swiftspec-cuda-memory-check)
set -uo pipefail
OUT=${OUT:-/tmp/swiftspec-int4}
BUILD_DIR=${BUILD_DIR:-build/gpu-int4}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[gpu_int4 +$(( $(date +%s) - T0 ))s] $*"; }
. "$(dirname "$0")/gpu_common.sh"
gpu_machine_info "$OUT/build.log"
gpu_headers /tmp/ss-int4-site "$OUT/build.log"
BIN=$BUILD_DIR/cuda
gpu_programs swiftspec-cuda-int4-bench swiftspec-cuda-check swiftspec-cuda-int4-bench swiftspec-cuda-memory-check

if [ "${SKIP_CHECK:-0}" != "1" ]; then
  timeout "${CHECK_TIMEOUT_S:-240}" "$BIN/swiftspec-cuda-check" --int4-only --json "$OUT/check_int4.json" \
    > "$OUT/check_int4.log" 2>&1
  log "int4 checks exit $? ($(grep -c ' PASS' "$OUT/check_int4.log") pass, $(grep -c ' FAIL' "$OUT/check_int4.log") fail)"
  grep -E ' FAIL|aborted' "$OUT/check_int4.log" | head -20
fi

if [ "${SKIP_BENCH:-0}" != "1" ]; then
  STEPS_FLAG=""; TAIL=12
  [ "${INT4_MODEL_STEPS:-0}" = "1" ] && STEPS_FLAG=--model-steps && TAIL=18
  timeout "${BENCH_TIMEOUT_S:-240}" "$BIN/swiftspec-cuda-int4-bench" \
    --shapes "${INT4_SHAPES:-qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b}" --ms "${INT4_MS:-1,16,64}" \
    --json "$OUT/int4_bench.json" ${BENCH_ARGS:-} $STEPS_FLAG > "$OUT/int4_bench.log" 2>&1
  log "int4 bench exit $?"
  grep -E '^device|^copy' "$OUT/int4_bench.log"
  tail -"$TAIL" "$OUT/int4_bench.log"
fi

if [ "${SKIP_MEMORY:-0}" != "1" ] && [ -x "$BIN/swiftspec-cuda-memory-check" ]; then
  timeout "${MEMORY_TIMEOUT_S:-120}" "$BIN/swiftspec-cuda-memory-check" --int4 "${INT4_GROUP:-32}" --contexts 4096 \
    > "$OUT/memory_int4.log" 2>&1
  log "int4 memory check exit $? (1: an estimate below what was measured)"
  grep -v '^\[' "$OUT/memory_int4.log" | head -4
fi
