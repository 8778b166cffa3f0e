// The int4-weight skinny GEMM (gemm_int4.h): the load-time re-layout, validation and random
// fill, the K slices, and the kernel (gemm_int4.cuh) instantiated with EpiPlain (checks and
// benchmarks; the model's epilogues: gemm_int4_{qkv,residual,swiglu}.cu).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "kernels/epilogues.h"
#include "kernels/gemm_int4.cuh"
#include "kernels/gemm_int4.h"
#include "kernels/kernels.h"
#include "kernels/random.cuh"

namespace swiftspec::cuda {

// ---------------------------------------------------------------------------
// Re-layout, validation, random fill
// ---------------------------------------------------------------------------
namespace {

__global__ void int4_relayout_kernel(const uint8_t* __restrict__ qweight, const uint16_t* __restrict__ scales,
                                     const uint8_t* __restrict__ zeros, const int* __restrict__ perm, int N, int K,
                                     int G, uint32_t* __restrict__ qw, uint32_t* __restrict__ meta,
                                     int* __restrict__ invalid) {
  const size_t nwords = static_cast<size_t>(N) * K / 8;
  const int ng = K / G;
  const size_t nmeta = static_cast<size_t>(N) * ng;
  const size_t K2 = static_cast<size_t>(K) / 2;
  const int NRT = N / 16;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < nwords + nmeta;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (i < nwords) {
      const int j = static_cast<int>(i & 3);
      const int l = static_cast<int>((i >> 2) & 31);
      const size_t tile = i >> 7;
      const int rt = static_cast<int>(tile % NRT);
      const int kt = static_cast<int>(tile / NRT);
      const int g = l >> 2, t = l & 3;
      const int r0 = rt * 16 + g, r1 = r0 + 8;
      const int s0 = perm ? perm[r0] : r0, s1 = perm ? perm[r1] : r1;
      const size_t c = (static_cast<size_t>(kt) * 64 + j * 16 + 2 * t) / 2;         // byte of element kb + 2t
      const uint32_t b0 = qweight[s0 * K2 + c], b1 = qweight[s1 * K2 + c];          // e0 e1 / e2 e3
      const uint32_t b2 = qweight[s0 * K2 + c + 4], b3 = qweight[s1 * K2 + c + 4];  // e4 e5 / e6 e7
      // slots 0..3: e0 e2 e4 e6 (low nibbles), slots 4..7: e1 e3 e5 e7 (high nibbles)
      const uint32_t word = (b0 & 15) | ((b1 & 15) << 4) | ((b2 & 15) << 8) | ((b3 & 15) << 12) | ((b0 >> 4) << 16) |
                            ((b1 >> 4) << 20) | ((b2 >> 4) << 24) | ((b3 >> 4) << 28);
      qw[i] = word;
    } else {
      const size_t m = i - nwords;
      const int gi = static_cast<int>(m / N);
      const int n = static_cast<int>(m % N);
      const int sn = perm ? perm[n] : n;
      const uint32_t z = zeros[static_cast<size_t>(sn) * ng + gi];
      const uint32_t sc = scales[static_cast<size_t>(sn) * ng + gi];
      if (invalid && (z > 15 || (sc & 0x7C00u) == 0x7C00u)) atomicAdd(invalid, 1);
      meta[m] = ((0xC300u | (z & 15u)) << 16) | sc;
    }
  }
}

__global__ void int4_fill_kernel(uint32_t* qw, size_t nwords, uint32_t* meta, size_t nmeta, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < nwords + nmeta;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    if (i < nwords) {
      qw[i] = static_cast<uint32_t>(h);
    } else {
      // fp16 scale +-[2^-10, 2^-9): exponent 5, random mantissa and sign; zero 0..15
      const uint32_t sc =
          (static_cast<uint32_t>(h >> 63) << 15) | (5u << 10) | static_cast<uint32_t>((h >> 20) & 0x3FF);
      const uint32_t z = static_cast<uint32_t>((h >> 40) & 15);
      meta[i - nwords] = ((0xC300u | z) << 16) | sc;
    }
  }
}

int int4_grid(size_t n) { return static_cast<int>(std::min<size_t>((n + 255) / 256, 65536)); }

}  // namespace

void check_int4_shape(int N, int K, int G) {
  if (N <= 0 || K <= 0 || N % 16 != 0 || K % 64 != 0)
    throw InvalidArgument("int4 gemm: N must be a positive multiple of 16 and K of 64 (N=" + std::to_string(N) +
                          ", K=" + std::to_string(K) + ")");
  if (G <= 0 || G % 32 != 0 || K % G != 0)
    throw InvalidArgument("int4 gemm: the group size must be a multiple of 32 dividing K (G=" + std::to_string(G) +
                          ", K=" + std::to_string(K) + ")");
}

void launch_int4_relayout(const uint8_t* qweight, const uint16_t* scales, const uint8_t* zeros, const int* perm, int N,
                          int K, int G, uint32_t* qw, uint32_t* meta, int* invalid, cudaStream_t stream) {
  check_int4_shape(N, K, G);
  const size_t total = static_cast<size_t>(N) * K / 8 + static_cast<size_t>(N) * (K / G);
  int4_relayout_kernel<<<int4_grid(total), 256, 0, stream>>>(qweight, scales, zeros, perm, N, K, G, qw, meta, invalid);
  SS_CUDA_CHECK_LAUNCH("int4_relayout_kernel");
}

Int4Matrix upload_int4_matrix(const uint8_t* qweight, const uint16_t* scales, const uint8_t* zeros, const int* perm,
                              int N, int K, int G, cudaStream_t stream) {
  check_int4_shape(N, K, G);
  const int ng = K / G;
  for (size_t i = 0; i < static_cast<size_t>(N) * ng; ++i) {
    if (zeros[i] > 15 || (scales[i] & 0x7C00u) == 0x7C00u)
      throw InvalidArgument(
          "int4 gemm: row " + std::to_string(i / ng) + " group " + std::to_string(i % ng) +
          (zeros[i] > 15 ? ": zero point " + std::to_string(zeros[i]) + " > 15" : ": scale is not finite"));
  }
  if (perm) {
    std::vector<char> seen(N, 0);
    for (int n = 0; n < N; ++n) {
      if (perm[n] < 0 || perm[n] >= N || seen[perm[n]])
        throw InvalidArgument("int4 gemm: perm is not a permutation of 0.." + std::to_string(N - 1));
      seen[perm[n]] = 1;
    }
  }
  const size_t qbytes = static_cast<size_t>(N) * K / 2, gbytes = static_cast<size_t>(N) * ng;
  DeviceBuffer dq(qbytes), ds(gbytes * 2), dz(gbytes), dp(perm ? sizeof(int) * N : 0);
  SS_CUDA_CHECK(cudaMemcpyAsync(dq.get(), qweight, qbytes, cudaMemcpyHostToDevice, stream));
  SS_CUDA_CHECK(cudaMemcpyAsync(ds.get(), scales, gbytes * 2, cudaMemcpyHostToDevice, stream));
  SS_CUDA_CHECK(cudaMemcpyAsync(dz.get(), zeros, gbytes, cudaMemcpyHostToDevice, stream));
  if (perm) SS_CUDA_CHECK(cudaMemcpyAsync(dp.get(), perm, sizeof(int) * N, cudaMemcpyHostToDevice, stream));
  Int4Matrix m;
  m.N = N;
  m.K = K;
  m.G = G;
  m.qw.allocate(qbytes);
  m.meta.allocate(gbytes * 4);
  launch_int4_relayout(dq.as<uint8_t>(), ds.as<uint16_t>(), dz.as<uint8_t>(), perm ? dp.as<int>() : nullptr, N, K, G,
                       m.qw.as<uint32_t>(), m.meta.as<uint32_t>(), nullptr, stream);
  SS_CUDA_CHECK(cudaStreamSynchronize(stream));  // the staging buffers go out of scope
  return m;
}

void launch_fill_random_int4(const Int4View& w, uint64_t seed, cudaStream_t stream) {
  check_int4_shape(w.N, w.K, w.G);
  const size_t nwords = static_cast<size_t>(w.N) * w.K / 8, nmeta = static_cast<size_t>(w.N) * (w.K / w.G);
  int4_fill_kernel<<<int4_grid(nwords + nmeta), 256, 0, stream>>>(const_cast<uint32_t*>(w.qw), nwords,
                                                                  const_cast<uint32_t*>(w.meta), nmeta, seed);
  SS_CUDA_CHECK_LAUNCH("int4_fill_kernel");
}

int gemm_int4_slices(int N, int K) {
  // The bf16 kernel's split (gemm_slices: about two CTAs per SM in one wave, slices of at
  // least 128 columns, at most 2048), not yet measured for int4, where a slice streams a
  // quarter of the bytes.
  return std::clamp(std::min(gemm_slices(N, K), K / 128), 1, 8);
}

SS_INSTANTIATE_GEMM_INT4(EpiPlain)

}  // namespace swiftspec::cuda
