// Instantiates the skinny GEMM (gemm_skinny.cuh) with the EpiResidual epilogue
// (epilogues.h). One file per epilogue keeps compile units small and parallel.
#include "kernels/epilogues.h"
#include "kernels/gemm_skinny.cuh"

namespace swiftspec::cuda {
SS_INSTANTIATE_GEMM(EpiResidual)
}  // namespace swiftspec::cuda
