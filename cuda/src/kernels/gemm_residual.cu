// Instantiates the skinny GEMM (gemm_skinny.cuh) with the EpiResidual epilogue
// (epilogues.h). One file per epilogue keeps compile units small and parallel.
#include "kernels/epilogues.h"
#include "kernels/gemm_skinny.cuh"

namespace swiftspec::cuda {
template <>
struct GemmWgmmaMinBlocks<EpiResidual> {
  static constexpr int value = 3;  // <= 80 registers (see gemm_skinny.cuh)
};
SS_INSTANTIATE_GEMM(EpiResidual)
}  // namespace swiftspec::cuda
