// Tiny models with int4 projections on the CUDA backend (swiftspec-cuda-check --int4-only,
// issue 31).
#pragma once

namespace swiftspec::cuda_check {

/// Tiny Llama- and Qwen2-style models (check_harness.h's tiny_config) with int4 projections of
/// group sizes 32 / 64 / 128 against the fp32 reference model over their dequantized weights:
/// prefill (every row's logits), decode, a tree, a long prompt through decode steps; batch-64
/// rows and a tree path bitwise equal to decoding alone; the step tuner's candidates verified
/// bitwise; refused options (megakernel, prefill path, group sizes) and tensors. Reports
/// through record().
void check_int4_model();

}  // namespace swiftspec::cuda_check
