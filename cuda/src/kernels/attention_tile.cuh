// The split-K attention's building blocks (attention.h): the step's work plan, the online-softmax
// merge, and one warp's partial of a 64-key tile (FA2-style, P in registers), with its stores and
// the cp.async pipeline that streams the tiles. Device code of attention_decode.cu (and of
// attention_fold.cuh), its only includers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common.h"
#include "kernels/attention.h"

// Internal to attention_decode.cu (its only includer): an anonymous namespace, as there.
namespace swiftspec::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxRows = 128;  ///< query rows of a main item at most (8 m16 tiles; AttnParams::max_rows)
constexpr int kStages = 4;     ///< K/V tiles in flight per CTA
constexpr int kTilesPerSuper = kAttnTilesPerSplit * kAttnSplitsPerSuper;
constexpr int kPieceBatch = 8;  ///< pieces whose loads a fold issues before merging them
/// Split mode with at most this many full splits folds them in the fold kernel directly.
constexpr int kDirectSplits = 16;
constexpr float kLog2e = 1.4426950408889634f;

/// Shared memory of a CTA: the item's Q rows, the K/V ring and the super state's O of a main
/// item (its m and l stay in registers). Items of up to 64 rows (and the narrow and tail items)
/// use a ring of kStages stages and the super area after it (the narrow items' hand-over area
/// too); items of more rows use kStages - 1 stages and a super area of kMaxRows rows that starts
/// at the last stage.
template <int HD>
struct Geom {
  static constexpr int kLD = HD + 8;  ///< bf16 row stride of the Q / K / V tiles (ldmatrix without bank conflicts)
  static constexpr size_t kQBytes = size_t(kMaxRows) * kLD * 2;
  static constexpr size_t kTileBytes = size_t(kAttnTile) * kLD * 2;
  static constexpr size_t kRingBytes = size_t(kStages) * 2 * kTileBytes;
  static constexpr size_t kRing = kQBytes;
  static constexpr size_t kSuper = kRing + kRingBytes;  ///< 64 rows (items of up to 4 m16 tiles)
  static constexpr size_t kSuperWide = kRing + size_t(kStages - 1) * 2 * kTileBytes;  ///< kMaxRows rows
  static constexpr size_t kSmemNarrow = kSuper + size_t(64) * HD * 4;
  static constexpr size_t kSmemWide = kSuperWide + size_t(kMaxRows) * HD * 4;
  static constexpr size_t kSmem = kSmemNarrow > kSmemWide ? kSmemNarrow : kSmemWide;
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
  /// One token (a decode step), either mode: main_item_narrow.
  int narrow = 0;
  int n_tail = 0, n_main = 0;
};

__device__ Plan make_plan(const AttnParams& p) {
  Plan q;
  const StepDesc* d = p.desc;
  q.n = d->n;
  q.cf = d->committed / kAttnTile;
  q.nfull = q.cf / kAttnTilesPerSplit;
  q.tpg = max(1, p.max_rows / p.group);
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
  // (p.narrow 1: only items of one split in split mode, the rule before several splits per item)
  q.narrow = q.n == 1 && (p.narrow == 2 || (p.narrow == 1 && q.split_mode && q.spi == 1)) ? 1 : 0;
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

/// The scores of a tile partial for one m16 tile (rows from `Qm`) over one 64-position tile (`Ks`,
/// positions >= nvalid masked): S = Q K^T (mma.sync, k over head_dim in order), the row max m over
/// the 64 positions, P = bf16(2^(s - m)) as the A fragments of P V, l = sum of P (per thread in
/// position order, then across the quad).
template <int HD>
__device__ __forceinline__ void tile_scores(const __nv_bfloat16* Qm, const __nv_bfloat16* Ks, int nvalid, float sl2,
                                            int lane, uint32_t (&pa)[4][4], float (&m)[2], float (&l)[2]) {
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
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    __nv_bfloat16 pb[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v = s[i][e];
      pb[e] = __float2bfloat16_rn(v == -INFINITY ? 0.f : exp2f(__fsub_rn(v, mx[e >> 1])));
      sum[e >> 1] = __fadd_rn(sum[e >> 1], __bfloat162float(pb[e]));
    }
    // The S accumulator of n8 tile i is the A fragment half of k16 block i / 2 (FA2).
    pa[i >> 1][(i & 1) * 2] = pack_bf16(pb[0], pb[1]);
    pa[i >> 1][(i & 1) * 2 + 1] = pack_bf16(pb[2], pb[3]);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] = __fadd_rn(sum[r], __shfl_xor_sync(0xffffffffu, sum[r], 1));
    sum[r] = __fadd_rn(sum[r], __shfl_xor_sync(0xffffffffu, sum[r], 2));
    m[r] = mx[r];
    l[r] = sum[r];
  }
}

/// O = P V of a tile partial (P from tile_scores, V rows of the tile in `Vs`; masked positions'
/// V rows must be finite) for output columns col0 .. col0 + 8 NT (mma.sync, k over the 64
/// positions in order): each column's sum is the same whichever columns a call covers.
template <int HD, int NT>
__device__ __forceinline__ void tile_pv(const uint32_t (&pa)[4][4], const __nv_bfloat16* Vs, int col0, int lane,
                                        float (&o)[NT][4]) {
  constexpr int LD = Geom<HD>::kLD;
#pragma unroll
  for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int jp = 0; jp < (NT + 1) / 2; ++jp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, smem_u32(Vs + (kk * 16 + (lane & 15)) * LD + col0 + jp * 16 + (lane >> 4) * 8));
      mma_bf16_16816(o[2 * jp], pa[kk], b[0], b[1]);
      if (2 * jp + 1 < NT) mma_bf16_16816(o[2 * jp + 1], pa[kk], b[2], b[3]);
    }
  }
}

/// The tile partial of one m16 tile (rows from `Qm`) over one 64-position tile (`Ks`, `Vs`,
/// positions >= nvalid masked; their V rows must be finite), output columns col0 .. col0 + 8 NT:
/// tile_scores, then tile_pv.
template <int HD, int NT>
__device__ __forceinline__ void tile_partial(const __nv_bfloat16* Qm, const __nv_bfloat16* Ks, const __nv_bfloat16* Vs,
                                             int col0, int nvalid, float sl2, int lane, FragState<NT>& t) {
  uint32_t pa[4][4];
  tile_scores<HD>(Qm, Ks, nvalid, sl2, lane, pa, t.m, t.l);
  tile_pv<HD, NT>(pa, Vs, col0, lane, t.o);
}

/// this = merge(this, the tile partial of Qm over Ks / Vs), all HD columns, without holding the
/// tile's whole O: its P V is computed and merged half the columns at a time. The same merges
/// of the same values as tile_partial followed by FragState::fold (per element), hence the same
/// bits, in fewer registers (one warp per m16 tile with every output column).
template <int HD, int NT>
__device__ __forceinline__ void fold_tile_partial(FragState<NT>& st, const __nv_bfloat16* Qm, const __nv_bfloat16* Ks,
                                                  const __nv_bfloat16* Vs, int nvalid, float sl2, int lane) {
  static_assert(NT * 8 == HD && NT % 2 == 0, "fold_tile_partial covers every column, in two halves");
  uint32_t pa[4][4];
  float tm[2], tl[2];
  tile_scores<HD>(Qm, Ks, nvalid, sl2, lane, pa, tm, tl);
  Merge c[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    c[r] = merge_of(st.m[r], tm[r]);
    st.l[r] = merge_val(c[r], st.l[r], tl[r]);
    st.m[r] = c[r].M;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float o[NT / 2][4];
    tile_pv<HD, NT / 2>(pa, Vs, h * (HD / 2), lane, o);
#pragma unroll
    for (int j = 0; j < NT / 2; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        st.o[h * (NT / 2) + j][2 * r] = merge_val(c[r], st.o[h * (NT / 2) + j][2 * r], o[j][2 * r]);
        st.o[h * (NT / 2) + j][2 * r + 1] = merge_val(c[r], st.o[h * (NT / 2) + j][2 * r + 1], o[j][2 * r + 1]);
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
/// STAGES shared-memory stages (cp.async, STAGES - 1 tiles ahead). Copies issued before the
/// call (the item's Q rows) complete with the first tile.
template <int HD, int STAGES, class Load, class Body>
__device__ __forceinline__ void tile_pipeline(uint8_t* ring, int ntiles, Load load, Body body) {
  constexpr int LD = Geom<HD>::kLD;
  auto kst = [&](int s) { return reinterpret_cast<__nv_bfloat16*>(ring + s * 2 * Geom<HD>::kTileBytes); };
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j < ntiles) load(j, kst(j), kst(j) + kAttnTile * LD);
    cp_async_commit();
  }
  for (int j = 0; j < ntiles; ++j) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile j is in; every warp is done with tile j - 1, whose stage is refilled next
    const int jn = j + STAGES - 1;
    if (jn < ntiles) load(jn, kst(jn % STAGES), kst(jn % STAGES) + kAttnTile * LD);
    cp_async_commit();
    body(j, kst(j % STAGES), kst(j % STAGES) + kAttnTile * LD);
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

}  // namespace
}  // namespace swiftspec::cuda
