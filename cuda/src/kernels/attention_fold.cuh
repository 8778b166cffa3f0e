// The folds of the split-K attention's pieces in global memory (attention.h): a row's pieces
// merged in the canonical order, the super folds of the last split to arrive, and the final fold
// of a token's row. Device code of attention_decode.cu, its only includer.
#pragma once
#include "kernels/attention_tile.cuh"

// Internal to attention_decode.cu (its only includer): an anonymous namespace, as there.
namespace swiftspec::cuda {
namespace {

// ---- folds of pieces in global memory (several threads per query row, DPT dims each) ----
//
// A fold is a serial chain of merges per row; with a few warps per SM each dependent instruction
// waits its full latency, so the folds keep few instructions per piece: few dims per thread
// (the fold kernel: 2, the super folds: 4), and a merge of an empty split or super state, an
// exact no-op, is skipped.

/// A softmax state of DPT dims of one row.
template <int DPT>
struct RowState {
  float m, l, o[DPT];
  __device__ __forceinline__ void clear() {
    m = -INFINITY;
    l = 0.f;
#pragma unroll
    for (int i = 0; i < DPT; ++i) o[i] = 0.f;
  }
  __device__ __forceinline__ void fold(float xm, float xl, const float (&xo)[DPT]) {
    const Merge c = merge_of(m, xm);
    l = merge_val(c, l, xl);
    m = c.M;
#pragma unroll
    for (int i = 0; i < DPT; ++i) o[i] = merge_val(c, o[i], xo[i]);
  }
  __device__ __forceinline__ void fold(const RowState& x) { fold(x.m, x.l, x.o); }
};

/// The three-level state of a fold (final, super, split) and which of the lower ones hold
/// anything. Pieces are added in the canonical order (attention.h); a piece starting at a split
/// boundary first flushes the split state into the super state, at a super boundary also the
/// super state into the final one. Folding an empty state (nothing merged into it since it was
/// cleared) changes nothing, so those folds are skipped: the same bits, fewer instructions.
template <int DPT>
struct FoldChain {
  RowState<DPT> fin, sup, spl;
  bool sup_used, spl_used;
  __device__ __forceinline__ void clear() {
    fin.clear();
    sup.clear();
    spl.clear();
    sup_used = spl_used = false;
  }
  /// Adds a piece (m, l, o) at level LEVEL (0: final, 1: super, 2: split) starting at tile c0.
  /// FLUSH = false where the lower states are known to be empty (nothing to flush): straight-line
  /// merges, which the compiler can interleave across the pieces of a batch.
  template <int LEVEL, bool FLUSH>
  __device__ __forceinline__ void add(int c0, float xm, float xl, const float (&xo)[DPT]) {
    if constexpr (FLUSH) {
      const bool split_edge = c0 > 0 && c0 % kAttnTilesPerSplit == 0;
      const bool super_edge = c0 > 0 && c0 % kTilesPerSuper == 0;
      if (split_edge && spl_used) {
        sup.fold(spl);
        spl.clear();
        spl_used = false;
        sup_used = true;
      }
      if (super_edge && sup_used) {
        fin.fold(sup);
        sup.clear();
        sup_used = false;
      }
    }
    if constexpr (LEVEL == 0) {
      fin.fold(xm, xl, xo);
    } else if constexpr (LEVEL == 1) {
      sup.fold(xm, xl, xo);
      sup_used = true;
    } else {
      spl.fold(xm, xl, xo);
      spl_used = true;
    }
  }
  /// The final state: the split and super states flushed up.
  __device__ __forceinline__ const RowState<DPT>& finish() {
    if (spl_used) {
      sup.fold(spl);
      sup_used = true;
    }
    if (sup_used) fin.fold(sup);
    return fin;
  }
};

/// Adds `count` pieces of one array to the chain at level LEVEL: piece i is entry e0 + i * stride of
/// `a` (this thread's dims d0 .. d0 + DPT - 1) and starts at tile c0 + i * c_step. The loads of a
/// batch of pieces are issued before their merges; the addresses are one multiply-add each, so a
/// thread's serial chain is little more than the merges themselves. FLUSH: as FoldChain::add.
template <int LEVEL, bool FLUSH, int DPT, int HD>
__device__ __forceinline__ void fold_run(FoldChain<DPT>& ch, const AttnPartials& a, size_t e0, size_t stride, int count,
                                         int d0, int c0, int c_step) {
  constexpr int kBatch = DPT <= 2 ? 2 * kPieceBatch : kPieceBatch;
  for (int i0 = 0; i0 < count; i0 += kBatch) {
    float2 ml[kBatch];
    float xo[kBatch][DPT];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (i0 + j < count) {
        const size_t e = e0 + static_cast<size_t>(i0 + j) * stride;
        ml[j] = __ldcg(a.ml + e);
        const float* src = a.o + e * HD + d0;
        if constexpr (DPT % 4 == 0) {
#pragma unroll
          for (int k = 0; k < DPT; k += 4) {
            const float4 f = __ldcg(reinterpret_cast<const float4*>(src + k));
            xo[j][k] = f.x;
            xo[j][k + 1] = f.y;
            xo[j][k + 2] = f.z;
            xo[j][k + 3] = f.w;
          }
        } else if constexpr (DPT % 2 == 0) {
#pragma unroll
          for (int k = 0; k < DPT; k += 2) {
            const float2 f = __ldcg(reinterpret_cast<const float2*>(src + k));
            xo[j][k] = f.x;
            xo[j][k + 1] = f.y;
          }
        } else {
#pragma unroll
          for (int k = 0; k < DPT; ++k) xo[j][k] = __ldcg(src + k);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (i0 + j < count) ch.template add<LEVEL, FLUSH>(c0 + (i0 + j) * c_step, ml[j].x, ml[j].y, xo[j]);
  }
}

/// The final fold of token t's row `r` (kv head kvh) and its attention output: the pieces in
/// tile order (full supers, or full splits in direct mode; the boundary super's full splits;
/// the boundary split's tiles below cf; the tail tiles).
template <int HD, int TPR>
__device__ void final_fold(const AttnParams& p, const Plan& q, int kvh, int t, int r) {
  constexpr int DPT = HD / TPR;
  const int d0 = (threadIdx.x % TPR) * DPT;
  const int head = kvh * p.group + r;
  const StepDesc* d = p.desc;
  const int L = d->prefix_len[t] + (d->is_tree ? d->attend_off[t + 1] - d->attend_off[t] : 0);
  const int nt = (L + kAttnTile - 1) / kAttnTile;
  const int cf = q.cf;
  const int nfs = q.direct ? 0 : cf / kTilesPerSuper;                                   // full super pieces
  const int nspl = q.direct ? q.nfull : 0;                                              // full split pieces
  const int has_bs = !q.direct && (cf % kTilesPerSuper) >= kAttnTilesPerSplit ? 1 : 0;  // boundary super's splits
  const int has_sp = cf % kAttnTilesPerSplit != 0 ? 1 : 0;                              // boundary split's tiles
  // entry (index, t, head) = index * stride + e0 (entry())
  const size_t stride = static_cast<size_t>(q.n) * p.num_heads;
  const size_t e0 = static_cast<size_t>(t) * p.num_heads + head;
  FoldChain<DPT> ch;
  ch.clear();
  // The full supers come first, into the final state: nothing below it to flush yet.
  fold_run<0, false, DPT, HD>(ch, p.super, e0, stride, nfs, d0, 0, kTilesPerSuper);
  fold_run<1, true, DPT, HD>(ch, p.split, e0, stride, nspl, d0, 0, kAttnTilesPerSplit);
  fold_run<1, true, DPT, HD>(ch, p.super, e0 + nfs * stride, stride, has_bs, d0, nfs * kTilesPerSuper, 0);
  fold_run<2, true, DPT, HD>(ch, p.boundary, e0, stride, has_sp, d0, q.nfull * kAttnTilesPerSplit, 0);
  fold_run<2, true, DPT, HD>(ch, p.tail, e0, stride, nt - cf, d0, cf, 1);
  const RowState<DPT>& f = ch.finish();
  const float inv = 1.0f / f.l;
  __nv_bfloat16* out = p.out + (static_cast<size_t>(t) * p.num_heads + head) * HD + d0;
  if constexpr (DPT % 2 == 0) {
#pragma unroll
    for (int k = 0; k < DPT; k += 2)
      *reinterpret_cast<__nv_bfloat162*>(out + k) = __floats2bfloat162_rn(f.o[k] * inv, f.o[k + 1] * inv);
  } else {
#pragma unroll
    for (int k = 0; k < DPT; ++k) out[k] = __float2bfloat16_rn(f.o[k] * inv);
  }
}

/// Split mode (not direct): after an item wrote its full splits s_lo .. s_hi - 1 of row group g,
/// counts them for their supers; the last item to arrive at a super folds the super's splits
/// into its super entry.
template <int HD>
__device__ void arrive_splits(const AttnParams& p, const Plan& q, int kvh, int g, int s_lo, int s_hi, AttnShared& sh) {
  constexpr int DPT = 4, TPR = HD / DPT;
  __threadfence();
  __syncthreads();
  for (int U = s_lo / kAttnSplitsPerSuper; U * kAttnSplitsPerSuper < s_hi; ++U) {
    const int u_lo = max(s_lo, U * kAttnSplitsPerSuper), u_hi = min(s_hi, (U + 1) * kAttnSplitsPerSuper);
    const int cnt = min(kAttnSplitsPerSuper, q.nfull - U * kAttnSplitsPerSuper);  // the super's full splits
    if (threadIdx.x == 0) {
      int* ctr = p.super_counters + (static_cast<size_t>(kvh) * kMaxStepTokens + g) * p.max_supers + U;
      const int prev = atomicAdd(ctr, u_hi - u_lo);
      sh.flag = prev + (u_hi - u_lo) == cnt ? 1 : 0;
      if (sh.flag) *ctr = 0;  // no other arrival is due this step
    }
    __syncthreads();
    if (sh.flag) {
      __threadfence();
      const int t0 = g * q.tpg, R = min(q.tpg, q.n - t0) * p.group;
      const int d0 = (threadIdx.x % TPR) * DPT;
      for (int r = threadIdx.x / TPR; r < R; r += kThreads / TPR) {
        const int t = t0 + r / p.group, head = kvh * p.group + r % p.group;
        // (a super's splits fold at one level: no boundary inside it)
        FoldChain<DPT> ch;
        ch.clear();
        fold_run<0, false, DPT, HD>(ch, p.split, entry(p, q, U * kAttnSplitsPerSuper, t, head),
                                    static_cast<size_t>(q.n) * p.num_heads, cnt, d0, 0, 0);
        const RowState<DPT>& f = ch.finish();
        const size_t e = entry(p, q, U, t, head);
        float* po = p.super.o + e * HD + d0;
#pragma unroll
        for (int k = 0; k < DPT; k += 4)
          __stcg(reinterpret_cast<float4*>(po + k), make_float4(f.o[k], f.o[k + 1], f.o[k + 2], f.o[k + 3]));
        if (threadIdx.x % TPR == 0) __stcg(&p.super.ml[e], make_float2(f.m, f.l));
      }
    }
    __syncthreads();
  }
}

}  // namespace
}  // namespace swiftspec::cuda
