// The decode megakernel (decode_megakernel.h): a whole single-token step as
// one persistent kernel. Layout of this file: synchronization and copy
// primitives; the weight streams (which rows of which matrix a CTA reads, in
// step order); the producer warp that streams them into the ring; the
// consumer warps' GEMV over the ring; the prologues (input vector, RMSNorm);
// attention; the kernel; the plan.
//
// Roles inside a CTA (warp specialization): warps 0-7 are consumers (all the
// arithmetic, synchronized among themselves by named barrier 1), warp 8's
// lane 0 is the producer. The producer never waits for arithmetic except for
// a free ring slot: each slot has a "full" mbarrier (completed by the TMA
// bytes) and an "empty" one (one arrival per consumer warp). Consumer warp w
// owns the rows i of every stream with i % 8 == w (i counted from the CTA's
// first row of that stream), so a chunk needs no CTA barrier: each warp
// reads its rows, then arrives on the slot's empty barrier.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "common.h"
#include "kernels/decode_megakernel.h"
#include "kernels/epilogues.h"

namespace swiftspec::cuda {

namespace {

constexpr int kWarps = 8;                    ///< consumer warps
constexpr int kConsumers = kWarps * 32;      ///< consumer threads
constexpr int kThreads = kConsumers + 32;    ///< + the producer warp
/// Counters per layer, in step order (also the trace's op slots; the LM head
/// is slot kCtrPerLayer * num_layers).
enum Counter { kCtrQKV = 0, kCtrAttn = 1, kCtrMerge = 2, kCtrO = 3, kCtrGateUp = 4, kCtrDown = 5, kCtrPerLayer = 6 };
/// Weight streams per layer (the attention has none).
enum StreamKind { kStreamQKV = 0, kStreamO = 1, kStreamGateUp = 2, kStreamDown = 3, kStreamsPerLayer = 4 };
/// Keys per attention unit (kv head, split): 8 warps x 4 keys in flight
/// (64 or more keys per unit measured slower, run 14).
constexpr int kKeysPerSplit = 32;
/// Splits whose partial states one thread loads at once in a merge.
constexpr int kMergeBatch = 16;
/// Default MegaPlan::head_keys per part at head_dim 64 (half at 128): query
/// heads run in head_attention units instead of split units and a merge up
/// to this many keys per part (its K and V rows: 144 KB). Run 20 (bench,
/// random weights, one part): 0.5B 0.674 vs 0.736 ms at 256 keys, 0.752 vs
/// 0.766 at 512. One SM reads those rows at only ~16 GB/s, so one part per
/// head was no faster at head_dim 128 (1.5B 1.356 vs 1.352 ms at 256 keys, 8B
/// 4.207 vs 4.182): there the default is 0 unless a head has several parts.
constexpr int kHeadKeysDefault64 = 576;
/// CTAs per query head in head_attention (MegaPlan::head_parts) at most, and
/// the plan's default: 4 parts measured faster than 8 at the 0.5B / 1.5B
/// shapes (run 20: 0.759 / 1.351 vs 0.771 / 1.371 ms), and than 1 (0.788 /
/// 1.401) or the split units (0.766 / 1.391).
constexpr int kMaxHeadParts = 8;
/// MegaPlan::merge_in_o merges at most this many parts per head (more spill).
constexpr int kMaxMergeParts = 4;
constexpr int kDefaultHeadParts = 4;
/// MegaPlan::max_inflight by default (0: the whole ring).
constexpr int kDefaultMaxInflight = 0;
/// MegaPlan::release_hold and hold_until_input by default: the slots of each
/// op's last two chunks refilled once the next op has its input. Run 22
/// (H200, 512 keys, one call, benchmarks/README.md): 0.5B 0.663 / 0.662 /
/// 0.724 ms (hold 2 until the input / until the release / off), 1.5B 1.207 /
/// 1.241 / 1.315, 8B 4.128 / 4.162 / 4.205; hold 3 or 16 slower (the bytes
/// come too late).
constexpr int kDefaultReleaseHold = 2;
constexpr int kDefaultHoldUntilInput = 1;
/// MegaPlan::attn_short by default at head_dim 64 (0 at 128). Run 22 (512
/// keys, 4 parts per head): 0.5B 0.599 vs 0.658 ms (attention 6.5 vs 8.2 µs
/// per layer); at head_dim 128 no faster: 1.5B 1.241 vs 1.208, 8B 4.085 vs 4.074.
constexpr int kDefaultAttnShort = 1;
/// MegaPlan::attn_prewait by default (a short head part's committed K/V loads
/// issued before its wait for the QKV op). Run 23 (512 keys): the 0.5B's
/// traced step 578.8-582.9 vs 589.8-592.1 µs, attention 6.0-6.2 vs 6.7-6.9 µs
/// per layer; head_dim 128 unchanged (batched parts load after the wait).
constexpr int kDefaultAttnPrewait = 1;
/// MegaPlan::merge_in_o by default: off until measured (run 23 wrote it
/// without a GPU; the next session's A/B decides).
constexpr int kDefaultMergeInO = 0;
/// Shared memory the plan reserves besides slots, x, misc, tables and
/// barriers: reduction scratch (16 floats, 8 keys), the step's constants,
/// RoPE table (64 (cos, sin) at most) and the CTA's release mark; and
/// alignment slack.
constexpr int kSmallBytes = 256 + 64 * 8;
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
/// The CTA's release mark (MegaPlan::release_hold): a plain shared-memory
/// word written by consumer thread 0, polled by the producer.
__device__ __forceinline__ int ld_volatile_shared(const int* p) {
  int v;
  asm volatile("ld.volatile.shared.s32 %0, [%1];" : "=r"(v) : "r"(smem_u32(p)) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile_shared(int* p, int v) {
  asm volatile("st.volatile.shared.s32 [%0], %1;" ::"r"(smem_u32(p)), "r"(v) : "memory");
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
/// Spins until ready(); traps after ~10 s: a producer that never arrives (or
/// a mismatch between the producer's and the consumers' chunk walks) is a
/// bug, and a trap reports it where a hang would not.
template <class F>
__device__ __forceinline__ void spin_until(F&& ready) {
  if (ready()) return;
  const long long t0 = clock64();
  while (!ready())
    if (clock64() - t0 > 20000000000LL) __trap();
}
/// mbar_wait with spin_until's guard.
__device__ __forceinline__ void ring_wait(uint64_t* bar, uint32_t parity) {
  spin_until([&] { return mbar_try_wait(bar, parity); });
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
/// Barrier of the consumer warps only (the producer warp never joins).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

/// Consumer thread 0 waits until *ctr >= target (acquire at GPU scope; with
/// spin_until's guard), then the consumers proceed. (Relaxed polls with one
/// fence after success measured slower, run 14.)
__device__ __forceinline__ void wait_counter(const unsigned* ctr, unsigned target) {
  if (threadIdx.x == 0) spin_until([&] { return ld_acquire_gpu(ctr) >= target; });
  consumer_sync();
}

/// Trace (MegaParams::trace): consumer thread 0 stamps the global timer (ns)
/// at the start (which 0: after its wait), the end (1: before its release) or
/// the arrival at the wait (2) of op `slot`.
__device__ __forceinline__ void trace_mark(const MegaParams& p, int slot, int which) {
  if (p.trace != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    p.trace[(static_cast<size_t>(slot) * p.plan.ctas + blockIdx.x) * kMegaTraceStamps + which] = t;
  }
}

/// The consumers' writes so far (ordered by the barrier) are released to the
/// waiters of `ctr` (the pattern of CUTLASS's generic barrier). The trace's
/// end of op `slot` is stamped after the barrier: all warps are done.
__device__ __forceinline__ void signal_counter(const MegaParams& p, unsigned* ctr, int slot) {
  consumer_sync();
  trace_mark(p, slot, 1);
  if (threadIdx.x == 0) red_release_gpu_add(ctr, 1u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/// Sum over the consumer threads, the same value in each (fixed order).
__device__ __forceinline__ float block_sum(float v, float* small) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) small[threadIdx.x >> 5] = v;
  consumer_sync();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t += small[w];
  consumer_sync();
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
      case kStreamQKV: st.w = L.qkv; st.K = s.hidden; units = (nq + 2 * nkv) / 16; unit = 16; break;
      case kStreamO: st.w = L.o; st.K = nq; units = s.hidden; unit = 1; break;
      case kStreamGateUp: st.w = L.gu; st.K = s.hidden; units = 2 * s.intermediate / 16; unit = 16; break;
      default: st.w = L.down; st.K = s.intermediate; units = s.hidden; unit = 1; break;
    }
  }
  const int G = p.plan.ctas;
  st.row0 = static_cast<int>(static_cast<long long>(cta) * units / G) * unit;
  st.row1 = static_cast<int>(static_cast<long long>(cta + 1) * units / G) * unit;
  st.pad = 0;
  return st;
}

__device__ __forceinline__ int rows_per_chunk(const MegaPlan& pl, int K) {
  return max(1, pl.slot_bytes / (2 * K));
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
/// prefetches further ahead of the ring measured slower, run 14.)
///
/// With MegaPlan::release_hold = D > 0, a slot that held one of the last D
/// chunks of a stream is refilled with a chunk of a later stream only once the
/// CTA has released that op's outputs (`released` > the stream's index;
/// chunks of the same stream never wait: the op needs them): its release (a fence
/// waiting for its stores) then does not queue behind the refills that its
/// own last chunks freed (run 21's trace: a CTA's release after the down op
/// took 2.8 µs at the 0.5B while its ring refilled; one chunk in flight cut
/// the wake by 1 µs but slowed the stream everywhere).
__device__ void producer_loop(const MegaParams& p, const Stream* table, int last_idx, unsigned char* slots,
                              uint64_t* full, uint64_t* empty, const int* released) {
  const uint64_t policy = l2_policy_evict_first();  // weights are read once per step
  const uint32_t ns = static_cast<uint32_t>(p.plan.num_slots);
  // A cap below the depth: before chunk seq, chunk seq - cap must have landed
  // (its full barrier's phase; the slot is not re-armed before seq - cap + ns > seq).
  const uint32_t cap = p.plan.max_inflight > 0 && static_cast<uint32_t>(p.plan.max_inflight) < ns
                           ? static_cast<uint32_t>(p.plan.max_inflight) : 0u;
  const int hold = p.plan.release_hold;
  ChunkWalk ring, freed;  // freed: the chunk whose slot the next refill reuses (seq - ns)
  uint32_t seq = 0;
  const void* src;
  uint32_t bytes;
  while (ring.next(p, table, last_idx, src, bytes)) {
    const uint32_t slot = seq % ns, round = seq / ns;
    if (round > 0) {
      ring_wait(&empty[slot], (round - 1) & 1u);
      if (hold > 0) {
        const void* fsrc;
        uint32_t fbytes;
        freed.next(p, table, last_idx, fsrc, fbytes);
        // Only a chunk of a later stream waits: the op still needs the rest of
        // its own (holding those deadlocks once an op is longer than the
        // ring). The LM head (the last stream) has no release.
        if (freed.after < hold && ring.idx != freed.idx && freed.idx < kStreamsPerLayer * p.s.num_layers) {
          const int need = freed.idx + 1;
          spin_until([&] { return ld_volatile_shared(released) >= need; });
        }
      }
    }
    if (cap != 0 && seq >= cap) ring_wait(&full[(seq - cap) % ns], ((seq - cap) / ns) & 1u);
    mbar_arrive_expect_tx(&full[slot], bytes);
    bulk_load(slots + static_cast<size_t>(slot) * p.plan.slot_bytes, src, bytes, &full[slot], policy);
    ++seq;
  }
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
};

/// Consumer warps: the chunks of stream `st` in order. Each warp waits for a
/// chunk, computes the dot products of its rows of it with x and hands each
/// (absolute row, value) to `on_row` (all lanes, the same value), then frees
/// the slot for the producer. No CTA barrier: warps drift apart by up to the
/// ring's depth.
template <class F>
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
    ring_wait(&ring.full[slot], (ring.seq / ns) & 1u);
    const uint4* w = reinterpret_cast<const uint4*>(ring.slots + static_cast<size_t>(slot) * p.plan.slot_bytes);
    // This warp's rows of the chunk: j with (row - row0 + j) % 8 == warp.
    for (int j = (warp - (row - st.row0)) & 7; j < R; j += 32) {
      const int n = min(4, (R - j + 7) / 8);
      const uint4* rows[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) rows[k] = w + static_cast<size_t>(j + 8 * min(k, n - 1)) * V;
      float out[4];
      if (n == 4) dot_rows<4>(rows, xv, V, lane, out);
      else if (n == 3) dot_rows<3>(rows, xv, V, lane, out);
      else if (n == 2) dot_rows<2>(rows, xv, V, lane, out);
      else dot_rows<1>(rows, xv, V, lane, out);
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
template <class Body>
__device__ __forceinline__ void gemv_op(const MegaParams& p, const Stream& st, const unsigned* wait_ctr,
                                        unsigned* done_ctr, int slot, int stream_idx, int prev_stream, int* released,
                                        Body&& body) {
  if (st.row1 > st.row0) {
    trace_mark(p, slot, 2);
    if (wait_ctr != nullptr) wait_counter(wait_ctr, static_cast<unsigned>(p.plan.ctas));
    trace_mark(p, slot, 0);
    body();
  } else {
    trace_mark(p, slot, 0);
    if (p.plan.hold_until_input) mark_released(released, prev_stream + 1);
  }
  signal_counter(p, done_ctr, slot);
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
  int r = 0, parts = 1;       ///< this part, parts of the head (1: no handoff)
  /// MegaPlan::merge_in_o: every part (0 too) leaves its state in part_o /
  /// part_ml and no part merges; the O projection's input load does.
  bool defer = false;
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
  int self_row = -1;                  ///< cache row of the step's own key
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
__device__ __noinline__ void head_attention(const __nv_bfloat16* __restrict__ kcache, const __nv_bfloat16* __restrict__ vcache,
                                            const __nv_bfloat16* __restrict__ qh, __nv_bfloat16* __restrict__ out,
                                            const int* __restrict__ attend, int k0, int n, int prefix, int tree_base,
                                            HeadPart part, float* scratch, float* small, bool short_parts,
                                            PreWait pw) {
  // Everything by value (registers): through references to the kernel's
  // parameters and locals, every row address cost dependent loads.
  constexpr int V8 = HD / 8;             // uint4 per K / V row
  constexpr int NS = kConsumers / V8;    // key subsets
  constexpr int kBatch = 16;             // loads in flight per thread
  constexpr int kShort = 8;              // K and V rows per thread of a short part (n <= NS * kShort)
  const int tid = threadIdx.x;
  const int d8 = tid % V8, ks = tid / V8;
  // Logical key j -> cache row: the committed prefix, then the attend list.
  const auto row = [&](int jj) {
    const int j = k0 + jj;  // this part's keys are [k0, k0 + n)
    return j < prefix ? j : tree_base + attend[j - prefix];
  };
  const float qscale = rsqrtf(static_cast<float>(HD)) * 1.4426950408889634f;  // softmax in base 2
  float* sc = scratch;                              // [n] scores, then probabilities
  float* pv = scratch + ((n + 3) & ~3);             // [NS][HD]
  const uint4* kc = reinterpret_cast<const uint4*>(kcache) + d8;
  const uint4* vc = reinterpret_cast<const uint4*>(vcache) + d8;
  // A row written before this launch may be loaded before the wait; the
  // step's own row (and q) only after it.
  const bool waits = pw.ctr != nullptr;
  const auto early = [&](int r) { return !waits || r != pw.self_row; };
  const auto wait_qkv = [&] {
    if (!waits) return;
    if (tid == 0) {
      spin_until([&] { return ld_acquire_gpu(pw.ctr) >= pw.target; });
      if (pw.stamp != nullptr) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        *pw.stamp = t;
      }
    }
    consumer_sync();
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
  } else {
  // ---- scores: keys j = ks + NS * i, kBatch rows in flight. The loop bound
  // is the same for every thread: the shuffles need the whole warp. ----
  // The batched parts wait first: their first batch's K rows in registers
  // spilled (16 per thread beside the caller's 168), and L2 prefetches of
  // its K and V rows before the wait were slower (run 23: 1.5B 1.260 vs
  // 1.225 ms, 8B 4.146 vs 4.110).
  float mloc = -INFINITY;
  wait_qkv();
  load_q();
  for (int base = 0; base < n; base += NS * kBatch) {
    const int j0 = base + ks;
    uint4 kv[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int j = j0 + NS * b;
      kv[b] = j < n ? __ldcg(kc + static_cast<size_t>(row(j)) * V8) : make_uint4(0, 0, 0, 0);
    }
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
  M = block_max(mloc, small);  // its barriers also publish sc
  float lsum = 0.f;
  for (int j = tid; j < n; j += kConsumers) {
    const float pj = exp2f(sc[j] - M);
    sc[j] = pj;
    lsum += pj;
  }
  L = block_sum(lsum, small);  // its barriers also publish the probabilities
  // ---- P V: the same (key subset, d8) ownership ----
  for (int base = 0; base < n; base += NS * kBatch) {
    const int j0 = base + ks;
    uint4 vv[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int j = j0 + NS * b;
      vv[b] = j < n ? __ldcg(vc + static_cast<size_t>(row(j)) * V8) : make_uint4(0, 0, 0, 0);
    }
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
/// the O projection, saves a grid-wide handoff but measured slower, run 14.)
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

// ---------------------------------------------------------------- the kernel
__global__ void __launch_bounds__(kThreads, 1) decode_megakernel_kernel(const __grid_constant__ MegaParams p) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 127) & ~uintptr_t(127));
  const MegaPlan& pl = p.plan;
  const MegaShape& s = p.s;
  unsigned char* slots = base;
  __nv_bfloat16* x = reinterpret_cast<__nv_bfloat16*>(base + static_cast<size_t>(pl.num_slots) * pl.slot_bytes);
  float* misc = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(x) + pl.x_bytes);
  float* h_own = misc;                      // this CTA's residual rows (O and down), the whole step
  float* ybuf = misc + pl.own_rows;         // QKV / gate-up outputs of its rows; attention scratch
  Stream* table = reinterpret_cast<Stream*>(reinterpret_cast<unsigned char*>(misc) + pl.misc_bytes);
  MegaLayer* layers = reinterpret_cast<MegaLayer*>(reinterpret_cast<unsigned char*>(table) + pl.table_bytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(layers) + pl.layers_bytes);
  uint64_t* empty = full + pl.num_slots;
  float* small = reinterpret_cast<float*>(empty + pl.num_slots);                      // [16]
  unsigned long long* small_key = reinterpret_cast<unsigned long long*>(small + 16);  // [8]
  StepConsts* consts = reinterpret_cast<StepConsts*>(small_key + 8);
  float2* rope = reinterpret_cast<float2*>(consts + 1);  // [head_dim / 2] (cos, sin) of the step's position
  int* released = reinterpret_cast<int*>(rope + 64);       // streams released so far (release_hold)

  const int tid = threadIdx.x, cta = blockIdx.x, G = pl.ctas;
  const int warp = tid >> 5, lane = tid & 31;
  const int L = s.num_layers, H = s.hidden, I = s.intermediate;
  const int nstreams = kStreamsPerLayer * L + 1;
  const int last_idx = nstreams - 1 - (p.lm_head ? 0 : 1);
  unsigned* ctr = p.sync;

  for (int i = tid; i < nstreams; i += kThreads) table[i] = stream_of(p, i, cta);
  for (int i = tid; i < L; i += kThreads) layers[i] = p.layers[i];
  {
    const int pos = p.desc->positions[0];
    for (int i = tid; i < s.head_dim / 2; i += kThreads) {
      float sn, cs;
      sincosf(static_cast<float>(pos) * p.inv_freq[i], &sn, &cs);  // as EpiQKV
      rope[i] = make_float2(cs, sn);
    }
  }
  if (tid == 0) {
    make_step_consts(p, *consts);
    for (int i = 0; i < pl.num_slots; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kWarps);
    }
    fence_mbar_init();
    if (cta == 0) *p.keys = 0ull;  // published to the LM head by CTA 0's first release
    *released = 0;
  }
  __syncthreads();

  if (warp == kWarps) {  // ---- the producer warp ----------------------------------------
    if (lane == 0) producer_loop(p, table, last_idx, slots, full, empty, released);
    __syncwarp();
  } else {  // ---- the consumer warps ----------------------------------------------------
    const StepConsts c = *consts;
    Ring ring{slots, full, empty, 0};
    const Stream own = table[kStreamO];  // O and down rows: the same in every layer
    // O and down: row += dot, in the shared-memory residual and in h32 (read by all CTAs).
    const auto add_residual = [&](int row, float v) {
      if (lane == 0) {
        const float h = h_own[row - own.row0] + v;
        h_own[row - own.row0] = h;
        p.h32[row] = h;
      }
    };
    float rinv = 0.f;
    for (int l = 0; l < L; ++l) {
      const MegaLayer& Ly = layers[l];
      unsigned* lc = ctr + l * kCtrPerLayer;
      const int slot0 = l * kCtrPerLayer;
      // (An L2 prefetch of the attention units' committed K/V rows here, run
      // 14's, measured slower at the 0.5B (0.724 vs 0.711 ms) and no faster at
      // the 1.5B / 8B in run 21: it delayed the QKV op more than it sped up
      // the attention.)
      // ---- QKV (+ bias, RoPE, K/V into the cache) ------------------------------------
      {
        const Stream st = table[kStreamsPerLayer * l + kStreamQKV];
        gemv_op(p, st, l > 0 ? lc - kCtrPerLayer + kCtrDown : nullptr, lc + kCtrQKV, slot0 + kCtrQKV,
                kStreamsPerLayer * l + kStreamQKV, kStreamsPerLayer * l - 1, released, [&] {
          rinv = load_normed_input(p, l == 0, c.token, x, small);
          if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * l);  // down of layer l - 1
          consume_stream(p, st, ring, x, [&](int row, float v) {
            if (lane == 0) ybuf[row - st.row0] = v;
          });
          __syncwarp();
          // EpiQKV with the RoPE table of the launch instead of a sincosf after a
          // dependent load on the op's critical path. Tile t's pair (r, r + 8)
          // sits in warp r (rows i = 16 t + r, 16 t + 8 + r).
          EpiQKV::Params e;
          e.bias = Ly.qkv_bias;
          e.q = p.q;
          e.kcache = Ly.kcache;
          e.vcache = Ly.vcache;
          e.num_heads = s.num_heads;
          e.num_kv_heads = s.num_kv_heads;
          e.head_dim = s.head_dim;
          e.slots = s.slots;
          e.neox = s.neox;
          for (int t = lane; t < (st.row1 - st.row0) / 16; t += 32) {
            const int tile = st.row0 / 16 + t;
            const float2 cs = rope[EpiQKV::pair_index(e, tile, warp)];
            EpiQKV::store(e, tile, warp, 0, c.kv_index, ybuf[t * 16 + warp], ybuf[t * 16 + 8 + warp], rinv, cs.x, cs.y);
          }
        });
      }
      // ---- attention: query heads in head_parts CTAs each for short
      // contexts; else (kv head, split) units, then the merge phase ----------------------
      // hold_until_input 2: QKV's held refills go once this CTA's attention
      // units are done (their K/V loads must not queue behind them), at once
      // in a CTA without units.
      const int units = c.whole_heads ? s.num_heads * pl.head_parts : s.num_kv_heads * c.splits;
      if (pl.hold_until_input == 2 && cta >= units) mark_released(released, kStreamsPerLayer * l + kStreamQKV + 1);
      trace_mark(p, slot0 + kCtrAttn, 2);
      // attn_prewait: a CTA's first head unit waits for QKV itself, after
      // issuing its committed K/V loads (PreWait); every other CTA waits here.
      bool waited = !(c.whole_heads && pl.attn_prewait);
      if (waited) {
        wait_counter(lc + kCtrQKV, G);
        trace_mark(p, slot0 + kCtrAttn, 0);
      }
      if (c.whole_heads) {
        // Unit u = h * P + r: part r of query head h (H * P <= G when P > 1,
        // so a part 0 never waits for a unit queued behind it in its own CTA).
        const int P = pl.head_parts;
        for (int u = cta; u < s.num_heads * P; u += G) {
          const int h = u / P, r = u - h * P;
          if (r >= c.head_parts) continue;
          PreWait pw;
          if (!waited) {
            pw.ctr = lc + kCtrQKV;
            pw.target = static_cast<unsigned>(G);
            pw.self_row = c.kv_index;
            if (p.trace != nullptr)
              pw.stamp = p.trace + (static_cast<size_t>(slot0 + kCtrAttn) * p.plan.ctas + blockIdx.x) * kMegaTraceStamps;
            waited = true;
          }
          HeadPart hp;
          hp.r = r;
          hp.parts = c.head_parts;
          hp.defer = pl.merge_in_o != 0;
          hp.flag = ctr + L * kCtrPerLayer + 1 + l * s.num_heads + h;
          hp.part_o = p.part_o + static_cast<size_t>(h) * pl.max_splits * s.head_dim;
          hp.part_ml = p.part_ml + static_cast<size_t>(h) * pl.max_splits;
          const int k0 = static_cast<int>(static_cast<long long>(r) * c.n_keys / c.head_parts);
          const int k1 = static_cast<int>(static_cast<long long>(r + 1) * c.n_keys / c.head_parts);
          const size_t kv = static_cast<size_t>(h / (s.num_heads / s.num_kv_heads)) * s.slots * s.head_dim;
          const size_t qo = static_cast<size_t>(h) * s.head_dim;
          const int* attend = p.desc->attend_slots + c.a0;
          if (s.head_dim == 64)
            head_attention<64>(Ly.kcache + kv, Ly.vcache + kv, p.q + qo, p.attn + qo, attend, k0, k1 - k0, c.prefix,
                               s.max_context, hp, ybuf, small, pl.attn_short != 0, pw);
          else
            head_attention<128>(Ly.kcache + kv, Ly.vcache + kv, p.q + qo, p.attn + qo, attend, k0, k1 - k0, c.prefix,
                                s.max_context, hp, ybuf, small, pl.attn_short != 0, pw);
        }
        if (!waited) {  // no unit in this CTA
          wait_counter(lc + kCtrQKV, G);
          trace_mark(p, slot0 + kCtrAttn, 0);
        }
        if (pl.hold_until_input == 2) mark_released(released, kStreamsPerLayer * l + kStreamQKV + 1);
        signal_counter(p, lc + kCtrAttn, slot0 + kCtrAttn);
        trace_mark(p, slot0 + kCtrMerge, 0);  // no merge: an empty op in the trace
        trace_mark(p, slot0 + kCtrMerge, 1);
      } else {
        for (int u = cta; u < s.num_kv_heads * c.splits; u += G) {
          if (s.head_dim == 64) attention_unit<64>(p, c, Ly, u, ybuf);
          else attention_unit<128>(p, c, Ly, u, ybuf);
        }
        if (pl.hold_until_input == 2) mark_released(released, kStreamsPerLayer * l + kStreamQKV + 1);
        signal_counter(p, lc + kCtrAttn, slot0 + kCtrAttn);
        trace_mark(p, slot0 + kCtrMerge, 2);
        wait_counter(lc + kCtrAttn, G);
        trace_mark(p, slot0 + kCtrMerge, 0);
        merge_splits(p, c, cta);
        signal_counter(p, lc + kCtrMerge, slot0 + kCtrMerge);
      }
      // ---- O projection + residual -------------------------------------------------------
      if (l == 0)  // the residual starts as the token's embedding
        for (int i = tid; i < own.row1 - own.row0; i += kConsumers)
          h_own[i] = __bfloat162float(p.embed[static_cast<size_t>(c.token) * H + own.row0 + i]);
      {
        const Stream st = table[kStreamsPerLayer * l + kStreamO];
        gemv_op(p, st, c.whole_heads ? lc + kCtrAttn : lc + kCtrMerge, lc + kCtrO, slot0 + kCtrO, kStreamsPerLayer * l + kStreamO,
                kStreamsPerLayer * l + kStreamQKV, released, [&] {
          if (c.whole_heads && c.head_parts > 1 && pl.merge_in_o)
            load_merged_attn(p.part_o, p.part_ml, s.num_heads, s.head_dim, pl.max_splits, c.head_parts, x);
          else
            load_input(p.attn, s.num_heads * s.head_dim, x);
          if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * l + kStreamQKV + 1);
          consume_stream(p, st, ring, x, add_residual);
        });
      }
      // ---- gate/up + SwiGLU --------------------------------------------------------------
      {
        const Stream st = table[kStreamsPerLayer * l + kStreamGateUp];
        gemv_op(p, st, lc + kCtrO, lc + kCtrGateUp, slot0 + kCtrGateUp,
                kStreamsPerLayer * l + kStreamGateUp, kStreamsPerLayer * l + kStreamO, released, [&] {
          rinv = load_normed_input(p, false, c.token, x, small);
          if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * l + kStreamO + 1);
          consume_stream(p, st, ring, x, [&](int row, float v) {
            if (lane == 0) ybuf[row - st.row0] = v;
          });
          __syncwarp();
          EpiSwiGLU::Params e;
          e.act = p.act;
          e.intermediate = I;
          for (int t = lane; t < (st.row1 - st.row0) / 16; t += 32)
            EpiSwiGLU::apply(e, nullptr, true, st.row0 / 16 + t, warp, 0, ybuf[t * 16 + warp],
                             ybuf[t * 16 + 8 + warp], rinv, 1);
        });
      }
      // ---- down projection + residual ------------------------------------------------------
      {
        const Stream st = table[kStreamsPerLayer * l + kStreamDown];
        gemv_op(p, st, lc + kCtrGateUp, lc + kCtrDown, slot0 + kCtrDown,
                kStreamsPerLayer * l + kStreamDown, kStreamsPerLayer * l + kStreamGateUp, released, [&] {
          load_input(p.act, I, x);
          if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * l + kStreamGateUp + 1);
          consume_stream(p, st, ring, x, add_residual);
        });
      }
    }
    // ---- final norm + LM head + arg-max -------------------------------------------------
    if (p.lm_head) {
      const Stream st = table[kStreamsPerLayer * L];
      unsigned long long best = 0ull;
      if (st.row1 > st.row0) {
        trace_mark(p, L * kCtrPerLayer, 2);
        wait_counter(ctr + (L - 1) * kCtrPerLayer + kCtrDown, G);
        trace_mark(p, L * kCtrPerLayer, 0);
        rinv = load_normed_input(p, false, c.token, x, small);
        if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * L);  // the last down
        consume_stream(p, st, ring, x, [&](int row, float v) {
          if (row < s.vocab) {
            v *= rinv;
            if (lane == 0 && p.logits) p.logits[row] = v;
            const unsigned long long k = argmax_key(v, row);
            best = k > best ? k : best;
          }
        });
      } else {
        trace_mark(p, L * kCtrPerLayer, 0);
        if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * L);
      }
      if (lane == 0) small_key[warp] = best;  // the same in every lane of the warp
      consumer_sync();
      if (tid == 0) {
        for (int w = 0; w < kWarps; ++w) best = small_key[w] > best ? small_key[w] : best;
        if (best != 0ull) atomicMax(p.keys, best);
      }
      trace_mark(p, L * kCtrPerLayer, 1);
    }
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
      for (int i = 0; i < L * s.num_heads; ++i) done[1 + i] = 0u;  // head_attention's arrival counters
      *done = 0u;
    }
  }
}

#endif  // __CUDACC__

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

size_t decode_megakernel_sync_words(const MegaShape& s) {
  // Per layer: the op counters; then one completion counter; then per layer
  // and query head head_attention's arrival counter.
  return static_cast<size_t>(s.num_layers) * kCtrPerLayer + 1 + static_cast<size_t>(s.num_layers) * s.num_heads;
}

MegaPlan plan_decode_megakernel(const MegaShape& s, int num_sms, int max_smem, const MegaTuning& t) {
  const int head_keys = t.head_keys, head_parts = t.head_parts;
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
  if (2 * kmax > 96 * 1024) bad("a weight row of " + std::to_string(2 * kmax) + " bytes exceeds 96 KB");
  MegaPlan pl;
  pl.ctas = num_sms;
  const int row_bytes = static_cast<int>(align_up(2 * static_cast<size_t>(kmax), 128));
  if (t.slot_bytes != 0 && (t.slot_bytes < row_bytes || t.slot_bytes % 128 != 0))
    bad("slot_bytes must be 0 (the default) or a multiple of 128 of at least one weight row (" +
        std::to_string(row_bytes) + " bytes), got " + std::to_string(t.slot_bytes));
  if (t.max_inflight < -1 || t.max_inflight > 16)
    bad("max_inflight must be -1 (the default), 0 (the whole ring) or 1..16, got " + std::to_string(t.max_inflight));
  pl.slot_bytes = t.slot_bytes != 0 ? t.slot_bytes : std::max(32768, row_bytes);
  pl.max_inflight = t.max_inflight < 0 ? kDefaultMaxInflight : t.max_inflight;
  if (t.release_hold < -1 || t.release_hold > 16)
    bad("release_hold must be -1 (the default), 0 (off) or 1..16 chunks, got " + std::to_string(t.release_hold));
  pl.release_hold = t.release_hold < 0 ? kDefaultReleaseHold : t.release_hold;
  if (t.hold_until_input < -1 || t.hold_until_input > 2)
    bad("hold_until_input must be -1 (the default), 0, 1 or 2, got " + std::to_string(t.hold_until_input));
  pl.hold_until_input = t.hold_until_input < 0 ? kDefaultHoldUntilInput : t.hold_until_input;
  if (t.attn_short < -1 || t.attn_short > 1)
    bad("attn_short must be -1 (the default), 0 or 1, got " + std::to_string(t.attn_short));
  pl.attn_short = t.attn_short >= 0 ? t.attn_short : s.head_dim == 64 ? kDefaultAttnShort : 0;
  if (t.attn_prewait < -1 || t.attn_prewait > 1)
    bad("attn_prewait must be -1 (the default), 0 or 1, got " + std::to_string(t.attn_prewait));
  pl.attn_prewait = t.attn_prewait >= 0 ? t.attn_prewait : kDefaultAttnPrewait;
  if (t.merge_in_o < -1 || t.merge_in_o > 1)
    bad("merge_in_o must be -1 (the default), 0 or 1, got " + std::to_string(t.merge_in_o));
  pl.merge_in_o = t.merge_in_o >= 0 ? t.merge_in_o : kDefaultMergeInO;
  pl.x_bytes = static_cast<int>(align_up(2 * static_cast<size_t>(kmax), 128));
  const int tiles_qkv = (nq + 2 * nkv) / 16, tiles_gu = 2 * s.intermediate / 16;
  pl.ybuf_rows = 16 * std::max((tiles_qkv + num_sms - 1) / num_sms, (tiles_gu + num_sms - 1) / num_sms);
  pl.own_rows = static_cast<int>(align_up((s.hidden + num_sms - 1) / num_sms, 4));
  pl.max_splits = std::max(1, num_sms / s.num_kv_heads);
  if (head_keys < -1) bad("head_keys must be -1 (default), 0 (never) or a key count");
  // Parts per head: as many as fit the grid, so each part has its own CTA (a
  // part 0 waits for the others); the partial buffers hold max_splits (>= P
  // then: G >= P H >= P KVH) states per head.
  if (head_parts < 0 || head_parts > kMaxHeadParts || (head_parts & (head_parts - 1)) != 0)
    bad("head_parts must be 0 (the plan's choice), 1, 2, 4 or 8");
  pl.head_parts = head_parts == 0 ? kDefaultHeadParts : head_parts;
  while (pl.head_parts > 1 && s.num_heads * pl.head_parts > num_sms) pl.head_parts /= 2;
  if (pl.merge_in_o && pl.head_parts > kMaxMergeParts)
    bad("merge_in_o merges at most " + std::to_string(kMaxMergeParts) + " parts per head, the plan has head_parts " +
        std::to_string(pl.head_parts));
  // Default: the K and V bytes per part that one SM read faster than the split
  // units and their merge took (kHeadKeysDefault64 keys at head_dim 64).
  pl.head_keys = head_keys >= 0 ? head_keys
                 : s.head_dim == 64 || pl.head_parts > 1 ? kHeadKeysDefault64 * pl.head_parts * 64 / s.head_dim
                                                         : 0;
  // The split units' per-warp states, or head_attention's scores and its
  // [kConsumers / (head_dim / 8)][head_dim] partial outputs (2048 floats).
  const size_t attn_floats = std::max(static_cast<size_t>(kWarps) * std::min(group, 8) * (s.head_dim + 2),
                                      pl.head_keys > 0 ? static_cast<size_t>((pl.head_keys + pl.head_parts - 1) / pl.head_parts + 3) / 4 * 4 +
                                                             8 * kConsumers
                                                       : 0);
  // h_own first (the residual rows live across the whole step), then ybuf,
  // which the attention scratch aliases.
  pl.misc_bytes = static_cast<int>(align_up(
      4 * (std::max(static_cast<size_t>(pl.ybuf_rows), attn_floats) + static_cast<size_t>(pl.own_rows)), 128));
  pl.table_bytes = static_cast<int>(align_up(sizeof(Stream) * (kStreamsPerLayer * static_cast<size_t>(s.num_layers) + 1), 128));
  pl.layers_bytes = static_cast<int>(align_up(sizeof(MegaLayer) * static_cast<size_t>(s.num_layers), 128));
  const long long fixed = kAlignSlack + pl.x_bytes + pl.misc_bytes + pl.table_bytes + pl.layers_bytes + kSmallBytes;
  long long ns = (static_cast<long long>(max_smem) - fixed) / (pl.slot_bytes + 16);
  ns = std::min<long long>(ns, 16);
  if (ns < 2)
    bad("the ring needs two slots of " + std::to_string(pl.slot_bytes) + " bytes; " + std::to_string(max_smem) +
        " bytes of shared memory leave room for " + std::to_string(std::max<long long>(ns, 0)));
  pl.num_slots = static_cast<int>(ns);
  pl.smem_bytes = static_cast<size_t>(fixed) + static_cast<size_t>(ns) * (pl.slot_bytes + 16);
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
