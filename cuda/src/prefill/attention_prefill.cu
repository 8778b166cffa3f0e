// Causal prefill attention (attention_prefill.h). A CTA takes 128 query tokens of one query
// head (8 warps x 16 rows) and walks the key tiles [0, its last token's position] through a
// two-stage cp.async ring shared by its warps; a warp skips the tiles wholly after its rows'
// positions. CTAs of the last token blocks, which see the most keys, start first.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "common.h"
#include "prefill/attention_prefill.h"

namespace swiftspec::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerCta = 128;
constexpr int kKeyTile = 64;
constexpr int kStages = 2;
constexpr float kLog2e = 1.4426950408889634f;

template <int HD>
struct PrefillGeom {
  static constexpr int kLD = HD + 8;
  static constexpr size_t kQBytes = size_t(kRowsPerCta) * kLD * 2;
  static constexpr size_t kTileBytes = size_t(kKeyTile) * kLD * 2;
  static constexpr size_t kSmem = kQBytes + size_t(kStages) * 2 * kTileBytes;
};

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) attention_prefill_kernel(const __grid_constant__ PrefillAttnParams p) {
  constexpr int LD = PrefillGeom<HD>::kLD, CH = HD / 8, NO = HD / 8;  // NO: n8 tiles of the output
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  uint8_t* ring = smem + PrefillGeom<HD>::kQBytes;
  auto stage_k = [&](int s) { return reinterpret_cast<__nv_bfloat16*>(ring + s * 2 * PrefillGeom<HD>::kTileBytes); };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int blocks = gridDim.x;
  const int blk = blocks - 1 - static_cast<int>(blockIdx.x);  // the heaviest blocks first
  const int head = blockIdx.y;
  const int G = p.num_heads / p.num_kv_heads;
  const int kvh = head / G;
  const int m0 = blk * kRowsPerCta;
  const int mend = min(m0 + kRowsPerCta, p.M);
  const int C = p.committed;
  const int kmax = C + mend;  // keys this CTA may read: [0, kmax)
  const int ntiles = (kmax + kKeyTile - 1) / kKeyTile;
  const size_t qstride = static_cast<size_t>(p.num_heads) * HD;

  // Q rows of this head (zero rows past M).
  for (int i = tid; i < kRowsPerCta * CH; i += kThreads) {
    const int r = i / CH, c = i - r * CH;
    if (m0 + r < p.M)
      cp_async_16(Qs + r * LD + c * 8, p.q + (m0 + r) * qstride + head * HD + c * 8);
    else
      *reinterpret_cast<uint4*>(Qs + r * LD + c * 8) = make_uint4(0u, 0u, 0u, 0u);
  }
  const size_t row0 = static_cast<size_t>(kvh) * p.slots;
  auto load_tile = [&](int kt, int s) {
    __nv_bfloat16* K = stage_k(s);
    __nv_bfloat16* V = K + kKeyTile * LD;
    for (int i = tid; i < kKeyTile * CH; i += kThreads) {
      const int r = i / CH, c = i - r * CH;
      const int key = kt * kKeyTile + r;
      if (key < kmax) {
        cp_async_16(K + r * LD + c * 8, p.kcache + (row0 + key) * HD + c * 8);
        cp_async_16(V + r * LD + c * 8, p.vcache + (row0 + key) * HD + c * 8);
      } else {  // past the chunk: masked, and 0 * V must stay finite
        *reinterpret_cast<uint4*>(K + r * LD + c * 8) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(V + r * LD + c * 8) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  load_tile(0, 0);
  asm volatile("cp.async.commit_group;" ::: "memory");

  // This thread's rows: g and g + 8 of the warp's 16; their last key (inclusive), clamped to
  // the chunk (rows past M compute on zero Q and are not stored).
  const int g = lane >> 2, q4 = lane & 3;
  int last[2];
  for (int r = 0; r < 2; ++r) last[r] = C + min(m0 + warp * 16 + g + 8 * r, p.M - 1);
  const int warp_last = C + min(m0 + warp * 16 + 15, p.M - 1);
  const float sl2 = p.scale * kLog2e;

  uint32_t qa[HD / 16][4];
  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};

  for (int kt = 0; kt < ntiles; ++kt) {
    if (kt + 1 < ntiles) load_tile(kt + 1, (kt + 1) % kStages);
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int ks = 0; ks < HD / 16; ++ks)
        ldmatrix_x4(qa[ks],
                    smem_u32(Qs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 + (lane >> 4) * 8));
    }
    const __nv_bfloat16* Ks = stage_k(kt % kStages);
    const __nv_bfloat16* Vs = Ks + kKeyTile * LD;
    if (kt * kKeyTile <= warp_last) {
      float s[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < HD / 16; ++ks) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          ldmatrix_x4(
              b, smem_u32(Ks + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + ks * 16 + ((lane >> 3) & 1) * 8));
          mma_bf16_16816(s[2 * np], qa[ks], b[0], b[1]);
          mma_bf16_16816(s[2 * np + 1], qa[ks], b[2], b[3]);
        }
      }
      const bool diag = (kt + 1) * kKeyTile - 1 > C + m0 + warp * 16;  // some key past some row's position
      float mx[2] = {mrow[0], mrow[1]};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kt * kKeyTile + i * 8 + 2 * q4 + (e & 1);
          float v = s[i][e] * sl2;
          if (diag && key > last[e >> 1]) v = -INFINITY;
          s[i][e] = v;
          mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        alpha[r] = exp2f(mrow[r] - mx[r]);  // 0 on the first tile (mrow = -inf; mx is finite: key 0 is always allowed)
        mrow[r] = mx[r];
      }
      uint32_t pa[4][4];
      float ls[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float pv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pv[e] = exp2f(s[i][e] - mx[e >> 1]);  // exp2(-inf) = 0 for masked keys
          ls[e >> 1] += pv[e];
        }
        pa[i >> 1][(i & 1) * 2] = pack_bf16x2(pv[0], pv[1]);
        pa[i >> 1][(i & 1) * 2 + 1] = pack_bf16x2(pv[2], pv[3]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        ls[r] += __shfl_xor_sync(0xffffffffu, ls[r], 1);
        ls[r] += __shfl_xor_sync(0xffffffffu, ls[r], 2);
        lrow[r] = lrow[r] * alpha[r] + ls[r];
      }
#pragma unroll
      for (int j = 0; j < NO; ++j) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int jp = 0; jp < NO / 2; ++jp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_u32(Vs + (kk * 16 + (lane & 15)) * LD + jp * 16 + (lane >> 4) * 8));
          mma_bf16_16816(o[2 * jp], pa[kk], b[0], b[1]);
          mma_bf16_16816(o[2 * jp + 1], pa[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next load refills it
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int m = m0 + warp * 16 + g + 8 * r;
    if (m >= p.M) continue;
    const float inv = 1.0f / lrow[r];
    __nv_bfloat16* dst = p.out + m * qstride + head * HD + 2 * q4;
#pragma unroll
    for (int j = 0; j < NO; ++j)
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) = __floats2bfloat162_rn(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
  }
}

template <int HD>
void launch_hd(const PrefillAttnParams& p, cudaStream_t stream) {
  static std::atomic<uint64_t> done{0};
  const uint64_t bit = current_device_bit();
  if (!bit || !(done.load(std::memory_order_acquire) & bit)) {
    SS_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(PrefillGeom<HD>::kSmem)));
    done.fetch_or(bit, std::memory_order_acq_rel);
  }
  const dim3 grid((p.M + kRowsPerCta - 1) / kRowsPerCta, p.num_heads, 1);
  attention_prefill_kernel<HD><<<grid, kThreads, PrefillGeom<HD>::kSmem, stream>>>(p);
  SS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_attention_prefill(const PrefillAttnParams& p, cudaStream_t stream) {
  if (p.M < 1) throw InvalidArgument("attention_prefill: M must be >= 1 (got " + std::to_string(p.M) + ")");
  if (p.head_dim == 128)
    launch_hd<128>(p, stream);
  else if (p.head_dim == 64)
    launch_hd<64>(p, stream);
  else
    throw InvalidArgument("attention_prefill: head_dim must be 64 or 128 (got " + std::to_string(p.head_dim) + ")");
}

}  // namespace swiftspec::cuda
