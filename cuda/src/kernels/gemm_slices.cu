// The K partition and the engine of the skinny GEMM (gemm_skinny.h): one
// place, because the batch-invariance contract (model.h) depends on neither
// varying with M.
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"

namespace swiftspec::cuda {

int gemm_slices(int K) {
  const int s = (K + 511) / 512;
  return s < 1 ? 1 : (s > 8 ? 8 : s);
}

GemmEngine gemm_default_engine(int /*N*/, int /*K*/) {
  // Per matrix, never per M (the engines round differently inside a k16 step).
  const char* e = std::getenv("SWIFTSPEC_GEMM_ENGINE");
  if (e && std::strcmp(e, "mma") == 0) return GemmEngine::Mma;
  return GemmEngine::Wgmma;
}

int gemm_default_split_n() {
  const char* e = std::getenv("SWIFTSPEC_WGMMA_SPLIT_N");
  return e && std::strcmp(e, "1") == 0 ? 1 : 0;
}

}  // namespace swiftspec::cuda
