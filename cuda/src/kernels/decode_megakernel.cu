// The decode megakernel (decode_megakernel.h): a whole single-token step as
// one persistent kernel. Layout of this file: synchronization and copy
// primitives; the weight streams (which rows of which matrix a CTA reads, in
// step order) and the ring that prefetches them; the per-chunk GEMV; the
// prologues (input vector, RMSNorm); attention; the kernel; the plan.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "common.h"
#include "kernels/decode_megakernel.h"
#include "kernels/epilogues.h"

namespace swiftspec::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
/// Counters per layer, in step order (also the trace's op slots; the LM head
/// is slot kCtrPerLayer * num_layers).
enum Counter { kCtrQKV = 0, kCtrAttn = 1, kCtrMerge = 2, kCtrO = 3, kCtrGateUp = 4, kCtrDown = 5, kCtrPerLayer = 6 };
/// Weight streams per layer (the attention has none).
enum StreamKind { kStreamQKV = 0, kStreamO = 1, kStreamGateUp = 2, kStreamDown = 3, kStreamsPerLayer = 4 };
/// Keys per attention unit (kv head, split): 8 warps x 4 keys in flight.
constexpr int kKeysPerSplit = 32;
/// Shared memory the plan reserves besides slots, x and misc: reduction
/// scratch (16 floats, 8 keys, 4 ints) and alignment slack.
constexpr int kSmallBytes = 256;
constexpr int kAlignSlack = 128;

// ---------------------------------------------------------------- primitives
#if defined(__CUDACC__)

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/// 1-D TMA bulk copy global -> shared (bytes % 16 == 0, both 16-byte aligned).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

/// Thread 0 waits until *ctr >= target (acquire at GPU scope), then the CTA
/// proceeds. Traps after ~10 s: a producer that never arrives is a bug, and a
/// trap reports it where a hang would not.
__device__ __forceinline__ void wait_counter(const unsigned* ctr, unsigned target) {
  if (threadIdx.x == 0 && ld_acquire_gpu(ctr) < target) {
    const long long t0 = clock64();
    while (ld_acquire_gpu(ctr) < target)
      if (clock64() - t0 > 20000000000LL) __trap();
  }
  __syncthreads();
}
/// The CTA's writes so far (ordered by the barrier) are released to the
/// waiters of `ctr` (the pattern of CUTLASS's generic barrier).
__device__ __forceinline__ void signal_counter(unsigned* ctr) {
  __syncthreads();
  if (threadIdx.x == 0) red_release_gpu_add(ctr, 1u);
}

/// Trace (MegaParams::trace): thread 0 stamps the global timer (ns) at the
/// start (after its wait) or the end (before its release) of op `slot`.
__device__ __forceinline__ void trace_mark(const MegaParams& p, int slot, int which) {
  if (p.trace != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    p.trace[(static_cast<size_t>(slot) * p.plan.ctas + blockIdx.x) * 2 + which] = t;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/// Sum over the CTA, the same value in every thread (fixed order).
__device__ __forceinline__ float block_sum(float v, float* small) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) small[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t += small[w];
  __syncthreads();
  return t;
}

__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  acc = fmaf(bf_lo(w.x), bf_lo(x.x), acc);
  acc = fmaf(bf_hi(w.x), bf_hi(x.x), acc);
  acc = fmaf(bf_lo(w.y), bf_lo(x.y), acc);
  acc = fmaf(bf_hi(w.y), bf_hi(x.y), acc);
  acc = fmaf(bf_lo(w.z), bf_lo(x.z), acc);
  acc = fmaf(bf_hi(w.z), bf_hi(x.z), acc);
  acc = fmaf(bf_lo(w.w), bf_lo(x.w), acc);
  acc = fmaf(bf_hi(w.w), bf_hi(x.w), acc);
  return acc;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---------------------------------------------------------------- weight streams
/// This CTA's rows [row0, row1) of one weight matrix (K columns).
struct Stream {
  const __nv_bfloat16* w;
  int K, row0, row1, pad;
};

/// Stream `idx` = 4 * layer + StreamKind, or 4 * num_layers for the LM head.
/// Rows are split over the CTAs in units of 16 (QKV: RoPE pairs; gate/up:
/// SwiGLU pairs; LM head: padded vocabulary) or 1 (O, down).
__device__ Stream stream_of(const MegaParams& p, int idx, int cta) {
  const MegaShape& s = p.s;
  const int nq = s.num_heads * s.head_dim, nkv = s.num_kv_heads * s.head_dim;
  Stream st;
  int units, unit;
  if (idx >= kStreamsPerLayer * s.num_layers) {
    st.w = p.lm;
    st.K = s.hidden;
    units = s.vocab_rows / 16;
    unit = 16;
  } else {
    const MegaLayer& L = p.layers[idx / kStreamsPerLayer];
    switch (idx % kStreamsPerLayer) {
      case kStreamQKV: st.w = L.qkv; st.K = s.hidden; units = (nq + 2 * nkv) / 16; unit = 16; break;
      case kStreamO: st.w = L.o; st.K = nq; units = s.hidden; unit = 1; break;
      case kStreamGateUp: st.w = L.gu; st.K = s.hidden; units = 2 * s.intermediate / 16; unit = 16; break;
      default: st.w = L.down; st.K = s.intermediate; units = s.hidden; unit = 1; break;
    }
  }
  const int G = p.plan.ctas;
  st.row0 = static_cast<int>(static_cast<long long>(cta) * units / G) * unit;
  st.row1 = static_cast<int>(static_cast<long long>(cta + 1) * units / G) * unit;
  return st;
}

__device__ __forceinline__ int rows_per_chunk(const MegaPlan& pl, int K) {
  return max(1, pl.slot_bytes / (2 * K));
}

/// The ring's producer (thread 0 only): chunk `seq` goes to slot seq % slots.
/// Weights do not depend on activations, so the producer runs as far ahead
/// of the arithmetic as the ring allows, across matrices and layers.
struct Producer {
  int idx = 0, row = -1, last_idx = 0;
  uint32_t seq = 0;
  uint64_t policy = 0;
};

__device__ void produce_one(const MegaParams& p, Producer& pr, const Stream* table, unsigned char* slots,
                            uint64_t* bars) {
  while (pr.idx <= pr.last_idx) {
    const Stream st = table[pr.idx];
    if (pr.row < st.row0) pr.row = st.row0;
    if (pr.row < st.row1) {
      const int rows = min(rows_per_chunk(p.plan, st.K), st.row1 - pr.row);
      const uint32_t bytes = static_cast<uint32_t>(rows) * st.K * 2u;
      const int slot = static_cast<int>(pr.seq % static_cast<uint32_t>(p.plan.num_slots));
      mbar_arrive_expect_tx(&bars[slot], bytes);
      bulk_load(slots + static_cast<size_t>(slot) * p.plan.slot_bytes, st.w + static_cast<size_t>(pr.row) * st.K,
                bytes, &bars[slot], pr.policy);
      pr.row += rows;
      ++pr.seq;
      return;
    }
    ++pr.idx;
    pr.row = -1;
  }
}

// ---------------------------------------------------------------- GEMV of one chunk
/// Rows a warp group shares: chunks of >= 8 rows give each warp whole rows;
/// shorter chunks split each row's K over kWarps / group warps.
__device__ __forceinline__ int row_groups(int R) { return R >= 8 ? 8 : R >= 4 ? 4 : R >= 2 ? 2 : 1; }

/// red[r * wpr + sub] = partial dot products of rows r < R of the chunk
/// (bf16 [R][K] in shared memory) with x (bf16 [K], shared). Ends with a barrier.
__device__ __forceinline__ void gemv_chunk(const uint4* w, const uint4* x, int R, int V, float* red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups = row_groups(R);
  const int wpr = kWarps / groups;
  const int rg = warp / wpr, sub = warp - rg * wpr;
  const int step = wpr * 32;
  for (int r = rg; r < R; r += groups) {
    const uint4* wr = w + static_cast<size_t>(r) * V;
    float a0 = 0.f, a1 = 0.f;
    int v = sub * 32 + lane;
    for (; v + step < V; v += 2 * step) {
      a0 = dot8(wr[v], x[v], a0);
      a1 = dot8(wr[v + step], x[v + step], a1);
    }
    if (v < V) a0 = dot8(wr[v], x[v], a0);
    const float a = warp_sum(a0 + a1);
    if (lane == 0) red[r * wpr + sub] = a;
  }
  __syncthreads();
}
/// Row t's dot product from gemv_chunk's partials (fixed order).
__device__ __forceinline__ float chunk_row(const float* red, int t, int R) {
  const int wpr = kWarps / row_groups(R);
  float s = 0.f;
  for (int k = 0; k < wpr; ++k) s += red[t * wpr + k];
  return s;
}

/// The CTA's consumer side of the ring: sequence number of the next chunk.
struct Ring {
  unsigned char* slots;
  uint64_t* bars;
  const Stream* table;  ///< this CTA's streams (shared memory)
  uint32_t seq = 0;
};

/// Runs the chunks of stream `st` in order: waits for each chunk, computes
/// its rows' dot products with x, hands (first row, row count, partials) to
/// `on_chunk` (all threads), frees the slot and refills it.
template <class F>
__device__ __forceinline__ void consume_stream(const MegaParams& p, const Stream& st, Ring& ring, Producer& pr,
                                               const __nv_bfloat16* x, float* red, F&& on_chunk) {
  const int rpc = rows_per_chunk(p.plan, st.K);
  const int V = st.K / 8;
  for (int row = st.row0; row < st.row1;) {
    const int R = min(rpc, st.row1 - row);
    const uint32_t ns = static_cast<uint32_t>(p.plan.num_slots);
    const int slot = static_cast<int>(ring.seq % ns);
    mbar_wait(&ring.bars[slot], (ring.seq / ns) & 1u);
    gemv_chunk(reinterpret_cast<const uint4*>(ring.slots + static_cast<size_t>(slot) * p.plan.slot_bytes),
               reinterpret_cast<const uint4*>(x), R, V, red);
    on_chunk(row, R);
    __syncthreads();  // slot, red and on_chunk's shared outputs are free again
    if (threadIdx.x == 0) produce_one(p, pr, ring.table, ring.slots, ring.bars);
    ++ring.seq;
    row += R;
  }
}

// ---------------------------------------------------------------- prologues
/// x = bf16(h) for the hidden state h (fp32 residual, or the token's
/// embedding row at layer 0), and returns 1/rms(h) (RMSNorm; the norm's
/// weight is folded into the next matrix).
__device__ float load_normed_input(const MegaParams& p, bool from_embed, int token, __nv_bfloat16* x, float* small) {
  const int H = p.s.hidden;
  float ss = 0.f;
  if (from_embed) {
    const uint4* e = reinterpret_cast<const uint4*>(p.embed + static_cast<size_t>(token) * H);
    for (int i = threadIdx.x; i < H / 8; i += kThreads) {
      const uint4 v = __ldg(e + i);
      reinterpret_cast<uint4*>(x)[i] = v;
      const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) ss += bf_lo(w4[k]) * bf_lo(w4[k]) + bf_hi(w4[k]) * bf_hi(w4[k]);
    }
  } else {
    const float4* h = reinterpret_cast<const float4*>(p.h32);
    for (int i = threadIdx.x; i < H / 4; i += kThreads) {
      const float4 v = __ldcg(h + i);
      reinterpret_cast<uint2*>(x)[i] = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  }
  const float total = block_sum(ss, small);  // its barriers also publish x
  return 1.0f / sqrtf(total / static_cast<float>(H) + p.s.eps);
}

/// x = src[0, K) (bf16, written by other CTAs this step).
__device__ void load_input(const __nv_bfloat16* src, int K, __nv_bfloat16* x) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  for (int i = threadIdx.x; i < K / 8; i += kThreads) reinterpret_cast<uint4*>(x)[i] = __ldcg(s + i);
  __syncthreads();
}

// ---------------------------------------------------------------- attention
/// Logical key j of the step's token -> KV cache index: the committed prefix,
/// then the attend list (tree slots, ancestors by depth, itself last).
__device__ __forceinline__ int key_index(const StepDesc* d, int j, int prefix, int a0, int max_context) {
  return j < prefix ? j : max_context + d->attend_slots[a0 + j - prefix];
}

template <int EPL>
__device__ __forceinline__ void load_row(const __nv_bfloat16* base, int lane, float (&out)[EPL]) {
  if constexpr (EPL == 2) {
    const uint32_t u = __ldcg(reinterpret_cast<const unsigned*>(base) + lane);
    out[0] = bf_lo(u);
    out[1] = bf_hi(u);
  } else {
    const uint2 u = __ldcg(reinterpret_cast<const uint2*>(base) + lane);
    out[0] = bf_lo(u.x);
    out[1] = bf_hi(u.x);
    out[2] = bf_lo(u.y);
    out[3] = bf_hi(u.y);
  }
}

/// Key splits per kv head for the step (the same in every CTA).
__device__ __forceinline__ int attention_splits(const MegaParams& p, int n_keys) {
  const int S = (n_keys + kKeysPerSplit - 1) / kKeysPerSplit;
  return max(1, min(S, min(p.plan.max_splits, max(1, p.plan.ctas / p.s.num_kv_heads))));
}
__device__ __forceinline__ int attention_keys(const StepDesc* d) {
  return d->prefix_len[0] + (d->attend_off[1] - d->attend_off[0]);
}

/// Attention units of layer `l`: (kv head, key split) over the CTAs. In a
/// unit the 8 warps share the keys (each key's K/V is loaded once for all
/// query heads of the kv head, 4 keys in flight per warp); the warps'
/// online-softmax states merge in shared memory into the unit's partial
/// (max, sum, unnormalized output) per query head, written to part_ml /
/// part_o. merge_splits() combines the splits.
template <int HD>
__device__ void attention_units(const MegaParams& p, int l, int cta, float* scratch) {
  constexpr int EPL = HD / 32;
  const MegaShape& s = p.s;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = p.plan.ctas, KVH = s.num_kv_heads, group = s.num_heads / KVH;
  const int hmax = min(group, 8);
  const int MS = p.plan.max_splits;
  const StepDesc* d = p.desc;
  const int prefix = d->prefix_len[0], a0 = d->attend_off[0];
  const int n_keys = attention_keys(d);
  const int S = attention_splits(p, n_keys);
  const int per = (n_keys + S - 1) / S;
  const MegaLayer& L = p.layers[l];
  const float qscale = rsqrtf(static_cast<float>(HD)) * 1.4426950408889634f;  // softmax in base 2

  for (int u = cta; u < KVH * S; u += G) {
    const int kvh = u / S, split = u - kvh * S;
    const int k0 = split * per, k1 = min(n_keys, k0 + per);
    const __nv_bfloat16* kc = L.kcache + static_cast<size_t>(kvh) * s.slots * HD;
    const __nv_bfloat16* vc = L.vcache + static_cast<size_t>(kvh) * s.slots * HD;
    for (int g0 = 0; g0 < group; g0 += 8) {
      const int hp = min(8, group - g0);
      float q[8][EPL], acc[8][EPL], m[8], lsum[8];
#pragma unroll
      for (int h = 0; h < 8; ++h) {
        m[h] = -INFINITY;
        lsum[h] = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[h][e] = 0.f, q[h][e] = 0.f;
        if (h < hp) {
          load_row<EPL>(p.q + static_cast<size_t>(kvh * group + g0 + h) * HD, lane, q[h]);
#pragma unroll
          for (int e = 0; e < EPL; ++e) q[h][e] *= qscale;
        }
      }
      for (int j = k0 + warp; j < k1; j += kWarps * 4) {
        float kv[4][EPL], vv[4][EPL];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int jj = j + b * kWarps;
          if (jj < k1) {
            const int idx = key_index(d, jj, prefix, a0, s.max_context);
            load_row<EPL>(kc + static_cast<size_t>(idx) * HD, lane, kv[b]);
            load_row<EPL>(vc + static_cast<size_t>(idx) * HD, lane, vv[b]);
          }
        }
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          if (j + b * kWarps >= k1) break;
#pragma unroll
          for (int h = 0; h < 8; ++h) {
            if (h >= hp) break;
            float sc = 0.f;
#pragma unroll
            for (int e = 0; e < EPL; ++e) sc = fmaf(q[h][e], kv[b][e], sc);
            sc = warp_sum(sc);
            const float mn = fmaxf(m[h], sc);
            const float corr = exp2f(m[h] - mn);  // 0 when m was -inf
            const float pr = exp2f(sc - mn);
            lsum[h] = lsum[h] * corr + pr;
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[h][e] = fmaf(pr, vv[b][e], acc[h][e] * corr);
            m[h] = mn;
          }
        }
      }
      // Merge the 8 warps' states per head: scratch[(warp * hmax + h) * (HD + 2)].
#pragma unroll
      for (int h = 0; h < 8; ++h) {
        if (h >= hp) break;
        float* sp = scratch + (warp * hmax + h) * (HD + 2);
#pragma unroll
        for (int e = 0; e < EPL; ++e) sp[lane * EPL + e] = acc[h][e];
        if (lane == 0) {
          sp[HD] = m[h];
          sp[HD + 1] = lsum[h];
        }
      }
      __syncthreads();
      for (int e = threadIdx.x; e < hp * HD; e += kThreads) {
        const int h = e / HD, dd = e - h * HD;
        float M = -INFINITY;
        for (int w = 0; w < kWarps; ++w) M = fmaxf(M, scratch[(w * hmax + h) * (HD + 2) + HD]);
        float o = 0.f, ls = 0.f;
        if (M != -INFINITY) {
          for (int w = 0; w < kWarps; ++w) {
            const float* sp = scratch + (w * hmax + h) * (HD + 2);
            const float f = exp2f(sp[HD] - M);
            o = fmaf(sp[dd], f, o);
            ls = fmaf(sp[HD + 1], f, ls);
          }
        }
        const int idx = (kvh * group + g0 + h) * MS + split;
        p.part_o[static_cast<size_t>(idx) * HD + dd] = o;
        if (dd == 0) p.part_ml[idx] = make_float2(M, ls);
      }
      __syncthreads();
    }
  }
}

/// Merges the key splits of every query head into the attention output
/// (bf16): this CTA's elements [c * nq / G, (c + 1) * nq / G); a warp per
/// element, a lane per split, (max, sum, output) combined by shuffles.
__device__ void merge_splits(const MegaParams& p, int cta) {
  const MegaShape& s = p.s;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int HD = s.head_dim, nq = s.num_heads * HD, G = p.plan.ctas, MS = p.plan.max_splits;
  const int S = attention_splits(p, attention_keys(p.desc));
  const int e0 = static_cast<int>(static_cast<long long>(cta) * nq / G);
  const int e1 = static_cast<int>(static_cast<long long>(cta + 1) * nq / G);
  for (int e = e0 + warp; e < e1; e += kWarps) {
    const int head = e / HD, dd = e - head * HD;
    float m = -INFINITY, l = 0.f, o = 0.f;
    for (int sp = lane; sp < S; sp += 32) {
      const float2 ml = __ldcg(p.part_ml + static_cast<size_t>(head) * MS + sp);
      const float po = __ldcg(p.part_o + (static_cast<size_t>(head) * MS + sp) * HD + dd);
      if (ml.x == -INFINITY) continue;  // a split without keys
      const float mn = fmaxf(m, ml.x);
      const float fa = exp2f(m - mn), fb = exp2f(ml.x - mn);
      l = l * fa + ml.y * fb;
      o = o * fa + po * fb;
      m = mn;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
      const float l2 = __shfl_xor_sync(0xffffffffu, l, off);
      const float o2 = __shfl_xor_sync(0xffffffffu, o, off);
      const float mn = fmaxf(m, m2);
      const float fa = m == -INFINITY ? 0.f : exp2f(m - mn);
      const float fb = m2 == -INFINITY ? 0.f : exp2f(m2 - mn);
      l = l * fa + l2 * fb;
      o = o * fa + o2 * fb;
      m = mn;
    }
    if (lane == 0) p.attn[e] = __float2bfloat16_rn(o / l);
  }
}

// ---------------------------------------------------------------- the kernel
__global__ void __launch_bounds__(kThreads, 1) decode_megakernel_kernel(const __grid_constant__ MegaParams p) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 127) & ~uintptr_t(127));
  const MegaPlan& pl = p.plan;
  const MegaShape& s = p.s;
  unsigned char* slots = base;
  __nv_bfloat16* x = reinterpret_cast<__nv_bfloat16*>(base + static_cast<size_t>(pl.num_slots) * pl.slot_bytes);
  float* misc = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(x) + pl.x_bytes);
  float* ybuf = misc;
  float* red = misc + pl.ybuf_rows;
  Stream* table = reinterpret_cast<Stream*>(reinterpret_cast<unsigned char*>(misc) + pl.misc_bytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(table) + pl.table_bytes);
  float* small = reinterpret_cast<float*>(bars + pl.num_slots);                        // [16]
  unsigned long long* small_key = reinterpret_cast<unsigned long long*>(small + 16);  // [8]

  const int tid = threadIdx.x, cta = blockIdx.x, G = pl.ctas;
  const int L = s.num_layers, H = s.hidden, I = s.intermediate;
  const int nq = s.num_heads * s.head_dim;
  const int nstreams = kStreamsPerLayer * L + 1;
  unsigned* ctr = p.sync;
  const int token = p.desc->tokens[0];

  for (int i = tid; i < nstreams; i += kThreads) table[i] = stream_of(p, i, cta);
  Producer pr;
  pr.last_idx = nstreams - 1 - (p.lm_head ? 0 : 1);
  if (tid == 0) {
    for (int i = 0; i < pl.num_slots; ++i) mbar_init(&bars[i], 1);
    fence_mbar_init();
    if (cta == 0) *p.keys = 0ull;  // published to the LM head by CTA 0's first release
  }
  __syncthreads();
  Ring ring{slots, bars, table, 0};
  if (tid == 0) {
    pr.policy = l2_policy_evict_first();  // weights are read once per step
    for (int i = 0; i < pl.num_slots; ++i) produce_one(p, pr, table, slots, bars);
  }

  float rinv = 0.f;
  for (int l = 0; l < L; ++l) {
    const MegaLayer& Ly = p.layers[l];
    unsigned* c = ctr + l * kCtrPerLayer;
    const int slot0 = l * kCtrPerLayer;
    // ---- QKV (+ bias, RoPE, K/V into the cache) --------------------------------
    {
      const Stream st = table[kStreamsPerLayer * l + kStreamQKV];
      if (st.row1 > st.row0) {
        if (l > 0) wait_counter(c - kCtrPerLayer + kCtrDown, G);
        trace_mark(p, slot0 + kCtrQKV, 0);
        rinv = load_normed_input(p, l == 0, token, x, small);
        consume_stream(p, st, ring, pr, x, red, [&](int row, int R) {
          for (int t = tid; t < R; t += kThreads) ybuf[row - st.row0 + t] = chunk_row(red, t, R);
        });
        EpiQKV::Params e;
        e.bias = Ly.qkv_bias;
        e.q = p.q;
        e.kcache = Ly.kcache;
        e.vcache = Ly.vcache;
        e.desc = p.desc;
        e.inv_freq = p.inv_freq;
        e.num_heads = s.num_heads;
        e.num_kv_heads = s.num_kv_heads;
        e.head_dim = s.head_dim;
        e.slots = s.slots;
        e.neox = s.neox;
        const int pairs = (st.row1 - st.row0) / 2;
        for (int i = tid; i < pairs; i += kThreads) {
          const int tl = i / 8, r = i - tl * 8;
          EpiQKV::apply(e, nullptr, true, st.row0 / 16 + tl, r, 0, ybuf[tl * 16 + r], ybuf[tl * 16 + 8 + r], rinv, 1);
        }
      } else {
        trace_mark(p, slot0 + kCtrQKV, 0);
      }
      trace_mark(p, slot0 + kCtrQKV, 1);
      signal_counter(c + kCtrQKV);
    }
    // ---- attention: units, then the merge of the key splits ------------------------
    wait_counter(c + kCtrQKV, G);
    trace_mark(p, slot0 + kCtrAttn, 0);
    if (s.head_dim == 64) attention_units<64>(p, l, cta, misc);
    else attention_units<128>(p, l, cta, misc);
    trace_mark(p, slot0 + kCtrAttn, 1);
    signal_counter(c + kCtrAttn);
    wait_counter(c + kCtrAttn, G);
    trace_mark(p, slot0 + kCtrMerge, 0);
    merge_splits(p, cta);
    trace_mark(p, slot0 + kCtrMerge, 1);
    signal_counter(c + kCtrMerge);
    // ---- O projection + residual ---------------------------------------------------
    {
      const Stream st = table[kStreamsPerLayer * l + kStreamO];
      if (st.row1 > st.row0) {
        wait_counter(c + kCtrMerge, G);
        trace_mark(p, slot0 + kCtrO, 0);
        load_input(p.attn, nq, x);
        const __nv_bfloat16* emb = p.embed + static_cast<size_t>(token) * H;
        consume_stream(p, st, ring, pr, x, red, [&](int row, int R) {
          for (int t = tid; t < R; t += kThreads) {
            const int r = row + t;
            const float base_v = l == 0 ? __bfloat162float(emb[r]) : __ldcg(p.h32 + r);
            p.h32[r] = base_v + chunk_row(red, t, R);
          }
        });
      } else {
        trace_mark(p, slot0 + kCtrO, 0);
      }
      trace_mark(p, slot0 + kCtrO, 1);
      signal_counter(c + kCtrO);
    }
    // ---- gate/up + SwiGLU ----------------------------------------------------------
    {
      const Stream st = table[kStreamsPerLayer * l + kStreamGateUp];
      if (st.row1 > st.row0) {
        wait_counter(c + kCtrO, G);
        trace_mark(p, slot0 + kCtrGateUp, 0);
        rinv = load_normed_input(p, false, token, x, small);
        consume_stream(p, st, ring, pr, x, red, [&](int row, int R) {
          for (int t = tid; t < R; t += kThreads) ybuf[row - st.row0 + t] = chunk_row(red, t, R);
        });
        EpiSwiGLU::Params e;
        e.act = p.act;
        e.intermediate = I;
        const int pairs = (st.row1 - st.row0) / 2;
        for (int i = tid; i < pairs; i += kThreads) {
          const int tl = i / 8, r = i - tl * 8;
          EpiSwiGLU::apply(e, nullptr, true, st.row0 / 16 + tl, r, 0, ybuf[tl * 16 + r], ybuf[tl * 16 + 8 + r], rinv, 1);
        }
      } else {
        trace_mark(p, slot0 + kCtrGateUp, 0);
      }
      trace_mark(p, slot0 + kCtrGateUp, 1);
      signal_counter(c + kCtrGateUp);
    }
    // ---- down projection + residual ---------------------------------------------------
    {
      const Stream st = table[kStreamsPerLayer * l + kStreamDown];
      if (st.row1 > st.row0) {
        wait_counter(c + kCtrGateUp, G);
        trace_mark(p, slot0 + kCtrDown, 0);
        load_input(p.act, I, x);
        consume_stream(p, st, ring, pr, x, red, [&](int row, int R) {
          for (int t = tid; t < R; t += kThreads) {
            const int r = row + t;
            p.h32[r] = __ldcg(p.h32 + r) + chunk_row(red, t, R);
          }
        });
      } else {
        trace_mark(p, slot0 + kCtrDown, 0);
      }
      trace_mark(p, slot0 + kCtrDown, 1);
      signal_counter(c + kCtrDown);
    }
  }
  // ---- final norm + LM head + arg-max -------------------------------------------------
  if (p.lm_head) {
    const Stream st = table[kStreamsPerLayer * L];
    unsigned long long best = 0ull;
    if (st.row1 > st.row0) {
      wait_counter(ctr + (L - 1) * kCtrPerLayer + kCtrDown, G);
      trace_mark(p, L * kCtrPerLayer, 0);
      rinv = load_normed_input(p, false, token, x, small);
      consume_stream(p, st, ring, pr, x, red, [&](int row, int R) {
        for (int t = tid; t < R; t += kThreads) {
          const int r = row + t;
          if (r < s.vocab) {
            const float v = chunk_row(red, t, R) * rinv;
            if (p.logits) p.logits[r] = v;
            const unsigned long long k = argmax_key(v, r);
            best = k > best ? k : best;
          }
        }
      });
    } else {
      trace_mark(p, L * kCtrPerLayer, 0);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
      best = other > best ? other : best;
    }
    if ((tid & 31) == 0) small_key[tid >> 5] = best;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < kWarps; ++w) best = small_key[w] > best ? small_key[w] : best;
      if (best != 0ull) atomicMax(p.keys, best);
    }
    trace_mark(p, L * kCtrPerLayer, 1);
  }
  // ---- the last CTA to finish re-zeroes the counters for the next launch --------------
  __syncthreads();
  if (tid == 0) {
    unsigned* done = p.sync + L * kCtrPerLayer;
    // The CTA's last release (a counter no one may wait on any more) must land
    // before its completion count, or the reset below could be overtaken by it
    // and the next launch would start from a stale counter.
    __threadfence();
    if (atomicAdd(done, 1u) == static_cast<unsigned>(G - 1)) {
      __threadfence();
      for (int i = 0; i < L * kCtrPerLayer; ++i) p.sync[i] = 0u;
      *done = 0u;
    }
  }
}

#endif  // __CUDACC__

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

size_t decode_megakernel_sync_words(const MegaShape& s) {
  return static_cast<size_t>(s.num_layers) * kCtrPerLayer + 1;
}

MegaPlan plan_decode_megakernel(const MegaShape& s, int num_sms, int max_smem) {
  const auto bad = [](const std::string& m) { throw InvalidArgument("decode megakernel: " + m); };
  if (s.num_layers < 1) bad("needs at least one layer");
  if (s.head_dim != 64 && s.head_dim != 128) bad("head_dim must be 64 or 128");
  if (s.num_kv_heads < 1 || s.num_heads % s.num_kv_heads) bad("num_heads must be a multiple of num_kv_heads");
  const int group = s.num_heads / s.num_kv_heads;
  if (group > 16) bad("at most 16 query heads per kv head");
  if (s.hidden % 16 || s.intermediate % 8 || s.vocab_rows % 16) bad("hidden % 16, intermediate % 8 and vocab_rows % 16 must be 0");
  if (num_sms < 1) bad("no SMs");
  const int nq = s.num_heads * s.head_dim, nkv = s.num_kv_heads * s.head_dim;
  const int kmax = std::max({s.hidden, nq, s.intermediate});
  const int kmin = std::min({s.hidden, nq, s.intermediate});
  if (2 * kmax > 96 * 1024) bad("a weight row of " + std::to_string(2 * kmax) + " bytes exceeds 96 KB");
  MegaPlan pl;
  pl.ctas = num_sms;
  pl.slot_bytes = static_cast<int>(std::max<size_t>(32768, align_up(2 * static_cast<size_t>(kmax), 128)));
  pl.x_bytes = static_cast<int>(align_up(2 * static_cast<size_t>(kmax), 128));
  const int tiles_qkv = (nq + 2 * nkv) / 16, tiles_gu = 2 * s.intermediate / 16;
  pl.ybuf_rows = 16 * std::max((tiles_qkv + num_sms - 1) / num_sms, (tiles_gu + num_sms - 1) / num_sms);
  pl.red_floats = std::max(pl.slot_bytes / (2 * kmin), 16);
  pl.max_splits = std::max(1, num_sms / s.num_kv_heads);
  const size_t attn_floats = static_cast<size_t>(kWarps) * std::min(group, 8) * (s.head_dim + 2);
  pl.misc_bytes = static_cast<int>(
      align_up(std::max(4 * static_cast<size_t>(pl.ybuf_rows + pl.red_floats), 4 * attn_floats), 128));
  pl.table_bytes = static_cast<int>(align_up(sizeof(Stream) * (kStreamsPerLayer * static_cast<size_t>(s.num_layers) + 1), 128));
  const long long fixed = kAlignSlack + pl.x_bytes + pl.misc_bytes + pl.table_bytes + kSmallBytes;
  long long ns = (static_cast<long long>(max_smem) - fixed) / (pl.slot_bytes + 8);
  ns = std::min<long long>(ns, 16);
  if (ns < 2)
    bad("the ring needs two slots of " + std::to_string(pl.slot_bytes) + " bytes; " + std::to_string(max_smem) +
        " bytes of shared memory leave room for " + std::to_string(std::max<long long>(ns, 0)));
  pl.num_slots = static_cast<int>(ns);
  pl.smem_bytes = static_cast<size_t>(fixed) + static_cast<size_t>(ns) * (pl.slot_bytes + 8);
  return pl;
}

void configure_decode_megakernel(const MegaPlan& plan) {
  // The attribute is per function and device, shared by every model of the
  // process: it only ever grows, so that a model with a smaller plan made
  // later (a 1.5B target after a 0.5B draft) does not break an earlier one.
  static std::mutex mu;
  static std::map<int, size_t> granted;  // device -> bytes set
  int dev = 0;
  SS_CUDA_CHECK(cudaGetDevice(&dev));
  {
    std::lock_guard<std::mutex> lock(mu);
    size_t& g = granted[dev];
    if (plan.smem_bytes > g) {
      SS_CUDA_CHECK(cudaFuncSetAttribute(decode_megakernel_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(plan.smem_bytes)));
      g = plan.smem_bytes;
    }
  }
  int blocks = 0;
  SS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, decode_megakernel_kernel, kThreads,
                                                              plan.smem_bytes));
  if (blocks < 1)
    throw CudaError("decode megakernel: a CTA with " + std::to_string(plan.smem_bytes) +
                    " bytes of shared memory does not fit on an SM");
}

void launch_decode_megakernel(const MegaParams& p, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.plan.ctas);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = p.plan.smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // all CTAs co-resident: they wait on each other
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  SS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_megakernel_kernel, p));
}

}  // namespace swiftspec::cuda
