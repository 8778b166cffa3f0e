#!/usr/bin/env bash
# GPU check of the CUDA backend (issue 5), for the H200 machine (nvcc 13.0,
# CMake, ninja, torch). One command, well inside 10 minutes:
#   1. starts the PyTorch peers (tools/bench_torch_peer.py, one process per
#      shape) so their torch.compile overlaps our build; they wait for a go
#      signal before timing, so no timing overlaps another;
#   2. configures + builds the CUDA targets (Ninja, sm_90a);
#   3. swiftspec-cuda-check: kernel and tiny-model checks vs fp32 CPU references;
#   4. swiftspec-cuda-bench: copy bandwidth, GEMM vs cuBLAS, decode latency of the
#      8B / 1.5B / 0.5B shapes, tree verification 32 / 64 nodes;
#   5. the peers time their decode, one after the other;
#   6. prints a summary table (last) and writes under $OUT (8 files):
#      build.log check.log check.json bench.log bench.json peer.log peer.json summary.json
# Usage (repo root): tools/gpu_check.sh        env: OUT (default /tmp/swiftspec-gpu),
#   SKIP_PEER=1, SKIP_CHECK=1, SKIP_GEMM_BENCH=1, NCU_GEMM (see 3c), BUILD_DIR (default build/gpu), JOBS (default nproc),
#   BENCH_ARGS (extra swiftspec-cuda-bench flags, e.g. "--sweep --mma-models" or "--megakernel-only"),
#   CHECK_ARGS (extra swiftspec-cuda-check flags, e.g. "--megakernel-only"),
#   NCU_MEGAKERNEL (a shape: also an Nsight Compute profile of one megakernel step, as CSV),
#   BUDGET_S (default 560: seconds the whole script may take; waits are cut to fit)
# nlohmann-json and CUTLASS headers: carried .whl/nlohmann_json-*.whl and .whl/nvidia_cutlass-*.whl,
# the installed Python packages, or SWIFTSPEC_JSON_INCLUDE_DIR / SWIFTSPEC_CUTLASS_DIR.
set -uo pipefail
OUT=${OUT:-/tmp/swiftspec-gpu}
BUILD_DIR=${BUILD_DIR:-build/gpu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
T0=$(date +%s)
DEADLINE=$((T0 + ${BUDGET_S:-560}))
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(date +%s) )); }
log() { echo "[gpu_check +$(el)s] $*"; }
export PYTHONUNBUFFERED=1

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv 2>&1
  nvcc --version | tail -2; cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1
} > "$OUT/build.log" 2>&1

# ---- 1. peers (background) ---------------------------------------------------
SHAPES="qwen2.5-0.5b qwen2.5-1.5b llama3-8b"
PEER_TMP=/tmp/swiftspec-peer
rm -rf "$PEER_TMP"; mkdir -p "$PEER_TMP"
declare -A PEER_PID
if [ "${SKIP_PEER:-0}" != "1" ]; then
  for s in $SHAPES; do
    TORCHINDUCTOR_CACHE_DIR=$PEER_TMP/inductor_$s python3 tools/bench_torch_peer.py --shapes "$s" \
      --json "$PEER_TMP/$s.json" --ready-file "$PEER_TMP/$s.ready" --go-file "$PEER_TMP/$s.go" \
      --go-timeout 500 > "$PEER_TMP/$s.log" 2>&1 &
    PEER_PID[$s]=$!
  done
  log "peers started"
fi

# ---- 2. build -----------------------------------------------------------------
. "$(dirname "$0")/gpu_common.sh"
gpu_headers /tmp/ss-site "$OUT/build.log"
CUTLASS_ARG=()
[ -n "$CUTLASS" ] && CUTLASS_ARG=(-DSWIFTSPEC_CUTLASS_DIR="$CUTLASS")  # else: cmake's own search (dependencies.cmake)
build() {
  cmake -S . -B "$BUILD_DIR" -G Ninja -DSWIFTSPEC_CUDA=ON -DSWIFTSPEC_PYTHON=OFF \
    -DSWIFTSPEC_JSON_INCLUDE_DIR="$JSON_INC" "${CUTLASS_ARG[@]}" "$@" >> "$OUT/build.log" 2>&1 &&
  timeout 300 cmake --build "$BUILD_DIR" --target swiftspec-cuda-check swiftspec-cuda-bench -j "$JOBS" >> "$OUT/build.log" 2>&1
}
log "configure + build ($BUILD_DIR, $JOBS jobs)"
if ! build; then
  log "build failed; retrying without the cuBLAS comparison"
  build -DSWIFTSPEC_CUDA_BENCH_CUBLAS=OFF || { log "BUILD FAILED (see build.log)"; tail -30 "$OUT/build.log"; }
fi
log "build done"
BIN=$BUILD_DIR/cuda

# ---- 3. checks ------------------------------------------------------------------
if [ -x "$BIN/swiftspec-cuda-check" ] && [ "${SKIP_CHECK:-0}" != "1" ]; then
  log "checks"
  timeout 150 "$BIN/swiftspec-cuda-check" --json "$OUT/check.json" ${CHECK_ARGS:-} > "$OUT/check.log" 2>&1
  log "checks exit $? ($(grep -c ' PASS' "$OUT/check.log") pass, $(grep -c ' FAIL' "$OUT/check.log") fail)"
  grep ' FAIL' "$OUT/check.log" | head -20
fi

# ---- 3b. optional: Nsight Compute profile of one decode-megakernel step ------------
# NCU_MEGAKERNEL=<shape> (e.g. qwen2.5-0.5b): the full section set with source
# counters (built with -lineinfo), as CSV: details (throughput, stalls, occupancy) and
# per-source-line samples, to find what the trace (--megakernel-trace) only locates.
if [ -n "${NCU_MEGAKERNEL:-}" ] && [ -x "$BIN/swiftspec-cuda-bench" ]; then
  log "ncu profile of the decode megakernel ($NCU_MEGAKERNEL)"
  timeout 240 ncu --set full --import-source yes --kernel-name regex:decode_megakernel -c 1 -f -o /tmp/ncu_mk \
    "$BIN/swiftspec-cuda-bench" --profile "$NCU_MEGAKERNEL" --profile-megakernel > "$OUT/ncu_mk.log" 2>&1
  ncu -i /tmp/ncu_mk.ncu-rep --page details --csv > "$OUT/ncu_mk_details.csv" 2>> "$OUT/ncu_mk.log"
  ncu -i /tmp/ncu_mk.ncu-rep --page source --csv --print-source cuda,sass > "$OUT/ncu_mk_source.csv" 2>> "$OUT/ncu_mk.log"
  log "ncu done ($(wc -l < "$OUT/ncu_mk_source.csv") source rows)"
fi

# ---- 3c. optional: Nsight Compute profiles of one GEMM shape, ours and cuBLAS's --------
# NCU_GEMM="<bench shape name>:<M>[,<M>...]" (e.g. "8B o:1,64"): the full section set of one
# launch of our planned kernel per M and of cuBLAS's kernel(s) at the same M, as text.
if [ -n "${NCU_GEMM:-}" ] && [ -x "$BIN/swiftspec-cuda-bench" ]; then
  GSHAPE=${NCU_GEMM%%:*}
  for GM in $(echo "${NCU_GEMM##*:}" | tr ',' ' '); do
    tag=$(echo "$GSHAPE-m$GM" | tr ' .' '__')
    log "ncu of the GEMM $GSHAPE at M=$GM (ours, cuBLAS)"
    timeout 120 ncu --set full -k regex:gemm_wgmma -s 3 -c 1 -f -o "/tmp/ncu_$tag" \
      "$BIN/swiftspec-cuda-bench" --gemm-only "$GSHAPE" --gemm-m "$GM" > "$OUT/ncu_$tag.log" 2>&1
    ncu -i "/tmp/ncu_$tag.ncu-rep" --page details >> "$OUT/ncu_$tag.txt" 2>&1
    # every collected metric (warp stall reasons included), for what the details page summarizes away
    ncu -i "/tmp/ncu_$tag.ncu-rep" --page raw --csv 2>/dev/null | gzip -9 > "$OUT/ncu_raw_$tag.csv.gz"
    timeout 120 ncu --set full -k 'regex:^(?!gemm_|fill).*' -s 3 -c 2 -f -o "/tmp/ncu_cublas_$tag" \
      "$BIN/swiftspec-cuda-bench" --gemm-only "$GSHAPE" --gemm-m "$GM" >> "$OUT/ncu_$tag.log" 2>&1
    ncu -i "/tmp/ncu_cublas_$tag.ncu-rep" --page details >> "$OUT/ncu_cublas_$tag.txt" 2>&1
  done
  log "ncu done"
fi

# ---- 4. our benchmark (after the peers finished compiling) ------------------------
if [ "${SKIP_PEER:-0}" != "1" ]; then
  for s in $SHAPES; do
    while [ ! -e "$PEER_TMP/$s.ready" ] && kill -0 "${PEER_PID[$s]}" 2>/dev/null && [ "$(left)" -gt 110 ]; do sleep 1; done
  done
  log "peers ready: $(ls $PEER_TMP/*.ready 2>/dev/null | wc -l)/3"
fi
if [ -x "$BIN/swiftspec-cuda-bench" ]; then
  BARGS="${BENCH_ARGS:-}"
  [ "${SKIP_GEMM_BENCH:-0}" = "1" ] && BARGS="$BARGS --no-gemm"
  log "bench"
  BT=$(( $(left) - 40 )); [ "$BT" -gt 240 ] && BT=240; [ "$BT" -lt 30 ] && BT=30
  timeout "$BT" "$BIN/swiftspec-cuda-bench" --json "$OUT/bench.json" $BARGS > "$OUT/bench.log" 2>&1
  log "bench exit $?"
fi

# ---- 5. peers time, one at a time ---------------------------------------------------
if [ "${SKIP_PEER:-0}" != "1" ]; then
  for s in $SHAPES; do
    touch "$PEER_TMP/$s.go"
    while kill -0 "${PEER_PID[$s]}" 2>/dev/null && [ "$(left)" -gt 8 ]; do sleep 0.5; done
    kill "${PEER_PID[$s]}" 2>/dev/null
    log "peer $s: $(grep -h 'ms/token' "$PEER_TMP/$s.log" | tail -1)"
  done
  for s in $SHAPES; do echo "=== $s"; cat "$PEER_TMP/$s.log"; done > "$OUT/peer.log" 2>&1
  python3 - "$PEER_TMP" "$OUT/peer.json" <<'PY'
import json, glob, os, sys
tmp, out = sys.argv[1], sys.argv[2]
merged = {"shapes": {}}
for p in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    try:
        d = json.load(open(p))
    except Exception:
        continue
    for k in ("device", "torch", "context", "steps"):
        merged.setdefault(k, d.get(k))
    merged["shapes"].update(d.get("shapes", {}))
json.dump(merged, open(out, "w"), indent=2)
PY
fi

# ---- 6. summary -------------------------------------------------------------------
log "done"
tail -5 "$OUT/bench.log" 2>/dev/null
python3 cuda/scripts/gpu_summary.py "$OUT"
