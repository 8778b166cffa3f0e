// Split-K attention of decode and tree-verification steps (attention.h).
//
// One persistent grid per step. Its work items, in this order:
//   tail items  (kv head, token): the tiles from floor(C / 64) to the token's last one, keys
//               gathered per token (committed tail, then its tree ancestors by depth), one
//               partial per tile;
//   main items  (kv head, unit, row group): the tiles of one split (split mode) or one super
//               (super mode) below floor(C / 64), the same keys for every token of the step,
//               for up to 64 query rows (the row group's tokens x their GQA heads) at once.
// Which mode a step takes only decides how the work is cut (enough items to fill the SMs,
// few partials to write): both produce the same pieces with the same bits.
//
// Pieces meet in global memory. A split-mode item writes its split; with many splits the last
// split of a super to arrive (a counter per kv head, row group and super) folds the super's
// splits. A second kernel, one CTA per (kv head, token), launched with a programmatic edge,
// folds each token's pieces in the canonical order (attention.h) and writes its output rows.
// Nothing waits on another CTA, so the attention grid can be any size.
//
// A main item's warps share each tile: WPM warps per m16 tile of query rows, each an output
// column slice; tiles stream through a 4-stage cp.async ring. A tail item's warps compute up
// to four tiles side by side (four tile slots x two column halves).
//
// A tile partial is computed by one warp for one m16 tile of query rows and one column
// slice of the output, FA2-style with P kept in registers (Dao 2023, "FlashAttention-2",
// §3.1): S = Q K^T (mma.sync, k over head_dim in order), row max over the 64 positions,
// P = bf16(2^(s - max)), l = sum of P (per thread in position order, then across the quad),
// O = P V (mma.sync, k over the 64 positions in order). Each output element depends only
// on its row's Q, the tile's K / V and the positions masked, never on the other rows of
// the m16 tile, the warp's column slice or the CTA that runs it.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common.h"
#include "kernels/attention.h"
#include "kernels/attention_fold.cuh"
#include "kernels/attention_tile.cuh"

namespace swiftspec::cuda {

namespace {

/// Runs `body(r0, count)` over rounds of up to kStages tiles (tiles r0 .. r0 + count - 1 in
/// stages 0 .. count - 1 of the ring, brought in by `load(j, K, V)`): the tail items, whose
/// warps compute the tiles of a round side by side. Copies issued before the call (the item's
/// Q rows) complete with the first round.
template <int HD, class Load, class Body>
__device__ __forceinline__ void round_pipeline(uint8_t* ring, int ntiles, Load load, Body body) {
  constexpr int LD = Geom<HD>::kLD;
  for (int r0 = 0; r0 < ntiles; r0 += kStages) {
    const int cnt = min(kStages, ntiles - r0);
    for (int j = 0; j < cnt; ++j) {
      __nv_bfloat16* K = reinterpret_cast<__nv_bfloat16*>(ring + j * 2 * Geom<HD>::kTileBytes);
      load(r0 + j, K, K + kAttnTile * LD);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    body(r0, cnt);
    __syncthreads();  // before the next round's loads overwrite the stages
  }
  cp_async_wait<0>();
}

/// Stage j of the ring: its K tile (V follows kAttnTile rows later).
template <int HD>
__device__ __forceinline__ const __nv_bfloat16* ring_k(const uint8_t* ring, int j) {
  return reinterpret_cast<const __nv_bfloat16*>(ring + j * 2 * Geom<HD>::kTileBytes);
}

/// Loads committed tile c of kv head kvh (64 contiguous cache rows) into K / V, by `nthreads`
/// threads of which this is `tid` (default: the whole CTA).
template <int HD>
__device__ __forceinline__ void load_committed_tile(const AttnParams& p, int kvh, int c, __nv_bfloat16* K,
                                                    __nv_bfloat16* V, int tid = threadIdx.x, int nthreads = kThreads) {
  constexpr int LD = Geom<HD>::kLD, CH = HD / 8;
  const size_t row0 = static_cast<size_t>(kvh) * p.slots + static_cast<size_t>(c) * kAttnTile;
  for (int i = tid; i < kAttnTile * CH; i += nthreads) {
    const int r = i / CH, ch = i - r * CH;
    cp_async_16(K + r * LD + ch * 8, p.kcache + (row0 + r) * HD + ch * 8);
    cp_async_16(V + r * LD + ch * 8, p.vcache + (row0 + r) * HD + ch * 8);
  }
}

/// A main item: the tiles below cf of unit u (split mode: spi consecutive splits; super mode:
/// a super) for row group g of kv head kvh. WPM warps per m16 tile, each HD / WPM output
/// columns (WPM = 1: each warp its own m16 tile, all columns, for up to kMaxRows rows); the
/// tiles stream through the ring one after the other. Full splits are stored
/// (split mode) or folded into the super state (super mode, its O in shared memory); the
/// split holding cf stores its tiles below cf as the boundary piece.
template <int HD, int WPM>
__device__ void main_item(const AttnParams& p, const Plan& q, int kvh, int g, int u, uint8_t* smem, AttnShared& sh) {
  constexpr int NC = HD / WPM, NT = NC / 8, MTA = 8 / WPM, LD = Geom<HD>::kLD;
  // More than 4 m16 tiles: a stage less, for a super area of kMaxRows rows (Geom).
  constexpr int STAGES = MTA > 4 ? kStages - 1 : kStages;
  constexpr size_t kSuperAt = MTA > 4 ? Geom<HD>::kSuperWide : Geom<HD>::kSuper;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int mt = warp / WPM, col0 = (warp % WPM) * NC;
  const bool write_ml = warp % WPM == 0;
  const int G = p.group;
  const int t0 = g * q.tpg, tc = min(q.tpg, q.n - t0), R = tc * G;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  load_q<HD>(p, Qs, kvh, t0, R, 16 * MTA);
  const int per_unit = (q.split_mode ? q.spi : kAttnSplitsPerSuper) * kAttnTilesPerSplit;
  const int c_lo = u * per_unit, c_hi = min(c_lo + per_unit, q.cf);
  const bool active = mt * 16 < R;
  const float sl2 = p.scale * kLog2e;
  auto row_entry = [&](int index) {
    return [&, index](int row) { return entry(p, q, index, t0 + row / G, kvh * G + row % G); };
  };
  FragState<NT> ps, ts;
  ps.clear();
  SmemState<HD, NT> ss;
  ss.o = reinterpret_cast<float*>(smem + kSuperAt) + mt * 16 * HD;
  ss.col0 = col0;
  ss.clear();
  tile_pipeline<HD, STAGES>(
      smem + Geom<HD>::kRing, c_hi - c_lo,
      [&](int j, __nv_bfloat16* K, __nv_bfloat16* V) { load_committed_tile<HD>(p, kvh, c_lo + j, K, V); },
      [&](int j, const __nv_bfloat16* Ks, const __nv_bfloat16* Vs) {
        const int c = c_lo + j;
        if (active) {
          if constexpr (WPM == 1) {
            fold_tile_partial<HD, NT>(ps, Qs + mt * 16 * LD, Ks, Vs, kAttnTile, sl2, lane);
          } else {
            tile_partial<HD, NT>(Qs + mt * 16 * LD, Ks, Vs, col0, kAttnTile, sl2, lane, ts);
            ps.fold(ts);
          }
        }
        if ((c + 1) % kAttnTilesPerSplit == 0 || c + 1 == c_hi) {  // a split ends here
          const int s = c / kAttnTilesPerSplit;
          if ((s + 1) * kAttnTilesPerSplit > q.cf) {
            if (active) store_state<HD, NT>(p.boundary, ps, mt * 16, R, col0, write_ml, lane, row_entry(0));
          } else if (q.split_mode) {
            if (active) store_state<HD, NT>(p.split, ps, mt * 16, R, col0, write_ml, lane, row_entry(s));
          } else if (active) {
            ss.fold(ps, lane);
          }
          ps.clear();
        }
      });
  if (q.split_mode) {
    // the item's full splits: c_lo / 4 .. min(c_hi / 4, nfull)
    const int s_lo = c_lo / kAttnTilesPerSplit, s_hi = min(c_hi / kAttnTilesPerSplit, q.nfull);
    if (!q.direct && s_hi > s_lo) arrive_splits<HD>(p, q, kvh, g, s_lo, s_hi, sh);
    return;
  }
  if (u * kTilesPerSuper + kAttnTilesPerSplit <= q.cf && active) {  // the super's full splits
    ss.load(ts, lane);
    store_state<HD, NT>(p.super, ts, mt * 16, R, col0, write_ml, lane, row_entry(u));
  }
}

/// Barrier of the two warps of tile slot `slot` (named barriers 1..4; 0 is __syncthreads).
__device__ __forceinline__ void slot_barrier(int slot) { asm volatile("bar.sync %0, 64;" ::"r"(slot + 1) : "memory"); }

/// A main item of a decode step (one token: its rows of a kv head fit one m16 tile, R <= 16), in
/// either mode: the narrow scheme of the tail items instead of main_item's, where all 8 warps
/// would compute the same S for 16 output columns each. The item's splits are taken one after
/// the other; a split's up to 4 tiles are computed side by side (4 tile slots x 2 column halves),
/// slots 1-3 hand their tile states to slot 0 through the free rows of the super area, and slot 0
/// folds them in tile order into the split state: the same FragState::fold calls on the same tile
/// states as main_item's loop, hence the same bits. Each slot's two warps load their own tile of
/// the next split as soon as they are done with the current one, so the keys keep streaming while
/// slot 0 folds and stores. Full splits are stored (split mode) or folded into the super state in
/// slot 0's registers (super mode: the same merges as main_item's shared-memory super state).
template <int HD>
__device__ void main_item_narrow(const AttnParams& p, const Plan& q, int kvh, int u, uint8_t* smem, AttnShared& sh) {
  constexpr int NT = HD / 16, LD = Geom<HD>::kLD;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = warp >> 1, col0 = (warp & 1) * (HD / 2), slot_tid = threadIdx.x & 63;
  const int G = p.group, R = G;  // one token (row group 0 holds it)
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  load_q<HD>(p, Qs, kvh, 0, R, 16);
  const int per_unit = (q.split_mode ? q.spi : kAttnSplitsPerSuper) * kAttnTilesPerSplit;
  const int c_lo = u * per_unit, c_hi = min(c_lo + per_unit, q.cf);
  const int s_lo = c_lo / kAttnTilesPerSplit, s_end = (c_hi + kAttnTilesPerSplit - 1) / kAttnTilesPerSplit;
  uint8_t* ring = smem + Geom<HD>::kRing;
  __nv_bfloat16* K = reinterpret_cast<__nv_bfloat16*>(ring + slot * 2 * Geom<HD>::kTileBytes);  // this slot's stage
  auto tiles_of = [&](int s) { return min(kAttnTilesPerSplit, c_hi - s * kAttnTilesPerSplit); };
  auto load_slot_tile = [&](int s) {
    if (slot < tiles_of(s))
      load_committed_tile<HD>(p, kvh, s * kAttnTilesPerSplit + slot, K, K + kAttnTile * LD, slot_tid, 64);
    cp_async_commit();
  };
  load_slot_tile(s_lo);
  cp_async_wait<0>();
  __syncthreads();  // the Q rows (every thread's copies) and the first split's tiles are in
  // Hand-over area: rows 16 .. 63 of the super area (row-major [16][HD] fp32 per slot 1..3, the
  // SmemState layout) and rows 16 .. of the Q area for (m, l) ([slot][16] float2); main_item
  // uses neither for R <= 16.
  float* xo = reinterpret_cast<float*>(smem + Geom<HD>::kSuper) + 16 * HD;
  float2* xml = reinterpret_cast<float2*>(Qs + 16 * LD);
  const float sl2 = p.scale * kLog2e;
  const bool write_ml = (warp & 1) == 0;
  auto row_entry = [&](int index) {
    return [&, index](int row) { return entry(p, q, index, row / G, kvh * G + row % G); };
  };
  FragState<NT> sup;  // super mode: the super's full splits so far (slot 0)
  sup.clear();
  for (int s = s_lo; s < s_end; ++s) {
    const int cnt = tiles_of(s);
    if (s > s_lo) {
      cp_async_wait<0>();
      slot_barrier(slot);  // this slot's tile of split s is in (its two warps loaded it)
    }
    FragState<NT> ts;
    if (slot < cnt) tile_partial<HD, NT>(Qs, K, K + kAttnTile * LD, col0, kAttnTile, sl2, lane, ts);
    if (s + 1 < s_end) {
      slot_barrier(slot);  // both warps are done with the stage: refill it
      load_slot_tile(s + 1);
    }
    __syncthreads();  // slot 0 has read the previous split's hand-over
    if (slot > 0 && slot < cnt) {
      SmemState<HD, NT> x;
      x.o = xo + (slot - 1) * 16 * HD;
      x.col0 = col0;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int jj = 0; jj < NT; ++jj)
          *reinterpret_cast<float2*>(x.at(r, jj, lane)) = make_float2(ts.o[jj][2 * r], ts.o[jj][2 * r + 1]);
      if (write_ml && (lane & 3) == 0) {
        xml[(slot - 1) * 16 + (lane >> 2)] = make_float2(ts.m[0], ts.l[0]);
        xml[(slot - 1) * 16 + (lane >> 2) + 8] = make_float2(ts.m[1], ts.l[1]);
      }
    }
    __syncthreads();
    if (slot == 0) {  // the other slots go on with the next split meanwhile
      FragState<NT> ps;
      ps.clear();
      ps.fold(ts);
      for (int j = 1; j < cnt; ++j) {
        SmemState<HD, NT> x;
        x.o = xo + (j - 1) * 16 * HD;
        x.col0 = col0;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float2 ml = xml[(j - 1) * 16 + (lane >> 2) + 8 * r];
          x.m[r] = ml.x;
          x.l[r] = ml.y;
        }
        x.load(ts, lane);
        ps.fold(ts);
      }
      if ((s + 1) * kAttnTilesPerSplit > q.cf)
        store_state<HD, NT>(p.boundary, ps, 0, R, col0, write_ml, lane, row_entry(0));
      else if (q.split_mode)
        store_state<HD, NT>(p.split, ps, 0, R, col0, write_ml, lane, row_entry(s));
      else
        sup.fold(ps);
    }
  }
  if (q.split_mode) {
    // The item's full splits count for their supers (without direct folds): every thread takes part.
    const int s_full = min(c_hi / kAttnTilesPerSplit, q.nfull);
    if (!q.direct && s_full > s_lo) arrive_splits<HD>(p, q, kvh, 0, s_lo, s_full, sh);
    return;
  }
  if (slot == 0 && u * kTilesPerSuper + kAttnTilesPerSplit <= q.cf)  // the super's full splits
    store_state<HD, NT>(p.super, sup, 0, R, col0, write_ml, lane, row_entry(u));
}

/// A tail item: token t's tiles from cf on (kv head kvh), keys gathered by logical position
/// (committed slots below its prefix length, then its attend list), one tail entry per tile;
/// the narrow scheme's warps (tile slots x column halves), no fold.
template <int HD>
__device__ void tail_item(const AttnParams& p, const Plan& q, int kvh, int t, uint8_t* smem, AttnShared& sh) {
  constexpr int NT = HD / 16, LD = Geom<HD>::kLD, CH = HD / 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = warp >> 1, col0 = (warp & 1) * (HD / 2);
  const StepDesc* d = p.desc;
  const int P = d->prefix_len[t];
  const int off = d->attend_off[t];
  const int L = P + (d->is_tree ? d->attend_off[t + 1] - off : 0);
  const int nt = (L + kAttnTile - 1) / kAttnTile;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  const uint8_t* ring = smem + Geom<HD>::kRing;
  load_q<HD>(p, Qs, kvh, t, p.group, 16);
  const float sl2 = p.scale * kLog2e;
  const size_t head_row0 = static_cast<size_t>(kvh) * p.slots;
  FragState<NT> ts;
  round_pipeline<HD>(
      smem + Geom<HD>::kRing, nt - q.cf,
      [&](int j, __nv_bfloat16* K, __nv_bfloat16* V) {
        const int pos0 = (q.cf + j) * kAttnTile;
        for (int i = threadIdx.x; i < kAttnTile * CH; i += kThreads) {
          const int r = i / CH, c = i - r * CH;
          const int pos = pos0 + r;
          if (pos < L) {
            const int slot_index = pos < P ? pos : p.max_context + d->attend_slots[off + pos - P];
            const size_t row = head_row0 + slot_index;
            cp_async_16(K + r * LD + c * 8, p.kcache + row * HD + c * 8);
            cp_async_16(V + r * LD + c * 8, p.vcache + row * HD + c * 8);
          } else {  // masked positions: P = 0 there, and 0 * V must stay 0
            *reinterpret_cast<uint4*>(K + r * LD + c * 8) = make_uint4(0u, 0u, 0u, 0u);
            *reinterpret_cast<uint4*>(V + r * LD + c * 8) = make_uint4(0u, 0u, 0u, 0u);
          }
        }
      },
      [&](int r0, int cnt) {
        if (slot >= cnt) return;
        const int j = r0 + slot, c = q.cf + j;
        const __nv_bfloat16* K = ring_k<HD>(ring, slot);
        tile_partial<HD, NT>(Qs, K, K + kAttnTile * LD, col0, min(kAttnTile, L - c * kAttnTile), sl2, lane, ts);
        store_state<HD, NT>(p.tail, ts, 0, p.group, col0, (warp & 1) == 0, lane,
                            [&](int row) { return entry(p, q, j, t, kvh * p.group + row); });
      });
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 1) attention_kernel(const __grid_constant__ AttnParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ AttnShared sh;
  griddep_launch_dependents();
  griddep_wait();  // Q and this step's K / V come from the QKV GEMM
  if (p.debug_empty & 1) return;
  const Plan q = make_plan(p);
  const int total = q.n_tail + q.n_main;
  for (int it = blockIdx.x; it < total; it += gridDim.x) {
    if (it < q.n_tail) {
      tail_item<HD>(p, q, it / q.n, it % q.n, smem, sh);
      continue;
    }
    int i = it - q.n_tail;
    const int g = i % q.ngroups;
    i /= q.ngroups;
    const int u = i % q.nunits;
    const int kvh = i / q.nunits;
    const int R = min(q.tpg, q.n - g * q.tpg) * p.group;
    if (q.narrow)
      main_item_narrow<HD>(p, q, kvh, u, smem, sh);
    else if (R <= 16)
      main_item<HD, 8>(p, q, kvh, g, u, smem, sh);
    else if (R <= 32)
      main_item<HD, 4>(p, q, kvh, g, u, smem, sh);
    else if (R <= 64)
      main_item<HD, 2>(p, q, kvh, g, u, smem, sh);
    else
      main_item<HD, 1>(p, q, kvh, g, u, smem, sh);
  }
}

/// Threads per query row of the fold kernel: 2 dims each.
template <int HD>
constexpr int kFoldThreadsPerRow = HD / 2;

/// The final folds: per (kv head, token), one CTA per kThreads / kFoldThreadsPerRow query rows. Launched after the
/// attention kernel with a programmatic edge: it waits for that grid's completion.
template <int HD>
__global__ void __launch_bounds__(kThreads) attention_fold_kernel(const __grid_constant__ AttnParams p) {
  griddep_launch_dependents();
  griddep_wait();
  if (p.debug_empty & 2) return;
  constexpr int TPR = kFoldThreadsPerRow<HD>, RPC = kThreads / TPR;  // threads per row, rows per CTA
  const int parts = (p.group + RPC - 1) / RPC;
  const int part = blockIdx.x % parts, kvh = (blockIdx.x / parts) % p.num_kv_heads,
            t = blockIdx.x / parts / p.num_kv_heads;
  const int r = part * RPC + static_cast<int>(threadIdx.x) / TPR;
  const Plan q = make_plan(p);
  if (t >= q.n || r >= p.group) return;
  final_fold<HD, TPR>(p, q, kvh, t, r);
}

template <int HD>
int grid_ctas(int num_sms) {
  static std::atomic<uint64_t> done{0};
  static std::atomic<int> per_sm{0};
  const uint64_t bit = current_device_bit();
  if (!bit || !(done.load(std::memory_order_acquire) & bit)) {
    SS_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(Geom<HD>::kSmem)));
    int blocks = 0;
    SS_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, attention_kernel<HD>, kThreads, Geom<HD>::kSmem));
    per_sm.store(std::max(1, blocks), std::memory_order_release);
    done.fetch_or(bit, std::memory_order_acq_rel);
  }
  return per_sm.load(std::memory_order_acquire) * num_sms;
}

}  // namespace

int attention_grid_ctas(int head_dim, int num_sms) {
  if (head_dim == 128) return grid_ctas<128>(num_sms);
  if (head_dim == 64) return grid_ctas<64>(num_sms);
  throw InvalidArgument("attention: head_dim must be 64 or 128 (got " + std::to_string(head_dim) + ")");
}

namespace {

/// Timing aid (docs/cuda_backend.md, "A/B switches"): SWIFTSPEC_ATTN_SKIP=attn|fold|both records
/// the step without that kernel, =empty-attn|empty-fold|empty-both launches it but returns at once
/// (its outputs are then wrong: for timing a stage in place only). Read at every launch: launches
/// are captured once per graph bucket.
bool skip_stage(const char* which) {
  const char* e = std::getenv("SWIFTSPEC_ATTN_SKIP");
  return e && (std::strcmp(e, which) == 0 || std::strcmp(e, "both") == 0);
}
int empty_stages() {
  const char* e = std::getenv("SWIFTSPEC_ATTN_SKIP");
  if (!e) return 0;
  return (std::strcmp(e, "empty-attn") == 0 ? 1 : 0) | (std::strcmp(e, "empty-fold") == 0 ? 2 : 0) |
         (std::strcmp(e, "empty-both") == 0 ? 3 : 0);
}

/// SWIFTSPEC_ATTN_CTAS=N: the attention grid's CTAs instead of the occupancy's (the plan follows
/// the grid size, never the bits).
int ctas_override(int ctas) {
  const char* e = std::getenv("SWIFTSPEC_ATTN_CTAS");
  const int v = e ? std::atoi(e) : 0;
  return v > 0 ? v : ctas;
}

/// SWIFTSPEC_ATTN_NARROW=0: decode steps' main items keep main_item's scheme; =single: only
/// items of one split in split mode take the narrow scheme (the rule before items of several
/// splits were narrow); default: every decode item does. The same bits in every case.
int narrow_allowed() {
  const char* e = std::getenv("SWIFTSPEC_ATTN_NARROW");
  if (e && std::strcmp(e, "0") == 0) return 0;
  return e && std::strcmp(e, "single") == 0 ? 1 : 2;
}

/// The rows of a main item: AttnParams::max_rows (the step tuner's "attn.rows" knob), unless
/// SWIFTSPEC_ATTN_ROWS=64 or =128 forces one for every step (A/B). The same bits either way.
int max_rows(int requested) {
  const char* e = std::getenv("SWIFTSPEC_ATTN_ROWS");
  if (e && std::strcmp(e, "128") == 0) return 128;
  if (e && std::strcmp(e, "64") == 0) return 64;
  return requested;
}

/// SWIFTSPEC_ATTN_CARVEOUT=1: both kernels prefer the largest shared-memory carve-out, so that the
/// SMs keep the GEMMs' L1 / shared split around them.
template <int HD>
void set_carveout() {
  const char* e = std::getenv("SWIFTSPEC_ATTN_CARVEOUT");
  if (!e || std::strcmp(e, "1") != 0) return;
  SS_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<HD>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  SS_CUDA_CHECK(cudaFuncSetAttribute(attention_fold_kernel<HD>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
}

}  // namespace

void launch_attention(const AttnParams& params, int ctas, bool pdl, bool pdl_fold, cudaStream_t stream) {
  if (params.group > 16 || params.group < 1)
    throw InvalidArgument("attention: query heads per KV head must be 1..16 (got " + std::to_string(params.group) +
                          ")");
  if (params.head_dim != 64 && params.head_dim != 128)
    throw InvalidArgument("attention: head_dim must be 64 or 128 (got " + std::to_string(params.head_dim) + ")");
  if (params.max_tokens < 1 || params.max_tokens > kMaxStepTokens)
    throw InvalidArgument("attention: max_tokens must be 1.." + std::to_string(kMaxStepTokens) + " (got " +
                          std::to_string(params.max_tokens) + ")");
  if (params.max_rows != 64 && params.max_rows != 128)
    throw InvalidArgument("attention: max_rows must be 64 or 128 (got " + std::to_string(params.max_rows) + ")");
  AttnParams p = params;
  p.ctas = std::max(1, ctas_override(ctas));
  p.narrow = narrow_allowed();
  p.max_rows = max_rows(params.max_rows);
  p.debug_empty = empty_stages();
  const bool run_attn = !skip_stage("attn"), run_fold = !skip_stage("fold");
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(p.ctas), 1, 1);
  lc.blockDim = dim3(kThreads, 1, 1);
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  cudaLaunchConfig_t fc = lc;  // the fold kernel, after the attention grid
  const int fold_rows = kThreads / (p.head_dim == 128 ? kFoldThreadsPerRow<128> : kFoldThreadsPerRow<64>);
  // Only the bucket's tokens: a decode step's fold grid is a few CTAs, not a second wave of idle ones.
  fc.gridDim =
      dim3(static_cast<unsigned>(p.num_kv_heads * p.max_tokens * ((p.group + fold_rows - 1) / fold_rows)), 1, 1);
  fc.dynamicSmemBytes = 0;
  fc.numAttrs = pdl_fold ? 1 : 0;
  if (p.head_dim == 128) {
    grid_ctas<128>(1);  // the shared-memory limit is set
    set_carveout<128>();
    lc.dynamicSmemBytes = Geom<128>::kSmem;
    if (run_attn) SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, attention_kernel<128>, p));
    if (run_fold) SS_CUDA_CHECK(cudaLaunchKernelEx(&fc, attention_fold_kernel<128>, p));
  } else {
    grid_ctas<64>(1);
    set_carveout<64>();
    lc.dynamicSmemBytes = Geom<64>::kSmem;
    if (run_attn) SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, attention_kernel<64>, p));
    if (run_fold) SS_CUDA_CHECK(cudaLaunchKernelEx(&fc, attention_fold_kernel<64>, p));
  }
}

}  // namespace swiftspec::cuda
