// Attention of a decode / verification step over the committed KV plus the
// tree KV with the tree mask (SwiftSpec ASPLOS'26 §4.2 tree-aware KV cache,
// §5.2 fused kernels).
//
// Logical key order of token t: committed slots [0, prefix_len_t), then its
// tree ancestors by depth (the attend list, itself last). A tree key at depth
// a sits at logical position committed + a for every token that attends it,
// so a chunk of kAttnChunk logical positions is the same set of keys for all
// tokens of a step; the union of the chunk's keys over a block of tokens is
// loaded once and masked per token.
//
// Grid: (kv head, token block of T <= 4 tokens, kAttnSplits); CTA z takes the
// chunks from the last one down (the chunk holding the tree positions costs
// the most and is dispatched first). Per chunk a CTA
//   1. builds the union of its tokens' keys in logical order, with a
//      per-token mask, each key's logical position, and per token the union
//      index of its key at each position (at most one per position); when the
//      union exceeds kVCap V rows, one token per pass instead,
//   2. S = Q K^T with mma.sync (one dot product per element: its value does
//      not depend on where the key or the query row sits in the tile), kept
//      per (query row, logical position),
//   3. per query row: max, P = bf16(exp(s - max)) per logical position (0
//      where the token has no key), l = the sum of P in a fixed warp order,
//   4. O = P V on the tensor cores, one m16 tile per token (its heads): the k
//      index is the logical position and the B rows are the V rows of the
//      token's own keys (a zero row where it has none), gathered by ldmatrix
//      addresses. A token's tile is the same matrices in the same k order
//      whether it is decoded alone or verified inside a tree, whatever the
//      other tokens of the block or the pass are,
//   5. writes (max, l, O) of the chunk.
// The last CTA of a (kv head, token block) — an atomic counter, reset by that
// CTA — combines the chunks in chunk order. The arithmetic seen by a token is
// therefore the same whether it is decoded alone or verified inside a tree,
// and whatever the step's batch size (checked bitwise by swiftspec-cuda-check).
// Measured (benchmarks/README.md, run 15): the phases of each CTA are
// latency-bound; CTAs with more tokens lengthen them (slower), P V on CUDA
// cores was the longest phase.
//
// Shared-prefix CTAs (AttnParams::shared_prefix, run 19). A chunk that lies
// wholly inside the committed prefix C holds the same 64 keys, unmasked, for
// every token of the step (every token attends [0, C)). With shared_prefix
// such chunks are computed by a grid of their own, once per (kv head, group
// of kPrefixBlocks token blocks, chunk): K and V are loaded once, the group's
// query rows (<= 64) sit in four m16 tiles, and the P V tiles hold several
// tokens (their B rows are the same V rows). A second grid of per-block CTAs
// (the tail) takes the chunks from floor(C / 64) on (the tree positions); it
// starts while the first runs (PDL) and waits for it only before combining.
// Every output element is the same dot products in the same k order as in a
// per-block CTA (an mma element depends only on its A row and B column), and
// the combine is the same code: a token's result is bit-identical either way
// (checked by swiftspec-cuda-check: tree == decode alone, and the step
// tuner's bitwise comparison of its candidates). A 64-node step at context
// 512: 256 + 128 CTAs with keys instead of 1152 (~2.2 waves), and the combine
// stays in the per-block CTAs (when the shared-prefix CTAs combined their
// four blocks in turn, the last one's combine took 13-17 us: slower).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cmath>

#include "common.h"
#include "kernels/kernels.h"

namespace swiftspec::cuda {

namespace {

constexpr int kAttnThreads = 256;
constexpr int kMaxTokPerBlock = 4;  ///< tokens per CTA (<= 16 query rows)
constexpr int kUnionMax = kAttnChunk * kMaxTokPerBlock;  ///< a chunk's union over the block, at most
// Union keys whose V rows fit in shared memory at once. 64 (one chunk's
// positions, so a one-token pass always fits): 51 KB per CTA, four CTAs per SM
// (the registers allow four); 128 took 68 KB, three per SM, and a 64-node tree
// step's 1152 CTAs ran in ~3 waves (run 15).
constexpr int kVCap = 64;
constexpr int kListMax = 128;       ///< attend-list entries per token kept in shared memory
constexpr int kPrefixBlocks = 4;    ///< token blocks per shared-prefix CTA (<= 64 query rows)
constexpr int kPrefixRows = 16 * kPrefixBlocks;
/// Splits of the per-block CTAs when shared-prefix CTAs take the full
/// committed chunks: what is left is the chunk(s) holding position C and the
/// tree positions, at most two for a step of <= 64 tokens (a CTA loops over
/// more if there are).
constexpr int kTailSplits = 2;

template <int HD>
struct AttnGeom {
  static constexpr int kLD = HD + 8;            ///< bf16 row stride (bank spread)
  static constexpr int kSLD = kAttnChunk + 1;   ///< fp32 score row stride
  static constexpr int kPLD = kAttnChunk + 8;   ///< bf16 P row stride
  static constexpr int kDPT = HD / 16;          ///< combine: dims per thread (16 threads per row)
  static constexpr size_t smem_bytes() {
    return size_t(16 + 64 + kVCap + 1) * kLD * 2      // Qs, Ks, Vs (+ a zero row)
           + size_t(16) * kSLD * 4                     // Ss
           + size_t(17) * kPLD * 2                     // Pb (+ a zero row)
           + size_t(kUnionMax) * 4                     // keys
           + size_t(kMaxTokPerBlock) * kAttnChunk * 2  // kidx
           + size_t(kUnionMax) * 2                     // kmask
           + size_t(kUnionMax);                        // kpos
  }
};

/// Shared memory of a shared-prefix CTA: Q of the group's rows, one chunk's K
/// and V, the scores by key; P (bf16) is written over K once the scores are
/// done.
template <int HD>
struct PrefixGeom {
  static constexpr int kLD = HD + 8;
  static constexpr int kSLD = kAttnChunk + 1;
  static constexpr int kPLD = kAttnChunk + 8;
  static_assert(kPLD <= kLD, "P rows must fit in the K rows they overwrite");
  static constexpr size_t smem_bytes() {
    return size_t(3) * kPrefixRows * kLD * 2 + size_t(kPrefixRows) * kSLD * 4;
  }
};

/// Statically allocated shared state of a per-block CTA.
struct AttnShared {
  int U;
  int last;
  int nch[kMaxTokPerBlock];     ///< per token: chunks it attends
  int prefix[kMaxTokPerBlock];  ///< per token: committed keys it attends
  int len[kMaxTokPerBlock];     ///< per token: tree keys it attends
  // The block's attend lists (ancestor slots by depth), loaded once: the
  // union of a tree chunk walks them position by position (a dependent
  // global load per position cost ~0.15 us each on the critical path).
  int list[kMaxTokPerBlock][kListMax];
  float m[16];  ///< per query row of the pass: the chunk's max and sum of P
  float l[16];
};

/// Statically allocated shared state of a shared-prefix CTA.
struct PrefixShared {
  float m[kPrefixRows];  ///< per query row of the group: the chunk's max and sum of P
  float l[kPrefixRows];
};

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

/// Launch geometry beside AttnParams (set by launch_attention_hd).
struct AttnGrid {
  int blocks = 0;        ///< token blocks of the bucket
  int block_splits = 0;  ///< per-block CTAs per token block: kAttnSplits, or kTailSplits after shared-prefix CTAs
  int groups = 0;        ///< shared-prefix CTA groups (0: none)
};

/// The CTA's row of phase stamps (AttnParams::trace), or null.
__device__ __forceinline__ unsigned long long* trace_row(const AttnParams& p, int kvh, int tb, int tz) {
  return p.trace == nullptr || tb >= kMaxStepTokens
             ? nullptr
             : p.trace + ((static_cast<size_t>(kvh) * kMaxStepTokens + tb) * kAttnSplits + tz) * kAttnTraceStamps;
}

__device__ __forceinline__ void trace_stamp(unsigned long long* tr, int i) {
  if (tr != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    tr[i] = t;
  }
}

/// One query row of a chunk: max, P = bf16(exp(s - max)) per logical position
/// (0 where s = -inf, i.e. no key), l = the sum of P in a fixed warp order.
/// Both CTA kinds call this, so a row's P and l are the same bits in either.
__device__ __forceinline__ void chunk_softmax_row(const float* srow, __nv_bfloat16* prow, float* m_out, float* l_out,
                                                  int lane) {
  const float s0 = srow[lane], s1 = srow[lane + 32];
  float mx = fmaxf(s0, s1);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const __nv_bfloat16 p0 = __float2bfloat16_rn((mx == -INFINITY || s0 == -INFINITY) ? 0.f : expf(s0 - mx));
  const __nv_bfloat16 p1 = __float2bfloat16_rn((mx == -INFINITY || s1 == -INFINITY) ? 0.f : expf(s1 - mx));
  prow[lane] = p0;
  prow[lane + 32] = p1;
  float l = __bfloat162float(p0) + __bfloat162float(p1);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) {
    *m_out = mx;
    *l_out = l;
  }
}

/// Combines the chunk partials of tokens tok0 .. tok0 + tact - 1 (one token
/// block, <= 16 query rows; 16 threads per row) in chunk order and writes the
/// attention output. nch[t]: chunks token t attends.
template <int HD>
__device__ void combine_block(const AttnParams& p, int kvh, int tok0, int tact, const int* nch) {
  constexpr int DPT = AttnGeom<HD>::kDPT;
  const int tid = threadIdx.x;
  const int G = p.group;
  const int H = p.num_heads;
  // Role in the combine: query row prh, dims pd0..pd0+DPT-1 (16 threads per row).
  const int prh = tid >> 4;
  const int pd0 = (tid & 15) * DPT;
  const int pt = prh / G;
  if (prh < tact * G) {
    const int p_tk = tok0 + pt;
    const int p_head = kvh * G + prh % G;
    const int p_nch = nch[pt];
    // Combine in chunk order. The loads of a batch of chunks are all issued
    // before its adds (one L2 round trip per batch instead of per chunk); the
    // arithmetic is the same sequence as chunk by chunk.
    constexpr int kB = 4;  // 8: 112 registers (ptxas), 2 CTAs per SM instead of 3
    const float2* ml = p.part_ml + (static_cast<size_t>(p_tk) * H + p_head) * p.max_chunks;
    const float* pob = p.part_o + (static_cast<size_t>(p_tk) * H + p_head) * p.max_chunks * HD + pd0;
    float M = -INFINITY;
#pragma unroll 4
    for (int c = 0; c < p_nch; ++c) M = fmaxf(M, __ldcg(&ml[c]).x);
    float o[DPT];
#pragma unroll
    for (int j = 0; j < DPT; ++j) o[j] = 0.f;
    float lsum = 0.f;
    for (int c0 = 0; c0 < p_nch; c0 += kB) {
      float2 v[kB];
      float pv[kB][DPT];
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        if (c0 + i < p_nch) {
          v[i] = __ldcg(&ml[c0 + i]);
#pragma unroll
          for (int j = 0; j < DPT; j += 4) {
            const float4 f = __ldcg(reinterpret_cast<const float4*>(pob + static_cast<size_t>(c0 + i) * HD + j));
            pv[i][j] = f.x;
            pv[i][j + 1] = f.y;
            pv[i][j + 2] = f.z;
            pv[i][j + 3] = f.w;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        if (c0 + i < p_nch) {
          const float w = expf(v[i].x - M);
          lsum = fmaf(w, v[i].y, lsum);
#pragma unroll
          for (int j = 0; j < DPT; ++j) o[j] = fmaf(w, pv[i][j], o[j]);
        }
      }
    }
    const float inv = 1.0f / lsum;
    __nv_bfloat16* out = p.out + (static_cast<size_t>(p_tk) * H + p_head) * HD + pd0;
#pragma unroll
    for (int j = 0; j < DPT; ++j) out[j] = __float2bfloat16_rn(o[j] * inv);
  }
}

/// A per-block CTA: token block `blk`, chunks nlo .. nch - 1 of its tokens
/// (the last first), split `split` of `nsplit`; see the file comment.
template <int HD>
__device__ void block_cta(const AttnParams& p, AttnShared& sh, uint8_t* smem_raw, int kvh, int blk, int split,
                          int nsplit, bool prefix_ctas, unsigned long long* tr) {
  using Geom = AttnGeom<HD>;
  constexpr int LD = Geom::kLD, SLD = Geom::kSLD, PLD = Geom::kPLD;
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  constexpr int ZROW = kVCap;  // the zero row of Vs
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [16][LD]
  __nv_bfloat16* Ks = Qs + 16 * LD;                                // [64][LD] one block of union keys
  __nv_bfloat16* Vs = Ks + 64 * LD;                                // [kVCap + 1][LD] the pass's union
  float* Ss = reinterpret_cast<float*>(Vs + (kVCap + 1) * LD);      // [16][SLD] by logical position
  __nv_bfloat16* Pb = reinterpret_cast<__nv_bfloat16*>(Ss + 16 * SLD);  // [17][PLD]
  int* keys = reinterpret_cast<int*>(Pb + 17 * PLD);                // [kUnionMax] cache row of union key u
  int16_t* kidx = reinterpret_cast<int16_t*>(keys + kUnionMax);     // [4][64] union index or -1
  uint16_t* kmask = reinterpret_cast<uint16_t*>(kidx + kMaxTokPerBlock * kAttnChunk);  // [kUnionMax]
  uint8_t* kpos = reinterpret_cast<uint8_t*>(kmask + kUnionMax);    // [kUnionMax] logical position in the chunk
  const auto stamp = [&](int i) { trace_stamp(tr, i); };

  const StepDesc* d = p.desc;
  const int T = p.tokens_per_block;
  const int G = p.group;
  const int n = d->n;
  const int tok0 = blk * T;
  if (tok0 >= n) return;
  const int tact = min(T, n - tok0);
  const int C = d->committed;
  const bool tree = d->is_tree != 0;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int H = p.num_heads;
  if (tid < tact) {
    const int tk = tok0 + tid;
    const int off = d->attend_off[tk];
    const int len = tree ? d->attend_off[tk + 1] - off : 0;
    const int P = d->prefix_len[tk];
    sh.prefix[tid] = P;
    sh.len[tid] = len;
    sh.nch[tid] = (P + len + kAttnChunk - 1) / kAttnChunk;
  }
  __syncthreads();
  int nch = 0;
  for (int t = 0; t < tact; ++t) nch = max(nch, sh.nch[t]);
  // Chunks below nlo are the shared-prefix CTAs' (every token attends them whole).
  const int nlo = prefix_ctas ? C / kAttnChunk : 0;
  // The last chunks first: the one holding the tree positions costs the most
  // (its union walk, more keys), and CTAs start in blockIdx.y order.
  if (split >= nch - nlo) return;
  const int RH = T * G;  // query rows of the block (<= 16)

  // Q by cp.async, in flight while the keys are listed (the scores' wait covers it).
  for (int i = tid; i < 16 * CH; i += kAttnThreads) {
    const int rh = i / CH;
    const int ch = i - rh * CH;
    if (rh < RH && rh / G < tact) {
      const int tk = tok0 + rh / G;
      const int head = kvh * G + rh % G;
      cp_async_16(Qs + rh * LD + ch * 8, p.q + (static_cast<size_t>(tk) * H + head) * HD + ch * 8);
    } else {
      *reinterpret_cast<uint4*>(Qs + rh * LD + ch * 8) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  cp_async_commit();
  // The attend lists, only where a chunk of this CTA holds tree positions.
  bool lists = false;
  for (int cs = split; cs < nch - nlo; cs += nsplit) lists = lists || (tree && (nch - cs) * kAttnChunk > C);
  if (lists) {
    for (int i = tid; i < tact * kListMax; i += kAttnThreads) {
      const int t = i / kListMax, a = i - t * kListMax;
      if (a < sh.len[t]) sh.list[t][a] = d->attend_slots[d->attend_off[tok0 + t] + a];
    }
  }
  for (int i = tid; i < HD; i += kAttnThreads) Vs[ZROW * LD + i] = __float2bfloat16_rn(0.f);
  for (int i = tid; i < kAttnChunk; i += kAttnThreads) Pb[16 * PLD + i] = __float2bfloat16_rn(0.f);

  int my_cnt = 0;
  for (int cs = split; cs < nch - nlo; cs += nsplit) {
    ++my_cnt;
    if (my_cnt == 1) stamp(2);
    const int c = nch - 1 - cs;  // see above: the last chunks first
    const int q0 = c * kAttnChunk;
    // Passes over the block's tokens: all at once when the union of their
    // keys fits kVCap V rows; else one token per pass (<= 64 keys). A token's
    // arithmetic is the same in either (its own tile, below).
    for (int pt0 = 0, pn = tact; pt0 < tact;) {
      // ---- 1. union of the pass tokens' keys in logical order ----
      // Committed keys first (logical position = key), then the tree keys of
      // each position (one per distinct ancestor slot among the pass tokens).
      int n1 = 0;
      for (int t = pt0; t < pt0 + pn; ++t) n1 = max(n1, sh.prefix[t]);
      n1 = max(0, min(q0 + kAttnChunk, n1) - q0);
      for (int i = tid; i < kMaxTokPerBlock * kAttnChunk; i += kAttnThreads) {
        const int t = i / kAttnChunk, j = i - t * kAttnChunk;
        kidx[i] = (t >= pt0 && t < pt0 + pn && j < n1 && q0 + j < sh.prefix[t]) ? static_cast<int16_t>(j)
                                                                                 : int16_t(-1);
      }
      for (int i = tid; i < 16 * SLD; i += kAttnThreads) Ss[i] = -INFINITY;
      for (int j = tid; j < n1; j += kAttnThreads) {
        const int key = q0 + j;
        unsigned mk = 0;
        for (int t = pt0; t < pt0 + pn; ++t)
          if (key < sh.prefix[t]) mk |= 1u << t;
        keys[j] = key;
        kmask[j] = static_cast<uint16_t>(mk);
        kpos[j] = static_cast<uint8_t>(j);
      }
      __syncthreads();  // kidx of the tree positions is written below by warp 0
      if (warp == 0) {
        int U = n1;
        if (tree) {
          int mlen = 0;
          for (int t = pt0; t < pt0 + pn; ++t) mlen = max(mlen, sh.len[t]);
          const int qlo = max(q0, C);
          const int qhi = min(q0 + kAttnChunk, C + mlen);
          const bool mine = lane >= pt0 && lane < pt0 + pn;  // lane = token of the block
          const int len = mine ? sh.len[lane] : 0;
          const int off = mine ? d->attend_off[tok0 + lane] : 0;
          for (int q = qlo; q < qhi; ++q) {
            const int a = q - C;
            const int slot = (mine && a < len) ? (a < kListMax ? sh.list[lane][a] : d->attend_slots[off + a]) : -1;
            unsigned same = 0;
            for (int u = pt0; u < pt0 + pn; ++u)
              if (__shfl_sync(0xffffffffu, slot, u) == slot) same |= 1u << u;
            const int first = __ffs(same) - 1;  // the lowest token with this slot leads
            const bool leader = slot >= 0 && first == lane;
            const unsigned lb = __ballot_sync(0xffffffffu, leader);
            if (slot >= 0) {
              const int pos = U + __popc(lb & ((1u << first) - 1u));
              kidx[lane * kAttnChunk + (q - q0)] = static_cast<int16_t>(pos);
              if (leader) {
                keys[pos] = p.max_context + slot;
                kmask[pos] = static_cast<uint16_t>(same);
                kpos[pos] = static_cast<uint8_t>(q - q0);
              }
            }
            U += __popc(lb);
          }
        }
        if (lane == 0) sh.U = U;
      }
      __syncthreads();
      const int U = sh.U;  // <= 64 * pn
      if (U > kVCap) {  // too many distinct keys for one pass: one token at a time
        pn = 1;
        continue;
      }
      if (my_cnt == 1 && pt0 == 0) stamp(3);

      // ---- 2. V of the union (one cp.async group), S = scale * Q K^T per block of 64 keys ----
      for (int i = tid; i < U * CH; i += kAttnThreads) {
        const int u = i / CH;
        const int ch = i - u * CH;
        const size_t row = static_cast<size_t>(kvh) * p.slots + keys[u];
        cp_async_16(Vs + u * LD + ch * 8, p.vcache + row * HD + ch * 8);
      }
      cp_async_commit();
      for (int ub = 0; ub < U; ub += 64) {
        const int nb = min(64, U - ub);
        for (int i = tid; i < nb * CH; i += kAttnThreads) {
          const int u = i / CH;
          const int ch = i - u * CH;
          const size_t row = static_cast<size_t>(kvh) * p.slots + keys[ub + u];
          cp_async_16(Ks + u * LD + ch * 8, p.kcache + row * HD + ch * 8);
        }
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
        if (warp * 8 < nb) {
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int ks = 0; ks < HD / 16; ++ks) {
            uint32_t a[4];
            ldmatrix_x4(a, smem_u32(Qs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 + (lane >> 4) * 8));
            uint32_t b[2];
            ldmatrix_x2(b, smem_u32(Ks + (warp * 8 + (lane & 7)) * LD + ks * 16 + ((lane >> 3) & 1) * 8));
            mma_bf16_16816(acc, a, b[0], b[1]);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int rh = (lane >> 2) + (j >= 2 ? 8 : 0);
            const int u = ub + warp * 8 + (lane & 3) * 2 + (j & 1);
            if (u < U && rh < RH && ((kmask[u] >> (rh / G)) & 1u)) Ss[rh * SLD + kpos[u]] = acc[j] * p.scale;
          }
        }
        __syncthreads();
      }
      if (my_cnt == 1 && pt0 == 0) stamp(4);

      // ---- 3. per query row: max, P = bf16(exp(s - max)) (0 where no key), l = sum of P ----
      for (int rh = warp; rh < 16; rh += kAttnThreads / 32)
        chunk_softmax_row(Ss + rh * SLD, Pb + rh * PLD, &sh.m[rh], &sh.l[rh], lane);
      cp_async_wait_all();  // V
      __syncthreads();

      // ---- 4. O = P V: one m16 tile per token (its heads), the B rows the V rows
      // of the token's own keys (k = logical position; a zero row where it has
      // none), two n8 tiles per warp unit ----
      constexpr int NP = HD / 16;
      for (int w = warp; w < pn * NP; w += kAttnThreads / 32) {
        const int t = pt0 + w / NP;
        const int n0 = (w % NP) * 16;
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        const int ar = (lane & 7) + ((lane >> 3) & 1) * 8;  // A row of this lane's ldmatrix address
        const int prow = ar < G ? t * G + ar : 16;          // rows past the token's heads: the zero row
#pragma unroll
        for (int ks = 0; ks < kAttnChunk / 16; ++ks) {
          uint32_t a[4];
          ldmatrix_x4(a, smem_u32(Pb + prow * PLD + ks * 16 + (lane >> 4) * 8));
          const int u = kidx[t * kAttnChunk + ks * 16 + (lane & 15)];
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_u32(Vs + (u >= 0 ? u : ZROW) * LD + n0 + (lane >> 4) * 8));
          mma_bf16_16816(acc[0], a, b[0], b[1]);
          mma_bf16_16816(acc[1], a, b[2], b[3]);
        }
        // ---- 5. the chunk partial of the token's heads ----
        if (c < sh.nch[t]) {
          const int tk = tok0 + t;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = (lane >> 2) + half * 8;
            if (r < G) {
              float* po = p.part_o + ((static_cast<size_t>(tk) * H + kvh * G + r) * p.max_chunks + c) * HD + n0 +
                          (lane & 3) * 2;
#pragma unroll
              for (int j = 0; j < 2; ++j)
                *reinterpret_cast<float2*>(po + j * 8) = make_float2(acc[j][half * 2], acc[j][half * 2 + 1]);
            }
          }
        }
      }
      if (tid < RH) {
        const int t = tid / G;
        if (t >= pt0 && t < pt0 + pn && c < sh.nch[t])
          p.part_ml[(static_cast<size_t>(tok0 + t) * H + kvh * G + tid % G) * p.max_chunks + c] =
              make_float2(sh.m[tid], sh.l[tid]);
      }
      __syncthreads();
      pt0 += pn;
    }
    if (my_cnt == 1) stamp(5);
  }

  // ---- arrival; the last CTA of the (kv head, token block) combines ----
  if (tid == 0) {
    __threadfence();
    const int prev = atomicAdd(&p.counters[kvh * kMaxStepTokens + blk], my_cnt);
    sh.last = (prev + my_cnt == nch - nlo) ? 1 : 0;
  }
  __syncthreads();
  stamp(6);
  if (!sh.last) return;
  // Tail mode: the shared-prefix grid wrote the other chunks' partials; it has
  // finished once this returns (PDL; a no-op without it: this grid then
  // started after that one's end).
  if (prefix_ctas) griddep_wait();
  __threadfence();
  combine_block<HD>(p, kvh, tok0, tact, sh.nch);
  __syncthreads();
  stamp(7);
  if (tid == 0) p.counters[kvh * kMaxStepTokens + blk] = 0;
}

/// A shared-prefix CTA: the partials of the full committed chunks z, z +
/// kAttnSplits, ... < floor(C / 64) for the tokens of token blocks
/// kPrefixBlocks * g ... (see the file comment); the tail grid combines them.
/// Each chunk's arithmetic per query row is block_cta's.
template <int HD>
__device__ void prefix_cta(const AttnParams& p, PrefixShared& sh, uint8_t* smem_raw, int kvh, int g, int z,
                           unsigned long long* tr) {
  using Geom = PrefixGeom<HD>;
  constexpr int LD = Geom::kLD, SLD = Geom::kSLD, PLD = Geom::kPLD;
  constexpr int CH = HD / 8;
  constexpr int R = kPrefixRows;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [64][LD]
  __nv_bfloat16* Ks = Qs + R * LD;                                 // [64][LD] the chunk's keys
  __nv_bfloat16* Vs = Ks + R * LD;                                 // [64][LD]
  float* Ss = reinterpret_cast<float*>(Vs + R * LD);                // [64][SLD]
  __nv_bfloat16* Pb = Ks;                                          // [64][PLD] over Ks after the scores
  const auto stamp = [&](int i) { trace_stamp(tr, i); };

  const StepDesc* d = p.desc;
  const int T = p.tokens_per_block;
  const int G = p.group;
  const int H = p.num_heads;
  const int n = d->n;
  const int tok0 = g * kPrefixBlocks * T;
  if (tok0 >= n) return;
  const int gact = min(kPrefixBlocks * T, n - tok0);
  const int nfull = d->committed / kAttnChunk;
  if (z >= nfull) return;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int RA = gact * G;  // query rows of the group (<= 64)
  const int mtiles = (RA + 15) / 16;
  for (int i = tid; i < R * CH; i += kAttnThreads) {
    const int rh = i / CH;
    const int ch = i - rh * CH;
    if (rh < RA) {
      const size_t qrow = static_cast<size_t>(tok0 + rh / G) * H + kvh * G + rh % G;
      cp_async_16(Qs + rh * LD + ch * 8, p.q + qrow * HD + ch * 8);
    } else {
      *reinterpret_cast<uint4*>(Qs + rh * LD + ch * 8) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  cp_async_commit();
  // Rows past the group's: no scores (P = 0, so their P V rows are zero and unused).
  for (int i = RA * SLD + tid; i < R * SLD; i += kAttnThreads) Ss[i] = -INFINITY;

  int my_cnt = 0;
  for (int c = z; c < nfull; c += kAttnSplits) {
    ++my_cnt;
    if (my_cnt == 1) stamp(2);
    const size_t row0 = static_cast<size_t>(kvh) * p.slots + static_cast<size_t>(c) * kAttnChunk;
    for (int i = tid; i < kAttnChunk * CH; i += kAttnThreads) {
      const int u = i / CH;
      const int ch = i - u * CH;
      cp_async_16(Ks + u * LD + ch * 8, p.kcache + (row0 + u) * HD + ch * 8);
      cp_async_16(Vs + u * LD + ch * 8, p.vcache + (row0 + u) * HD + ch * 8);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    if (my_cnt == 1) stamp(3);
    // ---- S = scale * Q K^T: warp w the keys 8w .. 8w + 7 of every m16 tile ----
    {
      float acc[4][4] = {};
#pragma unroll
      for (int ks = 0; ks < HD / 16; ++ks) {
        uint32_t b[2];
        ldmatrix_x2(b, smem_u32(Ks + (warp * 8 + (lane & 7)) * LD + ks * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          if (mt < mtiles) {
            uint32_t a[4];
            ldmatrix_x4(a, smem_u32(Qs + (mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 +
                                    (lane >> 4) * 8));
            mma_bf16_16816(acc[mt], a, b[0], b[1]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int rh = mt * 16 + (lane >> 2) + (j >= 2 ? 8 : 0);
          if (rh < RA) Ss[rh * SLD + warp * 8 + (lane & 3) * 2 + (j & 1)] = acc[mt][j] * p.scale;
        }
      }
    }
    __syncthreads();  // the scores are in Ss; Ks is free for P
    if (my_cnt == 1) stamp(4);
    for (int rh = warp; rh < mtiles * 16; rh += kAttnThreads / 32)
      chunk_softmax_row(Ss + rh * SLD, Pb + rh * PLD, &sh.m[rh], &sh.l[rh], lane);
    __syncthreads();
    // ---- O = P V: (m16 tile, 16 columns) units; a tile's tokens share the B rows ----
    constexpr int NP = HD / 16;
    for (int w = warp; w < mtiles * NP; w += kAttnThreads / 32) {
      const int mt = w / NP;
      const int n0 = (w % NP) * 16;
      float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int ks = 0; ks < kAttnChunk / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, smem_u32(Pb + (mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PLD + ks * 16 + (lane >> 4) * 8));
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_u32(Vs + (ks * 16 + (lane & 15)) * LD + n0 + (lane >> 4) * 8));
        mma_bf16_16816(acc[0], a, b[0], b[1]);
        mma_bf16_16816(acc[1], a, b[2], b[3]);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mt * 16 + (lane >> 2) + half * 8;
        if (r < RA) {
          const size_t qrow = static_cast<size_t>(tok0 + r / G) * H + kvh * G + r % G;
          float* po = p.part_o + (qrow * p.max_chunks + c) * HD + n0 + (lane & 3) * 2;
#pragma unroll
          for (int j = 0; j < 2; ++j)
            *reinterpret_cast<float2*>(po + j * 8) = make_float2(acc[j][half * 2], acc[j][half * 2 + 1]);
        }
      }
    }
    for (int r = tid; r < RA; r += kAttnThreads) {
      const size_t qrow = static_cast<size_t>(tok0 + r / G) * H + kvh * G + r % G;
      p.part_ml[qrow * p.max_chunks + c] = make_float2(sh.m[r], sh.l[r]);
    }
    __syncthreads();  // before the next chunk overwrites K / V / P
  }
  if (my_cnt > 0) stamp(5);
}

/// Per-block CTAs, blockIdx.y = split * blocks + token block. kTail = false:
/// every chunk (the grid waits for the QKV GEMM at entry). kTail = true: the
/// chunks from floor(C / 64) on, after the shared-prefix grid; it reads only
/// what the QKV GEMM wrote (that grid let this one start once the GEMM had
/// finished) until its combine, which waits for the shared-prefix grid.
template <int HD, bool kTail>
__global__ void __launch_bounds__(kAttnThreads, 4) attention_kernel(const AttnParams p, const AttnGrid grid) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ AttnShared sh;
  const int kvh = blockIdx.x;
  const int blk = blockIdx.y % grid.blocks;
  const int split = blockIdx.y / grid.blocks;
  unsigned long long* tr = trace_row(p, kvh, blk, split);
  trace_stamp(tr, 0);
  griddep_launch_dependents();
  if (!kTail) griddep_wait();
  trace_stamp(tr, 1);
  block_cta<HD>(p, sh, smem_raw, kvh, blk, split, grid.block_splits, kTail, tr);
}

/// Shared-prefix CTAs, blockIdx.y = split * groups + group; trace rows at
/// token-block index blocks + group. The tail grid may start once every CTA
/// of this one is past the QKV GEMM's completion.
template <int HD>
__global__ void __launch_bounds__(kAttnThreads) attention_prefix_kernel(const AttnParams p, const AttnGrid grid) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ PrefixShared sh;
  const int kvh = blockIdx.x;
  const int g = blockIdx.y % grid.groups;
  const int z = blockIdx.y / grid.groups;
  unsigned long long* tr = trace_row(p, kvh, grid.blocks + g, z);
  trace_stamp(tr, 0);
  griddep_wait();
  griddep_launch_dependents();
  trace_stamp(tr, 1);
  prefix_cta<HD>(p, sh, smem_raw, kvh, g, z, tr);
}

/// Sets a kernel's shared-memory limit once per device.
template <class Kernel>
void allow_smem(Kernel* kernel, size_t bytes, std::atomic<uint64_t>& done) {
  const uint64_t bit = current_device_bit();
  if (!bit || !(done.load(std::memory_order_acquire) & bit)) {
    SS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    done.fetch_or(bit, std::memory_order_acq_rel);
  }
}

template <class Kernel>
void launch(Kernel* kernel, dim3 grid, size_t smem, bool pdl, cudaStream_t stream, const AttnParams& p,
            const AttnGrid& g) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = grid;
  lc.blockDim = dim3(kAttnThreads, 1, 1);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, kernel, p, g));
}

template <int HD>
void launch_attention_hd(const AttnParams& p, int rows, bool pdl, bool pdl_tail, cudaStream_t stream) {
  static std::atomic<uint64_t> done_block{0}, done_tail{0}, done_prefix{0};  // per device (current_device_bit)
  constexpr size_t block_smem = AttnGeom<HD>::smem_bytes();
  constexpr size_t prefix_smem = PrefixGeom<HD>::smem_bytes();
  AttnGrid g;
  g.blocks = (rows + p.tokens_per_block - 1) / p.tokens_per_block;
  const unsigned kvh = static_cast<unsigned>(p.num_kv_heads);
  if (!p.shared_prefix) {
    g.block_splits = kAttnSplits;
    allow_smem(&attention_kernel<HD, false>, block_smem, done_block);
    launch(&attention_kernel<HD, false>, dim3(kvh, g.blocks * g.block_splits, 1), block_smem, pdl, stream, p, g);
    return;
  }
  g.groups = (g.blocks + kPrefixBlocks - 1) / kPrefixBlocks;
  g.block_splits = kTailSplits;
  allow_smem(&attention_prefix_kernel<HD>, prefix_smem, done_prefix);
  allow_smem(&attention_kernel<HD, true>, block_smem, done_tail);
  launch(&attention_prefix_kernel<HD>, dim3(kvh, g.groups * kAttnSplits, 1), prefix_smem, pdl, stream, p, g);
  launch(&attention_kernel<HD, true>, dim3(kvh, g.blocks * g.block_splits, 1), block_smem, pdl_tail, stream, p, g);
}

}  // namespace

int attn_tokens_per_block(int group) {
  return std::min(kMaxTokPerBlock, std::max(1, 16 / group));
}

void launch_attention(const AttnParams& p, int rows, bool pdl, bool pdl_tail, cudaStream_t stream) {
  if (p.group > 16 || p.group < 1)
    throw InvalidArgument("attention: query heads per KV head must be 1..16 (got " +
                          std::to_string(p.group) + ")");
  if (p.head_dim == 128) {
    launch_attention_hd<128>(p, rows, pdl, pdl_tail, stream);
  } else if (p.head_dim == 64) {
    launch_attention_hd<64>(p, rows, pdl, pdl_tail, stream);
  } else {
    throw InvalidArgument("attention: head_dim must be 64 or 128 (got " +
                          std::to_string(p.head_dim) + ")");
  }
}

}  // namespace swiftspec::cuda
