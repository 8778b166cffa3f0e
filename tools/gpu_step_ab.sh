#!/usr/bin/env bash
# Decode / tree step times of this tree against a baseline commit, in one call on the GPU machine
# (same machine session, same programs' flags): was a step made slower?
#   1. builds swiftspec-cuda-bench (and swiftspec-cuda-long-bench) of this tree and
#      swiftspec-cuda-bench of BASE_TAR (a carried `git archive` of the baseline commit, e.g.
#      .xfer/base.tar.gz), both at once, JOBS/2 jobs each;
#   2. runs each swiftspec-cuda-bench with AB_ARGS (default: --quick --no-gemm --shapes
#      qwen2.5-1.5b,llama3-8b --context 512), the two in turn, AB_ROUNDS (2) times;
#   3. with LONG_ARGS set, this tree's swiftspec-cuda-long-bench with those flags.
# Writes under $OUT: build_new.log build_base.log ab_<which>_<round>.log long.log; prints the
# decode lines of each run last.
# env: OUT, COMMIT, BASE_COMMIT (recorded), BASE_TAR, JOBS (nproc), AB_ARGS, AB_ROUNDS, LONG_ARGS
set -uo pipefail
OUT=${OUT:-/tmp/swiftspec-ab}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[gpu_step_ab +$(( $(date +%s) - T0 ))s] $*"; }
. "$(dirname "$0")/gpu_common.sh"
gpu_machine_info "$OUT/build_new.log"
echo "base commit: ${BASE_COMMIT:-unknown}" >> "$OUT/build_new.log"
gpu_headers /tmp/ss-ab-site "$OUT/build_new.log"
[ -f "${BASE_TAR:-}" ] || { log "BASE_TAR (a git archive of the baseline) is missing"; exit 1; }
rm -rf /tmp/ss-ab-base && mkdir -p /tmp/ss-ab-base && tar -xzf "$BASE_TAR" -C /tmp/ss-ab-base
configure() {  # SRC BUILD LOG
  cmake -S "$1" -B "$2" -G Ninja -DSWIFTSPEC_CUDA=ON -DSWIFTSPEC_PYTHON=OFF -DSWIFTSPEC_CUDA_BENCH_CUBLAS=OFF \
    -DSWIFTSPEC_JSON_INCLUDE_DIR="$JSON_INC" -DSWIFTSPEC_CUTLASS_DIR="$CUTLASS" >> "$3" 2>&1
}
half=$(( JOBS / 2 > 0 ? JOBS / 2 : 1 ))
( configure . /tmp/ss-ab-new "$OUT/build_new.log" &&
  timeout 480 cmake --build /tmp/ss-ab-new --target swiftspec-cuda-bench swiftspec-cuda-long-bench -j "$half" \
    >> "$OUT/build_new.log" 2>&1; echo $? > /tmp/ss-ab-new.rc ) &
( configure /tmp/ss-ab-base /tmp/ss-ab-basebuild "$OUT/build_base.log" &&
  timeout 480 cmake --build /tmp/ss-ab-basebuild --target swiftspec-cuda-bench -j "$half" \
    >> "$OUT/build_base.log" 2>&1; echo $? > /tmp/ss-ab-base.rc ) &
wait
log "builds: new rc=$(cat /tmp/ss-ab-new.rc 2>/dev/null) base rc=$(cat /tmp/ss-ab-base.rc 2>/dev/null)"
for w in new base; do
  if [ "$(cat /tmp/ss-ab-$w.rc 2>/dev/null)" != 0 ]; then grep -m 10 -A5 error "$OUT/build_$w.log"; exit 1; fi
done
NEW=/tmp/ss-ab-new/cuda/swiftspec-cuda-bench BASE=/tmp/ss-ab-basebuild/cuda/swiftspec-cuda-bench
for r in $(seq 1 "${AB_ROUNDS:-2}"); do
  for w in base new; do
    bin=$NEW; [ "$w" = base ] && bin=$BASE
    # shellcheck disable=SC2086
    timeout 240 "$bin" ${AB_ARGS:---quick --no-gemm --shapes qwen2.5-1.5b,llama3-8b --context 512} \
      > "$OUT/ab_${w}_$r.log" 2>&1
    log "$w round $r exit $?"
  done
done
if [ -n "${LONG_ARGS:-}" ]; then
  # shellcheck disable=SC2086
  timeout 300 /tmp/ss-ab-new/cuda/swiftspec-cuda-long-bench $LONG_ARGS > "$OUT/long.log" 2>&1
  log "long bench exit $?"
  tail -8 "$OUT/long.log"
fi
for f in "$OUT"/ab_*.log; do
  echo "== $(basename "$f")"
  grep -E -i "decode|step|tree" "$f" | head -12
done
