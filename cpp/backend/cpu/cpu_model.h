// The CPU backend: the numerical reference of the engine and a first-class
// path on machines without a GPU. fp32 activations and KV cache, fp32 or bf16
// weights read in place from the memory-mapped checkpoint, or int4 projections
// (format_version 3) dequantized on the fly with fp32 accumulation.
#pragma once
#include <memory>

#include "swiftspec/model.h"

namespace swiftspec {

/// Prompt tokens per forward pass of a chunked prefill on the CPU backends (plain and
/// tensor-parallel; Model::prefill_chunk_tokens). 64: measured as fast per token as longer
/// passes (a 1024-token prompt of the 0.5B: 10.3 s in chunks of 64, 14.2 s in one pass,
/// 2 cores), while a pass of the 1.5B stays near 2 s at most (the Ctrl-C latency).
constexpr int kCpuPrefillChunkTokens = 64;

/// Builds a CPU model over `checkpoint` (kept alive by the model). Throws
/// CheckpointError naming the tensor for a missing tensor or a shape that
/// disagrees with config.json, and for weight dtypes other than F32/BF16/int4 (an int4
/// projection's qweight/scales/zeros are validated by cpu::load_int4_matrix).
std::unique_ptr<Model> make_cpu_model(std::shared_ptr<const Checkpoint> checkpoint,
                                      const ModelOptions& options);

}  // namespace swiftspec
