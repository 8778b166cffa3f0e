// Causal attention of a prefill chunk: FlashAttention-2 style (Dao 2023, §3.1: online
// softmax over key tiles, P kept in registers, one warp per 16 query rows), over the
// committed KV cache plus the chunk's own keys, which the QKV epilogue has already written
// at cache indices committed .. committed + M - 1. No partials in global memory.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace swiftspec::cuda {

struct PrefillAttnParams {
  const __nv_bfloat16* q = nullptr;       ///< [M][num_heads * head_dim], RoPE applied
  const __nv_bfloat16* kcache = nullptr;  ///< this layer: [kv_heads][slots][head_dim]
  const __nv_bfloat16* vcache = nullptr;
  __nv_bfloat16* out = nullptr;  ///< [M][num_heads * head_dim]
  int M = 0;                     ///< tokens of the chunk
  int committed = 0;             ///< token m sits at cache index committed + m and attends [0, committed + m]
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, slots = 0;
  float scale = 0.f;  ///< 1/sqrt(head_dim)
};

/// Launches the chunk's attention. Throws InvalidArgument for head_dim other than 64 / 128 or
/// M < 1.
void launch_attention_prefill(const PrefillAttnParams& p, cudaStream_t stream);

}  // namespace swiftspec::cuda
