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
  // across the S CTAs (run 7: the 8B gate/up matrix, 448 row blocks, lost
  // ~1.6 µs per extra persistent round at S = 8), and slices of at least
  // 128 columns (two pipeline stages).
  constexpr int kTargetPairs = 256;
  const int row_blocks = (N + 63) / 64;
  int s = (kTargetPairs + row_blocks - 1) / row_blocks;
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

int gemm_pdl_early() {
  // Read at every launch (launches are captured once per graph bucket).
  const char* e = std::getenv("SWIFTSPEC_GEMM_PDL_EARLY");
  return e && std::strcmp(e, "1") == 0 ? 1 : 0;
}

}  // namespace swiftspec::cuda
