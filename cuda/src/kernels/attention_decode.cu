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

namespace swiftspec::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxRows = 64;  ///< query rows of a main item (4 m16 tiles)
constexpr int kStages = 4;    ///< K/V tiles in flight per CTA
constexpr int kTilesPerSuper = kAttnTilesPerSplit * kAttnSplitsPerSuper;
constexpr int kPieceBatch = 8;  ///< pieces whose loads a fold issues before merging them
/// Split mode with at most this many full splits folds them in the fold kernel directly.
constexpr int kDirectSplits = 16;
constexpr float kLog2e = 1.4426950408889634f;

/// Shared memory of a CTA: the item's Q rows, the K/V ring and the super state's O of a main
/// item (its m and l stay in registers).
template <int HD>
struct Geom {
  static constexpr int kLD = HD + 8;  ///< bf16 row stride of the Q / K / V tiles (ldmatrix without bank conflicts)
  static constexpr size_t kQBytes = size_t(kMaxRows) * kLD * 2;
  static constexpr size_t kTileBytes = size_t(kAttnTile) * kLD * 2;
  static constexpr size_t kRingBytes = size_t(kStages) * 2 * kTileBytes;
  static constexpr size_t kSuperBytes = size_t(kMaxRows) * HD * 4;
  static constexpr size_t kRing = kQBytes;
  static constexpr size_t kSuper = kRing + kRingBytes;
  static constexpr size_t kSmem = kSuper + kSuperBytes;
};

struct AttnShared {
  int flag;  ///< this CTA folds a super (arrive_split)
};

/// What a step's descriptor says about the work (every CTA of both kernels computes the same).
struct Plan {
  int n = 0;        ///< tokens
  int cf = 0;       ///< tiles every token attends whole: floor(committed / 64)
  int nfull = 0;    ///< full splits below cf
  int tpg = 0;      ///< tokens per row group
  int ngroups = 0;  ///< row groups
  int split_mode = 0;
  /// Split mode with few splits: the fold kernel folds the split pieces itself (the same
  /// arithmetic as folding them into supers first) instead of a super stage in this kernel.
  int direct = 0;
  int spi = 0;     ///< split mode: splits per main item (as many as fit the grid in one wave)
  int nunits = 0;  ///< main units per (kv head, row group)
  /// Split mode, one split per item, one token (a decode step): main_item_narrow.
  int narrow = 0;
  int n_tail = 0, n_main = 0;
};

__device__ Plan make_plan(const AttnParams& p) {
  Plan q;
  const StepDesc* d = p.desc;
  q.n = d->n;
  q.cf = d->committed / kAttnTile;
  q.nfull = q.cf / kAttnTilesPerSplit;
  q.tpg = max(1, kMaxRows / p.group);
  q.ngroups = (q.n + q.tpg - 1) / q.tpg;
  const int nsplits = (q.cf + kAttnTilesPerSplit - 1) / kAttnTilesPerSplit;
  const int nsupers = (q.cf + kTilesPerSuper - 1) / kTilesPerSuper;
  const long long super_items = static_cast<long long>(p.num_kv_heads) * q.ngroups * nsupers;
  // Super mode once it alone fills half the grid (or the split scratch is too small): its
  // items are 8x longer but write 8x fewer partials.
  q.split_mode = (static_cast<long long>(q.n) * nsplits <= p.split_capacity && 2 * super_items < p.ctas) ? 1 : 0;
  q.direct = q.split_mode && q.nfull <= kDirectSplits ? 1 : 0;
  // Split mode: consecutive splits per item so that the items fit one wave of the grid (each
  // item streams its tiles through one pipeline; a second wave would start cold).
  const long long split_items = static_cast<long long>(p.num_kv_heads) * q.ngroups * nsplits;
  q.spi = q.split_mode ? static_cast<int>(max(1LL, (split_items + p.ctas - 1) / max(1, p.ctas))) : kAttnSplitsPerSuper;
  q.nunits = q.split_mode ? (nsplits + q.spi - 1) / q.spi : nsupers;
  q.narrow = p.narrow && q.split_mode && q.spi == 1 && q.n == 1 ? 1 : 0;
  q.n_tail = p.num_kv_heads * q.n;
  q.n_main = p.num_kv_heads * q.ngroups * q.nunits;
  return q;
}

/// Entry of (index, token, head) in an AttnPartials array.
__device__ __forceinline__ size_t entry(const AttnParams& p, const Plan& q, int index, int token, int head) {
  return (static_cast<size_t>(index) * q.n + token) * p.num_heads + head;
}

// ---- the online-softmax merge (one definition for registers and global pieces) ----

struct Merge {
  float M, a, b;
  int kind;  ///< 0: the incoming piece is empty (keep), 1: the state is empty (take), 2: combine
};

__device__ __forceinline__ Merge merge_of(float m, float mx) {
  Merge c;
  c.M = m;
  c.a = 1.f;
  c.b = 0.f;
  c.kind = 0;
  if (mx == -INFINITY) return c;
  if (m == -INFINITY) {
    c.kind = 1;
    c.M = mx;
    return c;
  }
  c.kind = 2;
  c.M = fmaxf(m, mx);
  c.a = exp2f(__fsub_rn(m, c.M));
  c.b = exp2f(__fsub_rn(mx, c.M));
  return c;
}

__device__ __forceinline__ float merge_val(const Merge& c, float v, float vx) {
  return c.kind == 0 ? v : (c.kind == 1 ? vx : __fmaf_rn(vx, c.b, __fmul_rn(v, c.a)));
}

/// A softmax state of this thread's two rows (g and g + 8 of an m16 tile) over NT n8 column tiles.
template <int NT>
struct FragState {
  float m[2], l[2], o[NT][4];
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  }
  __device__ __forceinline__ void fold(const FragState& x) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const Merge c = merge_of(m[r], x.m[r]);
      l[r] = merge_val(c, l[r], x.l[r]);
      m[r] = c.M;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        o[j][2 * r] = merge_val(c, o[j][2 * r], x.o[j][2 * r]);
        o[j][2 * r + 1] = merge_val(c, o[j][2 * r + 1], x.o[j][2 * r + 1]);
      }
    }
  }
};

/// A softmax state whose O lives in shared memory (row-major [rows][HD] fp32, this thread's
/// elements only) and whose (m, l) this thread keeps for its two rows.
template <int HD, int NT>
struct SmemState {
  float m[2], l[2];
  float* o;  ///< row 0 of the m16 tile
  int col0;
  __device__ __forceinline__ float* at(int r, int j, int lane) const {
    return o + ((lane >> 2) + 8 * r) * HD + col0 + 8 * j + 2 * (lane & 3);
  }
  __device__ __forceinline__ void clear() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }
  /// this = merge(this, x), the same arithmetic as FragState::fold.
  __device__ __forceinline__ void fold(const FragState<NT>& x, int lane) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const Merge c = merge_of(m[r], x.m[r]);
      l[r] = merge_val(c, l[r], x.l[r]);
      m[r] = c.M;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float2* e = reinterpret_cast<float2*>(at(r, j, lane));
        const float2 v = c.kind == 1 ? make_float2(0.f, 0.f) : *e;  // kind 1 never reads (the slot may hold stale bits)
        *e = make_float2(merge_val(c, v.x, x.o[j][2 * r]), merge_val(c, v.y, x.o[j][2 * r + 1]));
      }
    }
  }
  __device__ __forceinline__ void load(FragState<NT>& x, int lane) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      x.m[r] = m[r];
      x.l[r] = l[r];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(at(r, j, lane));
        x.o[j][2 * r] = v.x;
        x.o[j][2 * r + 1] = v.y;
      }
    }
  }
};

__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

/// The tile partial of one m16 tile (rows from `Qm`) over one 64-position tile (`Ks`, `Vs`,
/// positions >= nvalid masked; their V rows must be finite), output columns col0 .. col0 + 8 NT.
template <int HD, int NT>
__device__ __forceinline__ void tile_partial(const __nv_bfloat16* Qm, const __nv_bfloat16* Ks, const __nv_bfloat16* Vs,
                                             int col0, int nvalid, float sl2, int lane, FragState<NT>& t) {
  constexpr int LD = Geom<HD>::kLD;
  float s[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, smem_u32(Qm + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 + (lane >> 4) * 8));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, smem_u32(Ks + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + ks * 16 + ((lane >> 3) & 1) * 8));
      mma_bf16_16816(s[2 * np], a, b[0], b[1]);
      mma_bf16_16816(s[2 * np + 1], a, b[2], b[3]);
    }
  }
  const int q4 = lane & 3;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = i * 8 + 2 * q4 + (e & 1);
      const float v = key < nvalid ? __fmul_rn(s[i][e], sl2) : -INFINITY;
      s[i][e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
  }
  uint32_t pa[4][4];
  float l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    __nv_bfloat16 pb[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v = s[i][e];
      pb[e] = __float2bfloat16_rn(v == -INFINITY ? 0.f : exp2f(__fsub_rn(v, mx[e >> 1])));
      l[e >> 1] = __fadd_rn(l[e >> 1], __bfloat162float(pb[e]));
    }
    // The S accumulator of n8 tile i is the A fragment half of k16 block i / 2 (FA2).
    pa[i >> 1][(i & 1) * 2] = pack_bf16(pb[0], pb[1]);
    pa[i >> 1][(i & 1) * 2 + 1] = pack_bf16(pb[2], pb[3]);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = __fadd_rn(l[r], __shfl_xor_sync(0xffffffffu, l[r], 1));
    l[r] = __fadd_rn(l[r], __shfl_xor_sync(0xffffffffu, l[r], 2));
    t.m[r] = mx[r];
    t.l[r] = l[r];
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) t.o[j][0] = t.o[j][1] = t.o[j][2] = t.o[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int jp = 0; jp < (NT + 1) / 2; ++jp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, smem_u32(Vs + (kk * 16 + (lane & 15)) * LD + col0 + jp * 16 + (lane >> 4) * 8));
      mma_bf16_16816(t.o[2 * jp], pa[kk], b[0], b[1]);
      if (2 * jp + 1 < NT) mma_bf16_16816(t.o[2 * jp + 1], pa[kk], b[2], b[3]);
    }
  }
}

/// Stores this thread's part of a fragment state as partial entries of rows row0 + g, row0 + g
/// + 8 (< R) of an item: `entry_of(row)` gives the entry; (m, l) by one thread per row.
template <int HD, int NT, class EntryOf>
__device__ __forceinline__ void store_state(const AttnPartials& P, const FragState<NT>& st, int row0, int R, int col0,
                                            bool write_ml, int lane, EntryOf entry_of) {
  const int g = lane >> 2, q4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= R) continue;
    const size_t e = entry_of(row);
    float* po = P.o + e * HD + col0 + 2 * q4;
#pragma unroll
    for (int j = 0; j < NT; ++j)
      __stcg(reinterpret_cast<float2*>(po + 8 * j), make_float2(st.o[j][2 * r], st.o[j][2 * r + 1]));
    if (write_ml && q4 == 0) __stcg(&P.ml[e], make_float2(st.m[r], st.l[r]));
  }
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/// Runs `body(j, K, V)` over tiles j = 0 .. ntiles - 1 that `load(j, K, V)` brings into a ring of
/// kStages shared-memory stages (cp.async, kStages - 1 tiles ahead). Copies issued before the
/// call (the item's Q rows) complete with the first tile.
template <int HD, class Load, class Body>
__device__ __forceinline__ void tile_pipeline(uint8_t* ring, int ntiles, Load load, Body body) {
  constexpr int LD = Geom<HD>::kLD;
  auto kst = [&](int s) { return reinterpret_cast<__nv_bfloat16*>(ring + s * 2 * Geom<HD>::kTileBytes); };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < ntiles) load(j, kst(j), kst(j) + kAttnTile * LD);
    cp_async_commit();
  }
  for (int j = 0; j < ntiles; ++j) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile j is in; every warp is done with tile j - 1, whose stage is refilled next
    const int jn = j + kStages - 1;
    if (jn < ntiles) load(jn, kst(jn % kStages), kst(jn % kStages) + kAttnTile * LD);
    cp_async_commit();
    body(j, kst(j % kStages), kst(j % kStages) + kAttnTile * LD);
  }
  cp_async_wait<0>();
  __syncthreads();
}

/// Q rows of an item into Qs [rows_alloc][LD]: row r = (token t0 + r / group, head kvh * group +
/// r % group) for r < R, zero rows after.
template <int HD>
__device__ __forceinline__ void load_q(const AttnParams& p, __nv_bfloat16* Qs, int kvh, int t0, int R, int rows_alloc) {
  constexpr int CH = HD / 8, LD = Geom<HD>::kLD;
  for (int i = threadIdx.x; i < rows_alloc * CH; i += kThreads) {
    const int r = i / CH, c = i - r * CH;
    if (r < R) {
      const int t = t0 + r / p.group, head = kvh * p.group + r % p.group;
      cp_async_16(Qs + r * LD + c * 8, p.q + (static_cast<size_t>(t) * p.num_heads + head) * HD + c * 8);
    } else {
      *reinterpret_cast<uint4*>(Qs + r * LD + c * 8) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

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

/// Loads committed tile c of kv head kvh (64 contiguous cache rows) into K / V.
template <int HD>
__device__ __forceinline__ void load_committed_tile(const AttnParams& p, int kvh, int c, __nv_bfloat16* K,
                                                    __nv_bfloat16* V) {
  constexpr int LD = Geom<HD>::kLD, CH = HD / 8;
  const size_t row0 = static_cast<size_t>(kvh) * p.slots + static_cast<size_t>(c) * kAttnTile;
  for (int i = threadIdx.x; i < kAttnTile * CH; i += kThreads) {
    const int r = i / CH, ch = i - r * CH;
    cp_async_16(K + r * LD + ch * 8, p.kcache + (row0 + r) * HD + ch * 8);
    cp_async_16(V + r * LD + ch * 8, p.vcache + (row0 + r) * HD + ch * 8);
  }
}

/// A main item: the tiles below cf of unit u (split mode: spi consecutive splits; super mode:
/// a super) for row group g of kv head kvh. WPM warps per m16 tile, each HD / WPM output
/// columns; the tiles stream through the ring one after the other. Full splits are stored
/// (split mode) or folded into the super state (super mode, its O in shared memory); the
/// split holding cf stores its tiles below cf as the boundary piece.
template <int HD, int WPM>
__device__ void main_item(const AttnParams& p, const Plan& q, int kvh, int g, int u, uint8_t* smem, AttnShared& sh) {
  constexpr int NC = HD / WPM, NT = NC / 8, MTA = 8 / WPM, LD = Geom<HD>::kLD;
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
  ss.o = reinterpret_cast<float*>(smem + Geom<HD>::kSuper) + mt * 16 * HD;
  ss.col0 = col0;
  ss.clear();
  tile_pipeline<HD>(
      smem + Geom<HD>::kRing, c_hi - c_lo,
      [&](int j, __nv_bfloat16* K, __nv_bfloat16* V) { load_committed_tile<HD>(p, kvh, c_lo + j, K, V); },
      [&](int j, const __nv_bfloat16* Ks, const __nv_bfloat16* Vs) {
        const int c = c_lo + j;
        if (active) {
          tile_partial<HD, NT>(Qs + mt * 16 * LD, Ks, Vs, col0, kAttnTile, sl2, lane, ts);
          ps.fold(ts);
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

/// A main item of one split (split mode, one split per item) whose query rows fit one m16 tile
/// (R <= 16: a decode step's rows of a kv head): the narrow scheme of the tail items instead of
/// main_item's, where all 8 warps would compute the same S for 16 output columns each. The split's
/// up to 4 tiles are loaded at once and computed side by side (4 tile slots x 2 column halves);
/// slots 1-3 hand their tile states to slot 0 through the free rows of the super area, and slot 0
/// folds them in tile order into the split state: the same FragState::fold calls on the same
/// tile states as main_item's loop, hence the same bits.
template <int HD>
__device__ void main_item_narrow(const AttnParams& p, const Plan& q, int kvh, int u, uint8_t* smem, AttnShared& sh) {
  constexpr int NT = HD / 16, LD = Geom<HD>::kLD;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = warp >> 1, col0 = (warp & 1) * (HD / 2);
  const int G = p.group, R = G;  // one token (row group 0 holds it)
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  load_q<HD>(p, Qs, kvh, 0, R, 16);
  const int c_lo = u * kAttnTilesPerSplit, c_hi = min(c_lo + kAttnTilesPerSplit, q.cf);
  const int cnt = c_hi - c_lo;
  uint8_t* ring = smem + Geom<HD>::kRing;
  for (int j = 0; j < cnt; ++j) {
    __nv_bfloat16* K = reinterpret_cast<__nv_bfloat16*>(ring + j * 2 * Geom<HD>::kTileBytes);
    load_committed_tile<HD>(p, kvh, c_lo + j, K, K + kAttnTile * LD);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // Hand-over area: rows 16 .. 63 of the super area (row-major [16][HD] fp32 per slot 1..3, the
  // SmemState layout) and rows 16 .. of the Q area for (m, l) ([slot][16] float2); main_item
  // uses neither for R <= 16.
  float* xo = reinterpret_cast<float*>(smem + Geom<HD>::kSuper) + 16 * HD;
  float2* xml = reinterpret_cast<float2*>(Qs + 16 * LD);
  FragState<NT> ts;
  const float sl2 = p.scale * kLog2e;
  if (slot < cnt) {
    const __nv_bfloat16* K = ring_k<HD>(ring, slot);
    tile_partial<HD, NT>(Qs, K, K + kAttnTile * LD, col0, kAttnTile, sl2, lane, ts);
    if (slot > 0) {
      SmemState<HD, NT> x;
      x.o = xo + (slot - 1) * 16 * HD;
      x.col0 = col0;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int jj = 0; jj < NT; ++jj)
          *reinterpret_cast<float2*>(x.at(r, jj, lane)) = make_float2(ts.o[jj][2 * r], ts.o[jj][2 * r + 1]);
      if ((warp & 1) == 0 && (lane & 3) == 0) {
        xml[(slot - 1) * 16 + (lane >> 2)] = make_float2(ts.m[0], ts.l[0]);
        xml[(slot - 1) * 16 + (lane >> 2) + 8] = make_float2(ts.m[1], ts.l[1]);
      }
    }
  }
  __syncthreads();
  const int s = c_lo / kAttnTilesPerSplit;
  if (slot == 0) {
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
    auto row_entry = [&](int index) {
      return [&, index](int row) { return entry(p, q, index, row / G, kvh * G + row % G); };
    };
    const bool write_ml = (warp & 1) == 0;
    if ((s + 1) * kAttnTilesPerSplit > q.cf)
      store_state<HD, NT>(p.boundary, ps, 0, R, col0, write_ml, lane, row_entry(0));
    else
      store_state<HD, NT>(p.split, ps, 0, R, col0, write_ml, lane, row_entry(s));
  }
  // A full split counts for its super (split mode without direct folds): every thread takes part.
  if (!q.direct && s < q.nfull) arrive_splits<HD>(p, q, kvh, 0, s, s + 1, sh);
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
    else
      main_item<HD, 2>(p, q, kvh, g, u, smem, sh);
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

/// SWIFTSPEC_ATTN_NARROW=0: decode steps' main items keep main_item's scheme (the same bits).
int narrow_allowed() {
  const char* e = std::getenv("SWIFTSPEC_ATTN_NARROW");
  return e && std::strcmp(e, "0") == 0 ? 0 : 1;
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
  AttnParams p = params;
  p.ctas = std::max(1, ctas_override(ctas));
  p.narrow = narrow_allowed();
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
  fc.gridDim =
      dim3(static_cast<unsigned>(p.num_kv_heads * kMaxStepTokens * ((p.group + fold_rows - 1) / fold_rows)), 1, 1);
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
