// Epilogues of the skinny GEMM (gemm_skinny.h) for row-parallel layers of a
// tensor-parallel group: each rank multiplies its K shard, Y_r = X_r W_r^T
// (X_r [M][K/n], W_r [N][K/n]), and the output is Y = sum_r Y_r
// (Megatron-LM row parallelism: attention output and MLP down projections).
//
//  EpiStoreBf16   Y_r as bf16 [M][ldo]: the plain GEMM, followed by an
//                 all-reduce kernel (ncclAllReduce or the peer all-reduce).
//  EpiAllReduce   the all-reduce fused into the GEMM (SwiftSpec ASPLOS'26
//                 §5.1: the all-reduce lives in the row-parallel GEMM's
//                 epilogue, over symmetric memory / NVLink peer access):
//                 apply() writes the CTA's tiles of Y_r (bf16) into this
//                 rank's symmetric buffer; cta_finish() exchanges flags with
//                 the same CTA on every rank (peer_channel.h), reads the same
//                 tiles of every rank and sums them in rank order (fp32), then
//                 either stores Y (fp32 or bf16) or adds it to the residual
//                 stream (h32 += Y, h16 = bf16(h32), RMSNorm statistics ssq),
//                 like EpiResidual of the one-GPU model.
// The tile partition of a launch is a function of the matrix shape and the
// token bucket only (plan_gemm), identical on every rank: a CTA waits for the
// same CTA of the other ranks, never for a grid-wide barrier, and CTAs that
// finish their GEMM early start exchanging early. The GEMM grid is persistent
// (all CTAs co-resident), as the protocol needs.
// Results: bit-identical on every rank (same bf16 partials, same order), and
// batch invariant (each element is reduced on its own; the GEMM's K split is
// fixed per shape).
#pragma once
#include <cuda_bf16.h>

#include <string>

#include "common.h"
#include "kernels/gemm_skinny.h"
#include "multigpu/peer_channel.h"

namespace swiftspec::cuda {

/// Plain bf16 output out[m * ldo + row] = bf16(y).
struct EpiStoreBf16 {
  struct Params {
    __nv_bfloat16* out = nullptr;
    int ldo = 0;
  };
  static constexpr bool kNeedsRms = false;
  static constexpr int kSmemBytes = 0;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void*, int, int) {}
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi, float,
                               int m_active) {
    if (!valid || m >= m_active) return;
    const int row = tile * 16 + r;
    p.out[static_cast<size_t>(m) * p.ldo + row] = __float2bfloat16_rn(lo);
    p.out[static_cast<size_t>(m) * p.ldo + row + 8] = __float2bfloat16_rn(hi);
  }
  __device__ static void cta_finish(const Params&, void*, int, int, int) {}
#endif
};

/// Y_r (bf16) straight into this rank's half of the peer channel's symmetric
/// buffer for the channel's next launch (data[rank][epoch & 1], row m at
/// m * N), for launch_peer_allreduce_residual() to reduce: the two-kernel
/// path (no copy-in, and only that kernel's few CTAs exchange flags). The
/// epoch is not advanced here; the all-reduce kernel that follows on the
/// same stream does it.
struct EpiPeerStore {
  struct Params {
    PeerChannel ch;
    int N = 0;
  };
  static constexpr bool kNeedsRms = false;
  static constexpr int kSmemBytes = 0;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void*, int, int) {}
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi, float,
                               int m_active) {
    if (!valid || m >= m_active) return;
    const uint32_t e = peer_epoch(p.ch);
    __nv_bfloat16* buf = p.ch.data[p.ch.rank] + (e & 1u) * p.ch.capacity + static_cast<size_t>(m) * p.N;
    buf[tile * 16 + r] = __float2bfloat16_rn(lo);
    buf[tile * 16 + r + 8] = __float2bfloat16_rn(hi);
  }
  __device__ static void cta_finish(const Params&, void*, int, int, int) {}
#endif
};

/// What EpiAllReduce does with the reduced output Y [M][N].
enum class AllReduceOut : int {
  F32 = 0,       ///< out32[m * ldo + row] = Y (tests, benchmarks)
  Bf16 = 1,      ///< out16[m * ldo + row] = bf16(Y)
  Residual = 2,  ///< h32 += Y; h16 = bf16(h32); ssq[m][tile] = sum of squares of the tile's 16 rows
};

#if defined(__CUDACC__)
/// 8 floats -> 8 bf16 (round to nearest even) in one 16-byte vector.
__device__ __forceinline__ uint4 pack_bf16x8(const float* v) {
  uint4 o;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  return o;
}
#endif

struct EpiAllReduce {
  struct Params {
    PeerChannel ch;  ///< this rank's view of the channel (capacity >= M * N)
    int N = 0;       ///< output features (rows of W): the exchange row length
    int br = 0;      ///< rows per row block of the launch (GemmConfig::BR; set by launch_gemm_allreduce)
    AllReduceOut out = AllReduceOut::F32;
    float* out32 = nullptr;          ///< F32: [M][ldo]
    __nv_bfloat16* out16 = nullptr;  ///< Bf16: [M][ldo]
    int ldo = 0;
    float* h32 = nullptr;          ///< Residual: [M][N] fp32 residual stream (replicated on every rank)
    __nv_bfloat16* h16 = nullptr;  ///< Residual: [M][N]
    float* ssq = nullptr;          ///< Residual: [M][N / 16]
  };
  static constexpr bool kNeedsRms = false;
  static constexpr int kSmemBytes = 0;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void*, int, int) {}
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi, float,
                               int m_active) {
    if (!valid || m >= m_active) return;
    const uint32_t e = peer_epoch(p.ch);
    __nv_bfloat16* buf = p.ch.data[p.ch.rank] + (e & 1u) * p.ch.capacity + static_cast<size_t>(m) * p.N;
    buf[tile * 16 + r] = __float2bfloat16_rn(lo);
    buf[tile * 16 + r + 8] = __float2bfloat16_rn(hi);
  }

  /// Exchange, rank-order sum and output of the CTA's tiles. Tiles of the CTA:
  /// row blocks blockIdx.x + i * gridDim.x, 16-row tiles blockIdx.y + j *
  /// gridDim.y inside each (gemm_reduce_epilogue's ownership). Work item =
  /// (tile, token, half): 8 rows as one 16-byte vector per rank; the two
  /// halves of a tile sit in adjacent lanes (sum of squares by one shuffle).
  __device__ static void cta_finish(const Params& p, void*, int tid, int nth, int m_active) {
    const uint32_t e = peer_epoch(p.ch);
    peer_exchange(p.ch, peer_cta_slot(), e);
    const size_t half = (e & 1u) * p.ch.capacity;
    const int tiles_per_rb = p.br >> 4;
    const int n_rb = (p.N + p.br - 1) / p.br;
    const int bx = static_cast<int>(blockIdx.x), by = static_cast<int>(blockIdx.y);
    const int gx = static_cast<int>(gridDim.x), gy = static_cast<int>(gridDim.y);
    const int my_rb = bx < n_rb ? (n_rb - 1 - bx) / gx + 1 : 0;
    const int my_tl = by < tiles_per_rb ? (tiles_per_rb - 1 - by) / gy + 1 : 0;
    const int items = my_rb * my_tl * m_active * 2;
    for (int base = 0; base < items; base += nth) {  // uniform bound: whole warps shuffle
      const int idx = base + tid;
      const int hf = idx & 1;
      const int rest = idx >> 1;
      const int m = m_active > 0 ? rest % m_active : 0;
      const int t = m_active > 0 ? rest / m_active : 0;
      const int ti = my_tl > 0 ? t % my_tl : 0;
      const int ri = my_tl > 0 ? t / my_tl : 0;
      const int tile = (bx + ri * gx) * tiles_per_rb + by + ti * gy;
      const bool act = idx < items && tile * 16 < p.N;
      const int row0 = tile * 16 + hf * 8;
      float acc[8];
      if (act) peer_sum8_n(p.ch, half, static_cast<size_t>(m) * p.N + row0, acc);
      // 16-byte accesses: row0 % 8 == 0, N % 16 == 0, ldo % 8 == 0, bases
      // 16-byte aligned (checked by launch_gemm_allreduce).
      if (p.out == AllReduceOut::Residual) {
        float s = 0.f;
        if (act) {
          float4* hp = reinterpret_cast<float4*>(p.h32 + static_cast<size_t>(m) * p.N + row0);
          float4 h[2] = {hp[0], hp[1]};
          float* a = reinterpret_cast<float*>(h);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            a[i] += acc[i];
            s += a[i] * a[i];
          }
          hp[0] = h[0];
          hp[1] = h[1];
          *reinterpret_cast<uint4*>(p.h16 + static_cast<size_t>(m) * p.N + row0) = pack_bf16x8(a);
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (act && hf == 0) p.ssq[static_cast<size_t>(m) * (p.N >> 4) + tile] = s;
      } else if (act && p.out == AllReduceOut::F32) {
        float4* o = reinterpret_cast<float4*>(p.out32 + static_cast<size_t>(m) * p.ldo + row0);
        o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      } else if (act) {
        *reinterpret_cast<uint4*>(p.out16 + static_cast<size_t>(m) * p.ldo + row0) = pack_bf16x8(acc);
      }
    }
    peer_finish_launch(p.ch);
  }
#endif
};

/// Launches the fused row-parallel GEMM + all-reduce on this rank (see
/// EpiAllReduce): fills ep.br from `cfg` and checks what the protocol needs.
/// Every rank must launch the same shape with the same plan on the channel.
/// Throws InvalidArgument when the channel's capacity is below
/// args.m_active_max * N, the grid has more CTAs than kMaxPeerCtas,
/// N % 16 != 0, an output pointer is null or not 16-byte aligned, or
/// ldo % 8 != 0.
void launch_gemm_allreduce(const GemmConfig& cfg, const CUtensorMap& wmap, const CUtensorMap& xmap,
                           const GemmArgs& args, EpiAllReduce::Params ep, bool pdl, cudaStream_t stream);

}  // namespace swiftspec::cuda
