#!/usr/bin/env bash
# End-to-end run of the real Qwen2.5-Coder pair on the GPU machine (issue #5, #6).
#
# Needs, carried into the repo root (all git-ignored):
#   .xfer/qwen2.5-coder-0.5b-instruct.gguf.d/chunk.*        (../shared/tools/split_chunks.sh)
#   .xfer/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf.d/chunk.*
#   .xfer/datasets/{mtbench/question.jsonl,humaneval/HumanEval.jsonl.gz}
#   .whl/gguf-0.19.0-*.whl .whl/nlohmann_json-3.12.0-*.whl
# Stages (env STAGES, comma list, run in this order; default prep,logits,bench,peers):
#   xfer      copy the chunks this call carries (.xfer/*.d/chunk.*) into /tmp/ss-xfer, where they outlive
#             the call while the machine stays warm (a call's carried files may not); prep joins from there
#   llamacpp_bg  beside the package build (build_bg), build llama.cpp with CUDA detached and niced, from the packed
#             source LLAMACPP_SRC (default .xfer/llama-src.tar.gz: `tools/llamacpp_bench.py --pack-source`)
#   build_bg  start the package build (as in prep) detached from this call (setsid), from a snapshot
#             of the sources in /tmp/ss-src (or of SRC_TAR, a carried git archive), and return at once: later calls that carry the model
#             chunks overlap it; prep then waits for it
#   prep      join + sha256-check the GGUFs into the cache; build and install the package
#             with CUDA on (sm_90a); convert both models to bf16. Skipped parts: a model
#             already joined, a package already built in this machine's life (SKIP_BUILD=1
#             forces skipping; the device machine keeps /usr/local between calls while warm)
#   check     swiftspec-cuda-check of the package build (kernels, tiny models, forward_top_k; CHECK_ARGS)
#   green     swiftspec-cuda-green-bench: SM isolation, exactness and draft/target interference
#             of green-context splits, random weights (GREEN_SPLITS, default 8,16,24,32,48,64)
#   logits    tools/check_cuda_logits.py: CUDA vs CPU logits of both models
#   logits_int4  issue 31: tools/check_cuda_logits.py --dtype int4, the int4 CUDA model against the
#             int4 CPU model (both models converted from the joined GGUFs to int4 on first use, group
#             size 32); then, with INT4_LOSSLESS=N, tools/check_lossless.py --dtype int4 --backend cuda
#             (serial and async greedy against target-only) on N MT-Bench + N HumanEval prompts
#   bench     `swiftspec bench --backend cuda` over HumanEval + MT-Bench (CONFIGS, NUM_PROMPTS,
#             NEW_TOKENS); configs with :smN run the draft in a green context on N SMs (the target
#             on the rest), :hp the target's stream at the highest priority; BENCH_TAG names the
#             result folder (default bench; e.g. an A/B with SWIFTSPEC_TOP_K_ON_HOST=1 in another);
#             BENCH_EXTRA: more bench options (e.g. "--temperature 0.7 --top-p 0.8" for sampled decoding)
#   peers     the HF transformers peers on PEER_PROMPTS prompts
#   peers_bg  the HF peers detached, one `swiftspec bench` per data set on its own GPU and cores
#             (PEER_DATASETS, PEER_CONFIGS, PEER_PROMPTS 20); waits PEER_WAIT_S (540) and copies
#             finished parts to $OUT/peers-<dataset>; peers_wait (a later call) waits and copies again
#   lossless  tools/check_lossless.py --backend cuda: target-only vs serial vs async greedy on
#             LOSSLESS_MTBENCH (80) MT-Bench first turns + LOSSLESS_HUMANEVAL (40) HumanEval
#             prompts, LOSSLESS_TOKENS (128) new tokens, configs LOSSLESS_CONFIGS (tree16:16:8:2),
#             modes LOSSLESS_MODES (serial,async; megakernel: target-only with the decode megakernel
#             against the layered target, with the top-2 gap at each divergence)
#   multigpu  issue 7 end to end (>= 2 GPUs): TP-2 CUDA logits vs CPU; greedy async == target-only
#             with the draft on GPU 1 and the target on GPU 0, then on GPUs 0+1 at TP 2
#             (MG_MTBENCH/MG_HUMANEVAL prompts, default 10+10, MG_TOKENS 128); `swiftspec bench`
#             of MG_CONFIGS (NUM_PROMPTS, NEW_TOKENS); MG_CORES pins them to cores (taskset);
#             MG_PARTS (logits,lossless,bench) picks the parts
#   cpu_lossless  the same check on the CPU backend of this machine's cores (issues 3 and 4), by
#             tools/lossless_cpu_jobs.sh (its header: LOSSLESS_JOBS, LOSSLESS_CORES, LOSSLESS_RESUME_FROM,
#             CPU_LOSSLESS_REFERENCE, ...); default two jobs on half the cores each: serial,async with
#             target TP 1 and async with target TP 2; waits for them unless LOSSLESS_BG=1
#   cpu_lossless_wait  wait for detached cpu_lossless shards (LOSSLESS_WAIT_S, default 540), merge
#             their records into one report per TP degree, copy to $OUT/lossless_cpu/
#   auto_random  issue 32 on the GPU without the real weights: `swiftspec bench` of AR_CONFIGS on random-weight
#             twins of the reference pair (tools/random_twin.py, layouts carried in .xfer/twin): a draft that
#             never agrees and one that always does (the target itself); AR_PROMPTS MT-Bench prompts, AR_TOKENS
#   long      issue 27, parts LONG_PARTS (llama,bench,lossless,gen): llama.cpp's llama-bench at depths
#             (tools/llamacpp_bench.py), `swiftspec bench --context-tokens LONG_CONTEXTS` of LONG_CONFIGS with
#             the peers LONG_PEERS (llamacpp; LONG_PROMPTS prompts, LONG_TOKENS new tokens), greedy losslessness
#             at LONG_LOSSLESS (N:prompts,...) of LONG_LOSSLESS_MODES, and a LONG_GEN_TOKENS-token generation's host time per token
#             (tools/check_long_generation.py)
#   cpu_acceptance  tools/bench_acceptance.py on this machine's cores (issue 3): acceptance length
#             and CPU tokens/s of the chain and tree budgets 8/16/32/64 vs target-only, ACC_PROMPTS
#             (5) prompts per dataset, ACC_TOKENS (64) new tokens; run it alone (timings)
# Every `swiftspec bench` here runs with --no-plots: on 2026-12-07 importing matplotlib segfaulted in
# the device image's Python (after bench.json was written); plot from the JSON off the machine.
# Results under $OUT, bundled into $OUT/e2e-results.tgz (the device tool returns 8 files).
#   env: OUT, COMMIT (sha recorded in the results), STAGES, NUM_PROMPTS (20), NEW_TOKENS (256),
#        PEER_PROMPTS (4), CONFIGS, SKIP_PEERS=1
#        (drops the peers stage), SKIP_BENCH=1 (drops bench and peers), BUILD_DIR (build/gpu-py),
#        BUILD_CUDA (ON; OFF builds the CPU backend only, enough for cpu_lossless)
set -uo pipefail
OUT=${OUT:-/tmp/swiftspec-e2e}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[gpu_e2e +$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 SWIFTSPEC_CACHE=${SWIFTSPEC_CACHE:-/tmp/sscache}
# The copy on the GPU machine has no .git: COMMIT (the sha this copy was made from) goes into
# the result files through SWIFTSPEC_COMMIT.
[ -n "${COMMIT:-}" ] && export SWIFTSPEC_COMMIT=$COMMIT
mkdir -p "$SWIFTSPEC_CACHE/models" "$SWIFTSPEC_CACHE/datasets"
STAGES=",${STAGES:-prep,logits,bench,peers},"
[ "${SKIP_BENCH:-0}" = "1" ] && STAGES=${STAGES//,bench,/,} && STAGES=${STAGES//,peers,/,}
[ "${SKIP_PEERS:-0}" = "1" ] && STAGES=${STAGES//,peers,/,}
has() { [[ "$STAGES" == *",$1,"* ]]; }
BUILD_DIR=${BUILD_DIR:-build/gpu-py}
NUM=${NUM_PROMPTS:-20}; NEW=${NEW_TOKENS:-256}

# The carried wheels (.whl/) go into /tmp/ss-site once; a later call of the same machine that
# carries none (a chunk of a model, say) keeps what an earlier one installed.
if compgen -G ".whl/*.whl" > /dev/null || [ ! -d /tmp/ss-site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/ss-site .whl/*.whl > "$OUT/install.log" 2>&1 \
    || { log "wheel install failed"; cat "$OUT/install.log"; exit 1; }
fi
export PYTHONPATH=/tmp/ss-site

build_cmd() {
  SWIFTSPEC_CUDA=${BUILD_CUDA:-ON} CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps \
    -Cbuild-dir="$BUILD_DIR" .
}
BG_LOG=/tmp/ss-build-bg.log BG_DONE=/tmp/ss-build-bg.done BG_SRC=/tmp/ss-src
if has build_bg; then
  rm -f "$BG_DONE"
  # Build from a snapshot of the sources: each later call of a chunked transfer copies the working
  # tree again and replaced headers under a build that read them (seen: checkpoint.h missing).
  rm -rf "$BG_SRC"; mkdir -p "$BG_SRC"
  # SRC_TAR (a carried `git archive` of a commit, e.g. .xfer/src.tar.gz): build that commit
  # instead of the copied working tree (whose uncommitted edits then stay out of the build).
  if [ -n "${SRC_TAR:-}" ]; then tar -xzf "$SRC_TAR" -C "$BG_SRC"
  else tar --exclude=./.xfer --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$BG_SRC"; fi
  export -f build_cmd; export BUILD_DIR
  (cd "$BG_SRC" && setsid nohup bash -c "build_cmd > $BG_LOG 2>&1; echo \$? > $BG_DONE" > /dev/null 2>&1 < /dev/null &)
  log "build started in the background from a snapshot in $BG_SRC (log $BG_LOG)"
fi
LLAMA_LOG=/tmp/ss-llamacpp-bg.log LLAMA_DONE=/tmp/ss-llamacpp-bg.done
XFER=/tmp/ss-xfer
if has llamacpp_bg; then
  # llama.cpp's CUDA build (minutes on 16 cores), detached and niced, started at once beside the
  # package build: llamacpp_build.py needs only the pure-Python part of the package, imported from
  # the source snapshot (a stand-in for swiftspec.bench keeps its __init__, which needs the
  # compiled core, out). Cached under SWIFTSPEC_CACHE, where the installed package finds it later.
  SRC=${LLAMACPP_SRC:-.xfer/llama-src.tar.gz}; [ -f "$XFER/$(basename "$SRC")" ] && SRC="$XFER/$(basename "$SRC")"
  mkdir -p /tmp/ss-llama-src && tar -xzf "$SRC" -C /tmp/ss-llama-src
  export SWIFTSPEC_LLAMACPP_SDIST=$(find /tmp/ss-llama-src -maxdepth 1 -mindepth 1 -type d | head -1)
  PYSRC=$BG_SRC/python; [ -d "$PYSRC" ] || PYSRC=$PWD/python
  cat > /tmp/ss-llama-build.py <<PY
import sys, types
sys.path.insert(0, "$PYSRC")
import swiftspec
bench = types.ModuleType("swiftspec.bench")
bench.__path__ = ["$PYSRC/swiftspec/bench"]
sys.modules["swiftspec.bench"] = bench
from swiftspec.bench.llamacpp_build import ensure_llamacpp
print(ensure_llamacpp("cuda"))
PY
  rm -f "$LLAMA_DONE"
  ( setsid nohup nice -n 10 bash -c "python3 /tmp/ss-llama-build.py > $LLAMA_LOG 2>&1; echo \$? > $LLAMA_DONE" \
      > /dev/null 2>&1 < /dev/null & )
  log "llama.cpp CUDA build started (log $LLAMA_LOG)"
fi

if has xfer; then
  for d in .xfer/*.d; do
    [ -d "$d" ] || continue
    mkdir -p "$XFER/$(basename "$d")" && cp "$d"/chunk.* "$XFER/$(basename "$d")/" 2>/dev/null
  done
  [ -d .xfer/datasets ] && mkdir -p "$XFER/datasets" && cp -r .xfer/datasets/* "$XFER/datasets/"
  for f in .xfer/*.tar.gz; do [ -f "$f" ] && cp "$f" "$XFER/"; done
  log "staged in $XFER: $(find "$XFER" -name 'chunk.*' | wc -l) chunks"
fi
chunks() { if [ -d "$XFER/$1" ]; then echo "$XFER/$1"; else echo ".xfer/$1"; fi; }

if { has prep || has auto_random; } && [ -f "$BG_LOG" ]; then  # a background build: wait, skip the build below
  for _ in $(seq 1 600); do [ -f "$BG_DONE" ] && break; sleep 1; done
  cp "$BG_LOG" "$OUT/build.log"
  if [ "$(cat "$BG_DONE" 2>/dev/null)" = "0" ]; then SKIP_BUILD=1; log "background build done"
  else log "background build failed or unfinished"; tail -40 "$BG_LOG"; exit 1; fi
fi

if has auto_random; then
  # Issue 32 without the real weights: random-weight twins of the reference pair (tools/random_twin.py;
  # layouts carried in .xfer/twin or staged in $XFER/twin). With the random draft the draft never
  # agrees (auto must fall back to target-only); drafting with the target itself it always agrees.
  TW=.xfer/twin; [ -d "$XFER/twin" ] && TW=$XFER/twin
  if [ -d "$XFER/datasets" ]; then cp -r "$XFER"/datasets/* "$SWIFTSPEC_CACHE/datasets/"
  else cp -r .xfer/datasets/* "$SWIFTSPEC_CACHE/datasets/"; fi
  T=/tmp/ss-twin/target D=/tmp/ss-twin/draft
  [ -f $T/manifest.json ] || python3 tools/random_twin.py make "$TW/qwen2.5-coder-1.5b-instruct" $T --seed 1 &
  [ -f $D/manifest.json ] || python3 tools/random_twin.py make "$TW/qwen2.5-coder-0.5b-instruct" $D --seed 2 &
  wait
  log "random twins made"
  for pair in never:$D always:$T; do
    timeout "${AR_TIMEOUT_S:-240}" swiftspec bench --backend cuda --target $T --draft "${pair#*:}" \
      --configs "${AR_CONFIGS:-target,target:mk,serial:tree16,auto:tree16,auto:tree16:mk}" --datasets mtbench \
      --num-prompts "${AR_PROMPTS:-4}" --max-new-tokens "${AR_TOKENS:-128}" --no-progress --no-plots \
      --out "$OUT/auto_random_${pair%%:*}" > "$OUT/auto_random_${pair%%:*}.log" 2>&1
    log "auto_random ${pair%%:*}: exit $?"; grep -A12 "^| config" "$OUT/auto_random_${pair%%:*}/bench.md" | head -14
  done
fi

if has prep; then
  join() {  # join CHUNKDIR NAME SHA
    local dst="$SWIFTSPEC_CACHE/models/$2"
    if [ ! -f "$dst" ]; then cat "$1"/chunk.* > "$dst.partial" && mv "$dst.partial" "$dst"; fi
    echo "$3  $dst" | sha256sum -c - || { log "sha256 mismatch for $2"; rm -f "$dst"; exit 1; }
  }
  join "$(chunks qwen2.5-coder-0.5b-instruct.gguf.d)" qwen2.5-coder-0.5b-instruct.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 &
  join "$(chunks qwen2.5-coder-1.5b-instruct-q4_k_m.gguf.d)" qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 &
  if [ -d "$XFER/datasets" ]; then cp -r "$XFER"/datasets/* "$SWIFTSPEC_CACHE/datasets/"
  else cp -r .xfer/datasets/* "$SWIFTSPEC_CACHE/datasets/"; fi
  # Build the package with the CUDA backend (no network there: no build isolation), while the
  # models join.
  if [ "${SKIP_BUILD:-0}" != "1" ]; then
    build_cmd > "$OUT/build.log" 2>&1 || { log "build failed"; tail -40 "$OUT/build.log"; exit 1; }
    log "built"
  fi
  wait
  log "models joined"
  python3 - > "$OUT/convert.log" 2>&1 <<'PY' || { log "convert failed"; tail -20 "$OUT/convert.log"; exit 1; }
from concurrent.futures import ProcessPoolExecutor
from swiftspec.fetch import ensure_checkpoint
names = ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]
with ProcessPoolExecutor(2) as ex:
    for p in ex.map(ensure_checkpoint, names, ["bfloat16"] * 2, [None] * 2, [False] * 2):
        print(p)
PY
  log "converted"
fi

# A tool the package build made: in BUILD_DIR here, or in the background build's snapshot.
package_tool() { find "$BUILD_DIR" "$BG_SRC/$BUILD_DIR" -name "$1" -type f 2>/dev/null | head -1; }

if has check; then
  CB=$(package_tool swiftspec-cuda-check)
  if [ -z "$CB" ]; then log "no swiftspec-cuda-check under $BUILD_DIR or $BG_SRC/$BUILD_DIR"; else
    timeout "${CHECK_TIMEOUT_S:-300}" "$CB" --json "$OUT/check.json" ${CHECK_ARGS:-} > "$OUT/check.log" 2>&1
    log "check rc=$?: $(tail -1 "$OUT/check.log")"
    grep FAIL "$OUT/check.log" | head -20
  fi
fi

if has green; then
  GB=$(package_tool swiftspec-cuda-green-bench)
  if [ -z "$GB" ]; then log "no swiftspec-cuda-green-bench under $BUILD_DIR or $BG_SRC/$BUILD_DIR"; else
    "$GB" --splits "${GREEN_SPLITS:-8,16,24,32,48,64}" --json "$OUT/green_bench.json" 2>&1 | tee "$OUT/green_bench.log"
    log "green bench done"
  fi
fi

if has logits; then
  python3 tools/check_cuda_logits.py --json "$OUT/logits_check.json" 2>&1 | tee "$OUT/logits_check.log"
  log "logits checked"
fi

if has logits_int4; then
  timeout "${LOGITS_INT4_TIMEOUT_S:-420}" python3 tools/check_cuda_logits.py --dtype int4 \
    --json "$OUT/logits_int4.json" 2>&1 | tee "$OUT/logits_int4.log"
  log "int4 logits checked: exit ${PIPESTATUS[0]} (0 pass, 1 fail, 124 timeout)"
  if [ "${INT4_LOSSLESS:-0}" != "0" ]; then
    timeout "${INT4_LOSSLESS_TIMEOUT_S:-300}" python3 tools/check_lossless.py --backend cuda --dtype int4 \
      --mode serial,async --configs tree16:16:8:2 --max-new-tokens "${LOSSLESS_TOKENS:-128}" \
      --mtbench "$INT4_LOSSLESS" --humaneval "$INT4_LOSSLESS" --out "$OUT/lossless_int4" > "$OUT/lossless_int4.log" 2>&1
    log "int4 lossless: exit $? ($(grep -c '=ok(' "$OUT/lossless_int4.log") prompts identical)"
  fi
fi

if has bench; then
  CONFIGS=${CONFIGS:-target,serial:tree16,async:tree16,async:tree16:hp,async:tree16:sm16,async:tree16:sm32,async:tree16:sm48}
  swiftspec bench --backend cuda --datasets humaneval,mtbench --num-prompts "$NUM" --max-new-tokens "$NEW" \
    --configs "$CONFIGS" --skip-unavailable --no-progress --no-plots ${BENCH_EXTRA:-} --out "$OUT/${BENCH_TAG:-bench}" 2>&1 | tee "$OUT/${BENCH_TAG:-bench}.log" | tail -40
  log "bench done"
fi

if has peers; then
  swiftspec bench --backend cuda --datasets humaneval,mtbench --num-prompts "${PEER_PROMPTS:-4}" \
    --max-new-tokens "$NEW" --configs target,serial:tree16,hf:target,hf:assisted --no-progress --no-plots \
    --out "$OUT/peers" 2>&1 | tee "$OUT/peers.log" | tail -30
  log "peers done"
fi

# The HF peers decode slowly (eager PyTorch, host-bound): 20 + 20 prompts x 256 tokens take
# longer on one GPU than one device call. peers_bg starts one detached `swiftspec bench`
# per data set (PEER_DATASETS), each on its own GPU (round robin over the visible GPUs) and its
# own disjoint block of cores (taskset; cores / GPUs each, the one-GPU machine's 16 on an x2),
# with the same settings as the bench stage; then waits up to PEER_WAIT_S (540) and copies what
# finished to $OUT/peers-<dataset>. peers_wait (a later call) waits again and copies. Merge the
# parts with ours afterwards: `swiftspec bench --merge DIR,DIR,... --out DIR` (no GPU needed).
PEER_RUN=/tmp/ss-peers
peers_collect() {  # wait up to PEER_WAIT_S for every started part, copy the finished ones
  local deadline=$(( $(date +%s) + ${PEER_WAIT_S:-540} )) d pending
  while :; do
    pending=0
    for d in "$PEER_RUN"/*/; do [ -f "$d/rc" ] || pending=1; done
    [ "$pending" = 0 ] || [ "$(date +%s)" -ge "$deadline" ] && break
    sleep 5
  done
  for d in "$PEER_RUN"/*/; do
    local name; name=$(basename "$d")
    if [ -f "$d/rc" ]; then
      rm -rf "$OUT/$name"; cp -r "$d/out" "$OUT/$name"; cp "$d/log" "$OUT/$name.log"
      log "peer part $name finished: exit $(cat "$d/rc")"
    else
      log "peer part $name still running: $(tail -c 300 "$d/log" | tr '\r' '\n' | tail -1)"
    fi
  done
}
if has peers_bg; then
  rm -rf "$PEER_RUN"; mkdir -p "$PEER_RUN"
  NGPU=$(nvidia-smi -L | grep -c '^GPU')
  NCORE=$(nproc); PER=$(( NCORE / NGPU ))
  i=0
  for ds in ${PEER_DATASETS:-humaneval mtbench}; do
    gpu=$(( i % NGPU )); lo=$(( gpu * PER )); hi=$(( lo + PER - 1 ))
    mkdir -p "$PEER_RUN/peers-$ds"
    # Each part: its own GPU and cores; HF's torch threads = its cores (as on the 16-core one-GPU kind).
    ( setsid nohup bash -c "CUDA_VISIBLE_DEVICES=$gpu taskset -c $lo-$hi swiftspec bench --backend cuda \
        --datasets $ds --num-prompts ${PEER_PROMPTS:-20} --max-new-tokens $NEW \
        --configs ${PEER_CONFIGS:-hf:target,hf:assisted} --hf-threads $PER --no-progress --no-plots \
        --out $PEER_RUN/peers-$ds/out > $PEER_RUN/peers-$ds/log 2>&1; echo \$? > $PEER_RUN/peers-$ds/rc" \
        > /dev/null 2>&1 < /dev/null & )
    log "peer part peers-$ds started on GPU $gpu, cores $lo-$hi"
    i=$(( i + 1 ))
  done
  peers_collect
fi
if has peers_wait; then peers_collect; fi

if has lossless; then
  # Resumable: a second call with the same LOSSLESS_DIR continues where a cut-off one stopped.
  LDIR=${LOSSLESS_DIR:-/tmp/ss-lossless}
  mkdir -p "$LDIR"
  timeout "${LOSSLESS_TIMEOUT_S:-100000}" python3 tools/check_lossless.py --backend cuda --dtype bfloat16 \
    --mode "${LOSSLESS_MODES:-serial,async}" --configs "${LOSSLESS_CONFIGS:-tree16:16:8:2}" --max-new-tokens "${LOSSLESS_TOKENS:-128}" \
    --mtbench "${LOSSLESS_MTBENCH:-80}" --humaneval "${LOSSLESS_HUMANEVAL:-40}" --out "$LDIR/lossless_gpu" --resume \
    2>&1 | tee "$OUT/lossless.log" | tail -25
  cp "$LDIR"/lossless_gpu.* "$OUT/" 2>/dev/null
  log "lossless done"
fi

if has multigpu; then
  # Issue 7 end to end, on a machine with >= 2 GPUs: the draft on GPU 1 and the target on GPU 0
  # (TP 1), then the target tensor-parallel over GPUs 0 and 1 (TP 2, the draft on GPU 1 beside
  # rank 1). MG_CORES (e.g. 28-31): run these on cores that cpu_lossless leaves free.
  # MG_PARTS (logits,lossless,bench) picks parts; each runs under a timeout (a rank that fails
  # leaves the other spinning in its GPU all-reduce: the timeout ends the process).
  pin() { if [ -n "${MG_CORES:-}" ]; then taskset -c "$MG_CORES" "$@"; else "$@"; fi; }
  part() { [[ ",${MG_PARTS:-logits,lossless,bench}," == *",$1,"* ]]; }
  if part logits; then
    pin timeout 240 python3 tools/check_cuda_logits.py --models qwen2.5-coder-1.5b-instruct --devices 0,1 \
      --json "$OUT/logits_tp2.json" 2>&1 | tee "$OUT/logits_tp2.log" | tail -4
    log "TP-2 logits checked: exit ${PIPESTATUS[0]} (0 pass, 1 fail, 124 timeout)"
  fi
  part lossless && for job in 'dg1:1:{"draft":{"devices":[1]},"target":{"devices":[0]}}' \
             'tp2dg1:2:{"draft":{"devices":[1]},"target":{"tp":2,"devices":[0,1]}}'; do
    IFS=: read -r name tp placement <<< "$job"
    pin timeout "${MG_LOSSLESS_TIMEOUT_S:-240}" python3 tools/check_lossless.py --backend cuda --dtype bfloat16 \
      --mode async --target-tp "$tp" --placement "$placement" --configs tree16:16:8:2 \
      --max-new-tokens "${MG_TOKENS:-128}" --mtbench "${MG_MTBENCH:-10}" --humaneval "${MG_HUMANEVAL:-10}" \
      --out "$OUT/lossless_gpu_$name" > "$OUT/lossless_gpu_$name.log" 2>&1
    log "lossless $name: exit $? ($(grep -c '=ok(' "$OUT/lossless_gpu_$name.log") prompts identical)"
  done
  if part bench; then
    pin timeout "${MG_BENCH_TIMEOUT_S:-500}" swiftspec bench --backend cuda --datasets humaneval,mtbench \
      --num-prompts "$NUM" --max-new-tokens "$NEW" \
      --configs "${MG_CONFIGS:-target,async:tree16,async:tree16:dg1,target:tp2,serial:tree16:tp2,async:tree16:tp2:dg1}" \
      --skip-unavailable --no-progress --no-plots --out "$OUT/bench_multigpu" 2>&1 | tee "$OUT/bench_multigpu.log" | tail -30
    log "multigpu bench done"
  fi
fi

if has cpu_lossless; then
  # tools/lossless_cpu_jobs.sh: shards on disjoint cores, detached, resumable (LOSSLESS_JOBS,
  # LOSSLESS_CORES, LOSSLESS_RESUME_FROM, ... there). LOSSLESS_BG=1 returns once they are started;
  # a later call's cpu_lossless_wait stage collects them.
  bash tools/lossless_cpu_jobs.sh start || { log "cpu lossless start failed"; exit 1; }
  log "cpu lossless shards started"
fi
if has cpu_lossless_wait || { has cpu_lossless && [ "${LOSSLESS_BG:-0}" != 1 ]; }; then
  bash tools/lossless_cpu_jobs.sh wait; log "cpu lossless wait: exit $? (0 done and equal, 1 differs/failed, 2 running)"
fi

if has long; then
  # LONG_PARTS (default all: llama,bench,lossless,gen) picks the parts, so that the untimed ones
  # (lossless, gen) can run while llama.cpp still builds and the timed ones in a later call.
  LP=",${LONG_PARTS:-llama,bench,lossless,gen},"
  if [[ "$LP" == *,llama,* || "$LP" == *,bench,* ]]; then
    for _ in $(seq 1 600); do [ ! -f "$LLAMA_LOG" ] || [ -f "$LLAMA_DONE" ] && break; sleep 1; done
    [ -f "$LLAMA_LOG" ] && cp "$LLAMA_LOG" "$OUT/llamacpp_build.log"
  fi
  TGGUF=$SWIFTSPEC_CACHE/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  if [[ "$LP" == *,llama,* ]]; then
    timeout "${LONG_LLAMA_TIMEOUT_S:-300}" python3 tools/llamacpp_bench.py --backend cuda --model "$TGGUF" \
      --out "$OUT/llamacpp_long" 2>&1 | tee "$OUT/llamacpp_long.log" | tail -12
    log "llama-bench done"
  fi
  if [[ "$LP" == *,bench,* ]]; then
    timeout "${LONG_BENCH_TIMEOUT_S:-100000}" swiftspec bench --backend cuda --context-tokens "${LONG_CONTEXTS:-512,4096,16384,32000}" \
      --num-prompts "${LONG_PROMPTS:-2}" --max-new-tokens "${LONG_TOKENS:-256}" \
      --configs "${LONG_CONFIGS:-target,target:mk,serial:tree16,async:tree16:sm72:dmk}" --peers "${LONG_PEERS:-llamacpp}" \
      --skip-unavailable --no-progress --no-plots --out "$OUT/bench_long" 2>&1 | tee "$OUT/bench_long.log" | tail -40
    log "long-context bench done"
  fi
  if [[ "$LP" == *,lossless,* ]]; then
    for item in $(echo "${LONG_LOSSLESS:-16384:10,32000:5}" | tr ',' ' '); do
      n=${item%%:*}; k=${item##*:}
      timeout "${LONG_LOSSLESS_TIMEOUT_S:-100000}" python3 tools/check_lossless.py --backend cuda --dtype bfloat16 \
        --mode "${LONG_LOSSLESS_MODES:-serial,async,auto}" --configs tree16:16:8:2 --max-new-tokens "${LONG_LOSSLESS_TOKENS:-128}" --mtbench 0 \
        --humaneval 0 --context-tokens "$n" --context-prompts "$k" --out "$OUT/lossless_ctx$n" \
        > "$OUT/lossless_ctx$n.log" 2>&1
      log "lossless at $n tokens: exit $? ($(grep -c '=ok(' "$OUT/lossless_ctx$n.log") prompts identical)"
    done
  fi
  if [[ "$LP" == *,gen,* ]]; then
    timeout "${LONG_GEN_TIMEOUT_S:-600}" python3 tools/check_long_generation.py --backend cuda \
      --max-new-tokens "${LONG_GEN_TOKENS:-16384}" --json "$OUT/long_generation.json" 2>&1 | tee "$OUT/long_generation.log" | tail -6
    log "long generation done"
  fi
fi

if has cpu_acceptance; then
  python3 tools/bench_acceptance.py --dtype bfloat16 --prompts "${ACC_PROMPTS:-5}" --max-new-tokens "${ACC_TOKENS:-64}" \
    --configs "${ACC_CONFIGS:-chain8:8:8:1:0,tree8:8:8:2:0,tree16:16:8:2:0,tree32:32:8:4:0,tree64:64:8:4:0,tree16-auto:16:8:2}" \
    --out "$OUT/acceptance_cpu" 2>&1 | tee "$OUT/acceptance_cpu.log" | tail -25
  log "cpu acceptance done"
fi

# The device tool returns at most 8 files from $OUT: bundle everything.
( cd "$OUT" && tar czf /tmp/e2e-results.tgz --exclude=e2e-results.tgz . && find . -mindepth 1 -delete \
  && mv /tmp/e2e-results.tgz . )
log "results bundled into $OUT/e2e-results.tgz"
