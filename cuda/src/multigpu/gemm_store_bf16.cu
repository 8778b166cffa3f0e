// Instantiation of the skinny GEMM with the plain bf16 epilogue
// (epi_allreduce.h: the row-parallel GEMM followed by a separate all-reduce).
#include "kernels/gemm_skinny.cuh"
#include "multigpu/epi_allreduce.h"

namespace swiftspec::cuda {

SS_INSTANTIATE_GEMM(EpiStoreBf16)

}  // namespace swiftspec::cuda
