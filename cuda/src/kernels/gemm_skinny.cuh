// Kernel template of the skinny GEMM (see gemm_skinny.h for the design).
// Included by one .cu file per epilogue, which instantiates plan_gemm<Epi> and
// launch_gemm<Epi>.
#pragma once
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "common.h"
#include "kernels/gemm_skinny.h"

namespace swiftspec::cuda {

namespace cg = cooperative_groups;

/// Pipeline depth for a tile shape: about 24 KiB of stages, 3..8 deep (small
/// CTAs, so that many are resident: the bytes in flight per SM come from the
/// number of CTAs, and more resident clusters mean fewer persistent rounds).
__host__ __device__ constexpr int gemm_stages(int NT, int TM, int WR) {
  const int stage = (16 * TM * WR + 8 * NT) * 128;
  const int s = (24 * 1024) / stage;
  return s < 3 ? 3 : (s > 8 ? 8 : s);
}

template <int NT, int TM, int WR>
constexpr size_t gemm_smem_bytes(int epi_smem) {
  constexpr int MP = 8 * NT, BR = 16 * TM * WR;
  constexpr int ST = gemm_stages(NT, TM, WR);
  return 1024 /*alignment slack*/ + size_t(ST) * (BR + MP) * 128 /*stages*/ + size_t(BR) * (MP + 4) * 4 /*partials*/ +
         64 * 4 /*rinv*/ + 9 * 8 /*barriers*/ + size_t(epi_smem);
}

/// 1/rms of the tokens m = rank (mod S) into rinv[m] (norm-fused GEMMs); the
/// other CTAs of the cluster read them through distributed shared memory.
template <class Epi>
__device__ __forceinline__ void gemm_rms_prologue(const GemmArgs& args, float* rinv, int x_row0, int m_active, int rank,
                                                  int S, int warp, int lane, int nwarps) {
  if constexpr (Epi::kNeedsRms) {
    for (int m = rank + warp * S; m < m_active; m += nwarps * S) {
      const float* p = args.ssq + static_cast<size_t>(x_row0 + m) * args.ssq_stride;
      float s = 0.f;
      for (int i = lane; i < args.ssq_stride; i += 32) s += p[i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) rinv[m] = 1.0f / sqrtf(s / static_cast<float>(args.hidden) + args.eps);
    }
  }
}

/// End of one row block `rb`: the CTA's fp32 partials (acc, zeroed here) go to
/// shared memory; after a cluster barrier each CTA sums, for the 16-row tiles
/// tl = rank (mod S) of the row block, the S partials in slice order 0..S-1
/// (the batch-invariant order; all remote loads issued before the adds) and
/// hands them to the epilogue. acc layout: mma.sync m16n8 fragments, warp w
/// owns rows (w*TM + tm)*16 .. +15 of the row block.
template <int NT, int TM, int WR, class Epi>
__device__ __forceinline__ void gemm_reduce_epilogue(float (&acc)[TM][NT][4], float* partial,
                                                     const float* const (&rpart)[8], const float* rinv,
                                                     cg::cluster_group& cluster, int rb, int S, int rank, int tid,
                                                     int warp, int lane, const GemmArgs& args,
                                                     const typename Epi::Params& ep, void* esm, int m_active) {
  constexpr int MP = 8 * NT;
  constexpr int BR = 16 * TM * WR;
  constexpr int NTH = 32 * WR;
  constexpr int PSTRIDE = MP + 4;
  if (S > 1)
    cluster.sync();
  else
    __syncthreads();  // previous partials fully read
#pragma unroll
  for (int tm = 0; tm < TM; ++tm) {
    const int row = (warp * TM + tm) * 16 + (lane >> 2);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int col = nt * 8 + (lane & 3) * 2;
      partial[row * PSTRIDE + col] = acc[tm][nt][0];
      partial[row * PSTRIDE + col + 1] = acc[tm][nt][1];
      partial[(row + 8) * PSTRIDE + col] = acc[tm][nt][2];
      partial[(row + 8) * PSTRIDE + col + 1] = acc[tm][nt][3];
      acc[tm][nt][0] = acc[tm][nt][1] = acc[tm][nt][2] = acc[tm][nt][3] = 0.f;
    }
  }
  if (S > 1)
    cluster.sync();
  else
    __syncthreads();

  // This CTA owns tiles tl = rank (mod S) of the row block.
  constexpr int TILES = BR / 16;
  const int my_tiles = rank < TILES ? (TILES - 1 - rank) / S + 1 : 0;
  const int total = my_tiles * 8 * MP;  // multiple of 64: whole warps
  for (int idx = tid; idx < total; idx += NTH) {
    const int ti = idx / (8 * MP);
    const int rem = idx - ti * 8 * MP;
    const int m = rem >> 3;
    const int r = rem & 7;
    const int tl = rank + ti * S;
    const int tile = rb * TILES + tl;
    const int prow = tl * 16 + r;
    float vlo[8], vhi[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      if (q < S) {
        vlo[q] = rpart[q][prow * PSTRIDE + m];
        vhi[q] = rpart[q][(prow + 8) * PSTRIDE + m];
      }
    }
    float lo = vlo[0], hi = vhi[0];
#pragma unroll
    for (int q = 1; q < 8; ++q) {
      if (q < S) {
        lo += vlo[q];
        hi += vhi[q];
      }
    }
    float ri = 1.f;
    if constexpr (Epi::kNeedsRms) {
      if (m < m_active) {
        const float* rp = S > 1 ? cluster.map_shared_rank(rinv, m % S) : rinv;
        ri = rp[m];
      }
    }
    const bool valid = (tile * 16 < args.N);
    Epi::apply(ep, esm, valid, tile, r, m, lo, hi, ri, m_active);
  }
}

// ---------------------------------------------------------------------------
// Engine Mma: ldmatrix + mma.sync m16n8k16, activations streamed per stage.
// ---------------------------------------------------------------------------
template <int NT, int TM, int WR, class Epi>
__global__ void __launch_bounds__(WR * 32)
    gemm_skinny_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                       const GemmArgs args, const typename Epi::Params ep) {
  constexpr int MP = 8 * NT;
  constexpr int BR = 16 * TM * WR;
  constexpr int NTH = 32 * WR;
  constexpr int ST = gemm_stages(NT, TM, WR);
  constexpr int W_BYTES = BR * 128;
  constexpr int X_BYTES = MP * 128;
  constexpr int STAGE_BYTES = W_BYTES + X_BYTES;
  constexpr int PSTRIDE = MP + 4;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  float* partial = reinterpret_cast<float*>(smem + ST * STAGE_BYTES);  // [BR][PSTRIDE]
  float* rinv = partial + BR * PSTRIDE;                                // [64]
  uint64_t* bars = reinterpret_cast<uint64_t*>(rinv + 64);             // [ST]
  void* esm = reinterpret_cast<void*>(bars + 9);

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int S = gridDim.y;
  const int rank = blockIdx.y;

  // This CTA's K slice: k16 blocks [rank*K16/S, (rank+1)*K16/S).
  const int K16 = args.K >> 4;
  const int kb = (rank * K16 / S) * 16;
  const int ke = ((rank + 1) * K16 / S) * 16;
  const int nst = (ke - kb + 63) >> 6;
  const int n_rb = (args.N + BR - 1) / BR;
  const int my_rb = blockIdx.x < n_rb ? (n_rb - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1 : 0;
  const int items = my_rb * nst;

  if (tid == 0) {
    prefetch_tensormap(&wmap);
    prefetch_tensormap(&xmap);
    for (int s = 0; s < ST; ++s) mbar_init(&bars[s], 1);
    fence_mbar_init();
  }
  Epi::cta_init(ep, esm, tid, NTH);
  __syncthreads();
  // Programmatic dependent launch: by default the next kernel is released
  // only when this CTA has streamed its last row block. Released at entry
  // (args.pdl_early), its CTAs wait on SMs for the whole main loop; with one
  // wave of long-running CTAs per GEMM that made the 8B decode step slower
  // with PDL than without (benchmarks/README.md, "wgmma GEMM engine").
  if (args.pdl_early || my_rb == 0) griddep_launch_dependents();

  // Weights do not depend on the previous kernel: request the first stages now.
  const uint64_t wpolicy = l2_policy_evict_first();
  if (tid == 0) {
    const int pre = items < ST ? items : ST;
    for (int i = 0; i < pre; ++i) {
      const int rb = blockIdx.x + (i / nst) * gridDim.x;
      const int st = i % nst;
      mbar_arrive_expect_tx(&bars[i], STAGE_BYTES);
      tma_load_2d_hint(smem + i * STAGE_BYTES, &wmap, kb + st * 64, rb * BR, &bars[i], wpolicy);
    }
  }
  griddep_wait();

  const int x_row0 = args.x_row0_ptr ? *args.x_row0_ptr : 0;
  int m_active = args.m_active_max;
  if (args.m_active_ptr) m_active = min(m_active, *args.m_active_ptr);

  if (tid == 0) {
    const int pre = items < ST ? items : ST;
    for (int i = 0; i < pre; ++i) {
      const int st = i % nst;
      tma_load_2d(smem + i * STAGE_BYTES + W_BYTES, &xmap, kb + st * 64, x_row0, &bars[i]);
    }
  }
  gemm_rms_prologue<Epi>(args, rinv, x_row0, m_active, rank, S, warp, lane, WR);

  float acc[TM][NT][4];
#pragma unroll
  for (int a = 0; a < TM; ++a)
#pragma unroll
    for (int b = 0; b < NT; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;

  cg::cluster_group cluster = cg::this_cluster();
  const float* rpart[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) rpart[q] = (S > 1 && q < S) ? cluster.map_shared_rank(partial, q) : partial;
  int it = 0;
  for (int rbi = 0; rbi < my_rb; ++rbi) {
    const int rb = blockIdx.x + rbi * gridDim.x;
    for (int st = 0; st < nst; ++st, ++it) {
      const int s = it % ST;
      mbar_wait(&bars[s], static_cast<uint32_t>((it / ST) & 1));
      const int k0 = kb + st * 64;
      const int nk = min(4, (ke - k0) >> 4);
      const uint32_t wbase = smem_u32(smem + s * STAGE_BYTES);
      const uint32_t xbase = wbase + W_BYTES;
#pragma unroll
      for (int kk = 0; kk < 4; kk += 2) {
        if (kk < nk) {
          uint32_t bfrag[NT][4];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            ldmatrix_x4(bfrag[nt], xbase + swz128(nt * 8 + (lane & 7), kk * 2 + (lane >> 3)));
#pragma unroll
          for (int tm = 0; tm < TM; ++tm) {
            const int row = (warp * TM + tm) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            uint32_t a0[4];
            ldmatrix_x4(a0, wbase + swz128(row, kk * 2 + (lane >> 4)));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(acc[tm][nt], a0, bfrag[nt][0], bfrag[nt][1]);
            if (kk + 1 < nk) {
              uint32_t a1[4];
              ldmatrix_x4(a1, wbase + swz128(row, (kk + 1) * 2 + (lane >> 4)));
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(acc[tm][nt], a1, bfrag[nt][2], bfrag[nt][3]);
            }
          }
        }
      }
      if constexpr (WR == 1) {
        __syncwarp();
      } else {
        __syncthreads();
      }
      if (tid == 0 && it + ST < items) {
        const int nx = it + ST;
        const int nrb = blockIdx.x + (nx / nst) * gridDim.x;
        const int nst_i = nx % nst;
        mbar_arrive_expect_tx(&bars[s], STAGE_BYTES);
        tma_load_2d_hint(smem + s * STAGE_BYTES, &wmap, kb + nst_i * 64, nrb * BR, &bars[s], wpolicy);
        tma_load_2d(smem + s * STAGE_BYTES + W_BYTES, &xmap, kb + nst_i * 64, x_row0, &bars[s]);
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

// ---------------------------------------------------------------------------
// Engine Wgmma: WG warpgroups per CTA, each owns 64 weight rows of the row
// block (BR = 64*WG) and issues wgmma m64n(8*NT)k16 with both operands in
// shared memory. Pipeline depth args.stages (runtime); one wgmma group stays
// in flight, and a stage is refilled as soon as its group has retired. With args.xres the
// CTA's activation slice [Mpad x (ke-kb)] is loaded once into shared memory
// (nst tiles of [Mpad x 64]) and the stages carry weights only.
// ---------------------------------------------------------------------------
/// Shared memory of the wgmma engine (bytes), for a slice of `nst` 64-column
/// tiles.
/// With `palias` the fp32 partials of the row block reuse the stage buffers
/// (possible when every CTA has one row block: no stage is refilled after
/// its main loop); the freed bytes buy pipeline depth at the same occupancy.
__host__ __device__ constexpr size_t gemm_wgmma_stage_area(int NT, int WG, int stages, int xres, int palias) {
  const size_t st = size_t(stages) * (64 * WG + (xres ? 0 : 8 * NT)) * 128;
  const size_t part = size_t(64 * WG) * (8 * NT + 4) * 4;
  return palias ? (st > part ? st : part) : st + part;
}
__host__ __device__ constexpr size_t gemm_wgmma_smem_bytes(int NT, int WG, int stages, int xres, int nst, int epi_smem,
                                                           int palias = 0) {
  return 1024 + gemm_wgmma_stage_area(NT, WG, stages, xres, palias) + (xres ? size_t(nst) * 8 * NT * 128 : 0) + 64 * 4 +
         10 * 8 + size_t(epi_smem);
}

/// Resident two-warpgroup CTAs per SM that the compiler must allow (a register
/// bound), per epilogue; specialized where an epilogue needs it. The residual
/// epilogue took 97 registers: two CTAs per SM left the 8B down matrix's 8-CTA
/// clusters two rounds at M = 64, measured slower under ncu than three per SM.
/// Not for all: the bound's spills made SwiGLU and the LM head slower
/// (benchmarks/README.md, "GEMM K slices and aliased partials").
template <class Epi>
struct GemmWgmmaMinBlocks {
  static constexpr int value = 1;
};

template <int NT, int WG, class Epi>
__global__ void __launch_bounds__(WG * 128, WG == 2 ? GemmWgmmaMinBlocks<Epi>::value : 1)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                      const GemmArgs args, const typename Epi::Params ep) {
  constexpr int MP = 8 * NT;
  constexpr int WR = 4 * WG;
  constexpr int BR = 64 * WG;
  constexpr int NTH = 128 * WG;
  constexpr int W_BYTES = BR * 128;
  constexpr int X_BYTES = MP * 128;
  constexpr int PSTRIDE = MP + 4;
  const int ST = args.stages;
  const bool xres = args.xres != 0;
  const bool split_n = NT > 1 && args.split_n != 0;
  const int STAGE_BYTES = W_BYTES + (xres ? 0 : X_BYTES);

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int wg = warp >> 2;
  const int S = gridDim.y;
  const int rank = blockIdx.y;
  const int K16 = args.K >> 4;
  const int kb = (rank * K16 / S) * 16;
  const int ke = ((rank + 1) * K16 / S) * 16;
  const int nst = (ke - kb + 63) >> 6;
  const int nst_max = ((K16 + S - 1) / S * 16 + 63) >> 6;  // layout: same for all ranks
  const int n_rb = (args.N + BR - 1) / BR;
  const int my_rb = blockIdx.x < n_rb ? (n_rb - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1 : 0;
  const int items = my_rb * nst;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  // Layout: stages (the partials [BR][PSTRIDE] after them, or over them with
  // args.palias), the resident activation slice [nst_max][MP x 64], rinv, barriers.
  const bool palias = args.palias != 0;
  const size_t part_bytes = size_t(BR) * PSTRIDE * 4;
  const size_t stage_area = palias ? max(size_t(ST) * STAGE_BYTES, part_bytes) : size_t(ST) * STAGE_BYTES + part_bytes;
  float* partial = reinterpret_cast<float*>(smem + (palias ? 0 : size_t(ST) * STAGE_BYTES));
  uint8_t* xbuf = smem + stage_area;                                              // [nst_max][MP x 64]
  float* rinv = reinterpret_cast<float*>(xbuf + (xres ? nst_max * X_BYTES : 0));  // [64]
  uint64_t* bars = reinterpret_cast<uint64_t*>(rinv + 64);                        // [ST], [8] = X
  void* esm = reinterpret_cast<void*>(bars + 10);

  if (tid == 0) {
    prefetch_tensormap(&wmap);
    prefetch_tensormap(&xmap);
    for (int s = 0; s < ST; ++s) mbar_init(&bars[s], 1);
    mbar_init(&bars[8], 1);
    fence_mbar_init();
  }
  Epi::cta_init(ep, esm, tid, NTH);
  __syncthreads();
  // Programmatic dependent launch: by default the next kernel is released
  // only when this CTA has streamed its last row block. Released at entry
  // (args.pdl_early), its CTAs wait on SMs for the whole main loop; with one
  // wave of long-running CTAs per GEMM that made the 8B decode step slower
  // with PDL than without (benchmarks/README.md, "wgmma GEMM engine").
  if (args.pdl_early || my_rb == 0) griddep_launch_dependents();

  const uint64_t wpolicy = l2_policy_evict_first();
  const int pre = items < ST ? items : ST;
  if (tid == 0) {
    for (int i = 0; i < pre; ++i) {
      const int rb = blockIdx.x + (i / nst) * gridDim.x;
      mbar_arrive_expect_tx(&bars[i], STAGE_BYTES);
      tma_load_2d_hint(smem + i * STAGE_BYTES, &wmap, kb + (i % nst) * 64, rb * BR, &bars[i], wpolicy);
    }
  }
  griddep_wait();

  const int x_row0 = args.x_row0_ptr ? *args.x_row0_ptr : 0;
  int m_active = args.m_active_max;
  if (args.m_active_ptr) m_active = min(m_active, *args.m_active_ptr);

  if (tid == 0 && items > 0) {
    if (xres) {
      mbar_arrive_expect_tx(&bars[8], nst * X_BYTES);
      for (int st = 0; st < nst; ++st) tma_load_2d(xbuf + st * X_BYTES, &xmap, kb + st * 64, x_row0, &bars[8]);
    } else {
      for (int i = 0; i < pre; ++i)
        tma_load_2d(smem + i * STAGE_BYTES + W_BYTES, &xmap, kb + (i % nst) * 64, x_row0, &bars[i]);
    }
  }
  gemm_rms_prologue<Epi>(args, rinv, x_row0, m_active, rank, S, warp, lane, WR);

  float acc[1][NT][4];
#pragma unroll
  for (int b = 0; b < NT; ++b)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[0][b][c] = 0.f;

  cg::cluster_group cluster = cg::this_cluster();
  const float* rpart[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) rpart[q] = (S > 1 && q < S) ? cluster.map_shared_rank(partial, q) : partial;
  if (xres && items > 0) mbar_wait(&bars[8], 0);
  int it = 0;
  for (int rbi = 0; rbi < my_rb; ++rbi) {
    const int rb = blockIdx.x + rbi * gridDim.x;
    for (int st = 0; st < nst; ++st, ++it) {
      const int s = it % ST;
      mbar_wait(&bars[s], static_cast<uint32_t>((it / ST) & 1));
      const int nk = min(4, (ke - kb - st * 64) >> 4);
      const uint32_t wbase = smem_u32(smem + s * STAGE_BYTES);
      const uint32_t abase = wbase + wg * (64 * 128);
      const uint32_t bbase = xres ? smem_u32(xbuf + st * X_BYTES) : wbase + W_BYTES;
      wgmma_fence();
      if (split_n) {
        // One n8 instruction per 8-token block (token block j's tile starts
        // 1024 bytes after block j-1's): the same instruction for every M.
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            if (kk < nk)
              wgmma_bf16<1>(reinterpret_cast<float (&)[1][4]>(acc[0][j]), wgmma_desc_sw128(abase + kk * 32),
                            wgmma_desc_sw128(bbase + j * 1024 + kk * 32));
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          if (kk < nk) wgmma_bf16<NT>(acc[0], wgmma_desc_sw128(abase + kk * 32), wgmma_desc_sw128(bbase + kk * 32));
      }
      wgmma_commit();
      // Keep this stage's group in flight; the previous item's group is done,
      // so its stage can be refilled now (the refill no longer waits for the
      // tensor cores to finish the stage just issued).
      wgmma_wait_1();
      __syncthreads();  // every warpgroup is done with the previous item's stage
      const int pv = it - 1;
      if (tid == 0 && pv >= 0 && pv + ST < items) {
        const int ps = pv % ST;
        const int nx = pv + ST;
        const int nrb = blockIdx.x + (nx / nst) * gridDim.x;
        const int nst_i = nx % nst;
        mbar_arrive_expect_tx(&bars[ps], STAGE_BYTES);
        tma_load_2d_hint(smem + ps * STAGE_BYTES, &wmap, kb + nst_i * 64, nrb * BR, &bars[ps], wpolicy);
        if (!xres) tma_load_2d(smem + ps * STAGE_BYTES + W_BYTES, &xmap, kb + nst_i * 64, x_row0, &bars[ps]);
      }
    }
    wgmma_wait_all();
    wgmma_fence_acc<NT>(acc[0]);
    // Aliased partials overwrite stage bytes last written by TMA and read by
    // wgmma (async proxy); the epilogue's first barrier orders all warpgroups.
    if (palias) fence_proxy_async_shared();
    if (!args.pdl_early && rbi == my_rb - 1) griddep_launch_dependents();
    gemm_reduce_epilogue<NT, 1, WR, Epi>(acc, partial, rpart, rinv, cluster, rb, S, rank, tid, warp, lane, args, ep,
                                         esm, m_active);
  }
  if (S > 1)
    cluster.sync();
  else
    __syncthreads();  // keep smem alive for remote readers
  Epi::cta_finish(ep, esm, tid, NTH, m_active);
}

// ---------------------------------------------------------------------------
// Host side: planning and launching
// ---------------------------------------------------------------------------
template <int NT, int TM, int WR, class Epi>
struct GemmInst {
  static constexpr int kStages = gemm_stages(NT, TM, WR);
  static size_t smem() { return gemm_smem_bytes<NT, TM, WR>(Epi::kSmemBytes); }
  static void* fn() { return reinterpret_cast<void*>(&gemm_skinny_kernel<NT, TM, WR, Epi>); }
  static void prepare() {
    static std::atomic<uint64_t> done{0};  // one bit per device ordinal (see current_device_bit)
    const uint64_t bit = current_device_bit();
    if (!bit || !(done.load(std::memory_order_acquire) & bit)) {
      SS_CUDA_CHECK(cudaFuncSetAttribute(&gemm_skinny_kernel<NT, TM, WR, Epi>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem())));
      done.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
};

/// Calls f.template operator()<NT, TM, WR>() for the runtime (NT, TM, WR).
template <class F>
void gemm_dispatch(int NT, int TM, int WR, F&& f) {
  // clang-format off
#define SS_GEMM_CASE(nt, tm, wr) \
  if (NT == nt && TM == tm && WR == wr) return f.template operator()<nt, tm, wr>();
  SS_GEMM_CASE(1, 1, 1)
  SS_GEMM_CASE(1, 1, 2)
  SS_GEMM_CASE(1, 1, 4)
  SS_GEMM_CASE(2, 1, 1)
  SS_GEMM_CASE(2, 1, 2)
  SS_GEMM_CASE(2, 1, 4)
  SS_GEMM_CASE(4, 2, 1)
  SS_GEMM_CASE(4, 2, 2)
  SS_GEMM_CASE(4, 2, 4)
  SS_GEMM_CASE(8, 2, 1)
  SS_GEMM_CASE(8, 2, 2)
  SS_GEMM_CASE(8, 2, 4)
#undef SS_GEMM_CASE
  // clang-format on
  throw InvalidArgument("gemm: no kernel for NT=" + std::to_string(NT) + " TM=" + std::to_string(TM) +
                        " WR=" + std::to_string(WR));
}

/// Dynamic shared memory opt-in limit of the current device (bytes), cached
/// per device ordinal (< 64; others are asked every time).
inline int gemm_smem_optin() {
  static std::atomic<int> cache[64] = {};
  int dev = 0, x = 0;
  SS_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && (x = cache[dev].load(std::memory_order_relaxed)) > 0) return x;
  SS_CUDA_CHECK(cudaDeviceGetAttribute(&x, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (dev < 64) cache[dev].store(x, std::memory_order_relaxed);
  return x;
}

template <int NT, int WG, class Epi>
struct GemmWgmmaInst {
  static void prepare() {
    // The opt-in maximum once per device: occupancy follows the launch's size.
    static std::atomic<uint64_t> done{0};
    const uint64_t bit = current_device_bit();
    if (!bit || !(done.load(std::memory_order_acquire) & bit)) {
      SS_CUDA_CHECK(cudaFuncSetAttribute(&gemm_wgmma_kernel<NT, WG, Epi>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         gemm_smem_optin()));
      done.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
};

/// Calls f.template operator()<NT, WG>() for the runtime (NT, WG) of the wgmma engine.
template <class F>
void gemm_wgmma_dispatch(int NT, int WG, F&& f) {
  // clang-format off
#define SS_GEMM_WCASE(nt, wg) \
  if (NT == nt && WG == wg) return f.template operator()<nt, wg>();
  SS_GEMM_WCASE(1, 1)
  SS_GEMM_WCASE(1, 2)
  SS_GEMM_WCASE(2, 1)
  SS_GEMM_WCASE(2, 2)
  SS_GEMM_WCASE(4, 1)
  SS_GEMM_WCASE(4, 2)
  SS_GEMM_WCASE(8, 1)
  SS_GEMM_WCASE(8, 2)
#undef SS_GEMM_WCASE
  // clang-format on
  throw InvalidArgument("gemm: no wgmma kernel for NT=" + std::to_string(NT) + " WG=" + std::to_string(WG));
}

/// The launch of a K-sliced GEMM (bf16 or int4): a grid of grid_x row-block columns by S slices,
/// the S CTAs of a column in one thread-block cluster (they sum their partials through distributed
/// shared memory), and with `pdl` a programmatic-dependent-launch edge to the previous kernel.
/// `config` points into the object itself: it is neither copied nor moved.
struct SlicedGemmLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attrs[2] = {};

  SlicedGemmLaunch(int grid_x, int S, int threads, size_t smem, bool pdl, cudaStream_t stream) {
    config.gridDim = dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(S), 1);
    config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    int n = 0;
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = 1;
    attrs[n].val.clusterDim.y = static_cast<unsigned>(S);
    attrs[n].val.clusterDim.z = 1;
    ++n;
    if (pdl) {
      attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    config.attrs = attrs;
    config.numAttrs = n;
  }
  SlicedGemmLaunch(const SlicedGemmLaunch&) = delete;
  SlicedGemmLaunch& operator=(const SlicedGemmLaunch&) = delete;
};

/// Resident clusters of S CTAs for a launch shape (occupancy API).
template <class Kern>
int gemm_resident_clusters(Kern* fn, int n_rb, int S, int threads, size_t smem) {
  SlicedGemmLaunch launch(n_rb, S, threads, smem, /*pdl=*/false, nullptr);
  int clusters = 0;
  SS_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, fn, &launch.config));
  return clusters;
}

/// Per-row-block fixed cost of the planner's model, in weight rows: with a
/// cluster (S > 1) the two cluster barriers per row block run in lockstep
/// across S CTAs (measured on the H200: many small row blocks lose); with
/// S = 1 only a CTA barrier and the epilogue remain.
inline int gemm_row_block_cost(int S) { return S > 1 ? 96 : 16; }

template <class Epi>
GemmConfig plan_gemm_wgmma(int N, int K, int NT, int num_sms, const GemmPlanHint& hint) {
  GemmConfig c;
  c.engine = GemmEngine::Wgmma;
  c.NT = NT;
  c.S = hint.slices > 0 ? std::min(hint.slices, K / 16) : gemm_slices(N, K);
  c.TM = 1;
  const int K16 = K / 16;
  const int nst_max = ((K16 + c.S - 1) / c.S * 16 + 63) / 64;
  const size_t optin = static_cast<size_t>(gemm_smem_optin());
  // Row-block cost model as for the mma engine; among equal costs the deeper
  // pipeline wins (4 stages: one is read by the tensor cores, one waits for
  // its wgmma group to retire, two are loading). Activations are streamed by
  // default: a sweep found the resident slice slower everywhere (its shared
  // memory costs resident CTAs, and CTAs — not bytes per CTA — set the
  // achieved bandwidth; benchmarks/README.md, "wgmma GEMM engine").
  // A launch of one round may alias the partials onto the stages (palias):
  // at M = 64 they are a quarter of a 3-stage CTA's shared memory, and the
  // bytes saved keep more CTAs resident, e.g. the 8B down matrix at M = 64
  // in one round of 128-row blocks (faster than two rounds of 64-row blocks).
  // Deeper pipelines than 4 stages were measured slower at M = 1 and no
  // faster at M = 64, so the depths stay 4 and 3 (benchmarks/README.md,
  // "GEMM K slices and aliased partials").
  long best_cost = -1;
  for (int wg : {2, 1}) {
    if (hint.wg && hint.wg != wg) continue;
    for (int stg : {4, 3}) {
      if (hint.stages && stg != 4) continue;  // one pass with the hinted depth
      const int br = 64 * wg;
      const int n_rb = (N + br - 1) / br;
      const int stages = hint.stages ? hint.stages : stg;
      for (int pa : {1, 0}) {
        // Cluster launches only: with S = 1 the resident CTAs it buys made
        // the planner pick 64-row blocks for the 8B gate/up at M = 64, slower
        // in the model than 128-row blocks under ncu (benchmarks/README.md,
        // "GEMM K slices and aliased partials").
        if (pa && (c.S == 1 || hint.palias == 0 || (hint.palias < 0 && !gemm_default_palias()))) continue;
        int xres = hint.xres >= 0 ? hint.xres : 0;
        size_t smem = gemm_wgmma_smem_bytes(NT, wg, stages, xres, nst_max, Epi::kSmemBytes, pa);
        if (smem > optin && xres) {
          xres = 0;
          smem = gemm_wgmma_smem_bytes(NT, wg, stages, xres, nst_max, Epi::kSmemBytes, pa);
        }
        if (smem > optin) continue;
        int clusters = 0;
        gemm_wgmma_dispatch(NT, wg, [&]<int nt, int w>() {
          GemmWgmmaInst<nt, w, Epi>::prepare();
          clusters = gemm_resident_clusters(&gemm_wgmma_kernel<nt, w, Epi>, n_rb, c.S, 128 * w, smem);
        });
        if (clusters <= 0) continue;
        const int rounds = (n_rb + clusters - 1) / clusters;
        if (pa && rounds > 1) continue;  // a second row block would refill stages under the partials
        const long cost = static_cast<long>(rounds) * (br + (xres ? 0 : 8 * NT) + gemm_row_block_cost(c.S));
        if (best_cost < 0 || cost < best_cost) {
          best_cost = cost;
          c.WR = 4 * wg;
          c.BR = br;
          c.stages = stages;
          c.xres = xres;
          c.palias = pa;
          c.split_n = hint.split_n >= 0 ? hint.split_n : gemm_default_split_n();
          c.smem = smem;
          c.grid_x = (n_rb + rounds - 1) / rounds;
        }
      }
    }
  }
  if (best_cost < 0)
    throw InvalidArgument("gemm: no wgmma configuration fits (N=" + std::to_string(N) + ", K=" + std::to_string(K) +
                          ", NT=" + std::to_string(NT) + ")");
  return c;
}

template <class Epi>
GemmConfig plan_gemm(int N, int K, int NT, int num_sms, const GemmPlanHint& hint) {
  if (N <= 0 || K <= 0 || N % 16 != 0 || K % 16 != 0)
    throw InvalidArgument("gemm: N and K must be positive multiples of 16 (N=" + std::to_string(N) +
                          ", K=" + std::to_string(K) + ")");
  if (NT != 1 && NT != 2 && NT != 4 && NT != 8)
    throw InvalidArgument("gemm: NT must be 1, 2, 4 or 8 (got " + std::to_string(NT) + ")");
  const GemmEngine engine = hint.engine < 0 ? gemm_default_engine(N, K) : static_cast<GemmEngine>(hint.engine);
  if (engine == GemmEngine::Wgmma) return plan_gemm_wgmma<Epi>(N, K, NT, num_sms, hint);
  GemmConfig c;
  c.engine = GemmEngine::Mma;
  c.NT = NT;
  c.S = hint.slices > 0 ? std::min(hint.slices, K / 16) : gemm_slices(N, K);
  c.TM = NT <= 2 ? 1 : 2;
  // Row-block size: for each candidate, the resident clusters (occupancy API)
  // give the number of rounds a persistent CTA makes; estimated time per CTA
  // ~ rounds * (BR + Mpad + cost) (the activation tile streams through TMA
  // and shared memory like weight rows: the 8B LM head at M = 64 was faster
  // with 128-row blocks in 4 rounds than with 64-row blocks in 6,
  // benchmarks/README.md, "wgmma GEMM engine"; gemm_row_block_cost: cluster
  // barriers, reduction, epilogue).
  // Then the grid is balanced so that every CTA makes the same number of rounds.
  long best_cost = -1;
  for (int wr : {4, 2, 1}) {
    const int br = 16 * c.TM * wr;
    const int n_rb = (N + br - 1) / br;
    int clusters = 0, stages = 0;
    size_t smem = 0;
    gemm_dispatch(NT, c.TM, wr, [&]<int nt, int tm, int w>() {
      using I = GemmInst<nt, tm, w, Epi>;
      I::prepare();
      stages = I::kStages;
      smem = I::smem();
      clusters = gemm_resident_clusters(&gemm_skinny_kernel<nt, tm, w, Epi>, n_rb, c.S, 32 * w, smem);
    });
    if (clusters <= 0) clusters = std::max(1, num_sms / c.S);
    const int rounds = (n_rb + clusters - 1) / clusters;
    const long cost = static_cast<long>(rounds) * (br + 8 * NT + gemm_row_block_cost(c.S));
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
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
void launch_gemm(const GemmConfig& cfg, const CUtensorMap& wmap, const CUtensorMap& xmap, const GemmArgs& args_in,
                 const typename Epi::Params& ep, bool pdl, cudaStream_t stream) {
  GemmArgs args = args_in;
  args.stages = cfg.stages;
  args.xres = cfg.xres;
  args.split_n = cfg.split_n;
  args.palias = cfg.palias;
  args.pdl_early = gemm_pdl_early();
  SlicedGemmLaunch launch(cfg.grid_x, cfg.S, 32 * cfg.WR, cfg.smem, pdl, stream);
  cudaLaunchConfig_t& lc = launch.config;
  if (cfg.engine == GemmEngine::Wgmma) {
    gemm_wgmma_dispatch(cfg.NT, cfg.WR / 4, [&]<int nt, int wg>() {
      SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, &gemm_wgmma_kernel<nt, wg, Epi>, wmap, xmap, args, ep));
    });
  } else {
    gemm_dispatch(cfg.NT, cfg.TM, cfg.WR, [&]<int nt, int tm, int wr>() {
      SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, &gemm_skinny_kernel<nt, tm, wr, Epi>, wmap, xmap, args, ep));
    });
  }
}

#define SS_INSTANTIATE_GEMM(EPI)                                                                             \
  template GemmConfig plan_gemm<EPI>(int, int, int, int, const GemmPlanHint&);                               \
  template void launch_gemm<EPI>(const GemmConfig&, const CUtensorMap&, const CUtensorMap&, const GemmArgs&, \
                                 const EPI::Params&, bool, cudaStream_t);

}  // namespace swiftspec::cuda
