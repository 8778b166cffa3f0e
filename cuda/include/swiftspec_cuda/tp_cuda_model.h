// A tensor-parallel model on the CUDA backend (issue 7; Megatron-LM tensor
// parallelism, Shoeybi et al. 2019 §3, per worker group as in SwiftSpec
// ASPLOS'26 DESIGN part 4): one swiftspec::Model whose ranks are CUDA models
// (cuda_model.h), one per GPU, each holding its shard of the weights and of
// the KV cache, meeting in one all-reduce per row-parallel projection (the
// attention output and the MLP down projection of every layer) through
// CudaModelOptions::row_parallel.
//
// The split follows TpPlan (tensor_parallel.h): query heads, KV heads and FFN
// rows by rank. The embedding, the RMSNorm weights and the LM head are
// replicated, so every rank computes the same full-vocabulary logits and no
// gather is needed (rank 0's are returned; the other ranks skip the LM head). The CUDA attention maps query head j of a
// rank to its KV head j / (q_heads / kv_heads), so the plan must need neither padding heads nor replicated KV heads
// (e.g. 12 query / 2 KV heads at TP 2); other degrees are rejected naming the counts.
//
// Each forward() runs all ranks at once (rank 0 on the calling thread, the
// others on parked threads of a WorkerGroup): the GPU all-reduce of one rank
// waits for the other ranks on the GPU. Every rank validates the batch before
// launching anything and sees the same batch, so a bad request throws on all
// of them and leaves the model usable. A failure after some rank has launched
// its step (a CUDA error) leaves the others waiting on the GPU: the peer
// all-reduce gives up after about 10 s with a trap, which ends that GPU's
// context, and an NCCL all-reduce waits for good. The model then refuses
// every later call (InvalidArgument naming the first failure): reload it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "swiftspec/checkpoint.h"
#include "swiftspec/model.h"

namespace swiftspec {

/// How the ranks complete a row-parallel projection (cuda/src/multigpu/).
enum class TpAllReduce {
  PeerTwoKernel,  ///< GEMM into symmetric peer memory, then a peer all-reduce + residual kernel (default)
  PeerFused,      ///< the peer all-reduce in the GEMM epilogue (one kernel)
  Nccl,           ///< GEMM, ncclAllReduce (bf16), residual add (builds with NCCL only)
};

struct TpCudaOptions {
  /// [tp] the GPU of each rank; distinct GPUs need peer access to each other.
  /// A GPU may repeat (ranks sharing a GPU: protocol tests on one GPU, with
  /// the PeerTwoKernel all-reduce only).
  std::vector<int> devices;
  TpAllReduce all_reduce = TpAllReduce::PeerTwoKernel;
};

/// A TP model over devices.size() ranks, sharded at load time from a TP-1
/// checkpoint. `options` sizes the KV cache (max_context, max_tree) and picks
/// the GEMM engine (gemm_engine: the row-parallel GEMMs of the hook keep the
/// default engine); its device is replaced by each rank's, and an SM
/// partition or a stream priority is rejected (InvalidArgument).
/// Throws InvalidArgument for fewer than 2 devices, an int4 checkpoint (int4 weights run on
/// one GPU: int4_backend_problem, swiftspec/model.h), an unsupported plan or a
/// repeated GPU with another all-reduce than PeerTwoKernel, CheckpointError
/// for a bad checkpoint, CudaError / NcclError for device failures (no peer
/// access between two GPUs).
std::unique_ptr<Model> make_tp_cuda_model(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options,
                                          const TpCudaOptions& tp);

/// The same over a folder pre-sharded by `tools/convert_weights.py --tp N`
/// (N must equal devices.size()).
std::unique_ptr<Model> make_tp_cuda_model_from_shards(const std::string& dir, const ModelOptions& options,
                                                      const TpCudaOptions& tp);

}  // namespace swiftspec
