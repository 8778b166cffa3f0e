// Tensor-parallel hook of the CUDA model (issue 7; Megatron-LM row
// parallelism, SwiftSpec ASPLOS'26 DESIGN part 4): a CudaModel built with
// CudaModelOptions::row_parallel is one rank of a group. Its config is the
// rank's shard shape (query heads, KV heads, FFN rows and vocabulary divided
// by the TP degree; hidden size whole); column-parallel GEMMs (QKV, gate/up,
// LM head) and attention need nothing from the other ranks, and the two
// row-parallel GEMMs of a layer (attention output, MLP down) go through this
// hook, which completes them with an all-reduce over the group.
//
// Contract of residual_gemm (EpiResidual's, plus the all-reduce): for token
// rows m < min(*args.m_active_ptr, args.m_active_max):
//   h32[m] += sum over ranks of (X_r[m] W_r^T), h16[m] = bf16(h32[m]),
//   ssq[m][t] = sum of squares of h32[m][16t .. 16t+15]
// with the same values on every rank (the residual stream is replicated).
// Every rank records the same sequence of calls (SPMD), each from its own
// thread. Implementations (cuda/src/multigpu/row_parallel_impl.h): the peer
// all-reduce fused into the GEMM epilogue, or GEMM + ncclAllReduce + a
// residual-add kernel.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/epilogues.h"
#include "kernels/gemm_skinny.h"

namespace swiftspec::cuda {

class RowParallel {
 public:
  virtual ~RowParallel() = default;
  /// Which row-parallel projection (lets an implementation keep one channel
  /// or buffer per call site).
  enum Kind { kAttnOut = 0, kMlpDown = 1 };
  /// Records the projection `kind` of one layer on `stream` (see above).
  /// w: this rank's weight shard [N][K] bf16 (N = hidden); x: activations
  /// [64][K] bf16; nt: token bucket (8 * nt rows); args: N, K, m_active_*;
  /// res: h32 / h16 / ssq of the model. `pdl`: launch the GEMM as a
  /// programmatic dependent.
  virtual void residual_gemm(Kind kind, const void* w, const void* x, int nt, const GemmArgs& args,
                             const EpiResidual::Params& res, bool pdl, cudaStream_t stream) = 0;
  /// TP degree and this rank's index.
  virtual int size() const = 0;
  virtual int rank() const = 0;
  /// Short name for logs ("peer-fused", "nccl").
  virtual const char* name() const = 0;
};

}  // namespace swiftspec::cuda
