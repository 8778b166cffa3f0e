// KV cache maintenance kernels: committing accepted tree slots into the
// committed region (SwiftSpec ASPLOS'26 §4.2) and random filling (benchmarks).
#include <algorithm>

#include "common.h"
#include "kernels/kernels.h"
#include "kernels/random.cuh"

namespace swiftspec::cuda {

namespace {

// One thread per 16-byte vector of (layer, kv head, i) rows, K and V.
__global__ void kv_copy_kernel(__nv_bfloat16* __restrict__ kc, __nv_bfloat16* __restrict__ vc, int rows_per_layer_head,
                               int slots, int vec_per_row, const int* __restrict__ src_index, int n, int dst0,
                               size_t total) {
  for (size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; g < total;
       g += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int v = static_cast<int>(g % vec_per_row);
    const size_t rest = g / vec_per_row;
    const int i = static_cast<int>(rest % n);
    const size_t lh = rest / n;  // layer * kv_heads + head
    const size_t base = lh * static_cast<size_t>(slots);
    const size_t src = (base + src_index[i]) * vec_per_row + v;
    const size_t dst = (base + dst0 + i) * vec_per_row + v;
    reinterpret_cast<uint4*>(kc)[dst] = reinterpret_cast<const uint4*>(kc)[src];
    reinterpret_cast<uint4*>(vc)[dst] = reinterpret_cast<const uint4*>(vc)[src];
  }
  (void)rows_per_layer_head;
}

__global__ void kv_fill_kernel(__nv_bfloat16* __restrict__ kc, __nv_bfloat16* __restrict__ vc, int slots, int head_dim,
                               int len, uint64_t seed, size_t total) {
  for (size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; g < total;
       g += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(g % head_dim);
    const size_t rest = g / head_dim;
    const int s = static_cast<int>(rest % len);
    const size_t lh = rest / len;
    const size_t idx = (lh * slots + s) * head_dim + d;
    kc[idx] = __float2bfloat16_rn(rand_sym(seed, 2 * g));
    vc[idx] = __float2bfloat16_rn(rand_sym(seed, 2 * g + 1));
  }
}

}  // namespace

void launch_kv_copy(__nv_bfloat16* kcache, __nv_bfloat16* vcache, int layers, int kv_heads, int slots, int head_dim,
                    const int* src_index, int n, int dst0, cudaStream_t stream) {
  if (n <= 0) return;
  const int vec = head_dim / 8;
  const size_t total = static_cast<size_t>(layers) * kv_heads * n * vec;
  if (total == 0) return;
  const int blocks = static_cast<int>(std::min<size_t>((total + 255) / 256, 4096));
  kv_copy_kernel<<<blocks, 256, 0, stream>>>(kcache, vcache, n, slots, vec, src_index, n, dst0, total);
  SS_CUDA_CHECK_LAUNCH("kv_copy_kernel");
}

void launch_kv_fill_random(__nv_bfloat16* kcache, __nv_bfloat16* vcache, int layers, int kv_heads, int slots,
                           int head_dim, int len, uint64_t seed, cudaStream_t stream) {
  if (len <= 0) return;
  const size_t total = static_cast<size_t>(layers) * kv_heads * len * head_dim;
  if (total == 0) return;
  const int blocks = static_cast<int>(std::min<size_t>((total + 255) / 256, 16384));
  kv_fill_kernel<<<blocks, 256, 0, stream>>>(kcache, vcache, slots, head_dim, len, seed, total);
  SS_CUDA_CHECK_LAUNCH("kv_fill_kernel");
}

}  // namespace swiftspec::cuda
