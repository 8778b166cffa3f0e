#!/usr/bin/env bash
# Fuzz campaign over the runtime's parsers (libFuzzer, clang) and the GGUF converter (atheris).
#
#   fuzz/run.sh                       # 20 s per C++ target, 30 s of atheris (CI passes 10 and 20)
#   fuzz/run.sh --seconds 600 --python-seconds 1800    # a long one (benchmarks/README.md)
#   fuzz/run.sh --runs 300000         # a fixed number of inputs per C++ target instead
#
# Targets (fuzz/README.md): config (config.json), manifest (manifest.json and a TP plan),
# safetensors (a safetensors file), gguf (the GGUF bounds check), py_gguf (the converter in
# Python, behind that check). Each starts from its seeds (fuzz/seeds/<target>, tiny valid files
# and the inputs of issue 28's findings) and the corpus of earlier runs (build/fuzz/corpus/<t>).
# A finding (crash, sanitizer report, an exception other than swiftspec's own, a timeout past
# 10 s, memory past 1 GB) is saved under build/fuzz/artifacts/ and fails the run.
#
# Needs clang with libFuzzer (Debian: apt-get install clang-14 libclang-rt-14-dev) and, for
# py_gguf, `pip install atheris==3.0.0` and swiftspec importable. Prints one line per target and
# writes build/fuzz/summary.tsv (target, inputs, seconds, peak RSS MB, result).
# Environment: CXX_FUZZ (clang++-14), FUZZ_TARGETS ("config manifest safetensors gguf py_gguf").
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER=20 PY_SECONDS=30 RUNS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --python-seconds) PY_SECONDS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    *) echo "fuzz/run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
OUT=build/fuzz
CXX_FUZZ=${CXX_FUZZ:-clang++-14}
TARGETS=${FUZZ_TARGETS:-"config manifest safetensors gguf py_gguf"}
command -v "$CXX_FUZZ" > /dev/null || { echo "fuzz/run.sh: $CXX_FUZZ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }
mkdir -p "$OUT"
cmake -S fuzz -B "$OUT" -G Ninja -DCMAKE_CXX_COMPILER="$CXX_FUZZ" > "$OUT/cmake.log" 2>&1 || { cat "$OUT/cmake.log"; exit 1; }
cmake --build "$OUT" -j "${JOBS:-$(nproc)}" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }

# Limits per input: 10 s, 1 GB RSS (and no single allocation over 1 GB); inputs up to 64 KiB.
# A smaller ASan quarantine keeps the fuzzer's own RSS (not the inputs') far from the limit.
export ASAN_OPTIONS="quarantine_size_mb=64:malloc_context_size=10:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
COMMON=(-timeout=10 -rss_limit_mb=1024 -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1)
: > "$OUT/summary.tsv"
failed=0
for t in $TARGETS; do
  corpus="$OUT/corpus/$t" artifacts="$OUT/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  if [ "$t" = py_gguf ]; then
    cmd=(python3 fuzz/py_fuzz.py "${COMMON[@]}" -max_total_time="$PY_SECONDS")
    seeds=fuzz/seeds/gguf
  else
    cmd=("$OUT/fuzz_$t" "${COMMON[@]}")
    if [ -n "$RUNS" ]; then cmd+=(-runs="$RUNS"); else cmd+=(-max_total_time="$SECONDS_PER"); fi
    seeds=fuzz/seeds/$t
  fi
  start=$(date +%s)
  "${cmd[@]}" -artifact_prefix="$artifacts" "$corpus" "$seeds" > "$OUT/$t.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  inputs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/$t.log" | grep -o '[0-9]*$' | tail -1)
  rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$OUT/$t.log" | grep -o '[0-9]*$' | tail -1)
  if [ $rc -eq 0 ]; then result=ok
  elif grep -q 'ERROR: libFuzzer: timeout' "$OUT/$t.log"; then result=HANG
  elif grep -q -e 'out-of-memory' -e 'malloc(.*) exceeds' "$OUT/$t.log"; then result=OOM
  else result=CRASH; fi
  [ "$result" = ok ] || failed=1
  printf '%s\t%s\t%s\t%s\t%s\n' "$t" "${inputs:-?}" "$took" "${rss:-?}" "$result" >> "$OUT/summary.tsv"
  printf 'fuzz %-12s %10s inputs %5ss peak RSS %5s MB  %s\n' "$t" "${inputs:-?}" "$took" "${rss:-?}" "$result"
  if [ "$result" != ok ]; then
    grep -A25 -m1 -e '==ERROR' -e 'ERROR: libFuzzer' -e 'Traceback' "$OUT/$t.log" | head -40
    echo "  log: $OUT/$t.log, input: $(ls -t "$artifacts" 2>/dev/null | head -1)"
  fi
done
awk -F'\t' '{n += $2} END {printf "fuzz total: %d inputs\n", n}' "$OUT/summary.tsv"
exit $failed
