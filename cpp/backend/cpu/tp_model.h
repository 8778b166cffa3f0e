// A tensor-parallel model on the CPU backend: one Model whose forward pass
// runs over the TP ranks of a WorkerGroup (worker_group.h), Megatron-style
// (tensor_parallel.h): each rank holds its shard of the weights and of the
// KV cache (its KV heads, committed and tree regions, model.h §4.2 layout),
// computes its heads / FFN rows / vocabulary slice, and the ranks meet in
// two all-reduces per layer (after o_proj and after down_proj) plus one
// gather of the logits to rank 0.
//
// Rank 0 runs on the thread that calls forward() (the group's leader in the
// asynchronous engine); ranks 1..N-1 are the group's parked threads. Every
// rank has its own cpu::ThreadPool of `threads_per_rank` threads pinned to
// that rank's cores.
//
// Numerics (see tensor_parallel.h): with TP 1 the output is bit-identical to
// the plain CPU model; with TP N the row-parallel sums differ from TP 1 in
// the last bits but every row is still computed independently of the batch
// and keys are attended in the same order in the committed and tree regions,
// so greedy speculation over a TP-N target equals target-only decoding with
// the same TP-N target.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "swiftspec/checkpoint.h"
#include "swiftspec/model.h"
#include "swiftspec/tensor_parallel.h"

namespace swiftspec {

/// Where the ranks of a tensor-parallel CPU model run.
struct TpCpuOptions {
  int tp = 2;                                ///< TP degree (ranks), >= 1
  std::vector<std::vector<int>> rank_cores;  ///< [tp] core lists (empty: unpinned)
  int threads_per_rank = 1;                  ///< CPU threads per rank (>= 1)
  int ffn_align = 8;                         ///< FFN padding multiple (load-time sharding)
};

/// What a TP CPU model over the folder `dir` (its `config`, sharded by `plan`) needs in RAM
/// (cpu_memory_need): the KV heads of every rank (tp * kv_heads_per_rank, replicas included),
/// and the folder's weight files, counted twice when `sharded_at_load` (the ranks' copies
/// besides the mapped TP-1 files; a pre-sharded folder is mapped in place).
ModelMemory tp_cpu_model_memory(const std::string& dir, const ModelConfig& config, const TpPlan& plan,
                                const ModelOptions& options, bool sharded_at_load);

/// A TP model sharded at load time from a TP-1 checkpoint (float32, bfloat16
/// or int4; an int4 one's FFN is split on whole quantization groups). `options` sizes
/// the KV cache (max_context, max_tree); its num_threads / cpu_affinity are
/// replaced by threads_per_rank and rank 0's cores. Throws InvalidArgument
/// for bad options, CheckpointError for a bad checkpoint.
std::unique_ptr<Model> make_tp_cpu_model(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options,
                                         const TpCpuOptions& tp);

/// A TP model over a pre-sharded folder (its tp_degree must equal tp.tp, or
/// tp.tp may be 0 to take it from the folder).
std::unique_ptr<Model> make_tp_cpu_model_from_shards(const std::string& dir, const ModelOptions& options,
                                                     const TpCpuOptions& tp);

}  // namespace swiftspec
