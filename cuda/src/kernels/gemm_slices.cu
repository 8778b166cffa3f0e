// The K partition and the engine of the skinny GEMM (gemm_skinny.h): one
// place, because the batch-invariance contract (model.h) depends on neither
// varying with M (both are functions of the matrix shape N x K alone).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"

namespace swiftspec::cuda {

int gemm_slices(int N, int K) {
  // Enough (64-row block, slice) pairs for about two CTAs per SM of the H200
  // (132 SMs) in one wave — K is split only as far as N leaves SMs idle.
  // Splitting further costs a cluster barrier per row block in lockstep
  // across the S CTAs (the 8B gate/up matrix, 448 row blocks, lost time with
  // every extra persistent round at S = 8; benchmarks/README.md, "wgmma GEMM
  // engine"), and slices of at least 128 columns (two pipeline stages).
  //
  // A split K is then rounded up to a power of two, so that a slice is a
  // whole number of 64-column pipeline stages (the 8B QKV matrix, K = 4096,
  // at S = 3 gave each CTA 21.3 stages, a ragged last one costing a full
  // stage's latency), and split further while slices exceed 2048 columns
  // (the 8B down matrix, K = 14336: 3584-column slices at S = 4 are a long
  // serial chain per CTA). Both measured faster at M = 1 / 16 / 64: the QKV
  // matrix at S = 4 than 3, the down matrix at S = 8 than 4
  // (benchmarks/README.md, "shape-based K split" and "GEMM K slices and
  // aliased partials").
  constexpr int kTargetPairs = 256;
  constexpr int kMaxSliceColumns = 2048;
  const int row_blocks = (N + 63) / 64;
  int s = (kTargetPairs + row_blocks - 1) / row_blocks;
  if (s > 1) {
    int p = 1;
    while (p < s && p < 8) p *= 2;
    while (p < 8 && K / p > kMaxSliceColumns) p *= 2;
    s = p;
  }
  s = std::min(s, std::max(1, K / 128));
  return std::clamp(s, 1, 8);
}

GemmEngine gemm_default_engine(int /*N*/, int /*K*/) {
  // Per matrix, never per M: nothing guarantees that the two engines round a
  // k16 step identically.
  const char* e = std::getenv("SWIFTSPEC_GEMM_ENGINE");
  if (e && std::strcmp(e, "mma") == 0) return GemmEngine::Mma;
  return GemmEngine::Wgmma;
}

int gemm_default_split_n() {
  const char* e = std::getenv("SWIFTSPEC_WGMMA_SPLIT_N");
  return e && std::strcmp(e, "1") == 0 ? 1 : 0;
}

int gemm_default_palias() {
  const char* e = std::getenv("SWIFTSPEC_GEMM_PALIAS");
  return e && std::strcmp(e, "0") == 0 ? 0 : 1;
}

int gemm_pdl_early() {
  // Read at every launch (launches are captured once per graph bucket).
  const char* e = std::getenv("SWIFTSPEC_GEMM_PDL_EARLY");
  return e && std::strcmp(e, "1") == 0 ? 1 : 0;
}

}  // namespace swiftspec::cuda
