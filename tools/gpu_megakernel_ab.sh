#!/usr/bin/env bash
# A/B of decode-megakernel settings on the GPU machine, in one process each,
# after tools/gpu_check.sh has built the CUDA targets (same call).
#   tools/gpu_megakernel_ab.sh "" "--mk-merge-in-o 1" "" "--mk-l2-prefetch 131072"
# Each argument is one variant: extra swiftspec-cuda-bench flags ("" = the
# defaults; repeat it between variants to see the run-to-run noise). Every
# run is `swiftspec-cuda-bench --megakernel-only --no-gemm --megakernel-trace
# <flags>`, appended to $OUT/mk_ab.log (one file: $OUT returns at most 8);
# then a table: per variant and shape, the megakernel decode step (ms, wall
# clock over the bench's replays) and the traced step and layer (us).
# env: OUT (default /tmp/swiftspec-gpu), BUILD_DIR (default build/gpu),
#      MK_AB_SHAPES (default all three, e.g. "qwen2.5-0.5b,qwen2.5-1.5b"),
#      MK_AB_TIMEOUT_S (default 120: a variant that runs longer, e.g. a hung
#      kernel, is killed and reported as failed with exit 124, and the next
#      variant runs).
set -uo pipefail
OUT=${OUT:-/tmp/swiftspec-gpu}
BENCH=${BUILD_DIR:-build/gpu}/cuda/swiftspec-cuda-bench
LOG="$OUT/mk_ab.log"
if [ ! -x "$BENCH" ]; then
  echo "gpu_megakernel_ab: $BENCH is missing: run tools/gpu_check.sh first (it builds it)" >&2
  exit 2
fi
if [ $# -eq 0 ]; then
  echo "gpu_megakernel_ab: give at least one variant (a string of bench flags, \"\" for the defaults)" >&2
  exit 2
fi
mkdir -p "$OUT"
shapes=()
[ -n "${MK_AB_SHAPES:-}" ] && shapes=(--shapes "$MK_AB_SHAPES")
i=0
for flags in "$@"; do
  i=$((i + 1))
  echo "==== variant $i: [${flags}]" >> "$LOG"
  # shellcheck disable=SC2086 # the flags are words on purpose
  timeout -k 5 "${MK_AB_TIMEOUT_S:-120}" "$BENCH" --megakernel-only --no-gemm --megakernel-trace "${shapes[@]}" $flags >> "$LOG" 2>&1
  rc=$?
  [ $rc -ne 0 ] && echo "==== variant $i failed (exit $rc)" >> "$LOG"
done
# The table: "model <shape> megakernel decode <ms> ms" and
# "megakernel trace <shape> total <us> us, ... | layer <us>" per run.
awk '
  /^==== variant [0-9]+: / { v = $0; sub(/^==== /, "", v); next }
  /^==== variant [0-9]+ failed/ { print; next }
  / megakernel decode / { for (k = 1; k <= NF; ++k) if ($k == "decode") ms[$2] = $(k + 1); next }
  /^megakernel trace / && $4 == "total" {
    shape = $3; tot = $5; lay = $NF
    printf "%-40s %-14s decode %8s ms  traced %8s us  layer %6s us\n", v, shape, ms[shape], tot, lay
  }' "$LOG"
