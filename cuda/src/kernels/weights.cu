// Weight preparation on the GPU: dtype conversion to bf16, row permutation
// (RoPE / gate-up pairing, see epilogues.h) and RMSNorm-weight folding; and
// random fills for benchmarks.
#include <cuda_fp16.h>

#include <algorithm>

#include "common.h"
#include "kernels/kernels.h"
#include "kernels/random.cuh"

namespace swiftspec::cuda {

namespace {

__device__ __forceinline__ float load_as_float(const void* p, SrcType st, size_t i) {
  switch (st) {
    case SrcType::F32:
      return static_cast<const float*>(p)[i];
    case SrcType::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return __half2float(static_cast<const __half*>(p)[i]);
  }
}

__global__ void weight_transform_kernel(const void* __restrict__ src, SrcType st, __nv_bfloat16* __restrict__ dst,
                                        int N, int K, const int* __restrict__ perm, const float* __restrict__ gamma) {
  const size_t total = static_cast<size_t>(N) * K;
  for (size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; g < total;
       g += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int n = static_cast<int>(g / K);
    const int k = static_cast<int>(g - static_cast<size_t>(n) * K);
    const int sn = perm ? perm[n] : n;
    float v = load_as_float(src, st, static_cast<size_t>(sn) * K + k);
    if (gamma) v *= gamma[k];
    dst[g] = __float2bfloat16_rn(v);
  }
}

__global__ void fill_bf16_kernel(__nv_bfloat16* dst, size_t count, float scale, uint64_t seed) {
  for (size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; g < count;
       g += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[g] = __float2bfloat16_rn(scale * rand_sym(seed, g));
}

__global__ void fill_f32_kernel(float* dst, size_t count, float scale, uint64_t seed) {
  for (size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; g < count;
       g += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[g] = scale * rand_sym(seed, g);
}

int grid_for(size_t n) { return static_cast<int>(std::min<size_t>((n + 255) / 256, 65536)); }

}  // namespace

void launch_weight_transform(const void* src, SrcType st, __nv_bfloat16* dst, int N, int K, const int* perm,
                             const float* gamma, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(N) * K;
  weight_transform_kernel<<<grid_for(total), 256, 0, stream>>>(src, st, dst, N, K, perm, gamma);
  SS_CUDA_CHECK_LAUNCH("weight_transform_kernel");
}

void launch_fill_random_bf16(__nv_bfloat16* dst, size_t count, float scale, uint64_t seed, cudaStream_t stream) {
  fill_bf16_kernel<<<grid_for(count), 256, 0, stream>>>(dst, count, scale, seed);
  SS_CUDA_CHECK_LAUNCH("fill_bf16_kernel");
}

void launch_fill_random_f32(float* dst, size_t count, float scale, uint64_t seed, cudaStream_t stream) {
  fill_f32_kernel<<<grid_for(count), 256, 0, stream>>>(dst, count, scale, seed);
  SS_CUDA_CHECK_LAUNCH("fill_f32_kernel");
}

}  // namespace swiftspec::cuda
