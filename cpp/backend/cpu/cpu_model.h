// The CPU backend: the numerical reference of the engine and a first-class
// path on machines without a GPU. fp32 activations and KV cache, fp32 or bf16
// weights read in place from the memory-mapped checkpoint.
#pragma once
#include <memory>

#include "swiftspec/model.h"

namespace swiftspec {

/// Builds a CPU model over `checkpoint` (kept alive by the model). Throws
/// CheckpointError naming the tensor for a missing tensor or a shape that
/// disagrees with config.json, and for weight dtypes other than F32/BF16.
std::unique_ptr<Model> make_cpu_model(std::shared_ptr<const Checkpoint> checkpoint,
                                      const ModelOptions& options);

}  // namespace swiftspec
