// Instantiation of the skinny GEMM with the EpiPeerStore epilogue
// (epi_allreduce.h: the first kernel of the two-kernel row-parallel path).
#include "kernels/gemm_skinny.cuh"
#include "multigpu/epi_allreduce.h"

namespace swiftspec::cuda {

SS_INSTANTIATE_GEMM(EpiPeerStore)

}  // namespace swiftspec::cuda
