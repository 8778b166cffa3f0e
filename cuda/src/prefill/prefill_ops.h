// The elementwise steps of the prefill path around its large GEMMs (gemm_large.h) and its
// attention (attention_prefill.h), for a chunk of M tokens. The QKV and SwiGLU steps apply
// the decode path's epilogues (kernels/epilogues.h) to the GEMM's fp32 output, so the weight
// layouts (permuted rows, RMSNorm weights folded) are read the same way.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace swiftspec::cuda {

/// h32[m] = float(table[tokens[m]]), h16[m] = table[tokens[m]], m < M. table [vocab][hidden]
/// bf16; tokens [M] (device); h32 [M][hidden] fp32; h16 [M][hidden] bf16.
void launch_prefill_embed(const __nv_bfloat16* table, const int* tokens, int M, int hidden, float* h32,
                          __nv_bfloat16* h16, cudaStream_t stream);

/// The input of a norm-fused GEMM: h16[m] = bf16(h32[m]) and rinv[m] = 1 / sqrt(mean(h32[m]^2) +
/// eps) (the RMSNorm weight is folded into the next weight matrix). h32 [M][hidden]; rinv [M].
void launch_prefill_rms(const float* h32, int M, int hidden, float eps, __nv_bfloat16* h16, float* rinv,
                        cudaStream_t stream);

struct PrefillQkvParams {
  const float* y = nullptr;        ///< [M][(heads + 2 kv_heads) * head_dim] fp32, the QKV GEMM's output (permuted rows)
  const float* rinv = nullptr;     ///< [M]
  const int* positions = nullptr;  ///< [M] RoPE positions (device)
  const float* bias = nullptr;     ///< [N] fp32 in permuted row order, or null
  const float* inv_freq = nullptr;  ///< [head_dim / 2]
  float rope_scale = 1.0f;          ///< cos/sin multiplier (EpiQKV::Params::rope_scale)
  __nv_bfloat16* q = nullptr;       ///< [M][heads * head_dim]
  __nv_bfloat16* kcache = nullptr;  ///< this layer: [kv_heads][slots][head_dim]; token m at kv_index0 + m
  __nv_bfloat16* vcache = nullptr;
  int M = 0, kv_index0 = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, slots = 0, neox = 1;
};
/// RMSNorm scale, bias and RoPE of the QKV GEMM's output; Q rows to q, K / V into the cache
/// (EpiQKV's arithmetic).
void launch_prefill_qkv(const PrefillQkvParams& p, cudaStream_t stream);

/// act[m][i] = bf16(silu(rinv_m g) * rinv_m u) from the gate/up GEMM's fp32 output y
/// [M][2 intermediate] (rows interleaved by 8; EpiSwiGLU's arithmetic). act [M][intermediate].
void launch_prefill_swiglu(const float* y, const float* rinv, int M, int intermediate, __nv_bfloat16* act,
                           cudaStream_t stream);

}  // namespace swiftspec::cuda
