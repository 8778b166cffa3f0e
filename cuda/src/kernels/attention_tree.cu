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
// Grid: (kv head, token block of T tokens, kAttnSplits); a CTA holds up to
// 16 (narrow) or 64 (wide, the 32/64-token buckets) query rows. Per chunk a CTA
//   1. builds the union of the chunk's keys over its tokens in logical order,
//      with a per-token mask and each key's logical position,
//   2. S = Q K^T with mma.sync (one dot product per element: its value does
//      not depend on where the key or the query row sits in the tile), kept
//      per (query row, logical position),
//   3. per query head: max, p = exp(s - max), and sum_j p_j and sum_j p_j v_j
//      sequentially in logical order over the attended keys only (keys of
//      the block's union that a token does not attend add exact zeros),
//   4. writes (max, sum, o) of the chunk.
// The last CTA of a (kv head, token block) — an atomic counter, reset by that
// CTA — combines the chunks in chunk order. The arithmetic seen by a token is
// therefore the same whether it is decoded alone or verified inside a tree,
// and whatever the step's batch size.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "common.h"
#include "kernels/kernels.h"

namespace swiftspec::cuda {

namespace {

constexpr int kAttnThreads = 256;

/// Geometry of one attention variant: RMAX query rows (tokens x heads of one
/// kv head) per CTA. Narrow (16 rows: one m16 tile, 16 threads per row in the
/// PV loop) for decode and small buckets; wide (64 rows: 4 m16 tiles, 4
/// threads per row) for the 32- and 64-token tree buckets, so that a chunk's
/// K/V is loaded once for 4x more tokens (the committed prefix is the same
/// keys for every token of a tree). Both variants give every (token, head)
/// the same arithmetic (see the file comment), so the choice is free.
template <int HD, int RMAX>
struct AttnGeom {
  static constexpr int kTokMax = RMAX == 64 ? 16 : 8;     ///< tokens per block (kmask bits)
  static constexpr int kUMax = kAttnChunk * kTokMax;       ///< union keys of a chunk, at most
  static constexpr int kLD = HD + 8;                       ///< bf16 row stride (bank spread)
  static constexpr int kTPR = kAttnThreads / RMAX;         ///< PV threads per query row
  static constexpr int kDPT = HD / kTPR;                   ///< dims per thread in the PV loop
  static constexpr int kComb = kDPT >= 16 ? 2 : 4;         ///< chunks per load batch in the combine
  static constexpr int kSLD = kAttnChunk + 1;             ///< score row stride (rows in distinct banks)
  static constexpr size_t smem_bytes() {
    return size_t(RMAX + 64 + 64) * kLD * 2        // Qs, Ks, Vs
           + size_t(RMAX) * kSLD * 4               // Ss
           + size_t(kUMax) * 4                     // keys
           + size_t(kUMax) * 2                     // kmask
           + size_t(kUMax);                        // kpos
  }
};

/// dst[0, N) = float(src[0, N)) for N bf16 values in shared memory (N % 4 == 0).
template <int N>
__device__ __forceinline__ void load_bf16_row(const __nv_bfloat16* src, float (&dst)[N]) {
  if constexpr (N % 8 == 0) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
      const uint4 raw = reinterpret_cast<const uint4*>(src)[i];
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h2[j]);
        dst[8 * i + 2 * j] = f.x;
        dst[8 * i + 2 * j + 1] = f.y;
      }
    }
  } else {
    static_assert(N == 4, "dims per thread: 4 or a multiple of 8");
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float2 f = __bfloat1622float2(h2[j]);
      dst[2 * j] = f.x;
      dst[2 * j + 1] = f.y;
    }
  }
}

template <int HD, int RMAX>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(const AttnParams p) {
  using Geom = AttnGeom<HD, RMAX>;
  constexpr int LD = Geom::kLD;
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  constexpr int DPT = Geom::kDPT;
  constexpr int TPR = Geom::kTPR;
  constexpr int UMAX = Geom::kUMax;
  constexpr int MT = RMAX / 16;  // m16 tiles of query rows
  constexpr int SLD = Geom::kSLD;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [RMAX][LD]
  __nv_bfloat16* Ks = Qs + RMAX * LD;                              // [64][LD]
  __nv_bfloat16* Vs = Ks + 64 * LD;                                // [64][LD]
  // Scores by (query row, logical position in the chunk): a token has at most
  // one key per logical position, so a row needs kAttnChunk entries whatever
  // the union of the block's keys is.
  float* Ss = reinterpret_cast<float*>(Vs + 64 * LD);               // [RMAX][SLD]
  int* keys = reinterpret_cast<int*>(Ss + RMAX * SLD);              // [UMAX] cache row of union key u
  uint16_t* kmask = reinterpret_cast<uint16_t*>(keys + UMAX);       // [UMAX] tokens attending u
  uint8_t* kpos = reinterpret_cast<uint8_t*>(kmask + UMAX);         // [UMAX] logical position of u in the chunk
  __shared__ int s_U;
  __shared__ int s_last;
  __shared__ float s_m[RMAX];

  griddep_launch_dependents();
  griddep_wait();

  const StepDesc* d = p.desc;
  const int kvh = blockIdx.x;
  const int blk = blockIdx.y;
  const int split = blockIdx.z;
  const int T = p.tokens_per_block;
  const int G = p.group;
  const int n = d->n;
  const int tok0 = blk * T;
  if (tok0 >= n) return;
  const int tact = min(T, n - tok0);
  const int C = d->committed;
  const bool tree = d->is_tree != 0;
  int maxP = 0, maxlen = 0, nch = 0;
  for (int t = 0; t < tact; ++t) {
    const int tk = tok0 + t;
    const int P = d->prefix_len[tk];
    const int len = tree ? d->attend_off[tk + 1] - d->attend_off[tk] : 0;
    maxP = max(maxP, P);
    maxlen = max(maxlen, len);
    nch = max(nch, (P + len + kAttnChunk - 1) / kAttnChunk);
  }
  if (split >= nch) return;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int RH = T * G;  // query rows of the block (<= RMAX)
  const int H = p.num_heads;

  for (int i = tid; i < RMAX * CH; i += kAttnThreads) {
    const int rh = i / CH;
    const int ch = i - rh * CH;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (rh < RH && rh / G < tact) {
      const int tk = tok0 + rh / G;
      const int head = kvh * G + rh % G;
      v = *reinterpret_cast<const uint4*>(p.q + (static_cast<size_t>(tk) * H + head) * HD + ch * 8);
    }
    *reinterpret_cast<uint4*>(Qs + rh * LD + ch * 8) = v;
  }

  // Role in the PV loop and the combine: query row prh, dims pd0..pd0+DPT-1.
  const int prh = tid / TPR;
  const int pd0 = (tid % TPR) * DPT;
  const int pt = prh / G;
  const bool pact = prh < RH && pt < tact;
  int p_nch = 0, p_tk = 0, p_head = 0;
  if (pact) {
    p_tk = tok0 + pt;
    p_head = kvh * G + prh % G;
    const int len = tree ? d->attend_off[p_tk + 1] - d->attend_off[p_tk] : 0;
    p_nch = (d->prefix_len[p_tk] + len + kAttnChunk - 1) / kAttnChunk;
  }

  int my_cnt = 0;
  for (int c = split; c < nch; c += kAttnSplits) {
    ++my_cnt;
    const int q0 = c * kAttnChunk;
    // ---- 1. union of the chunk's keys in logical order, per-token masks ----
    // Committed keys first (logical position = key), then the tree keys of
    // each position (one per distinct ancestor slot among the block's tokens).
    const int n1 = max(0, min(q0 + kAttnChunk, maxP) - q0);
    for (int i = tid; i < RMAX * SLD; i += kAttnThreads) Ss[i] = -INFINITY;
    for (int j = tid; j < n1; j += kAttnThreads) {
      const int key = q0 + j;
      unsigned mk = 0;
      for (int t = 0; t < tact; ++t)
        if (key < d->prefix_len[tok0 + t]) mk |= 1u << t;
      keys[j] = key;
      kmask[j] = static_cast<uint16_t>(mk);
      kpos[j] = static_cast<uint8_t>(j);
    }
    if (warp == 0) {
      int U = n1;
      if (tree) {
        const int qlo = max(q0, C);
        const int qhi = min(q0 + kAttnChunk, C + maxlen);
        int off = 0, len = 0;
        if (lane < tact) {
          off = d->attend_off[tok0 + lane];
          len = d->attend_off[tok0 + lane + 1] - off;
        }
        for (int q = qlo; q < qhi; ++q) {
          const int a = q - C;
          const int slot = (lane < tact && a < len) ? d->attend_slots[off + a] : -1;
          unsigned same = 0;
          for (int u = 0; u < tact; ++u)
            if (__shfl_sync(0xffffffffu, slot, u) == slot) same |= 1u << u;
          const bool leader = slot >= 0 && (__ffs(same) - 1) == lane;  // the lowest token with this slot
          const unsigned lb = __ballot_sync(0xffffffffu, leader);
          if (leader) {
            const int pos = U + __popc(lb & ((1u << lane) - 1u));
            keys[pos] = p.max_context + slot;
            kmask[pos] = static_cast<uint16_t>(same);
            kpos[pos] = static_cast<uint8_t>(q - q0);
          }
          U += __popc(lb);
        }
      }
      if (lane == 0) s_U = U;
    }
    __syncthreads();
    const int U = s_U;
    const bool single = U <= 64;

    // ---- 2. scores S = scale * Q K^T of the attended (row, key) pairs ----
    for (int ub = 0; ub < U; ub += 64) {
      const int nb = min(64, U - ub);
      for (int i = tid; i < nb * CH; i += kAttnThreads) {
        const int u = i / CH;
        const int ch = i - u * CH;
        const size_t row = static_cast<size_t>(kvh) * p.slots + keys[ub + u];
        cp_async_16(Ks + u * LD + ch * 8, p.kcache + row * HD + ch * 8);
        if (single) cp_async_16(Vs + u * LD + ch * 8, p.vcache + row * HD + ch * 8);
      }
      cp_async_commit_wait_all();
      __syncthreads();
      if (warp * 8 < nb) {
        float acc[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
          uint32_t b[2];
          ldmatrix_x2(b, smem_u32(Ks + (warp * 8 + (lane & 7)) * LD + ks * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (mt * 16 < RH) {
              uint32_t a[4];
              ldmatrix_x4(a, smem_u32(Qs + (mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 +
                                      (lane >> 4) * 8));
              mma_bf16_16816(acc[mt], a, b[0], b[1]);
            }
          }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int rh = mt * 16 + (lane >> 2) + (j >= 2 ? 8 : 0);
            const int u = ub + warp * 8 + (lane & 3) * 2 + (j & 1);
            if (u < U && rh < RH && ((kmask[u] >> (rh / G)) & 1u))
              Ss[rh * SLD + kpos[u]] = acc[mt][j] * p.scale;
          }
        }
      }
      __syncthreads();
    }

    // ---- 3a. per query row: max and p = exp(s - max) ----
    for (int rh = warp; rh < RH; rh += kAttnThreads / 32) {
      float* srow = Ss + rh * SLD;
      float mx = -INFINITY;
      for (int q = lane; q < kAttnChunk; q += 32) mx = fmaxf(mx, srow[q]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      for (int q = lane; q < kAttnChunk; q += 32) {
        const float s = srow[q];
        srow[q] = (mx == -INFINITY || s == -INFINITY) ? 0.f : expf(s - mx);
      }
      if (lane == 0) s_m[rh] = mx;
    }
    __syncthreads();

    // ---- 3b. sum p and p*v over the union in logical order ----
    float o[DPT];
#pragma unroll
    for (int j = 0; j < DPT; ++j) o[j] = 0.f;
    float l = 0.f;
    for (int ub = 0; ub < U; ub += 64) {
      const int nb = min(64, U - ub);
      if (!single) {
        for (int i = tid; i < nb * CH; i += kAttnThreads) {
          const int u = i / CH;
          const int ch = i - u * CH;
          const size_t row = static_cast<size_t>(kvh) * p.slots + keys[ub + u];
          cp_async_16(Vs + u * LD + ch * 8, p.vcache + row * HD + ch * 8);
        }
        cp_async_commit_wait_all();
        __syncthreads();
      }
      if (pact) {
        // Branch-free over all keys of the block: a key of the union that this
        // token does not attend gets p = 0 exactly, and adding it changes
        // neither l nor o bitwise (both start at +0 and never become -0:
        // x + (+-0) == x, and +0 + -0 == +0). So the sums equal those over the
        // token's own keys alone, in logical order (union order), as in a
        // step of this token alone; and the loop pipelines its loads.
        const float* srow = Ss + prh * SLD;
#pragma unroll 4
        for (int u = 0; u < nb; ++u) {
          const float s = srow[kpos[ub + u]];
          const float pr = ((kmask[ub + u] >> pt) & 1u) ? s : 0.f;
          l += pr;
          float vf[DPT];
          load_bf16_row<DPT>(Vs + u * LD + pd0, vf);
#pragma unroll
          for (int j = 0; j < DPT; ++j) o[j] = fmaf(pr, vf[j], o[j]);
        }
      }
      if (!single) __syncthreads();
    }

    // ---- 4. chunk partial ----
    if (pact && c < p_nch) {
      float* po = p.part_o + ((static_cast<size_t>(p_tk) * H + p_head) * p.max_chunks + c) * HD + pd0;
#pragma unroll
      for (int j = 0; j < DPT; ++j) po[j] = o[j];
      if ((tid % TPR) == 0)
        p.part_ml[(static_cast<size_t>(p_tk) * H + p_head) * p.max_chunks + c] = make_float2(s_m[prh], l);
    }
    __syncthreads();
  }

  // ---- arrival; the last CTA of the (kv head, token block) combines ----
  if (tid == 0) {
    __threadfence();
    const int prev = atomicAdd(&p.counters[kvh * kMaxStepTokens + blk], my_cnt);
    s_last = (prev + my_cnt == nch) ? 1 : 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (pact) {
    // Combine in chunk order. The loads of a batch of chunks are all issued
    // before its adds (one L2 round trip per batch instead of per chunk); the
    // arithmetic is the same sequence as chunk by chunk.
    constexpr int kB = Geom::kComb;
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
  if (tid == 0) p.counters[kvh * kMaxStepTokens + blk] = 0;
}

template <int HD, int RMAX>
void launch_attention_variant(AttnParams p, int rows, bool pdl, cudaStream_t stream) {
  static std::atomic<uint64_t> attr_done{0};  // per device (current_device_bit)
  constexpr size_t smem = AttnGeom<HD, RMAX>::smem_bytes();
  const uint64_t bit = current_device_bit();
  if (!bit || !(attr_done.load(std::memory_order_acquire) & bit)) {
    SS_CUDA_CHECK(cudaFuncSetAttribute(&attention_kernel<HD, RMAX>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    attr_done.fetch_or(bit, std::memory_order_acq_rel);
  }
  p.tokens_per_block = std::min(AttnGeom<HD, RMAX>::kTokMax, std::max(1, RMAX / p.group));
  cudaLaunchConfig_t lc = {};
  const int blocks = (rows + p.tokens_per_block - 1) / p.tokens_per_block;
  lc.gridDim = dim3(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(blocks), kAttnSplits);
  lc.blockDim = dim3(kAttnThreads, 1, 1);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, &attention_kernel<HD, RMAX>, p));
}

/// Narrow CTAs below 32 rows (decode: a short PV loop per thread), wide ones
/// for the 32- and 64-token buckets (one K/V load per chunk for 4x the tokens).
/// Buckets of at least this many rows take the wide CTAs: kAttnWideRows, or
/// SWIFTSPEC_ATTN_WIDE_ROWS for A/B measurements (65: never).
int attn_wide_rows() {
  const char* e = std::getenv("SWIFTSPEC_ATTN_WIDE_ROWS");
  return e ? std::atoi(e) : kAttnWideRows;
}

template <int HD>
void launch_attention_hd(const AttnParams& p, int rows, bool pdl, cudaStream_t stream) {
  if (rows >= attn_wide_rows()) launch_attention_variant<HD, 64>(p, rows, pdl, stream);
  else launch_attention_variant<HD, 16>(p, rows, pdl, stream);
}

}  // namespace

void launch_attention(const AttnParams& p, int rows, bool pdl, cudaStream_t stream) {
  if (p.group > 16 || p.group < 1)
    throw InvalidArgument("attention: query heads per KV head must be 1..16 (got " +
                          std::to_string(p.group) + ")");
  if (p.head_dim == 128) {
    launch_attention_hd<128>(p, rows, pdl, stream);
  } else if (p.head_dim == 64) {
    launch_attention_hd<64>(p, rows, pdl, stream);
  } else {
    throw InvalidArgument("attention: head_dim must be 64 or 128 (got " +
                          std::to_string(p.head_dim) + ")");
  }
}

}  // namespace swiftspec::cuda
