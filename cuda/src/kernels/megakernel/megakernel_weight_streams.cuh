// Decode megakernel weight streams: which rows of which matrix a CTA reads (in
// step order), the producer warp that streams them through the ring, the
// consumer warps' GEMV over the ring, a GEMV op's wait / release, and the ops'
// input prologues (RMSNorm).
// Part of decode_megakernel.cu, included once inside its anonymous
// namespace and its `#if defined(__CUDACC__)`, so that each file holds one
// piece of the kernel; uses megakernel_primitives.cuh.
#pragma once

// ---------------------------------------------------------------- weight streams
/// This CTA's rows [row0, row1) of one weight matrix (K columns).
struct Stream {
  const __nv_bfloat16* w;
  int K, row0, row1, pad;
};

/// Stream `idx` = 4 * layer + StreamKind, or 4 * num_layers for the LM head.
/// Rows are split over the CTAs in units of 16 (QKV: RoPE pairs; gate/up:
/// SwiGLU pairs; LM head: padded vocabulary) or 1 (O, down: the same split,
/// so a CTA owns the same residual rows in both).
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
      case kStreamQKV:
        st.w = L.qkv;
        st.K = s.hidden;
        units = (nq + 2 * nkv) / 16;
        unit = 16;
        break;
      case kStreamO:
        st.w = L.o;
        st.K = nq;
        units = s.hidden;
        unit = 1;
        break;
      case kStreamGateUp:
        st.w = L.gu;
        st.K = s.hidden;
        units = 2 * s.intermediate / 16;
        unit = 16;
        break;
      default:
        st.w = L.down;
        st.K = s.intermediate;
        units = s.hidden;
        unit = 1;
        break;
    }
  }
  const int G = p.plan.ctas;
  st.row0 = static_cast<int>(static_cast<long long>(cta) * units / G) * unit;
  st.row1 = static_cast<int>(static_cast<long long>(cta + 1) * units / G) * unit;
  st.pad = 0;
  return st;
}

/// The trace's op slot of stream `idx` (QKV, O, gate/up, down per layer;
/// the LM head last).
__device__ __forceinline__ int op_slot_of_stream(int idx, int num_layers) {
  if (idx >= kStreamsPerLayer * num_layers) return kCtrPerLayer * num_layers;
  const int base = (idx / kStreamsPerLayer) * kCtrPerLayer;
  switch (idx % kStreamsPerLayer) {
    case kStreamQKV:
      return base + kCtrQKV;
    case kStreamO:
      return base + kCtrO;
    case kStreamGateUp:
      return base + kCtrGateUp;
    default:
      return base + kCtrDown;
  }
}

/// This CTA's kMegaRingWords trace words of op `slot` (MegaParams::trace set).
__device__ __forceinline__ unsigned long long* ring_trace_words(const MegaParams& p, int slot) {
  return p.trace + mega_trace_ring_offset(p.s.num_layers, p.plan.ctas) +
         (static_cast<size_t>(slot) * p.plan.ctas + blockIdx.x) * kMegaRingWords;
}

/// The producer's ring waits of the traced kernel, summed per op (words 1-4
/// of kMegaRingWords): a wait counts for the op whose chunk holds the slot
/// waited for; the sums are stored when that op changes (streams come in
/// order) and at the end.
struct ProducerWaits {
  static constexpr int kWords = kMegaRingWords - 1;
  int idx = -1;
  uint32_t landed = 0;                ///< every chunk below this one has landed (seen so far)
  unsigned long long w[kWords] = {};  ///< in flight, landed not consumed, of that idle, held
  /// Adds `cycles` to word `k` (1..4) of stream `stream`'s op.
  __device__ void add(const MegaParams& p, int stream, int k, unsigned long long cycles) {
    if (stream != idx) {
      flush(p);
      idx = stream;
    }
    w[k - 1] += cycles;
  }
  __device__ void flush(const MegaParams& p) {
    if (idx >= 0 && p.trace != nullptr) {
      unsigned long long* out = ring_trace_words(p, op_slot_of_stream(idx, p.s.num_layers));
      for (int k = 0; k < kWords; ++k) out[k + 1] = w[k];
    }
    for (int k = 0; k < kWords; ++k) w[k] = 0;
  }
};

/// Traced producer, before refilling `slot` (chunk seq - ns, round >= 1):
/// how long the chunk there took to land (word 1), then to be consumed
/// (word 2), and of that, how long every chunk in the ring, up to seq - 1,
/// had landed too (word 3: the SM's stream stood still; bulk copies may land
/// out of order, so each one's full barrier is probed, in order, from the
/// last one seen landed). The barriers probed cannot be re-armed before this
/// refill (chunk k's slot only at k + ns > seq - 1), so the probes read
/// settled phases. The wait on `empty` suspends in ~100 ns steps between the
/// probes instead of busy-polling (warp 8 shares a scheduler with consumer
/// warps).
__device__ __forceinline__ void timed_refill_wait(const MegaParams& p, ProducerWaits& waits, int stream, uint64_t* full,
                                                  uint64_t* empty, uint32_t seq, uint32_t ns) {
  const uint32_t slot = seq % ns, parity = (seq / ns - 1) & 1u;
  waits.add(p, stream, 1, timed_ring_wait(&full[slot], parity));
  if (waits.landed < seq - ns + 1) waits.landed = seq - ns + 1;  // chunk seq - ns just did
  if (mbar_test_wait(&empty[slot], parity)) return;
  const auto all_landed = [&] {
    while (waits.landed < seq && mbar_test_wait(&full[waits.landed % ns], (waits.landed / ns) & 1u)) ++waits.landed;
    return waits.landed == seq;
  };
  const long long t0 = clock64();
  long long since = all_landed() ? t0 : -1;
  spin_until([&] {
    if (since < 0 && all_landed()) since = clock64();
    return mbar_try_wait_for(&empty[slot], parity, 100);
  });
  const long long t1 = clock64();
  waits.add(p, stream, 2, static_cast<unsigned long long>(t1 - t0));
  if (since >= 0) waits.add(p, stream, 3, static_cast<unsigned long long>(t1 - since));
}

__device__ __forceinline__ int rows_per_chunk(const MegaPlan& pl, int K) { return max(1, pl.slot_bytes / (2 * K)); }

/// MegaPlan::l2_prefetch_bytes: one bulk L2 prefetch of at most
/// `pl.l2_prefetch_bytes` from the end of the CTA's rows of stream `st`,
/// issued once the CTA's attention is done, while HBM would idle until the O
/// projection; a hint, no data changes. Only rows the ring cannot hold
/// before the stream's op starts: the ring fetches the head of the stream
/// itself, at most num_slots chunks of it, and a prefetch of those would read
/// them from HBM twice (at the 0.5B shape a CTA's gate/up rows are 112-140 KB,
/// about what the ring holds: nothing to prefetch).
__device__ __forceinline__ void l2_prefetch_tail(const MegaPlan& pl, const Stream& st) {
  const int beyond = st.row1 - st.row0 - pl.num_slots * rows_per_chunk(pl, st.K);
  if (beyond <= 0) return;
  const size_t total = static_cast<size_t>(beyond) * st.K * 2;
  const size_t cap = static_cast<size_t>(pl.l2_prefetch_bytes);
  const size_t n = (total < cap ? total : cap) & ~size_t(15);
  if (n == 0) return;
  const char* end = reinterpret_cast<const char*>(st.w + static_cast<size_t>(st.row1) * st.K);
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(end - n), "r"(static_cast<uint32_t>(n)) : "memory");
}

/// A walk over the CTA's streams in step order, chunk by chunk (whole rows,
/// at most one slot), the producer's.
/// After next(): the chunk's stream is `idx` and `after` chunks of that
/// stream follow it in this CTA.
struct ChunkWalk {
  int idx = 0, row = -1, after = 0;
  __device__ bool next(const MegaParams& p, const Stream* table, int last_idx, const void*& src, uint32_t& bytes) {
    while (idx <= last_idx) {
      const Stream st = table[idx];
      if (row < st.row0) row = st.row0;
      if (row < st.row1) {
        const int rpc = rows_per_chunk(p.plan, st.K);
        const int rows = min(rpc, st.row1 - row);
        src = st.w + static_cast<size_t>(row) * st.K;
        bytes = static_cast<uint32_t>(rows) * st.K * 2u;
        row += rows;
        after = (st.row1 - row + rpc - 1) / rpc;
        return true;
      }
      ++idx;
      row = -1;
    }
    return false;
  }
};

/// The producer (lane 0 of warp 8): every chunk of the step in order into
/// slot seq % slots, as soon as the consumer warps have freed that slot.
/// Weights do not depend on activations, so it runs as far ahead of the
/// arithmetic as the ring allows, across matrices and layers. (Bulk L2
/// prefetches further ahead of the ring measured slower; benchmarks/README.md,
/// "the decode megakernel reworked".)
///
/// With MegaPlan::release_hold = D > 0, a slot that held one of the last D
/// chunks of a stream is refilled with a chunk of a later stream only once the
/// CTA has released that op's outputs (`released` > the stream's index;
/// chunks of the same stream never wait: the op needs them): its release (a fence
/// waiting for its stores) then does not queue behind the refills that its
/// own last chunks freed (the per-CTA trace showed a CTA's release after the
/// down op slow at the 0.5B while its ring refilled; one chunk in flight
/// shortened the wake but slowed the stream; benchmarks/README.md, "where the
/// megakernel's handoffs go").
///
/// kTraced: the waits are timed (ProducerWaits); the untraced instantiation
/// has none of that code.
template <bool kTraced>
__device__ void producer_loop(const MegaParams& p, const Stream* table, int last_idx, unsigned char* slots,
                              uint64_t* full, uint64_t* empty, const int* released) {
  const uint64_t policy = l2_policy_evict_first();  // weights are read once per step
  const uint32_t ns = static_cast<uint32_t>(p.plan.num_slots);
  // A cap below the depth: before chunk seq, chunk seq - cap must have landed
  // (its full barrier's phase; the slot is not re-armed before seq - cap + ns > seq).
  const uint32_t cap = p.plan.max_inflight > 0 && static_cast<uint32_t>(p.plan.max_inflight) < ns
                           ? static_cast<uint32_t>(p.plan.max_inflight)
                           : 0u;
  const int hold = p.plan.release_hold;
  ChunkWalk ring, freed;  // freed: the chunk whose slot the next refill reuses (seq - ns)
  ProducerWaits waits;    // kTraced only
  uint32_t seq = 0;
  const void* src;
  uint32_t bytes;
  while (ring.next(p, table, last_idx, src, bytes)) {
    const uint32_t slot = seq % ns, round = seq / ns;
    if (round > 0) {
      const void* fsrc;
      uint32_t fbytes;
      if constexpr (kTraced) {
        freed.next(p, table, last_idx, fsrc, fbytes);  // which op's chunk the slot holds
        timed_refill_wait(p, waits, freed.idx, full, empty, seq, ns);
      } else {
        ring_wait(&empty[slot], (round - 1) & 1u);
      }
      if (hold > 0) {
        if constexpr (!kTraced) freed.next(p, table, last_idx, fsrc, fbytes);
        // Only a chunk of a later stream waits: the op still needs the rest of
        // its own (holding those deadlocks once an op is longer than the
        // ring). The LM head (the last stream) has no release.
        if (freed.after < hold && ring.idx != freed.idx && freed.idx < kStreamsPerLayer * p.s.num_layers) {
          const int need = freed.idx + 1;
          long long t0 = 0;
          if constexpr (kTraced) t0 = clock64();
          spin_until([&] { return ld_volatile_shared(released) >= need; });
          if constexpr (kTraced) waits.add(p, freed.idx, 4, static_cast<unsigned long long>(clock64() - t0));
        }
      }
    }
    if (cap != 0 && seq >= cap) ring_wait(&full[(seq - cap) % ns], ((seq - cap) / ns) & 1u);
    mbar_arrive_expect_tx(&full[slot], bytes);
    bulk_load(slots + static_cast<size_t>(slot) * p.plan.slot_bytes, src, bytes, &full[slot], policy);
    ++seq;
  }
  if constexpr (kTraced) waits.flush(p);
}

// ---------------------------------------------------------------- consumer GEMV
/// Dot products of N rows (bf16, in a ring slot, V uint4 each) with x (bf16,
/// shared), summed over the warp: every lane returns all N (fixed order).
template <int N>
__device__ __forceinline__ void dot_rows(const uint4* const (&w)[4], const uint4* x, int V, int lane, float (&out)[4]) {
  float a[N][2];
#pragma unroll
  for (int n = 0; n < N; ++n) a[n][0] = a[n][1] = 0.f;
  int v = lane;
  for (; v + 32 < V; v += 64) {
    const uint4 x0 = x[v], x1 = x[v + 32];
#pragma unroll
    for (int n = 0; n < N; ++n) {
      a[n][0] = dot8(w[n][v], x0, a[n][0]);
      a[n][1] = dot8(w[n][v + 32], x1, a[n][1]);
    }
  }
  if (v < V) {
    const uint4 x0 = x[v];
#pragma unroll
    for (int n = 0; n < N; ++n) a[n][0] = dot8(w[n][v], x0, a[n][0]);
  }
#pragma unroll
  for (int n = 0; n < N; ++n) out[n] = a[n][0] + a[n][1];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int n = 0; n < N; ++n) out[n] += __shfl_xor_sync(0xffffffffu, out[n], o);
  }
}

/// The consumers' position in the ring (the same sequence as the producer's).
struct Ring {
  unsigned char* slots;
  uint64_t* full;
  uint64_t* empty;
  uint32_t seq = 0;
  /// Traced kernel, consumer thread 0: cycles blocked waiting for chunks to
  /// land in the current op (stored and reset by store_ring_wait).
  unsigned long long bytes_wait = 0;
};

/// Traced kernel: consumer thread 0 stores the op's wait for bytes (word 0
/// of kMegaRingWords of op `slot`) and resets it.
template <bool kTraced>
__device__ __forceinline__ void store_ring_wait(const MegaParams& p, int slot, Ring& ring) {
  if constexpr (kTraced) {
    if (p.trace != nullptr && threadIdx.x == 0) ring_trace_words(p, slot)[0] = ring.bytes_wait;
    ring.bytes_wait = 0;
  }
}

/// Consumer warps: the chunks of stream `st` in order. Each warp waits for a
/// chunk, computes the dot products of its rows of it with x and hands each
/// (absolute row, value) to `on_row` (all lanes, the same value), then frees
/// the slot for the producer. No CTA barrier: warps drift apart by up to the
/// ring's depth.
template <bool kTraced, class F>
__device__ __forceinline__ void consume_stream(const MegaParams& p, const Stream& st, Ring& ring,
                                               const __nv_bfloat16* x, F&& on_row) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rpc = rows_per_chunk(p.plan, st.K);
  const int V = st.K / 8;
  const uint32_t ns = static_cast<uint32_t>(p.plan.num_slots);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  for (int row = st.row0; row < st.row1;) {
    const int R = min(rpc, st.row1 - row);
    const uint32_t slot = ring.seq % ns;
    if constexpr (kTraced)
      ring.bytes_wait += timed_ring_wait(&ring.full[slot], (ring.seq / ns) & 1u);
    else
      ring_wait(&ring.full[slot], (ring.seq / ns) & 1u);
    const uint4* w = reinterpret_cast<const uint4*>(ring.slots + static_cast<size_t>(slot) * p.plan.slot_bytes);
    // This warp's rows of the chunk: j with (row - row0 + j) % 8 == warp.
    for (int j = (warp - (row - st.row0)) & 7; j < R; j += 32) {
      const int n = min(4, (R - j + 7) / 8);
      const uint4* rows[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) rows[k] = w + static_cast<size_t>(j + 8 * min(k, n - 1)) * V;
      float out[4];
      if (n == 4)
        dot_rows<4>(rows, xv, V, lane, out);
      else if (n == 3)
        dot_rows<3>(rows, xv, V, lane, out);
      else if (n == 2)
        dot_rows<2>(rows, xv, V, lane, out);
      else
        dot_rows<1>(rows, xv, V, lane, out);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (k < n) on_row(row + j + 8 * k, out[k]);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&ring.empty[slot]);
    ++ring.seq;
    row += R;
  }
}

/// The held refills of streams < `value` may go (MegaPlan::release_hold):
/// consumer thread 0 moves the CTA's mark (monotone, stream index + 1).
__device__ __forceinline__ void mark_released(int* released, int value) {
  if (threadIdx.x == 0) st_volatile_shared(released, value);
}

/// One GEMV op of the step, the same skeleton for QKV, O, gate/up and down:
/// a CTA with rows in `st` waits until `wait_ctr` (null: nothing to wait for)
/// reaches the grid size, stamps the op's start, runs `body` (input, stream,
/// epilogue); a CTA without rows only stamps its start. Either way it then
/// counts itself done on `done_ctr` (a CTA without rows must not hold back
/// the next op's waiters). Held refills (MegaPlan::release_hold): by default
/// the op's own go after its release; with hold_until_input the body marks
/// those of `prev_stream` once its input is loaded (a CTA without rows here
/// at once).
template <bool kTraced, class Body>
__device__ __forceinline__ void gemv_op(const MegaParams& p, const Stream& st, const unsigned* wait_ctr,
                                        unsigned* done_ctr, int slot, int stream_idx, int prev_stream, int* released,
                                        Body&& body) {
  if (st.row1 > st.row0) {
    trace_mark<kTraced>(p, slot, 2);
    if (wait_ctr != nullptr) wait_counter(wait_ctr, static_cast<unsigned>(p.plan.ctas));
    trace_mark<kTraced>(p, slot, 0);
    body();
  } else {
    trace_mark<kTraced>(p, slot, 0);
    if (p.plan.hold_until_input) mark_released(released, prev_stream + 1);
  }
  signal_counter<kTraced>(p, done_ctr, slot);
  // After the release (its fence has waited for the op's stores): the
  // producer may refill the slots held for it.
  if (!p.plan.hold_until_input) mark_released(released, stream_idx + 1);
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
    for (int i = threadIdx.x; i < H / 8; i += kConsumers) {
      const uint4 v = __ldg(e + i);
      reinterpret_cast<uint4*>(x)[i] = v;
      const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) ss += bf_lo(w4[k]) * bf_lo(w4[k]) + bf_hi(w4[k]) * bf_hi(w4[k]);
    }
  } else {
    const float4* h = reinterpret_cast<const float4*>(p.h32);
    for (int i = threadIdx.x; i < H / 4; i += kConsumers) {
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
  for (int i = threadIdx.x; i < K / 8; i += kConsumers) reinterpret_cast<uint4*>(x)[i] = __ldcg(s + i);
  consumer_sync();
}
