#!/usr/bin/env bash
# Multi-GPU check and benchmark (issue 7), for the H200 machines (nvcc 13.0,
# CMake, ninja, the Python package nvidia-nccl-cu13). One command, well inside
# 10 minutes, on any number of GPUs (1 GPU: a smoke test at TP 1, plus the peer
# protocol with several ranks on GPU 0):
#   1. records the machine (nvidia-smi, the GPU link matrix, NCCL version);
#   2. configures + builds the multi-GPU targets (Ninja, sm_90a, NCCL found from
#      the Python wheel or NCCL_ROOT);
#   3. swiftspec-cuda-multigpu-check: NCCL group, peer all-reduce, fused
#      row-parallel GEMM + all-reduce vs host references;
#   4. swiftspec-cuda-allreduce-bench: all-reduce latency 8 KB - 1 MB (NCCL vs
#      peer) and the row-parallel GEMM variants, per TP degree;
#   5. swiftspec-cuda-tp-bench (if built): decode-step latency of the Llama-3-8B /
#      70B shapes at each TP degree vs the physical limit;
#   6. writes under $OUT: multigpu.tgz (every log and JSON) plus check.json,
#      bench.json, tp_bench.json and summary.txt (the device tool returns <= 8 files).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends, exported here and
# set again by the programs): a program using it can take a shared host's GPUs
# out of service.
# Usage (repo root): tools/gpu_multi.sh   env: OUT (default /tmp/swiftspec-multi),
#   BUILD_DIR (default build/multigpu), JOBS (default nproc), GPUS (default all),
#   BENCH_ARGS / TP_BENCH_ARGS (extra flags), BUDGET_S (default 540: seconds the
#   whole script may take; each stage's timeout is cut to fit), SKIP_TP_BENCH=1,
#   PREBUILT (a folder with the three binaries built elsewhere: used when they
#   start on this machine, else the script builds).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/swiftspec-multi}
BUILD_DIR=${BUILD_DIR:-build/multigpu}
JOBS=${JOBS:-$(nproc)}
# Logs live outside $OUT: only the bundle and a few files go there (the device
# tool returns at most 8 files).
LOGS=${LOGS:-/tmp/swiftspec-multi-logs}
rm -rf "$LOGS"; mkdir -p "$LOGS" "$OUT"
T0=$(date +%s)
DEADLINE=$((T0 + ${BUDGET_S:-540}))
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(date +%s) )); }
log() { echo "[gpu_multi +$(el)s] $*" | tee -a "$LOGS/summary.txt"; }
# Seconds for a stage: at most $1, at most what is left minus $2 (reserve), at least 10.
cap() { local t=$(( $(left) - $2 )); [ "$t" -gt "$1" ] && t=$1; [ "$t" -lt 10 ] && t=10; echo "$t"; }
GPU_ARG=()
[ -n "${GPUS:-}" ] && GPU_ARG=(--gpus "$GPUS")

# ---- 1. machine ---------------------------------------------------------------------
NCCL_ROOT_DIR=${NCCL_ROOT:-$(python3 -c "import importlib.util as u; s = u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0] if s else '')" 2>/dev/null)}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  echo "--- nvidia-smi topo -m"; nvidia-smi topo -m 2>&1
  echo "--- nvidia-smi nvlink -s (first GPU)"; nvidia-smi nvlink -s -i 0 2>&1 | head -20
  nvcc --version | tail -2; cmake --version | head -1
  echo "nccl wheel: $NCCL_ROOT_DIR"; ls "$NCCL_ROOT_DIR/lib" 2>&1
  env | grep -E '^(NCCL|NVSHMEM|TORCH_SYMM)' | sort
} > "$LOGS/machine.log" 2>&1
log "$(grep -c H200 "$LOGS/machine.log") H200 lines; NCCL from '$NCCL_ROOT_DIR'"

# ---- 2. build (or use PREBUILT binaries, if they start here) ---------------------------------
BIN=$BUILD_DIR/cuda
export LD_LIBRARY_PATH="$NCCL_ROOT_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -n "${PREBUILT:-}" ] && [ -x "$PREBUILT/swiftspec-cuda-allreduce-bench" ]; then
  # A binary that loads answers an unknown flag with its usage and status 2.
  "$PREBUILT/swiftspec-cuda-allreduce-bench" --probe-loads > "$LOGS/prebuilt.log" 2>&1
  if [ $? = 2 ]; then BIN=$PREBUILT; SKIP_BUILD=1; log "using prebuilt binaries in $PREBUILT"
  else log "prebuilt binaries do not start here (see prebuilt.log): building"; fi
fi
JSON_INC=${SWIFTSPEC_JSON_INCLUDE_DIR:-}
if [ -z "$JSON_INC" ] && ls .whl/nlohmann_json-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/ss-site .whl/nlohmann_json-*.whl >> "$LOGS/build.log" 2>&1
  JSON_INC=/tmp/ss-site/nlohmann_json/include
fi
[ -z "$JSON_INC" ] && JSON_INC=$(python3 -c 'import nlohmann_json, os; print(os.path.join(os.path.dirname(nlohmann_json.__file__), "include"))' 2>/dev/null || true)
# The multi-GPU targets do not use the JSON headers (only the runtime does):
# a placeholder keeps the top-level configure going without them.
[ -z "$JSON_INC" ] && JSON_INC=/nonexistent-json-include
TARGETS="swiftspec-cuda-multigpu-check swiftspec-cuda-allreduce-bench"
if [ "${SKIP_BUILD:-0}" != "1" ]; then
  log "configure + build ($BUILD_DIR, $JOBS jobs)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DSWIFTSPEC_CUDA=ON -DSWIFTSPEC_PYTHON=OFF -DSWIFTSPEC_NCCL=ON \
    -DNCCL_ROOT="$NCCL_ROOT_DIR" -DSWIFTSPEC_JSON_INCLUDE_DIR="$JSON_INC" >> "$LOGS/build.log" 2>&1 || log "CONFIGURE FAILED"
  grep -q "swiftspec-cuda-tp-bench" "$BUILD_DIR/build.ninja" 2>/dev/null && [ "${SKIP_TP_BENCH:-0}" != "1" ] &&
    TARGETS="$TARGETS swiftspec-cuda-tp-bench"
  timeout "$(cap 240 130)" cmake --build "$BUILD_DIR" --target $TARGETS -j "$JOBS" >> "$LOGS/build.log" 2>&1 ||
    { log "BUILD FAILED (see build.log)"; grep -B2 -A8 -m3 'error' "$LOGS/build.log" | tee -a "$LOGS/summary.txt"; }
  log "build done"
fi

# ---- 3. checks --------------------------------------------------------------------------
if [ -x "$BIN/swiftspec-cuda-multigpu-check" ]; then
  timeout "$(cap 120 120)" "$BIN/swiftspec-cuda-multigpu-check" "${GPU_ARG[@]}" --json "$LOGS/check.json" > "$LOGS/check.log" 2>&1
  rc=$?
  log "checks exit $rc ($(grep -c ' PASS' "$LOGS/check.log") pass, $(grep -c ' FAIL' "$LOGS/check.log") fail)$([ $rc = 124 ] && echo ' TIMED OUT')"
  grep ' FAIL' "$LOGS/check.log" | head -20 | tee -a "$LOGS/summary.txt"
fi

# ---- 4. all-reduce / row-parallel GEMM benchmark ---------------------------------------------
if [ -x "$BIN/swiftspec-cuda-allreduce-bench" ]; then
  timeout "$(cap 150 60)" "$BIN/swiftspec-cuda-allreduce-bench" "${GPU_ARG[@]}" --json "$LOGS/bench.json" ${BENCH_ARGS:-} \
    > "$LOGS/bench.log" 2>&1
  log "allreduce bench exit $?"
fi

# ---- 5. TP decode-step benchmark -------------------------------------------------------------------
if [ -x "$BIN/swiftspec-cuda-tp-bench" ] && [ "${SKIP_TP_BENCH:-0}" != "1" ]; then
  timeout "$(cap 150 10)" "$BIN/swiftspec-cuda-tp-bench" "${GPU_ARG[@]}" --json "$LOGS/tp_bench.json" ${TP_BENCH_ARGS:-} \
    > "$LOGS/tp_bench.log" 2>&1
  log "tp bench exit $?"
fi

# ---- 6. bundle ------------------------------------------------------------------------------------
log "done"
python3 cuda/scripts/multigpu_summary.py "$LOGS" >> "$LOGS/summary.txt" 2>&1
tar czf "$OUT/multigpu.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
for f in check.json bench.json tp_bench.json summary.txt; do [ -f "$LOGS/$f" ] && cp "$LOGS/$f" "$OUT/$f"; done
cat "$LOGS/summary.txt"
