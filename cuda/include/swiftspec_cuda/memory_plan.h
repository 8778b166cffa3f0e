// What a CUDA model needs in GPU memory, and what is free there (memory_plan.h's rule decides
// the context from both).
#pragma once
#include "swiftspec/config.h"
#include "swiftspec/memory_plan.h"
#include "swiftspec/model.h"

namespace swiftspec {

/// Device bytes of a CudaModel of `config` with `options` (its max_context counts through
/// MemoryNeed::bytes(context); options.max_context itself is not read). A function of the shapes
/// only, written to follow the buffers CudaModelImpl allocates (allocate_state and load_host in
/// cuda/src/cuda_model_load.cu, setup_megakernel in cuda_model_megakernel.cu); update it with them:
///  - weights, bf16: per layer the fused QKV (+ fp32 bias), O, fused gate/up and down
///    projections, or with `int4_group_size` = G > 0 (an int4 checkpoint,
///    CudaModelOptions::int4_group_size) those projections in the int4 GEMM's layout,
///    n k / 2 + 4 n k / G bytes each (cuda_projection_bytes, swiftspec/memory_plan.h), and
///    the layer's two RMSNorm weights in fp32; the embedding and the LM head (bf16 in both
///    cases; rows padded to 16; allocated also when tied);
///  - KV cache, bf16: K and V, [layers][kv_heads][max_context + max_tree][head_dim];
///  - workspaces: the activations of a 64-token step (fp32 residual, bf16 copies, q, attention
///    output, MLP activation), fp32 logits [64][vocab] and the top-k scratch; the attention's
///    split partials and counters, which grow with the context in steps (MemoryNeed::
///    workspace_of_context, sized by the kernels' own attention_scratch_sizes); the prefill
///    path's buffers (PrefillRunner::device_bytes; not for int4 models, which go without);
///    the megakernel's partials (options.megakernel); the load-time staging buffer (the
///    largest uploaded tensor in the checkpoint's dtype: `weight_dtype_bytes` per element, 2
///    for bf16 / f16, 4 for f32; for int4 projections their checkpoint tensors); and a
///    fixed allowance for CUDA graphs, launch resources and the step tuner. Not counted: the
///    CUDA context itself (already outside cudaMemGetInfo's free bytes once it exists) and the
///    megakernel's debug trace (CudaModelOptions::megakernel_trace).
/// Throws InvalidArgument when `int4_group_size` does not divide a projection's K.
MemoryNeed cuda_memory_need(const ModelConfig& config, const ModelOptions& options, int weight_dtype_bytes = 2,
                            int int4_group_size = 0);

/// cudaMemGetInfo's free bytes on GPU `device` (where: "on cuda:<device>"), or the test hook
/// SWIFTSPEC_TEST_FREE_BYTES (memory_plan.h). Throws InvalidArgument for a device that does not
/// exist, CudaError when the device cannot be queried.
FreeMemory cuda_free_memory(int device);

/// Checks, before any buffer of a CudaModel is allocated, that a model of `config` with
/// `options` (max_context >= 1 resolved) fits in what is free on GPU `device`: plan_contexts'
/// rule for one model named "the model" (int4 projections with `int4_group_size` > 0, as
/// cuda_memory_need). Throws InvalidArgument with the numbers (needed, free, the largest context
/// that fits) when it does not.
void check_cuda_memory(const ModelConfig& config, const ModelOptions& options, int device, int int4_group_size = 0);

}  // namespace swiftspec
