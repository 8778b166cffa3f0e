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

/// Where a piece of a fold lives and which state it merges into.
struct Piece {
  const float* o;    ///< its head_dim floats
  const float2* ml;  ///< its (max, sum)
  int level;         ///< 0: final, 1: super, 2: split
  int flush;         ///< before merging: 1 split -> super, 2 also super -> final
};

/// A piece starting at tile c0: before it, a split boundary flushes the split state into the
/// super state and a super boundary also the super state into the final one (a no-op for
/// states that are empty there).
__device__ __forceinline__ Piece piece_at(const AttnPartials& a, size_t e, int head_dim, int level, int c0) {
  Piece pc;
  pc.o = a.o + e * head_dim;
  pc.ml = a.ml + e;
  pc.level = level;
  pc.flush = c0 > 0 && c0 % kTilesPerSuper == 0 ? 2 : (c0 > 0 && c0 % kAttnTilesPerSplit == 0 ? 1 : 0);
  return pc;
}

/// Folds `np` pieces (`piece_of(i)`) in order into a three-level state and returns the final
/// state (pieces at lower levels flushed up as the walk says; the split and super states are
/// flushed at the end). This thread holds dims d0 .. d0 + DPT - 1. Loads of a batch of pieces are
/// issued before their merges. Folding an empty state (nothing merged into it since it was
/// cleared) changes nothing, so those folds are skipped: the same bits, fewer instructions.
template <int DPT, class PieceOf>
__device__ __forceinline__ RowState<DPT> fold_pieces(int np, int d0, PieceOf piece_of) {
  constexpr int kBatch = DPT <= 2 ? 2 * kPieceBatch : kPieceBatch;
  RowState<DPT> fin, sup, spl;  // the final, super and split states (named: no runtime-indexed array)
  fin.clear();
  sup.clear();
  spl.clear();
  bool sup_used = false, spl_used = false;  // whether anything was merged in since the last clear
  for (int i0 = 0; i0 < np; i0 += kBatch) {
    float2 ml[kBatch];
    float xo[kBatch][DPT];
    Piece pc[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (i0 + j < np) {
        pc[j] = piece_of(i0 + j);
        ml[j] = __ldcg(pc[j].ml);
        const float* src = pc[j].o + d0;
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
    for (int j = 0; j < kBatch; ++j) {
      if (i0 + j < np) {
        if (pc[j].flush >= 1 && spl_used) {
          sup.fold(spl);
          spl.clear();
          spl_used = false;
          sup_used = true;
        }
        if (pc[j].flush >= 2 && sup_used) {
          fin.fold(sup);
          sup.clear();
          sup_used = false;
        }
        if (pc[j].level == 0) {
          fin.fold(ml[j].x, ml[j].y, xo[j]);
        } else if (pc[j].level == 1) {
          sup.fold(ml[j].x, ml[j].y, xo[j]);
          sup_used = true;
        } else {
          spl.fold(ml[j].x, ml[j].y, xo[j]);
          spl_used = true;
        }
      }
    }
  }
  if (spl_used) {
    sup.fold(spl);
    sup_used = true;
  }
  if (sup_used) fin.fold(sup);
  return fin;
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
  const int np = nfs + nspl + has_bs + has_sp + (nt - cf);
  const RowState<DPT> f = fold_pieces<DPT>(np, d0, [&](int i) {
    if (i < nfs) return piece_at(p.super, entry(p, q, i, t, head), HD, 0, i * kTilesPerSuper);
    i -= nfs;
    if (i < nspl) return piece_at(p.split, entry(p, q, i, t, head), HD, 1, i * kAttnTilesPerSplit);
    i -= nspl;
    if (i < has_bs) return piece_at(p.super, entry(p, q, nfs, t, head), HD, 1, nfs * kTilesPerSuper);
    i -= has_bs;
    if (i < has_sp) return piece_at(p.boundary, entry(p, q, 0, t, head), HD, 2, q.nfull * kAttnTilesPerSplit);
    i -= has_sp;
    return piece_at(p.tail, entry(p, q, i, t, head), HD, 2, cf + i);
  });
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
        const RowState<DPT> f = fold_pieces<DPT>(cnt, d0, [&](int i) {
          return piece_at(p.split, entry(p, q, U * kAttnSplitsPerSuper + i, t, head), HD, 0, 0);
        });
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
