// Kernel template of the int4-weight skinny GEMM (gemm_int4.h for the design), its planner and
// launcher. Included by one .cu file per epilogue (gemm_int4.cu: EpiPlain; gemm_int4_qkv.cu,
// gemm_int4_residual.cu, gemm_int4_swiglu.cu: the model's), which instantiates them with
// SS_INSTANTIATE_GEMM_INT4.
#pragma once
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "common.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_skinny.cuh"

namespace swiftspec::cuda {

// Stage geometry: 128 k per stage = two 64-k tiles.
constexpr int kInt4StageK = 128;
constexpr int kInt4MaxGroupsPerStage = kInt4StageK / 32;  // G % 32 == 0, stages start on 64-k tiles

/// Bytes of one stage: [2][8*NT x 128 B] activation boxes (1024-aligned for the 128-byte
/// swizzle), [2][BR/16][512 B] weight words, [4][BR] meta words; rounded up to 1 KiB.
__host__ __device__ constexpr int int4_stage_bytes(int NT, int BR) {
  return ((2 * 1024 * NT + 2 * BR * 32 + kInt4MaxGroupsPerStage * BR * 4) + 1023) & ~1023;
}
/// Pipeline depth: about 64 KiB of stages, 3..6 deep.
__host__ __device__ constexpr int int4_stages(int NT, int BR) {
  const int s = (64 * 1024) / int4_stage_bytes(NT, BR);
  return s < 3 ? 3 : (s > 6 ? 6 : s);
}
constexpr int int4_tm(int NT) { return NT <= 2 ? 2 : 1; }

template <int NT, int WR>
constexpr size_t int4_smem_bytes(int epi_smem) {
  constexpr int TM = int4_tm(NT), BR = 16 * TM * WR, MP = 8 * NT;
  return 1024 /*alignment slack*/ + size_t(int4_stages(NT, BR)) * int4_stage_bytes(NT, BR) +
         size_t(BR) * (MP + 4) * 4 /*partials*/ + 64 * 4 /*rinv*/ + 8 * 8 /*barriers*/ + size_t(epi_smem);
}

#if defined(__CUDACC__)
/// 1-D TMA bulk copy global -> shared (bytes % 16 == 0, both 16-byte aligned), completing on `bar`.
__device__ __forceinline__ void int4_bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                               uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

/// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

/// a + c on bf16x2 (as a * 1 + c; exact here: small integers).
__device__ __forceinline__ uint32_t bf16x2_add(uint32_t a, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3F803F80u), "r"(c));
  return d;
}

/// The mma.sync A fragment (four bf16x2 registers, values q - z) of one word of the
/// layout: pair i = nibble slots (i, i + 4); pairs 0 and 2 are row g (zero pair nz_lo),
/// 1 and 3 row g + 8 (nz_hi). 0x4300 | q is bf16 128 + q; adding -(128 + z) gives q - z.
__device__ __forceinline__ void int4_dequant(uint32_t w, uint32_t nz_lo, uint32_t nz_hi, uint32_t (&a)[4]) {
  constexpr uint32_t kMask = 0x000F000Fu, kMagic = 0x43004300u;
  a[0] = bf16x2_add(lop3_and_or(w, kMask, kMagic), nz_lo);
  a[1] = bf16x2_add(lop3_and_or(w >> 4, kMask, kMagic), nz_hi);
  a[2] = bf16x2_add(lop3_and_or(w >> 8, kMask, kMagic), nz_lo);
  a[3] = bf16x2_add(lop3_and_or(w >> 12, kMask, kMagic), nz_hi);
}

__device__ __forceinline__ float meta_scale(uint32_t m) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(m & 0xFFFFu)));
}
__device__ __forceinline__ uint32_t meta_negz(uint32_t m) { return __byte_perm(m, 0, 0x3232); }

/// One work item (row block, stage) of a CTA: what its copies cover.
struct Int4Item {
  int rb;   ///< row block
  int kt0;  ///< first 64-k tile
  int nkt;  ///< 64-k tiles (1 or 2)
  int nrt;  ///< valid 16-row tiles of the row block
  int ga;   ///< first group touched
  int ng;   ///< groups touched (1..4)
};

template <int BR>
__device__ __forceinline__ Int4Item int4_item(int i, int nst, int kt_b, int kt_e, int N, int G) {
  Int4Item t;
  t.rb = static_cast<int>(blockIdx.x) + (i / nst) * static_cast<int>(gridDim.x);
  const int st = i % nst;
  t.kt0 = kt_b + 2 * st;
  t.nkt = min(2, kt_e - t.kt0);
  t.nrt = min(BR / 16, N / 16 - t.rb * (BR / 16));
  const int k0 = t.kt0 * 64;
  t.ga = k0 / G;
  t.ng = (k0 + t.nkt * 64 - 1) / G - t.ga + 1;
  return t;
}
#endif

#if defined(__CUDACC__)
// ---------------------------------------------------------------------------
// The kernel. Grid (grid_x, S), cluster (1, S, 1), WR warps; warp w owns row tiles
// w*TM .. w*TM+TM-1 of each row block.
// ---------------------------------------------------------------------------
template <int NT, int WR, class Epi>
__global__ void __launch_bounds__(WR * 32)
    gemm_int4_skinny_kernel(const Int4View w, const __grid_constant__ CUtensorMap xmap, const GemmArgs args,
                            const typename Epi::Params ep) {
  constexpr int TM = int4_tm(NT);
  constexpr int MP = 8 * NT;
  constexpr int BR = 16 * TM * WR;
  constexpr int NTH = 32 * WR;
  constexpr int ST = int4_stages(NT, BR);
  constexpr int STAGE = int4_stage_bytes(NT, BR);
  constexpr int XB = MP * 128;            // one activation box (64 k)
  constexpr int W_OFF = 2 * XB;           // weight words
  constexpr int M_OFF = W_OFF + 64 * BR;  // meta words
  constexpr int PSTRIDE = MP + 4;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  float* partial = reinterpret_cast<float*>(smem + ST * STAGE);  // [BR][PSTRIDE]
  float* rinv = partial + BR * PSTRIDE;                          // [64]
  uint64_t* bars = reinterpret_cast<uint64_t*>(rinv + 64);       // [ST]
  void* esm = reinterpret_cast<void*>(bars + 8);

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int S = gridDim.y;
  const int rank = blockIdx.y;
  const int N = args.N, G = w.G;

  // This CTA's K slice: 64-k tiles [kt_b, kt_e).
  const int K64 = args.K >> 6;
  const int kt_b = rank * K64 / S;
  const int kt_e = (rank + 1) * K64 / S;
  const int ke = kt_e * 64;
  const int nst = (kt_e - kt_b + 1) >> 1;
  const int n_rb = (N + BR - 1) / BR;
  const int my_rb = blockIdx.x < n_rb ? (n_rb - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1 : 0;
  const int items = my_rb * nst;
  const int NRT = N >> 4;

  if (tid == 0) {
    prefetch_tensormap(&xmap);
    for (int s = 0; s < ST; ++s) mbar_init(&bars[s], 1);
    fence_mbar_init();
  }
  Epi::cta_init(ep, esm, tid, NTH);
  __syncthreads();
  if (args.pdl_early || my_rb == 0) griddep_launch_dependents();

  const uint64_t wpolicy = l2_policy_evict_first();
  // The weight part of item i into stage s; arms the barrier for the item's X boxes too.
  auto issue_weights = [&](int i, int s) {
    const Int4Item t = int4_item<BR>(i, nst, kt_b, kt_e, N, G);
    uint8_t* sb = smem + s * STAGE;
    const uint32_t wbytes = t.nrt * 512, mbytes = t.nrt * 64;
    mbar_arrive_expect_tx(&bars[s], t.nkt * (wbytes + XB) + t.ng * mbytes);
    for (int j = 0; j < t.nkt; ++j)
      int4_bulk_load(sb + W_OFF + j * (BR * 32), w.qw + (static_cast<size_t>(t.kt0 + j) * NRT + t.rb * (BR / 16)) * 128,
                     wbytes, &bars[s], wpolicy);
    for (int gi = 0; gi < t.ng; ++gi)
      int4_bulk_load(sb + M_OFF + gi * (BR * 4), w.meta + static_cast<size_t>(t.ga + gi) * N + t.rb * BR, mbytes,
                     &bars[s], wpolicy);
  };
  auto issue_x = [&](int i, int s, int x_row0) {
    const Int4Item t = int4_item<BR>(i, nst, kt_b, kt_e, N, G);
    for (int j = 0; j < t.nkt; ++j) tma_load_2d(smem + s * STAGE + j * XB, &xmap, (t.kt0 + j) * 64, x_row0, &bars[s]);
  };

  // Weights do not depend on the previous kernel: request the first stages now.
  const int pre = items < ST ? items : ST;
  if (tid == 0)
    for (int i = 0; i < pre; ++i) issue_weights(i, i);
  griddep_wait();

  const int x_row0 = args.x_row0_ptr ? *args.x_row0_ptr : 0;
  int m_active = args.m_active_max;
  if (args.m_active_ptr) m_active = min(m_active, *args.m_active_ptr);
  if (tid == 0)
    for (int i = 0; i < pre; ++i) issue_x(i, i, x_row0);
  gemm_rms_prologue<Epi>(args, rinv, x_row0, m_active, rank, S, warp, lane, WR);

  float acc[TM][NT][4], gacc[TM][NT][4];
#pragma unroll
  for (int a = 0; a < TM; ++a)
#pragma unroll
    for (int b = 0; b < NT; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = gacc[a][b][c] = 0.f;

  cg::cluster_group cluster = cg::this_cluster();
  const float* rpart[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) rpart[q] = (S > 1 && q < S) ? cluster.map_shared_rank(partial, q) : partial;

  const int g4 = lane >> 2;
  float s_lo[TM], s_hi[TM];
  uint32_t nz_lo[TM], nz_hi[TM];
  int it = 0;
  for (int rbi = 0; rbi < my_rb; ++rbi) {
    const int rb = blockIdx.x + rbi * gridDim.x;
    for (int st = 0; st < nst; ++st, ++it) {
      const int s = it % ST;
      mbar_wait(&bars[s], static_cast<uint32_t>((it / ST) & 1));
      const int kt0 = kt_b + 2 * st;
      const int nkt = min(2, kt_e - kt0);
      const int k0 = kt0 * 64;
      const int ga = k0 / G;
      const uint32_t sbase = smem_u32(smem + s * STAGE);
      const uint32_t* smeta = reinterpret_cast<const uint32_t*>(smem + s * STAGE + M_OFF);
      auto load_meta = [&](int gi) {
#pragma unroll
        for (int tm = 0; tm < TM; ++tm) {
          const int row = (warp * TM + tm) * 16 + g4;
          const uint32_t mlo = smeta[gi * BR + row], mhi = smeta[gi * BR + row + 8];
          s_lo[tm] = meta_scale(mlo);
          s_hi[tm] = meta_scale(mhi);
          nz_lo[tm] = meta_negz(mlo);
          nz_hi[tm] = meta_negz(mhi);
        }
      };
      load_meta(0);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (j < nkt) {
          uint4 wv[TM];
#pragma unroll
          for (int tm = 0; tm < TM; ++tm)
            wv[tm] = lds128(sbase + W_OFF + j * (BR * 32) + ((warp * TM + tm) * 32 + lane) * 16);
          const uint32_t xbase = sbase + j * XB;
#pragma unroll
          for (int kk = 0; kk < 4; kk += 2) {
            uint32_t bfrag[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              ldmatrix_x4(bfrag[nt], xbase + swz128(nt * 8 + (lane & 7), kk * 2 + (lane >> 3)));
#pragma unroll
            for (int sub = 0; sub < 2; ++sub) {
              const int ks = kk + sub;
#pragma unroll
              for (int tm = 0; tm < TM; ++tm) {
                const uint32_t word = ks == 0 ? wv[tm].x : ks == 1 ? wv[tm].y : ks == 2 ? wv[tm].z : wv[tm].w;
                uint32_t a[4];
                int4_dequant(word, nz_lo[tm], nz_hi[tm], a);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                  mma_bf16_16816(gacc[tm][nt], a, bfrag[nt][2 * sub], bfrag[nt][2 * sub + 1]);
              }
            }
            // Group (or slice) end after these 32 k: scale the group sums into acc.
            const int kend = k0 + j * 64 + (kk + 2) * 16;
            if (kend % G == 0 || kend == ke) {
#pragma unroll
              for (int tm = 0; tm < TM; ++tm)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                  acc[tm][nt][0] = fmaf(s_lo[tm], gacc[tm][nt][0], acc[tm][nt][0]);
                  acc[tm][nt][1] = fmaf(s_lo[tm], gacc[tm][nt][1], acc[tm][nt][1]);
                  acc[tm][nt][2] = fmaf(s_hi[tm], gacc[tm][nt][2], acc[tm][nt][2]);
                  acc[tm][nt][3] = fmaf(s_hi[tm], gacc[tm][nt][3], acc[tm][nt][3]);
                  gacc[tm][nt][0] = gacc[tm][nt][1] = gacc[tm][nt][2] = gacc[tm][nt][3] = 0.f;
                }
              if (kend < k0 + nkt * 64) load_meta(kend / G - ga);
            }
          }
        }
      }
      if constexpr (WR == 1) {
        __syncwarp();
      } else {
        __syncthreads();  // every warp is done with stage s
      }
      if (tid == 0 && it + ST < items) {
        issue_weights(it + ST, s);
        issue_x(it + ST, s, x_row0);
      }
    }
    if (!args.pdl_early && rbi == my_rb - 1) griddep_launch_dependents();
    gemm_reduce_epilogue<NT, TM, WR, Epi>(acc, partial, rpart, rinv, cluster, rb, S, rank, tid, warp, lane, args, ep,
                                          esm, m_active);
  }
  if (S > 1)
    cluster.sync();
  else
    __syncthreads();  // keep smem alive for remote readers
  Epi::cta_finish(ep, esm, tid, NTH, m_active);
}
#endif

// ---------------------------------------------------------------------------
// Planning and launching
// ---------------------------------------------------------------------------
template <int NT, int WR, class Epi>
struct Int4Inst {
  static size_t smem() { return int4_smem_bytes<NT, WR>(Epi::kSmemBytes); }
  static void prepare() {
    static std::atomic<uint64_t> done{0};  // one bit per device ordinal
    const uint64_t bit = current_device_bit();
    if (!bit || !(done.load(std::memory_order_acquire) & bit)) {
      SS_CUDA_CHECK(cudaFuncSetAttribute(&gemm_int4_skinny_kernel<NT, WR, Epi>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem())));
      done.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
};

template <class F>
void int4_dispatch(int NT, int WR, F&& f) {
  // clang-format off
#define SS_INT4_CASE(nt, wr) \
  if (NT == nt && WR == wr) return f.template operator()<nt, wr>();
  SS_INT4_CASE(1, 2)
  SS_INT4_CASE(1, 4)
  SS_INT4_CASE(1, 8)
  SS_INT4_CASE(2, 2)
  SS_INT4_CASE(2, 4)
  SS_INT4_CASE(2, 8)
  SS_INT4_CASE(4, 2)
  SS_INT4_CASE(4, 4)
  SS_INT4_CASE(4, 8)
  SS_INT4_CASE(8, 2)
  SS_INT4_CASE(8, 4)
  SS_INT4_CASE(8, 8)
#undef SS_INT4_CASE
  // clang-format on
  throw InvalidArgument("int4 gemm: no kernel for NT=" + std::to_string(NT) + " WR=" + std::to_string(WR));
}

template <class Epi>
Int4GemmConfig plan_gemm_int4(int N, int K, int G, int NT, int num_sms, const Int4PlanHint& hint) {
  check_int4_shape(N, K, G);
  if (NT != 1 && NT != 2 && NT != 4 && NT != 8)
    throw InvalidArgument("int4 gemm: NT must be 1, 2, 4 or 8 (got " + std::to_string(NT) + ")");
  if (hint.warps != 0 && hint.warps != 2 && hint.warps != 4 && hint.warps != 8)
    throw InvalidArgument("int4 gemm: warps must be 2, 4 or 8 (got " + std::to_string(hint.warps) + ")");
  Int4GemmConfig c;
  c.NT = NT;
  c.TM = int4_tm(NT);
  c.S = hint.slices > 0 ? std::clamp(std::min(hint.slices, K / 128), 1, 8) : gemm_int4_slices(N, K);
  // Row-block size: as the bf16 planner, rounds of persistent CTAs (occupancy API) times
  // the per-row-block cost in 128-byte units per 64 k: BR/4 weight rows (int4), 8*NT
  // activation rows (from L2), plus the fixed cost of a row block (gemm_row_block_cost).
  long best = -1;
  for (int wr : {8, 4, 2}) {
    if (hint.warps && hint.warps != wr) continue;
    const int br = 16 * c.TM * wr;
    const int n_rb = (N + br - 1) / br;
    int clusters = 0, stages = 0;
    size_t smem = 0;
    int4_dispatch(NT, wr, [&]<int nt, int w>() {
      using I = Int4Inst<nt, w, Epi>;
      I::prepare();
      smem = I::smem();
      stages = int4_stages(nt, 16 * int4_tm(nt) * w);
      clusters = gemm_resident_clusters(&gemm_int4_skinny_kernel<nt, w, Epi>, n_rb, c.S, 32 * w, smem);
    });
    if (clusters <= 0) clusters = std::max(1, num_sms / c.S);
    const int rounds = (n_rb + clusters - 1) / clusters;
    const long cost = static_cast<long>(rounds) * (br / 4 + 8 * NT + gemm_row_block_cost(c.S));
    if (best < 0 || cost < best) {
      best = cost;
      c.WR = wr;
      c.BR = br;
      c.stages = stages;
      c.smem = smem;
      c.grid_x = (n_rb + rounds - 1) / rounds;
    }
  }
  return c;
}

template <class Epi>
void launch_gemm_int4(const Int4GemmConfig& cfg, const Int4View& w, const CUtensorMap& xmap, const GemmArgs& args_in,
                      const typename Epi::Params& ep, bool pdl, cudaStream_t stream) {
  if (w.N != args_in.N || w.K != args_in.K)
    throw InvalidArgument("int4 gemm: args N x K (" + std::to_string(args_in.N) + " x " + std::to_string(args_in.K) +
                          ") is not the matrix's (" + std::to_string(w.N) + " x " + std::to_string(w.K) + ")");
  if (args_in.m_active_max > 8 * cfg.NT)
    throw InvalidArgument("int4 gemm: " + std::to_string(args_in.m_active_max) + " tokens exceed the plan's " +
                          std::to_string(8 * cfg.NT));
  GemmArgs args = args_in;
  args.stages = cfg.stages;
  args.pdl_early = gemm_pdl_early();
  SlicedGemmLaunch launch(cfg.grid_x, cfg.S, 32 * cfg.WR, cfg.smem, pdl, stream);
  cudaLaunchConfig_t& lc = launch.config;
  int4_dispatch(cfg.NT, cfg.WR, [&]<int nt, int wr>() {
    Int4Inst<nt, wr, Epi>::prepare();
    SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, &gemm_int4_skinny_kernel<nt, wr, Epi>, w, xmap, args, ep));
  });
}

#define SS_INSTANTIATE_GEMM_INT4(EPI)                                                                              \
  template Int4GemmConfig plan_gemm_int4<EPI>(int, int, int, int, int, const Int4PlanHint&);                       \
  template void launch_gemm_int4<EPI>(const Int4GemmConfig&, const Int4View&, const CUtensorMap&, const GemmArgs&, \
                                      const EPI::Params&, bool, cudaStream_t);

}  // namespace swiftspec::cuda
