# Sourced by the GPU machine's scripts (tools/gpu_*.sh): what each writes first into its build log,
# and where the build finds the nlohmann-json and CUTLASS headers.

# gpu_machine_info LOG: the date, the commit ($COMMIT or git's), the GPU and nvcc, into LOG.
gpu_machine_info() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
    nvcc --version | tail -2
  } > "$1" 2>&1
}

# gpu_headers SITE LOG: sets JSON_INC and CUTLASS. The carried wheels (.whl/nlohmann_json-*.whl,
# .whl/nvidia_cutlass-*.whl; the machine cannot download) are unpacked into SITE; otherwise the
# installed Python packages; SWIFTSPEC_JSON_INCLUDE_DIR / SWIFTSPEC_CUTLASS_DIR override both.
gpu_headers() {
  local site=$1 log=$2 w
  for w in .whl/nlohmann_json-*.whl .whl/nvidia_cutlass-*.whl; do
    [ -e "$w" ] && python3 -m pip install -q --no-index --no-deps --target "$site" "$w" >> "$log" 2>&1
  done
  JSON_INC=${SWIFTSPEC_JSON_INCLUDE_DIR:-$site/nlohmann_json/include}
  [ -d "$JSON_INC" ] || JSON_INC=$(python3 -c 'import nlohmann_json, os; print(os.path.join(os.path.dirname(nlohmann_json.__file__), "include"))' 2>/dev/null)
  CUTLASS=${SWIFTSPEC_CUTLASS_DIR:-$site/cutlass_library/source}
  [ -d "$CUTLASS/include/cutlass" ] || CUTLASS=$(python3 -c 'import importlib.util, os; s = importlib.util.find_spec("cutlass_library"); print(os.path.join(list(s.submodule_search_locations)[0], "source"))' 2>/dev/null)
  return 0
}

# gpu_programs PROBE TARGET...: the programs TARGET... in $BUILD_DIR/cuda, used as they are when
# they are there and load; with PREBUILT (a .tar.xz
# of them built on the development machine with the same nvcc) they are unpacked and used when they
# load here (PROBE given a bad flag exits 2 once loaded), which saves the build's device minutes;
# otherwise configured and built ($JOBS jobs, 420 s at most). Needs OUT, BUILD_DIR, JOBS, JSON_INC,
# CUTLASS and log(); exits 1 with the build's errors when the build fails.
gpu_programs() {
  local probe=$1 rc
  shift
  local bin=$BUILD_DIR/cuda
  # Programs already built in BUILD_DIR (e.g. the package build of tools/gpu_e2e.sh's build_bg,
  # BUILD_DIR=/tmp/ss-src/build/gpu-py) are used as they are.
  if [ -x "$bin/$probe" ]; then
    "$bin/$probe" --no-such-flag > /dev/null 2>&1
    if [ $? -eq 2 ]; then
      local p
      for p in "$@"; do [ -x "$bin/$p" ] || break; done
      if [ -x "$bin/$p" ]; then log "programs already built in $bin: no build"; return 0; fi
    fi
  fi
  if [ -n "${PREBUILT:-}" ] && [ -f "$PREBUILT" ]; then
    mkdir -p "$bin" && tar -xJf "$PREBUILT" -C "$bin"
    "$bin/$probe" --no-such-flag > /dev/null 2>&1
    if [ $? -eq 2 ]; then log "prebuilt programs load: no build"; return 0; fi
    log "prebuilt programs do not load here: building"
  fi
  log "configure + build ($BUILD_DIR, $JOBS jobs)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DSWIFTSPEC_CUDA=ON -DSWIFTSPEC_PYTHON=OFF -DSWIFTSPEC_CUDA_BENCH_CUBLAS=OFF \
    -DSWIFTSPEC_JSON_INCLUDE_DIR="$JSON_INC" -DSWIFTSPEC_CUTLASS_DIR="$CUTLASS" >> "$OUT/build.log" 2>&1 &&
    timeout 420 cmake --build "$BUILD_DIR" --target "$@" -j "$JOBS" >> "$OUT/build.log" 2>&1
  rc=$?
  log "build exit $rc"
  [ $rc -ne 0 ] && { grep -m 20 -B2 -A8 "error" "$OUT/build.log" | tail -60; exit 1; }
  return 0
}
