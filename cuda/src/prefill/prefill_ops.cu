// The elementwise steps of the prefill path (prefill_ops.h).
#include "prefill/prefill_ops.h"

#include "common.h"
#include "kernels/epilogues.h"

namespace swiftspec::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t work) {
  const size_t b = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535u * 32u ? b : 65535u * 32u);
}

__global__ void embed_kernel(const __nv_bfloat16* table, const int* tokens, int M, int hidden, float* h32,
                             __nv_bfloat16* h16) {
  const size_t total = static_cast<size_t>(M) * hidden;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t m = i / hidden, c = i - m * hidden;
    const __nv_bfloat16 v = table[static_cast<size_t>(tokens[m]) * hidden + c];
    h16[i] = v;
    h32[i] = __bfloat162float(v);
  }
}

/// One warp per row.
__global__ void rms_kernel(const float* h32, int M, int hidden, float eps, __nv_bfloat16* h16, float* rinv) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= M) return;
  const float* row = h32 + static_cast<size_t>(warp) * hidden;
  __nv_bfloat16* out = h16 + static_cast<size_t>(warp) * hidden;
  float ss = 0.f;
  for (int c = lane * 4; c < hidden; c += 128) {
    const float4 v = *reinterpret_cast<const float4*>(row + c);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    *reinterpret_cast<__nv_bfloat162*>(out + c) = __floats2bfloat162_rn(v.x, v.y);
    *reinterpret_cast<__nv_bfloat162*>(out + c + 2) = __floats2bfloat162_rn(v.z, v.w);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) rinv[warp] = rsqrtf(ss / static_cast<float>(hidden) + eps);
}

/// One thread per (token m, 16-row tile, row pair r): EpiQKV's store with this chunk's
/// position and cache index.
__global__ void qkv_kernel(const PrefillQkvParams p) {
  const int N = (p.num_heads + 2 * p.num_kv_heads) * p.head_dim;
  const int pairs = N / 2;  // (tile, r) pairs per token: N / 16 tiles x 8
  const size_t total = static_cast<size_t>(p.M) * pairs;
  EpiQKV::Params e;
  e.bias = p.bias;
  e.q = p.q;
  e.kcache = p.kcache;
  e.vcache = p.vcache;
  e.inv_freq = p.inv_freq;
  e.num_heads = p.num_heads;
  e.num_kv_heads = p.num_kv_heads;
  e.head_dim = p.head_dim;
  e.slots = p.slots;
  e.neox = p.neox;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const int m = static_cast<int>(i / pairs);
    const int pr = static_cast<int>(i - static_cast<size_t>(m) * pairs);
    const int tile = pr >> 3, r = pr & 7;
    const float* y = p.y + static_cast<size_t>(m) * N + tile * 16 + r;
    float sn = 0.f, cs = 1.f;
    if (tile / (p.head_dim >> 4) < p.num_heads + p.num_kv_heads) {  // q and k rotate, v does not
      sincosf(static_cast<float>(p.positions[m]) * p.inv_freq[EpiQKV::pair_index(e, tile, r)], &sn, &cs);
      if (p.rope_scale != 1.0f) {  // as EpiQKV::apply
        cs *= p.rope_scale;
        sn *= p.rope_scale;
      }
    }
    EpiQKV::store(e, tile, r, m, p.kv_index0 + m, y[0], y[8], p.rinv[m], cs, sn);
  }
}

__global__ void swiglu_kernel(const float* y, const float* rinv, int M, int intermediate, __nv_bfloat16* act) {
  const size_t total = static_cast<size_t>(M) * intermediate;
  EpiSwiGLU::Params e;
  e.act = act;
  e.intermediate = intermediate;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const int m = static_cast<int>(i / intermediate);
    const int k = static_cast<int>(i - static_cast<size_t>(m) * intermediate);  // act column 8 t + r
    const int tile = k >> 3, r = k & 7;
    const float* yr = y + static_cast<size_t>(m) * 2 * intermediate + tile * 16 + r;
    EpiSwiGLU::apply(e, nullptr, true, tile, r, m, yr[0], yr[8], rinv[m], M);
  }
}

}  // namespace

void launch_prefill_embed(const __nv_bfloat16* table, const int* tokens, int M, int hidden, float* h32,
                          __nv_bfloat16* h16, cudaStream_t stream) {
  embed_kernel<<<blocks_for(static_cast<size_t>(M) * hidden), kThreads, 0, stream>>>(table, tokens, M, hidden, h32,
                                                                                     h16);
  SS_CUDA_CHECK(cudaGetLastError());
}

void launch_prefill_rms(const float* h32, int M, int hidden, float eps, __nv_bfloat16* h16, float* rinv,
                        cudaStream_t stream) {
  if (hidden % 4 != 0) throw InvalidArgument("prefill: hidden_size must be a multiple of 4");
  rms_kernel<<<(M * 32 + kThreads - 1) / kThreads, kThreads, 0, stream>>>(h32, M, hidden, eps, h16, rinv);
  SS_CUDA_CHECK(cudaGetLastError());
}

void launch_prefill_qkv(const PrefillQkvParams& p, cudaStream_t stream) {
  const size_t work = static_cast<size_t>(p.M) * (p.num_heads + 2 * p.num_kv_heads) * p.head_dim / 2;
  qkv_kernel<<<blocks_for(work), kThreads, 0, stream>>>(p);
  SS_CUDA_CHECK(cudaGetLastError());
}

void launch_prefill_swiglu(const float* y, const float* rinv, int M, int intermediate, __nv_bfloat16* act,
                           cudaStream_t stream) {
  swiglu_kernel<<<blocks_for(static_cast<size_t>(M) * intermediate), kThreads, 0, stream>>>(y, rinv, M, intermediate,
                                                                                            act);
  SS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace swiftspec::cuda
