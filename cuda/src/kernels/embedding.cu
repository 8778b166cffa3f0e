// Token embedding gather for one step (first kernel of the step graph).
#include "common.h"
#include "kernels/kernels.h"

namespace swiftspec::cuda {

namespace {

/// kNormed: h16 = bf16(h32 * gamma) (int4 models, launch_embedding); else h16 = the table row.
template <bool kNormed>
__global__ void embedding_kernel(const __nv_bfloat16* __restrict__ table, int hidden, const StepDesc* __restrict__ desc,
                                 float* __restrict__ h32, __nv_bfloat16* __restrict__ h16, float* __restrict__ ssq,
                                 unsigned long long* __restrict__ keys, const float* __restrict__ gamma) {
  griddep_launch_dependents();
  const int m = blockIdx.x;
  const int tiles = hidden >> 4;
  if (m == 0)
    for (int i = threadIdx.x; i < kMaxStepTokens; i += blockDim.x) keys[i] = 0ull;
  float* hr = h32 + static_cast<size_t>(m) * hidden;
  __nv_bfloat16* hb = h16 + static_cast<size_t>(m) * hidden;
  float* sr = ssq + static_cast<size_t>(m) * tiles;
  if (m >= desc->n) {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      hr[i] = 0.f;
      hb[i] = __float2bfloat16_rn(0.f);
    }
    for (int t = threadIdx.x; t < tiles; t += blockDim.x) sr[t] = 0.f;
    return;
  }
  const __nv_bfloat16* src = table + static_cast<size_t>(desc->tokens[m]) * hidden;
  for (int t = threadIdx.x; t < tiles; t += blockDim.x) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src + t * 16);
    const uint4 u0 = s4[0], u1 = s4[1];
    if constexpr (!kNormed) {
      reinterpret_cast<uint4*>(hb + t * 16)[0] = u0;
      reinterpret_cast<uint4*>(hb + t * 16)[1] = u1;
    }
    const __nv_bfloat16* e0 = reinterpret_cast<const __nv_bfloat16*>(&u0);
    const __nv_bfloat16* e1 = reinterpret_cast<const __nv_bfloat16*>(&u1);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float v = __bfloat162float(e0[j]);
      hr[t * 16 + j] = v;
      if constexpr (kNormed) hb[t * 16 + j] = __float2bfloat16_rn(v * gamma[t * 16 + j]);
      s += v * v;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float v = __bfloat162float(e1[j]);
      hr[t * 16 + 8 + j] = v;
      if constexpr (kNormed) hb[t * 16 + 8 + j] = __float2bfloat16_rn(v * gamma[t * 16 + 8 + j]);
      s += v * v;
    }
    sr[t] = s;
  }
}

}  // namespace

void launch_embedding(const __nv_bfloat16* table, int hidden, const StepDesc* desc, int rows, float* h32,
                      __nv_bfloat16* h16, float* ssq, unsigned long long* argmax_keys, cudaStream_t stream,
                      const float* gamma) {
  if (gamma)
    embedding_kernel<true><<<rows, 128, 0, stream>>>(table, hidden, desc, h32, h16, ssq, argmax_keys, gamma);
  else
    embedding_kernel<false><<<rows, 128, 0, stream>>>(table, hidden, desc, h32, h16, ssq, argmax_keys, nullptr);
  SS_CUDA_CHECK_LAUNCH("embedding_kernel");
}

}  // namespace swiftspec::cuda
