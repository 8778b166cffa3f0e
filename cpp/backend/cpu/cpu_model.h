// The CPU backend: the numerical reference of the engine and a first-class
// path on machines without a GPU. fp32 activations and KV cache, fp32 or bf16
// weights read in place from the memory-mapped checkpoint, or int4 projections
// (format_version 3) dequantized on the fly with fp32 accumulation.
#pragma once
#include <memory>

#include "swiftspec/memory_plan.h"
#include "swiftspec/model.h"

namespace swiftspec {

/// Prompt tokens per forward pass of a chunked prefill on the CPU backends (plain and
/// tensor-parallel; Model::prefill_chunk_tokens). 64: measured as fast per token as longer
/// passes (faster than one pass over a 1024-token prompt of the 0.5B), while a pass of the
/// 1.5B stays short enough that Ctrl-C is answered within seconds (benchmarks/README.md,
/// "Ctrl-C during a long prefill").
constexpr int kCpuPrefillChunkTokens = 64;

/// What a CPU model of `config` needs in RAM with `options` (memory_plan.h; its max_context
/// counts through MemoryNeed::bytes(context), options.max_context itself is not read):
///  - weights: `weight_bytes`, the checkpoint's tensors as the model holds them (mapped in
///    place; a tensor-parallel model sharded at load time holds a copy besides);
///  - KV cache: fp32 K and V, [layers][slots][kv_heads * head_dim] each, for max_context
///    committed slots plus max_tree tree slots; `kv_heads_stored` is the KV heads the cache holds
///    (0: config.num_kv_heads; tensor parallel: tp * kv_heads_per_rank, replicas included);
///  - workspaces: a forward pass's activations and logits for the largest pass (a prefill
///    chunk, or max_tree tree nodes), with the logits forward_top_k keeps, and each thread's
///    attention scores (one float per key).
MemoryNeed cpu_memory_need(const ModelConfig& config, const ModelOptions& options, uint64_t weight_bytes,
                           int kv_heads_stored = 0);

/// Builds a CPU model over `checkpoint` (kept alive by the model). Throws
/// CheckpointError naming the tensor for a missing tensor or a shape that
/// disagrees with config.json, and for weight dtypes other than F32/BF16/int4 (an int4
/// projection's qweight/scales/zeros are validated by cpu::load_int4_matrix).
std::unique_ptr<Model> make_cpu_model(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options);

}  // namespace swiftspec
