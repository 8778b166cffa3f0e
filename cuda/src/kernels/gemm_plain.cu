// Instantiates the skinny GEMM (gemm_skinny.cuh) with the EpiPlain and EpiPlainRms epilogues (tests, benchmarks)
// (epilogues.h). One file per epilogue keeps compile units small and parallel.
#include "kernels/epilogues.h"
#include "kernels/gemm_skinny.cuh"

namespace swiftspec::cuda {
SS_INSTANTIATE_GEMM(EpiPlain)
SS_INSTANTIATE_GEMM(EpiPlainRms)
}  // namespace swiftspec::cuda
