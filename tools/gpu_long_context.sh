#!/usr/bin/env bash
# Long-context GPU run (issue 27), one command on the GPU machine (repo root), well inside
# its 10-minute limit:
#   1. configures + builds swiftspec-cuda-check and swiftspec-cuda-long-bench (sm_90a; CUTLASS
#      headers from a carried .whl/nvidia_cutlass-*.whl or an installed nvidia-cutlass);
#   2. swiftspec-cuda-check --long-only (split-K attention vs fp64, tree == decode alone at
#      long contexts, the prefill path vs the reference and the decode steps), then, with
#      FULL_CHECK=1, the whole check under CHECK_TIMEOUT_S (default 200);
#   3. swiftspec-cuda-long-bench: decode, trees and prefill at LONG_CONTEXTS for LONG_SHAPES
#      (random weights), against the copy-bandwidth limit of the same run.
# Writes under $OUT: build.log check_long.log check_long.json [check.log check.json]
# long_bench.log long_bench.json; prints the bench table last.
# env: OUT (default /tmp/swiftspec-long), COMMIT, BUILD_DIR (build/gpu-long), JOBS (nproc),
#      LONG_SHAPES (qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b), LONG_CONTEXTS (512,4096,16384,32768),
#      BENCH_ARGS (more swiftspec-cuda-long-bench flags), SKIP_CHECK=1, SKIP_BENCH=1, FULL_CHECK=1,
#      PREBUILT (a .tar.xz of swiftspec-cuda-check and swiftspec-cuda-long-bench built elsewhere)
set -uo pipefail
OUT=${OUT:-/tmp/swiftspec-long}
BUILD_DIR=${BUILD_DIR:-build/gpu-long}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[gpu_long +$(( $(date +%s) - T0 ))s] $*"; }
. "$(dirname "$0")/gpu_common.sh"
gpu_machine_info "$OUT/build.log"
gpu_headers /tmp/ss-long-site "$OUT/build.log"
BIN=$BUILD_DIR/cuda
gpu_programs swiftspec-cuda-long-bench swiftspec-cuda-check swiftspec-cuda-long-bench

if [ "${SKIP_CHECK:-0}" != "1" ]; then
  timeout 240 "$BIN/swiftspec-cuda-check" --long-only --json "$OUT/check_long.json" > "$OUT/check_long.log" 2>&1
  log "long checks exit $? ($(grep -c ' PASS' "$OUT/check_long.log") pass, $(grep -c ' FAIL' "$OUT/check_long.log") fail)"
  grep -E ' FAIL|aborted' "$OUT/check_long.log" | head -20
  if [ "${FULL_CHECK:-0}" = "1" ]; then
    timeout "${CHECK_TIMEOUT_S:-200}" "$BIN/swiftspec-cuda-check" --json "$OUT/check.json" > "$OUT/check.log" 2>&1
    log "full checks exit $? ($(grep -c ' PASS' "$OUT/check.log") pass, $(grep -c ' FAIL' "$OUT/check.log") fail)"
    grep -E ' FAIL|aborted' "$OUT/check.log" | head -20
  fi
fi

if [ "${SKIP_BENCH:-0}" != "1" ]; then
  timeout "${BENCH_TIMEOUT_S:-300}" "$BIN/swiftspec-cuda-long-bench" \
    --shapes "${LONG_SHAPES:-qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b}" \
    --contexts "${LONG_CONTEXTS:-512,4096,16384,32768}" --json "$OUT/long_bench.json" ${BENCH_ARGS:-} \
    > "$OUT/long_bench.log" 2>&1
  log "long bench exit $?"
  tail -16 "$OUT/long_bench.log"
fi
