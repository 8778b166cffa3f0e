#!/usr/bin/env bash
# Greedy losslessness on the CPU backend over many cores (issues 3 and 4): tools/check_lossless.py
# split into shards, each a process on its own cores, detached from the calling shell so that
# the run outlives one device call; then one report per target TP degree from every shard's
# records and the earlier ones (check_lossless.py --merge).
#
#   tools/lossless_cpu_jobs.sh start    launch the shards (detached) and return
#   tools/lossless_cpu_jobs.sh wait     wait until they end (at most LOSSLESS_WAIT_S seconds), then
#                                       merge what is recorded so far into $LDIR/merged/ and copy it
#                                       and the shard logs to $OUT/lossless_cpu/
#   tools/lossless_cpu_jobs.sh status   one line per shard: running or its exit status, prompts recorded
#
# env:
#   LOSSLESS_JOBS  jobs, space-separated, each TP:MODES:SHARDS:CORES (target TP degree, check_lossless
#                  --mode, number of shards, cores per shard); default "1:serial,async:1:H 2:async:1:H"
#                  with H = half of LOSSLESS_CORES; one job per TP degree (its shards share the
#                  record names lossless_cpu_tp<TP>_s<K>of<N>). Cores are handed out in order from the first allowed
#                  one; each shard puts its draft on a quarter of its cores (at least 2 when it has 6 or
#                  more) and its target TP ranks on the rest (swiftspec.placement JSON).
#   LOSSLESS_CORES cores to use (default: all allowed ones)
#   LOSSLESS_DIR   work folder (default /tmp/ss-lossless); LOSSLESS_RESUME_FROM: a folder holding
#                  earlier lossless_cpu_tp<TP>.jsonl records, whose prompts are not checked again
#   CPU_LOSSLESS_REFERENCE (prefill), LOSSLESS_CONFIGS (tree16:16:8:2), LOSSLESS_TOKENS (128),
#   LOSSLESS_MTBENCH (80), LOSSLESS_HUMANEVAL (40), LOSSLESS_LIMIT (0: all), LOSSLESS_WAIT_S (540)
# Exit status of `wait`: 0 when every shard finished and every output equals target-only, 1 when an
# output differs or a shard failed, 2 when shards are still running.
set -uo pipefail
cd "$(dirname "$0")/.."
ACTION=${1:?usage: tools/lossless_cpu_jobs.sh start|wait|status}
LDIR=${LOSSLESS_DIR:-/tmp/ss-lossless}
OUT=${OUT:-/tmp/swiftspec-e2e}
CONFIGS=${LOSSLESS_CONFIGS:-tree16:16:8:2}
mkdir -p "$LDIR/merged"

ALLOWED=($(python3 -c "import os; print(*sorted(os.sched_getaffinity(0)))"))
NCORES=${LOSSLESS_CORES:-${#ALLOWED[@]}}
if (( NCORES > ${#ALLOWED[@]} )); then echo "LOSSLESS_CORES=$NCORES but only ${#ALLOWED[@]} cores are allowed"; exit 1; fi
HALF=$(( NCORES / 2 ))
JOBS=${LOSSLESS_JOBS:-"1:serial,async:1:$HALF 2:async:1:$HALF"}

placement() {  # TP CORE... -> JSON: the draft on a quarter of the cores, the target's TP ranks on the rest
  python3 -c "import json,sys; tp=int(sys.argv[1]); c=[int(x) for x in sys.argv[2:]]; d=max(2 if len(c)>=6 else 1,len(c)//4); t=c[d:]; \
k=len(t)//tp; assert k>=1, f'{len(c)} cores are too few for a draft and {tp} target ranks'; \
print(json.dumps({'draft':{'tp':1,'cores':c[:d]},'target':{'tp':tp,'cores':[t[i*k:(i+1)*k] for i in range(tp)]}}))" "$@"
}

# Every shard as "TP MODES K N FIRST COUNT", with cores handed out in order.
shards() {
  local next=0 tp modes n cores k seen=" "
  for job in $JOBS; do
    IFS=: read -r tp modes n cores <<< "$job"
    [[ "$tp" =~ ^[1-9][0-9]*$ && "$n" =~ ^[1-9][0-9]*$ && "$cores" =~ ^[1-9][0-9]*$ ]] \
      || { echo "LOSSLESS_JOBS item '$job' must be TP:MODES:SHARDS:CORES" >&2; return 1; }
    [[ "$seen" != *" $tp "* ]] \
      || { echo "LOSSLESS_JOBS has two jobs with target TP $tp: give each TP degree one job (its modes comma-separated)" >&2; return 1; }
    seen+="$tp "
    for (( k = 0; k < n; k++ )); do
      (( next + cores <= NCORES )) || { echo "LOSSLESS_JOBS needs more than the $NCORES cores" >&2; return 1; }
      echo "$tp $modes $k $n $next $cores"; next=$(( next + cores ))
    done
  done
}
SHARDS=$(shards) || exit 1
name() { echo "lossless_cpu_tp$1_s$2of$3"; }  # TP K N -> the shard's --out name
alive() { [ -f "$LDIR/$1.pid" ] && kill -0 "$(cat "$LDIR/$1.pid")" 2> /dev/null; }  # NAME

if [ "$ACTION" = start ]; then
  if [ -n "${LOSSLESS_RESUME_FROM:-}" ]; then
    ls "$LOSSLESS_RESUME_FROM"/lossless_cpu_tp*.jsonl > /dev/null 2>&1 \
      || { echo "LOSSLESS_RESUME_FROM=$LOSSLESS_RESUME_FROM holds no lossless_cpu_tp*.jsonl"; exit 1; }
    for f in "$LOSSLESS_RESUME_FROM"/lossless_cpu_tp*.jsonl; do
      [ -f "$LDIR/$(basename "$f")" ] || cp "$f" "$LDIR/"
    done
  fi
  while read -r tp modes k n first count; do
    nm=$(name "$tp" "$k" "$n")
    if alive "$nm"; then echo "$nm is still running (pid $(cat "$LDIR/$nm.pid")): not started twice"; exit 1; fi
    P=$(placement "$tp" "${ALLOWED[@]:$first:$count}") || exit 1
    skip=(); [ -f "$LDIR/lossless_cpu_tp$tp.jsonl" ] && skip=(--skip-done "$LDIR/lossless_cpu_tp$tp.jsonl")
    echo "$nm: $P"
    rm -f "$LDIR/$nm.exit"
    # The shard's log and exit files are the first two arguments (no path is pasted into the script).
    setsid nohup bash -c 'log=$1 ex=$2; shift 2; python3 tools/check_lossless.py "$@" > "$log" 2>&1; echo $? > "$ex"' _ \
      "$LDIR/$nm.log" "$LDIR/$nm.exit" --backend cpu --dtype bfloat16 --mode "$modes" --target-tp "$tp" --placement "$P" \
      --reference "${CPU_LOSSLESS_REFERENCE:-prefill}" --configs "$CONFIGS" --max-new-tokens "${LOSSLESS_TOKENS:-128}" \
      --mtbench "${LOSSLESS_MTBENCH:-80}" --humaneval "${LOSSLESS_HUMANEVAL:-40}" --limit "${LOSSLESS_LIMIT:-0}" \
      --shard "$k/$n" "${skip[@]}" --out "$LDIR/$nm" --resume > /dev/null 2>&1 < /dev/null &
    echo $! > "$LDIR/$nm.pid"
  done <<< "$SHARDS"
  exit 0
fi

status() {  # prints one line per shard; returns the number still running
  local running=0
  while read -r tp modes k n first count; do
    nm=$(name "$tp" "$k" "$n")
    local rec=0; [ -f "$LDIR/$nm.jsonl" ] && rec=$(wc -l < "$LDIR/$nm.jsonl")
    local last; last=$(grep -E '^\[|nothing to check|Error|error' "$LDIR/$nm.log" 2>/dev/null | tail -1)
    if [ -f "$LDIR/$nm.exit" ]; then echo "$nm: exit $(cat "$LDIR/$nm.exit"), $rec records; $last"
    elif alive "$nm"; then echo "$nm: running, $rec records; $last"; running=$(( running + 1 ))
    else echo "$nm: not running and no exit status (never started, or killed), $rec records; $last"; fi
  done <<< "$SHARDS"
  return "$running"
}

if [ "$ACTION" = status ]; then status; exit 0; fi
[ "$ACTION" = wait ] || { echo "unknown action '$ACTION' (start, wait, status)"; exit 1; }

deadline=$(( $(date +%s) + ${LOSSLESS_WAIT_S:-540} ))
while true; do
  status > /dev/null; left=$?
  (( left == 0 || $(date +%s) >= deadline )) && break
  sleep 5
done
status
rc=0; (( left > 0 )) && rc=2
mkdir -p "$OUT/lossless_cpu"
for tp in $(awk '{print $1}' <<< "$SHARDS" | sort -u); do
  modes=$(awk -v t="$tp" '$1 == t {print $2; exit}' <<< "$SHARDS")
  files=()
  [ -f "$LDIR/lossless_cpu_tp$tp.jsonl" ] && files+=("$LDIR/lossless_cpu_tp$tp.jsonl")
  # Only this run's shards (an earlier run with another shard count may have left records).
  while read -r t m k n first count; do
    f="$LDIR/$(name "$t" "$k" "$n").jsonl"; [ "$t" = "$tp" ] && [ -s "$f" ] && files+=("$f")
  done <<< "$SHARDS"
  (( ${#files[@]} )) || continue
  cat "${files[@]}" > "$LDIR/merged/lossless_cpu_tp$tp.jsonl"
  python3 tools/check_lossless.py --mode "$modes" --target-tp "$tp" --configs "$CONFIGS" --dtype bfloat16 \
    --reference "${CPU_LOSSLESS_REFERENCE:-prefill}" --max-new-tokens "${LOSSLESS_TOKENS:-128}" \
    --merge "$LDIR/merged/lossless_cpu_tp$tp.jsonl" --out "$LDIR/merged/lossless_cpu_tp$tp" > "$LDIR/merged/tp$tp.merge.log" 2>&1
  m=$?; (( m != 0 )) && rc=1 && tail -5 "$LDIR/merged/tp$tp.merge.log"
  grep -E '^\| ' "$LDIR/merged/lossless_cpu_tp$tp.md" 2>/dev/null
done
while read -r tp modes k n first count; do
  nm=$(name "$tp" "$k" "$n")
  if [ -f "$LDIR/$nm.exit" ]; then [ "$(cat "$LDIR/$nm.exit")" != 0 ] && rc=1
  elif ! alive "$nm"; then rc=1; fi  # killed or never started
done <<< "$SHARDS"
cp "$LDIR"/merged/* "$LDIR"/*.log "$OUT/lossless_cpu/" 2>/dev/null
exit "$rc"
