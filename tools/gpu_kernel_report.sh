#!/usr/bin/env bash
# The kernel-level report of a tree on the GPU machine, in one call, from programs built on the
# development machine (no build there: PREBUILT, a .tar.xz of swiftspec-cuda-check,
# swiftspec-cuda-long-bench, swiftspec-cuda-bench, swiftspec-cuda-int4-bench and, for the A/B,
# swiftspec-cuda-bench-base: a baseline commit's swiftspec-cuda-bench). Parts (PARTS, comma list,
# in this order; default all):
#   checks   swiftspec-cuda-check --long-only and --int4-only (CHECK_PARTS, default "long int4")
#   stages   the split-K attention's stages in place (SWIFTSPEC_ATTN_SKIP variants, step tuner off):
#            STAGE_SHAPES (qwen2.5-1.5b) at STAGE_CONTEXTS (512,16384)
#   ab       decode / tree steps of this tree against the baseline, AB_ARGS (default --quick
#            --no-gemm --shapes qwen2.5-1.5b,llama3-8b --context 512), base then new, AB_ROUNDS (1)
#   envab    swiftspec-cuda-long-bench under each environment setting of ENV_AB (space-separated,
#            e.g. "SWIFTSPEC_ATTN_NARROW=single SWIFTSPEC_ATTN_NARROW=all"; the A/B switches of
#            docs/cuda_backend.md; a setting "base:VAR=val" runs swiftspec-cuda-long-bench-base, a
#            baseline commit's program in PREBUILT), ENV_AB_ARGS (default --shapes qwen2.5-1.5b,llama3-8b --contexts
#            512,16384,32768 --no-megakernel --no-prefill --iters 20), step tuner off, settings
#            alternating for ENV_AB_ROUNDS (2) rounds
#   long     swiftspec-cuda-long-bench over LONG_SHAPES (qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b) at
#            LONG_CONTEXTS (512,4096,16384,32768), the step tuner on (the default)
#   int4     swiftspec-cuda-int4-bench --sweep at M = 1 for INT4_SHAPES (llama3-8b)
#   ncu      one step's attention kernels under Nsight Compute (--set full): NCU_SHAPE (qwen2.5-1.5b)
#            at NCU_CONTEXT (32768), kernels matching NCU_KERNELS (attention), step tuner off
#   full     the whole swiftspec-cuda-check (only when named; its log gzipped)
# Writes every log under $OUT; prints the tables. env: OUT, PREBUILT (.dev/bins.tar.xz), COMMIT.
set -uo pipefail
OUT=${OUT:-/tmp/swiftspec-report}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[kernel_report +$(( $(date +%s) - T0 ))s] $*"; }
PARTS=",${PARTS:-checks,stages,ab,long,int4},"  # full, envab and ncu only when named
has() { [[ "$PARTS" == *",$1,"* ]]; }
B=/tmp/ss-report-bin
rm -rf "$B" && mkdir -p "$B" && tar -xJf "${PREBUILT:-.dev/bins.tar.xz}" -C "$B" || { log "no PREBUILT programs"; exit 1; }
{ echo "commit: ${COMMIT:-unknown}"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } \
  > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
table() { grep -E "^(qwen|llama)[^ ]* +[0-9]" "$1" | grep -v " C=" | cut -c1-104; }

if has checks; then
  for part in ${CHECK_PARTS:-long int4}; do
    timeout 150 "$B/swiftspec-cuda-check" --$part-only > "$OUT/check_$part.log" 2>&1
    log "check --$part-only exit $? ($(grep -c ' PASS' "$OUT/check_$part.log") pass, $(grep -c ' FAIL' "$OUT/check_$part.log") fail)"
    grep -E ' FAIL|aborted' "$OUT/check_$part.log" | head -10
  done
fi

if has stages; then
  for v in none empty-attn empty-fold empty-both fold attn both; do
    env SWIFTSPEC_STEP_TUNE=0 SWIFTSPEC_ATTN_SKIP=$v timeout 150 "$B/swiftspec-cuda-long-bench" \
      --shapes "${STAGE_SHAPES:-qwen2.5-1.5b}" --contexts "${STAGE_CONTEXTS:-512,16384}" --no-megakernel --no-prefill \
      --iters 20 > "$OUT/stage_$v.log" 2>&1
    echo "== SWIFTSPEC_ATTN_SKIP=$v (exit $?)"; table "$OUT/stage_$v.log"
  done
fi

if has ab; then
  for r in $(seq 1 "${AB_ROUNDS:-1}"); do
    for w in base new; do
      bin=$B/swiftspec-cuda-bench; [ "$w" = base ] && bin=$B/swiftspec-cuda-bench-base
      # shellcheck disable=SC2086
      timeout 200 "$bin" ${AB_ARGS:---quick --no-gemm --shapes qwen2.5-1.5b,llama3-8b --context 512} \
        > "$OUT/ab_${w}_$r.log" 2>&1
      echo "== $w round $r (exit $?)"; grep -E "pdl=. decode|pdl=0 tree|megakernel decode" "$OUT/ab_${w}_$r.log" | cut -c1-90
    done
  done
fi

if has envab; then
  for r in $(seq 1 "${ENV_AB_ROUNDS:-2}"); do
    for setting in ${ENV_AB:-SWIFTSPEC_ATTN_NARROW=single SWIFTSPEC_ATTN_NARROW=all}; do
      tag=$(echo "$setting" | tr -c 'A-Za-z0-9_\n' _)
      bin=$B/swiftspec-cuda-long-bench
      case $setting in base:*) bin=$B/swiftspec-cuda-long-bench-base; setting=${setting#base:} ;; esac
      # shellcheck disable=SC2086
      env SWIFTSPEC_STEP_TUNE=0 "$setting" timeout 200 "$bin" \
        ${ENV_AB_ARGS:---shapes qwen2.5-1.5b,llama3-8b --contexts 512,16384,32768 --no-megakernel --no-prefill --iters 20} \
        > "$OUT/envab_${tag}_$r.log" 2>&1
      echo "== $setting round $r (exit $?)"; table "$OUT/envab_${tag}_$r.log"
    done
  done
fi

if has long; then
  timeout 300 "$B/swiftspec-cuda-long-bench" --shapes "${LONG_SHAPES:-qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b}" \
    --contexts "${LONG_CONTEXTS:-512,4096,16384,32768}" --json "$OUT/long_bench.json" > "$OUT/long_bench.log" 2>&1
  log "long bench exit $?"; grep -E "^shape" "$OUT/long_bench.log"; table "$OUT/long_bench.log"
fi

if has int4; then
  timeout 200 "$B/swiftspec-cuda-int4-bench" --shapes "${INT4_SHAPES:-llama3-8b}" --ms 1 --sweep \
    --json "$OUT/int4_sweep.json" > "$OUT/int4_sweep.log" 2>&1
  log "int4 sweep exit $?"; grep -E "sweep|^int4" "$OUT/int4_sweep.log" | head -40
fi

if has ncu; then
  env SWIFTSPEC_STEP_TUNE=0 timeout 240 ncu --clock-control none --graph-profiling node --set full \
    -k "regex:${NCU_KERNELS:-attention}" --launch-skip 56 --launch-count 4 "$B/swiftspec-cuda-long-bench" \
    --shapes "${NCU_SHAPE:-qwen2.5-1.5b}" --contexts "${NCU_CONTEXT:-32768}" --iters 3 --no-megakernel --no-prefill \
    > "$OUT/ncu.txt" 2>&1
  log "ncu exit $?"
  grep -E "attention_|Duration|DRAM Throughput|Memory Throughput|Eligible Warps|Achieved Occupancy|Registers Per" \
    "$OUT/ncu.txt" | head -60
fi

if has full; then
  timeout 300 "$B/swiftspec-cuda-check" > "$OUT/check_full.log" 2>&1
  log "whole check exit $? ($(grep -c ' PASS' "$OUT/check_full.log") pass, $(grep -c ' FAIL' "$OUT/check_full.log") fail)"
  grep -E ' FAIL|aborted' "$OUT/check_full.log" | head -10
  gzip -f "$OUT/check_full.log"
fi
