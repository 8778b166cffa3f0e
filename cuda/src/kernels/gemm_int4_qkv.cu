// Instantiates the int4-weight skinny GEMM (gemm_int4.cuh) with the EpiQKV epilogue
// (epilogues.h) for models with int4 projections. One file per epilogue keeps compile units
// small and parallel.
#include "kernels/epilogues.h"
#include "kernels/gemm_int4.cuh"

namespace swiftspec::cuda {
SS_INSTANTIATE_GEMM_INT4(EpiQKV)
}  // namespace swiftspec::cuda
