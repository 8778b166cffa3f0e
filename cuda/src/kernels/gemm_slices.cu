// The K partition of the skinny GEMM (gemm_skinny.h): one place, because the
// batch-invariance contract (model.h) depends on it never varying with M.
#include "kernels/kernels.h"

namespace swiftspec::cuda {

int gemm_slices(int K) {
  const int s = (K + 511) / 512;
  return s < 1 ? 1 : (s > 8 ? 8 : s);
}

}  // namespace swiftspec::cuda
