#!/usr/bin/env bash
# End-to-end run of the real Qwen2.5-Coder pair on the GPU machine (issue #5, #6).
#
# Needs, carried into the repo root (all git-ignored):
#   .xfer/qwen2.5-coder-0.5b-instruct.gguf.d/chunk.*        (../shared/tools/split_chunks.sh)
#   .xfer/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf.d/chunk.*
#   .xfer/datasets/{mtbench/question.jsonl,humaneval/HumanEval.jsonl.gz}
#   .whl/gguf-0.19.0-*.whl .whl/nlohmann_json-3.12.0-*.whl
# Steps: join + sha256-check the GGUFs into the cache; build and install the
# package with CUDA on (sm_90a); convert both models to bf16; CUDA-vs-CPU logits
# check; `swiftspec bench` on the CUDA backend (target-only, serial, async) over
# HumanEval + MT-Bench; the HF transformers peers on a subset. Results under $OUT.
#   env: OUT, NUM_PROMPTS (20), NEW_TOKENS (256), PEER_PROMPTS (4), CONFIGS, SKIP_BENCH=1
set -uo pipefail
OUT=${OUT:-/tmp/swiftspec-e2e}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[gpu_e2e +$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 SWIFTSPEC_CACHE=${SWIFTSPEC_CACHE:-/tmp/sscache}
mkdir -p "$SWIFTSPEC_CACHE/models" "$SWIFTSPEC_CACHE/datasets"

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ss-site .whl/*.whl > "$OUT/install.log" 2>&1 \
  || { log "wheel install failed"; cat "$OUT/install.log"; exit 1; }
export PYTHONPATH=/tmp/ss-site

join() {  # join CHUNKDIR NAME SHA
  local dst="$SWIFTSPEC_CACHE/models/$2"
  if [ ! -f "$dst" ]; then cat "$1"/chunk.* > "$dst.partial" && mv "$dst.partial" "$dst"; fi
  echo "$3  $dst" | sha256sum -c - || { log "sha256 mismatch for $2"; rm -f "$dst"; exit 1; }
}
join .xfer/qwen2.5-coder-0.5b-instruct.gguf.d qwen2.5-coder-0.5b-instruct.gguf \
  1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 &
join .xfer/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf.d qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
  cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 &
cp -r .xfer/datasets/* "$SWIFTSPEC_CACHE/datasets/"
wait
log "models joined"

# Build the package with the CUDA backend (no network there: no build isolation).
SWIFTSPEC_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps \
  -Cbuild-dir=build/gpu-py . > "$OUT/build.log" 2>&1 || { log "build failed"; tail -40 "$OUT/build.log"; exit 1; }
log "built"

python3 - > "$OUT/convert.log" 2>&1 <<'PY' || { log "convert failed"; tail -20 "$OUT/convert.log"; exit 1; }
from concurrent.futures import ProcessPoolExecutor
from swiftspec.fetch import ensure_checkpoint
names = ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]
with ProcessPoolExecutor(2) as ex:
    for p in ex.map(ensure_checkpoint, names, ["bfloat16"] * 2, [None] * 2, [False] * 2):
        print(p)
PY
log "converted"

python3 tools/check_cuda_logits.py --json "$OUT/logits_check.json" 2>&1 | tee "$OUT/logits_check.log"
log "logits checked"

if [ "${SKIP_BENCH:-0}" != "1" ]; then
NUM=${NUM_PROMPTS:-20}; NEW=${NEW_TOKENS:-256}
CONFIGS=${CONFIGS:-target,serial:chain6,serial:tree16,async:tree16}
swiftspec bench --backend cuda --datasets humaneval,mtbench --num-prompts "$NUM" --max-new-tokens "$NEW" \
  --configs "$CONFIGS" --skip-unavailable --no-progress --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -40
log "bench done"
[ "${SKIP_PEERS:-0}" = "1" ] || swiftspec bench --backend cuda --datasets humaneval,mtbench --num-prompts "${PEER_PROMPTS:-4}" \
  --max-new-tokens "$NEW" --configs target,serial:tree16,hf:target,hf:assisted --no-progress \
  --out "$OUT/peers" 2>&1 | tee "$OUT/peers.log" | tail -30
log "peers done"
fi

# The device tool returns at most 8 files from $OUT: bundle everything.
( cd "$OUT" && tar czf /tmp/e2e-results.tgz --exclude=e2e-results.tgz . && find . -mindepth 1 -delete \
  && mv /tmp/e2e-results.tgz . )
log "results bundled into $OUT/e2e-results.tgz"
