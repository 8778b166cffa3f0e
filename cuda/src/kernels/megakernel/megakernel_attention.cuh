// Decode megakernel attention: the step's constants, the (kv head, split)
// units and their merge phase, and the query-head parts (head_attention) with
// their merge by part 0 or by the O projection's input load.
// Part of decode_megakernel.cu, included once inside its anonymous
// namespace and its `#if defined(__CUDACC__)`, so that each file holds one
// piece of the kernel; uses megakernel_primitives.cuh.
#pragma once

// ---------------------------------------------------------------- attention
/// The step's constants, copied to shared memory once per launch: every op
/// reads them, and a global load that misses L1 (a small L1 beside a full
/// ring) would add a dependent L2 round trip to the op's critical path.
/// 16-byte aligned: the RoPE table (float2) follows it in shared memory.
struct alignas(16) StepConsts {
  int token, position, kv_index;  ///< the step's token, its RoPE position, its KV slot
  int prefix, a0, n_keys;         ///< committed keys, attend list offset, keys in all
  int splits, per_split;          ///< key splits per kv head, keys per split
  int whole_heads;                ///< 1: query heads in head_parts CTAs each, no merge phase (head_attention)
  int head_parts;                 ///< parts per head this step: min(MegaPlan::head_parts, n_keys)
  /// Trace: this CTA's head_attention phase stamps of layer 0 (layer l at
  /// + l * ctas * kMegaAttnStamps), or null.
  unsigned long long* attn_stamps;
};

/// Logical key j of the step's token -> KV cache index: the committed prefix,
/// then the attend list (tree slots, ancestors by depth, itself last).
__device__ __forceinline__ int key_index(const MegaParams& p, const StepConsts& c, int j) {
  return j < c.prefix ? j : p.s.max_context + p.desc->attend_slots[c.a0 + j - c.prefix];
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

/// One level of a transposed warp reduction of 32 values (O = 16, 8, .., 1
/// in turn): the lanes with bit O set keep the upper O of the live values,
/// the others the lower, each adding its partner's copy. After all five
/// levels, part[0] of lane i is the warp's sum of value i.
template <int O>
__device__ __forceinline__ void transposed_sum_level(float (&part)[32], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = upper ? part[i] : part[i + O];
    const float keep = upper ? part[i + O] : part[i];
    part[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}

/// The step's constants (thread 0): about kKeysPerSplit keys per unit, at
/// most max_splits splits per kv head (KVH * S <= CTAs unless there are more
/// kv heads than CTAs; then S = 1), and no split without keys.
__device__ void make_step_consts(const MegaParams& p, StepConsts& c) {
  const StepDesc* d = p.desc;
  c.token = d->tokens[0];
  c.position = d->positions[0];
  c.kv_index = d->kv_index[0];
  c.prefix = d->prefix_len[0];
  c.a0 = d->attend_off[0];
  c.n_keys = c.prefix + (d->attend_off[1] - c.a0);
  const int S = (c.n_keys + kKeysPerSplit - 1) / kKeysPerSplit;
  c.splits = max(1, min(S, min(p.plan.max_splits, max(1, p.plan.ctas / p.s.num_kv_heads))));
  c.per_split = (c.n_keys + c.splits - 1) / c.splits;
  c.splits = (c.n_keys + c.per_split - 1) / c.per_split;  // a capped S can leave trailing splits empty
  c.whole_heads = c.n_keys <= p.plan.head_keys ? 1 : 0;
  c.head_parts = min(p.plan.head_parts, c.n_keys);  // no part without keys
}

/// The attention unit u < KVH * S (kv head u / S, key split u % S) of layer
/// `L`: the 8 warps share the unit's keys (each key's K/V is loaded once for
/// all query heads of the kv head, 4 keys in flight per warp); the warps'
/// online-softmax states merge in shared memory into the unit's partial
/// (max, sum, unnormalized output) per query head, written to part_ml /
/// part_o for merge_splits().
template <int HD>
__device__ void attention_unit(const MegaParams& p, const StepConsts& c, const MegaLayer& L, int u, float* scratch) {
  constexpr int EPL = HD / 32;
  const MegaShape& s = p.s;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int KVH = s.num_kv_heads, group = s.num_heads / KVH;
  const int hmax = min(group, 8);
  const int MS = p.plan.max_splits;
  const float qscale = rsqrtf(static_cast<float>(HD)) * 1.4426950408889634f;  // softmax in base 2
  const int kvh = u / c.splits, split = u - kvh * c.splits;
  const int k0 = split * c.per_split, k1 = min(c.n_keys, k0 + c.per_split);
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
        // Not scaled here: a use right after the load would wait for it
        // before the K/V loads below are issued (qscale goes into the score).
        load_row<EPL>(p.q + static_cast<size_t>(kvh * group + g0 + h) * HD, lane, q[h]);
      }
    }
    for (int j = k0 + warp; j < k1; j += kWarps * 4) {
      float kv[4][EPL], vv[4][EPL];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int jj = j + b * kWarps;
#pragma unroll
        for (int e = 0; e < EPL; ++e) kv[b][e] = vv[b][e] = 0.f;
        if (jj < k1) {
          const int idx = key_index(p, c, jj);
          load_row<EPL>(kc + static_cast<size_t>(idx) * HD, lane, kv[b]);
          load_row<EPL>(vc + static_cast<size_t>(idx) * HD, lane, vv[b]);
        }
      }
      // The lane's partial dot products of 4 keys x 8 heads, summed over the
      // warp in one transposed reduction: lane b * 8 + h ends with the score
      // of (key b, head h). 31 independent shuffles, where a warp_sum per
      // score would be 32 chains of 5.
      float part[32];
#pragma unroll
      for (int b = 0; b < 4; ++b)
#pragma unroll
        for (int h = 0; h < 8; ++h) {
          float d = 0.f;
#pragma unroll
          for (int e = 0; e < EPL; ++e) d = fmaf(q[h][e], kv[b][e], d);
          part[b * 8 + h] = d;
        }
      transposed_sum_level<16>(part, lane);
      transposed_sum_level<8>(part, lane);
      transposed_sum_level<4>(part, lane);
      transposed_sum_level<2>(part, lane);
      transposed_sum_level<1>(part, lane);
      const float my_score = part[0] * qscale;
      // Online softmax per head over the 4 keys (heads independent: no
      // branch, an invalid key or head leaves the state as it is).
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const bool valid_key = j + b * kWarps < k1;
#pragma unroll
        for (int h = 0; h < 8; ++h) {
          const float sc = __shfl_sync(0xffffffffu, my_score, b * 8 + h);
          const bool use = valid_key && h < hp;
          const float mn = use ? fmaxf(m[h], sc) : m[h];
          const float corr = use ? exp2f(m[h] - mn) : 1.f;  // 0 when m was -inf
          const float pr = use ? exp2f(sc - mn) : 0.f;
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
    consumer_sync();
    for (int e = threadIdx.x; e < hp * HD; e += kConsumers) {
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
    consumer_sync();
  }
}

/// Max over the consumer threads, the same value in each.
__device__ __forceinline__ float block_max(float v, float* small) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) small[threadIdx.x >> 5] = v;
  consumer_sync();
  float t = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t = fmaxf(t, small[w]);
  consumer_sync();
  return t;
}

/// One part of a query head split over several CTAs (MegaPlan::head_parts):
/// part r > 0 leaves its state (max, sum, unnormalized output) in the
/// partial buffers and counts itself on `flag`; part 0 waits for the others
/// there, merges them in part order and writes the output.
struct HeadPart {
  int r = 0, parts = 1;  ///< this part, parts of the head (1: no handoff)
  /// MegaPlan::merge_in_o: every part (0 too) leaves its state in part_o /
  /// part_ml and no part merges; the O projection's input load does.
  bool defer = false;
  /// Null, or this CTA's kMegaAttnStamps phase stamps of the layer (trace).
  unsigned long long* stamps = nullptr;
  unsigned* flag = nullptr;   ///< the head's arrival counter of this layer
  float* part_o = nullptr;    ///< [parts][HD] of this head
  float2* part_ml = nullptr;  ///< [parts] of this head
};

/// The wait for the QKV op that head_attention does itself (MegaPlan::
/// attn_prewait): the committed K/V rows do not depend on this step, so their
/// loads are issued first and fly while thread 0 spins; only the q row and
/// the step's own K/V row (`self_row`, written by this step's QKV op) are
/// loaded after the acquire. ctr == nullptr: the caller has waited.
struct PreWait {
  const unsigned* ctr = nullptr;
  unsigned target = 0;
  int self_row = -1;                    ///< cache row of the step's own key
  unsigned long long* stamp = nullptr;  ///< the trace's "start" stamp of the attention op, or null
};

/// Attention of one query head (q row `qh`, its kv head's cache rows) over
/// its keys [k0, k0 + n) in one CTA (short contexts: all keys <=
/// MegaPlan::head_keys), one part of `part.parts`: with one part the output
/// goes straight to `out` (its slice of p.attn); else part 0 merges the
/// others' states (HeadPart). No merge phase: one grid-wide handoff less per
/// layer than the split units. Thread t owns 8 dims (d8 = t % (HD / 8)) of the keys
/// j = t / (HD / 8) (mod NS): the K and V loads of a row are coalesced, 16 of
/// them in flight per thread. Scores are summed over the row's HD / 8 lanes
/// with shuffles; the softmax is exact (max, then exp2 and sum over the CTA);
/// P V partial sums per key subset are added in subset order (deterministic).
/// Scratch: n scores, then [NS][HD] partial outputs. Not inlined: inside
/// the kernel its 16 loads in flight spilled (ptxas caps the kernel at 168
/// registers: 9 warps per SM, 3 in one of the four register-file quarters).
template <int HD>
__device__ __noinline__ void head_attention(const __nv_bfloat16* __restrict__ kcache,
                                            const __nv_bfloat16* __restrict__ vcache,
                                            const __nv_bfloat16* __restrict__ qh, __nv_bfloat16* __restrict__ out,
                                            const int* __restrict__ attend, int k0, int n, int prefix, int tree_base,
                                            HeadPart part, float* scratch, float* small, bool short_parts, PreWait pw) {
  // Everything by value (registers): through references to the kernel's
  // parameters and locals, every row address cost dependent loads.
  constexpr int V8 = HD / 8;           // uint4 per K / V row
  constexpr int NS = kConsumers / V8;  // key subsets
  constexpr int kBatch = 16;           // loads in flight per thread
  constexpr int kShort = 8;            // K and V rows per thread of a short part (n <= NS * kShort)
  const int tid = threadIdx.x;
  const int d8 = tid % V8, ks = tid / V8;
  // Logical key j -> cache row: the committed prefix, then the attend list.
  const auto row = [&](int jj) {
    const int j = k0 + jj;  // this part's keys are [k0, k0 + n)
    return j < prefix ? j : tree_base + attend[j - prefix];
  };
  const float qscale = rsqrtf(static_cast<float>(HD)) * 1.4426950408889634f;  // softmax in base 2
  float* sc = scratch;                                                        // [n] scores, then probabilities
  float* pv = scratch + ((n + 3) & ~3);                                       // [NS][HD]
  const uint4* kc = reinterpret_cast<const uint4*>(kcache) + d8;
  const uint4* vc = reinterpret_cast<const uint4*>(vcache) + d8;
  // The trace's phase stamps (thread 0, %globaltimer), when asked for.
  const auto mark = [&](int k) {
    if (part.stamps != nullptr && tid == 0) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      part.stamps[k] = t;
    }
  };
  mark(0);
  // A row written before this launch may be loaded before the wait; the
  // step's own row (and q) only after it.
  const bool waits = pw.ctr != nullptr;
  const auto early = [&](int r) { return !waits || r != pw.self_row; };
  const auto wait_qkv = [&] {
    if (!waits) {
      mark(1);
      return;
    }
    if (tid == 0) {
      spin_until([&] { return ld_acquire_gpu(pw.ctr) >= pw.target; });
      if (pw.stamp != nullptr) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        *pw.stamp = t;
      }
    }
    consumer_sync();
    mark(1);
  };
  float q[8];
  const auto load_q = [&] {
    const uint4 qv = __ldcg(reinterpret_cast<const uint4*>(qh) + d8);
    const uint32_t u[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) q[2 * e] = bf_lo(u[e]), q[2 * e + 1] = bf_hi(u[e]);
  };
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.f;
  float M, L;
  if (short_parts && n <= NS * kShort) {
    // ---- short parts (every decode step up to NS * kShort keys per part):
    // the K and the V rows of all the part's keys in flight at once, the
    // scores and probabilities in registers. One dependent round trip to
    // the cache instead of two (V used to wait for the softmax), no score
    // buffer. All V8 lanes of a row hold the same (bitwise) score: the
    // shuffle butterfly adds the same pairs in every lane. ----
    uint4 kv[kShort], vv[kShort];
    int rw[kShort];
#pragma unroll
    for (int b = 0; b < kShort; ++b) {
      const int j = ks + NS * b;
      rw[b] = j < n ? row(j) : -1;
      kv[b] = rw[b] >= 0 && early(rw[b]) ? __ldcg(kc + static_cast<size_t>(rw[b]) * V8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kShort; ++b)
      vv[b] = rw[b] >= 0 && early(rw[b]) ? __ldcg(vc + static_cast<size_t>(rw[b]) * V8) : make_uint4(0, 0, 0, 0);
    wait_qkv();
    load_q();
#pragma unroll
    for (int b = 0; b < kShort; ++b)
      if (rw[b] >= 0 && !early(rw[b])) {
        kv[b] = __ldcg(kc + static_cast<size_t>(rw[b]) * V8);
        vv[b] = __ldcg(vc + static_cast<size_t>(rw[b]) * V8);
      }
    float sj[kShort];
    float mloc = -INFINITY;
#pragma unroll
    for (int b = 0; b < kShort; ++b) {
      const uint32_t u[4] = {kv[b].x, kv[b].y, kv[b].z, kv[b].w};
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) d = fmaf(q[2 * e], bf_lo(u[e]), fmaf(q[2 * e + 1], bf_hi(u[e]), d));
#pragma unroll
      for (int o = V8 / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      sj[b] = ks + NS * b < n ? d * qscale : -INFINITY;
      mloc = fmaxf(mloc, sj[b]);
    }
    mark(2);
    M = block_max(mloc, small);
    float lsum = 0.f;
#pragma unroll
    for (int b = 0; b < kShort; ++b) {
      const float pj = ks + NS * b < n ? exp2f(sj[b] - M) : 0.f;
      if (d8 == 0) lsum += pj;  // each key once
      const uint32_t u[4] = {vv[b].x, vv[b].y, vv[b].z, vv[b].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * e] = fmaf(pj, bf_lo(u[e]), acc[2 * e]);
        acc[2 * e + 1] = fmaf(pj, bf_hi(u[e]), acc[2 * e + 1]);
      }
    }
    L = block_sum(lsum, small);
    mark(3);
  } else {
    // ---- scores: keys j = ks + NS * i, kBatch rows in flight. The loop bound
    // is the same for every thread: the shuffles need the whole warp. ----
    // The batched parts wait first: their first batch's K rows in registers
    // spilled (16 per thread beside the caller's 168), and L2 prefetches of
    // its K and V rows before the wait were slower at the 1.5B and 8B
    // (benchmarks/README.md, "committed K/V loads issued before its wait").
    // One batch of this thread's K (or V) rows, keys j0 + NS * b: kBatch
    // loads in flight; a key past the part's end reads nothing (zeros).
    const auto load_batch = [&](uint4(&rows)[kBatch], const uint4* cache, int j0) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int j = j0 + NS * b;
        rows[b] = j < n ? __ldcg(cache + static_cast<size_t>(row(j)) * V8) : make_uint4(0, 0, 0, 0);
      }
    };
    float mloc = -INFINITY;
    wait_qkv();
    load_q();
    for (int base = 0; base < n; base += NS * kBatch) {
      const int j0 = base + ks;
      uint4 kv[kBatch];
      load_batch(kv, kc, j0);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const uint32_t u[4] = {kv[b].x, kv[b].y, kv[b].z, kv[b].w};
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) d = fmaf(q[2 * e], bf_lo(u[e]), fmaf(q[2 * e + 1], bf_hi(u[e]), d));
#pragma unroll
        for (int o = V8 / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);  // the row's V8 lanes
        const int j = j0 + NS * b;
        if (j < n) {
          const float sj = d * qscale;
          mloc = fmaxf(mloc, sj);
          if (d8 == 0) sc[j] = sj;
        }
      }
    }
    mark(2);
    M = block_max(mloc, small);  // its barriers also publish sc
    float lsum = 0.f;
    for (int j = tid; j < n; j += kConsumers) {
      const float pj = exp2f(sc[j] - M);
      sc[j] = pj;
      lsum += pj;
    }
    L = block_sum(lsum, small);  // its barriers also publish the probabilities
    mark(3);
    // ---- P V: the same (key subset, d8) ownership ----
    for (int base = 0; base < n; base += NS * kBatch) {
      const int j0 = base + ks;
      uint4 vv[kBatch];
      load_batch(vv, vc, j0);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int j = j0 + NS * b;
        const float pj = j < n ? sc[j] : 0.f;
        const uint32_t u[4] = {vv[b].x, vv[b].y, vv[b].z, vv[b].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[2 * e] = fmaf(pj, bf_lo(u[e]), acc[2 * e]);
          acc[2 * e + 1] = fmaf(pj, bf_hi(u[e]), acc[2 * e + 1]);
        }
      }
    }
  }
  float4* mine = reinterpret_cast<float4*>(pv + ks * HD + d8 * 8);
  mine[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  mine[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  consumer_sync();
  float o = 0.f;
  if (tid < HD) {
#pragma unroll 8
    for (int k = 0; k < NS; ++k) o += pv[k * HD + tid];
    if (part.parts == 1) {
      out[tid] = __float2bfloat16_rn(o / L);
    } else if (part.r > 0 || part.defer) {
      __stcg(part.part_o + part.r * HD + tid, o);
      if (tid == 0) __stcg(part.part_ml + part.r, make_float2(M, L));
    }
  }
  mark(4);
  if (part.parts > 1 && !part.defer) {
    if (part.r > 0) {
      consumer_sync();
      if (tid == 0) red_release_gpu_add(part.flag, 1u);
    } else {
      if (tid == 0) spin_until([&] { return ld_acquire_gpu(part.flag) >= static_cast<unsigned>(part.parts - 1); });
      consumer_sync();
      if (tid < HD) {
        float2 ml[kMaxHeadParts];
        float mx = M;
        for (int q = 1; q < part.parts; ++q) {
          ml[q] = __ldcg(part.part_ml + q);
          mx = fmaxf(mx, ml[q].x);
        }
        const float f0 = exp2f(M - mx);
        float num = o * f0, den = L * f0;
        for (int q = 1; q < part.parts; ++q) {
          const float f = exp2f(ml[q].x - mx);
          num = fmaf(__ldcg(part.part_o + q * HD + tid), f, num);
          den = fmaf(ml[q].y, f, den);
        }
        out[tid] = __float2bfloat16_rn(num / den);
      }
    }
  }
  mark(5);
  consumer_sync();  // the scratch is reused by the next head of this CTA
}

/// MegaPlan::merge_in_o: x = the attention output, merged here from every
/// query head's `parts` part states (part_o / part_ml, left by head_attention
/// with HeadPart::defer) instead of by each head's part 0. The same
/// operations in the same order as part 0's merge, so the same bits; it
/// spares the attention its point-to-point handoff (part 0's wait for the
/// others, its loads and its output store) at the cost of every O CTA loading
/// parts x num_heads x head_dim floats instead of num_heads x head_dim bf16.
/// Thread t takes 4 consecutive dims of one head at a time, all its parts'
/// loads in flight at once (at most kMaxMergeParts parts: 8 x 6 registers of
/// loads in flight spilled). Not inlined: inside the kernel it added spills.
__device__ __noinline__ void load_merged_attn(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                                              int num_heads, int head_dim, int max_splits, int parts,
                                              __nv_bfloat16* x) {
  const int g4 = head_dim / 4;
  for (int g = threadIdx.x; g < num_heads * g4; g += kConsumers) {
    const int h = g / g4, d0 = (g - h * g4) * 4;
    const float* po = part_o + static_cast<size_t>(h) * max_splits * head_dim + d0;
    const float2* pm = part_ml + static_cast<size_t>(h) * max_splits;
    float2 ml[kMaxMergeParts];
    float4 o[kMaxMergeParts];
#pragma unroll
    for (int q = 0; q < kMaxMergeParts; ++q)
      if (q < parts) {
        ml[q] = __ldcg(pm + q);
        o[q] = __ldcg(reinterpret_cast<const float4*>(po + static_cast<size_t>(q) * head_dim));
      }
    float mx = ml[0].x;
#pragma unroll
    for (int q = 1; q < kMaxMergeParts; ++q)
      if (q < parts) mx = fmaxf(mx, ml[q].x);
    const float f0 = exp2f(ml[0].x - mx);
    float n0 = o[0].x * f0, n1 = o[0].y * f0, n2 = o[0].z * f0, n3 = o[0].w * f0;
    float den = ml[0].y * f0;
#pragma unroll
    for (int q = 1; q < kMaxMergeParts; ++q)
      if (q < parts) {
        const float f = exp2f(ml[q].x - mx);
        n0 = fmaf(o[q].x, f, n0);
        n1 = fmaf(o[q].y, f, n1);
        n2 = fmaf(o[q].z, f, n2);
        n3 = fmaf(o[q].w, f, n3);
        den = fmaf(ml[q].y, f, den);
      }
    reinterpret_cast<uint2*>(x)[g] = make_uint2(pack_bf16x2(n0 / den, n1 / den), pack_bf16x2(n2 / den, n3 / den));
  }
  consumer_sync();
}

/// The merge phase: every CTA merges the key splits of a slice of the output
/// elements, [c * nq / G, (c+1) * nq / G), in split order (deterministic),
/// the partial states loaded kMergeBatch splits at a time, all in flight.
/// (Merging in the last unit of each kv head, or redundantly in every CTA of
/// the O projection, saves a grid-wide handoff but measured slower;
/// benchmarks/README.md, "the decode megakernel reworked".)
__device__ void merge_splits(const MegaParams& p, const StepConsts& c, int cta) {
  const MegaShape& s = p.s;
  const int HD = s.head_dim, nq = s.num_heads * HD, G = p.plan.ctas, MS = p.plan.max_splits, S = c.splits;
  const int e0 = static_cast<int>(static_cast<long long>(cta) * nq / G);
  const int e1 = static_cast<int>(static_cast<long long>(cta + 1) * nq / G);
  for (int e = e0 + threadIdx.x; e < e1; e += kConsumers) {
    const int head = e / HD, dd = e - head * HD;
    float m = -INFINITY, l = 0.f, o = 0.f;
    for (int s0 = 0; s0 < S; s0 += kMergeBatch) {
      float2 ml[kMergeBatch];
      float po[kMergeBatch];
#pragma unroll
      for (int b = 0; b < kMergeBatch; ++b) {
        if (s0 + b < S) {
          const size_t idx = static_cast<size_t>(head) * MS + s0 + b;
          ml[b] = __ldcg(p.part_ml + idx);
          po[b] = __ldcg(p.part_o + idx * HD + dd);
        } else {
          ml[b] = make_float2(-INFINITY, 0.f);
          po[b] = 0.f;
        }
      }
#pragma unroll
      for (int b = 0; b < kMergeBatch; ++b) {
        if (ml[b].x == -INFINITY) continue;  // a split without keys, or past S
        const float mn = fmaxf(m, ml[b].x);
        const float fa = exp2f(m - mn), fb = exp2f(ml[b].x - mn);  // fa = 0 while m = -inf
        l = l * fa + ml[b].y * fb;
        o = o * fa + po[b] * fb;
        m = mn;
      }
    }
    p.attn[e] = __float2bfloat16_rn(o / l);
  }
}
