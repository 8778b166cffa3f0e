// Implementations of the tensor-parallel hook of the CUDA model
// (row_parallel.h), one object per rank:
//   make_peer_row_parallel  the peer all-reduce (rank-order sums, results
//                           bit-identical on every rank), either fused into
//                           the GEMM epilogue (EpiAllReduce, residual output:
//                           one kernel per projection) or as a second kernel
//                           reading the GEMM's partials from the symmetric
//                           buffer and adding the residual (two kernels);
//   make_nccl_row_parallel  the plain GEMM (bf16 partial output), then
//                           ncclAllReduce (bf16, in place) and a residual-add
//                           kernel: three kernels per projection.
// Both keep their own GEMM plans and TMA maps (per shape and token bucket).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>

#include "multigpu/peer_allreduce.h"
#include "row_parallel.h"

#if defined(SWIFTSPEC_HAVE_NCCL)
#include "swiftspec_cuda/nccl_group.h"
#endif

namespace swiftspec::cuda {

/// How the peer hook completes a row-parallel projection.
enum class PeerRowMode {
  Fused,      ///< EpiAllReduce (residual output): every GEMM CTA exchanges its own tiles
  TwoKernel,  ///< GEMM with EpiPeerStore into the symmetric buffer, then
              ///< launch_peer_allreduce_residual (few CTAs exchange, no copy-in)
};

/// Rank `rank` of `group` (which must outlive the hook; capacity >= 64 *
/// hidden; channel c serves projection kind c mod channels()). `num_sms`:
/// SMs of the GEMM grids (the model's). Throws InvalidArgument for a bad rank.
std::shared_ptr<RowParallel> make_peer_row_parallel(const PeerGroup& group, int rank, int num_sms,
                                                    PeerRowMode mode = PeerRowMode::Fused);

#if defined(SWIFTSPEC_HAVE_NCCL)
/// Rank comm.rank() of an NCCL group (`comm` must outlive the hook; its
/// stream is switched to the model's stream at each call). `hidden`: the
/// model's hidden size (the all-reduce buffer holds 64 x hidden bf16).
std::shared_ptr<RowParallel> make_nccl_row_parallel(CudaCommunicator& comm, int hidden, int num_sms);
#endif

/// h32[m] += y[m] (bf16), h16[m] = bf16(h32[m]), ssq[m][t] = sum of squares
/// of h32[m][16t..16t+15] for m < min(*m_active_ptr, m_active_max) (null
/// pointer: m_active_max); all [rows][hidden] row-major, hidden % 16 == 0.
void launch_residual_add(const __nv_bfloat16* y, const int* m_active_ptr, int m_active_max, float* h32,
                         __nv_bfloat16* h16, float* ssq, int hidden, bool pdl, cudaStream_t stream);

}  // namespace swiftspec::cuda
