// The decode megakernel (decode_megakernel.h): a whole single-token step as
// one persistent kernel. Layout: the constants (here); synchronization and
// copy primitives (megakernel/megakernel_primitives.cuh); the weight streams
// (which rows of which matrix a CTA reads, in step order), the producer warp
// that streams them into the ring, the consumer warps' GEMV over the ring
// and the prologues (input vector, RMSNorm) (megakernel_weight_streams.cuh);
// attention (megakernel_attention.cuh); the kernel and the plan (here).
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

constexpr int kWarps = 8;                  ///< consumer warps
constexpr int kConsumers = kWarps * 32;    ///< consumer threads
constexpr int kThreads = kConsumers + 32;  ///< + the producer warp
/// Counters per layer, in step order (also the trace's op slots; the LM head
/// is slot kCtrPerLayer * num_layers).
enum Counter { kCtrQKV = 0, kCtrAttn = 1, kCtrMerge = 2, kCtrO = 3, kCtrGateUp = 4, kCtrDown = 5, kCtrPerLayer = 6 };
static_assert(kCtrPerLayer == 6, "decode_megakernel.h's trace layout counts 6 op slots per layer");
/// Weight streams per layer (the attention has none).
enum StreamKind { kStreamQKV = 0, kStreamO = 1, kStreamGateUp = 2, kStreamDown = 3, kStreamsPerLayer = 4 };
/// Keys per attention unit (kv head, split): 8 warps x 4 keys in flight
/// (64 or more keys per unit measured slower; benchmarks/README.md, "the
/// decode megakernel reworked").
constexpr int kKeysPerSplit = 32;
/// Splits whose partial states one thread loads at once in a merge.
constexpr int kMergeBatch = 16;
/// Default MegaPlan::head_keys per part at head_dim 64 (half at 128): query
/// heads run in head_attention units instead of split units and a merge up
/// to this many keys per part (its K and V rows: 144 KB): with one part per
/// head, faster at the 0.5B shape at 256 and 512 keys. One SM reads those
/// rows slowly, so one part per head was no faster at head_dim 128 (1.5B,
/// 8B): there the default is 0 unless a head has several parts
/// (benchmarks/README.md, "attention by query heads in 4 CTAs each").
constexpr int kHeadKeysDefault64 = 576;
/// CTAs per query head in head_attention (MegaPlan::head_parts) at most, and
/// the plan's default: 4 parts measured faster than 8 at the 0.5B / 1.5B
/// shapes, and than 1 or the split units (benchmarks/README.md, "attention by
/// query heads in 4 CTAs each").
constexpr int kMaxHeadParts = 8;
/// MegaPlan::merge_in_o merges at most this many parts per head (more spill).
constexpr int kMaxMergeParts = 4;
constexpr int kDefaultHeadParts = 4;
/// MegaPlan::max_inflight by default (0: the whole ring).
constexpr int kDefaultMaxInflight = 0;
/// MegaPlan::release_hold and hold_until_input by default: the slots of each
/// op's last two chunks refilled once the next op has its input: faster than
/// no hold at every shape, and than holding them until the release at the
/// 1.5B / 8B (equal at the 0.5B); holding 3 or 16 was slower (the bytes come
/// too late). benchmarks/README.md, "ring refills held back at the handoffs".
constexpr int kDefaultReleaseHold = 2;
constexpr int kDefaultHoldUntilInput = 1;
/// MegaPlan::attn_short by default at head_dim 64 (0 at 128): with 4 parts
/// per head, faster at the 0.5B (its attention shorter per layer); at head_dim
/// 128 no faster (1.5B, 8B). benchmarks/README.md, "short attention parts in
/// one round trip".
constexpr int kDefaultAttnShort = 1;
/// MegaPlan::attn_prewait by default (a short head part's committed K/V loads
/// issued before its wait for the QKV op): the 0.5B's traced step and its
/// attention per layer faster; head_dim 128 unchanged (batched parts load
/// after the wait). benchmarks/README.md, "committed K/V loads issued before
/// its wait".
constexpr int kDefaultAttnPrewait = 1;
/// MegaPlan::merge_in_o by default: off until measured (written without a
/// GPU; an A/B on one decides).
constexpr int kDefaultMergeInO = 0;
/// MegaPlan::l2_prefetch_bytes by default: off until measured (written
/// without a GPU). Largest value accepted: 4 MiB per CTA.
constexpr int kDefaultL2PrefetchBytes = 0;
constexpr int kMaxL2PrefetchBytes = 4 << 20;
/// Shared memory the plan reserves besides slots, x, misc, tables and
/// barriers: reduction scratch (16 floats, 8 keys), the step's constants,
/// RoPE table (64 (cos, sin) at most) and the CTA's release mark; and
/// alignment slack.
constexpr int kSmallBytes = 256 + 64 * 8;
constexpr int kAlignSlack = 128;

// ---------------------------------------------------------------- device code
#if defined(__CUDACC__)

// The pieces of the kernel, one file each (included here: they share this
// file's anonymous namespace and constants).
#include "kernels/megakernel/megakernel_primitives.cuh"
#include "kernels/megakernel/megakernel_weight_streams.cuh"
#include "kernels/megakernel/megakernel_attention.cuh"

// ---------------------------------------------------------------- the kernel
// Two instantiations: kTraced (MegaParams::trace set) and not. The trace's
// pointer arithmetic, kept live across the whole step, cost the untraced
// kernel registers: 132 / 508 bytes of static spill stores / loads with the
// stamps in a runtime branch, 76 / 268 without (ptxas -v, sm_90a, nvcc 13.0).
template <bool kTraced>
__global__ void __launch_bounds__(kThreads, 1) decode_megakernel_kernel(const __grid_constant__ MegaParams p) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 127) & ~uintptr_t(127));
  const MegaPlan& pl = p.plan;
  const MegaShape& s = p.s;
  unsigned char* slots = base;
  __nv_bfloat16* x = reinterpret_cast<__nv_bfloat16*>(base + static_cast<size_t>(pl.num_slots) * pl.slot_bytes);
  float* misc = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(x) + pl.x_bytes);
  float* h_own = misc;               // this CTA's residual rows (O and down), the whole step
  float* ybuf = misc + pl.own_rows;  // QKV / gate-up outputs of its rows; attention scratch
  Stream* table = reinterpret_cast<Stream*>(reinterpret_cast<unsigned char*>(misc) + pl.misc_bytes);
  MegaLayer* layers = reinterpret_cast<MegaLayer*>(reinterpret_cast<unsigned char*>(table) + pl.table_bytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(layers) + pl.layers_bytes);
  uint64_t* empty = full + pl.num_slots;
  float* small = reinterpret_cast<float*>(empty + pl.num_slots);                      // [16]
  unsigned long long* small_key = reinterpret_cast<unsigned long long*>(small + 16);  // [8]
  StepConsts* consts = reinterpret_cast<StepConsts*>(small_key + 8);
  float2* rope = reinterpret_cast<float2*>(consts + 1);  // [head_dim / 2] (cos, sin) of the step's position
  int* released = reinterpret_cast<int*>(rope + 64);     // streams released so far (release_hold)

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
      if (p.rope_scale != 1.0f) {
        cs *= p.rope_scale;
        sn *= p.rope_scale;
      }
      rope[i] = make_float2(cs, sn);
    }
  }
  if (tid == 0) {
    make_step_consts(p, *consts);
    consts->attn_stamps = kTraced && p.trace != nullptr
                              ? p.trace + mega_trace_attn_offset(L, G) + static_cast<size_t>(cta) * kMegaAttnStamps
                              : nullptr;
    for (int i = 0; i < pl.num_slots; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kWarps);
    }
    fence_mbar_init();
    if (cta == 0) *p.keys = 0ull;  // published to the LM head by CTA 0's first release
    *released = 0;
  }
  if constexpr (kTraced) {
    // The ring's waits are stored per op only where there were any: clear
    // this CTA's words of the previous launch first.
    if (p.trace != nullptr)
      for (int i = tid; i <= kCtrPerLayer * L; i += kThreads) {
        unsigned long long* w = ring_trace_words(p, i);
        for (int k = 0; k < kMegaRingWords; ++k) w[k] = 0ull;
      }
  }
  __syncthreads();

  if (warp == kWarps) {  // ---- the producer warp ----------------------------------------
    if (lane == 0) producer_loop<kTraced>(p, table, last_idx, slots, full, empty, released);
    __syncwarp();
  } else {  // ---- the consumer warps ----------------------------------------------------
    const StepConsts c = *consts;
    Ring ring{slots, full, empty, 0};
    if constexpr (kTraced) clock_trace(p, 0);
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
      // (An L2 prefetch of the attention units' committed K/V rows here
      // measured slower at the 0.5B and no faster at the 1.5B / 8B: it delayed
      // the QKV op more than it sped up the attention; benchmarks/README.md,
      // "where the megakernel's handoffs go".)
      // ---- QKV (+ bias, RoPE, K/V into the cache) ------------------------------------
      {
        const Stream st = table[kStreamsPerLayer * l + kStreamQKV];
        gemv_op<kTraced>(p, st, l > 0 ? lc - kCtrPerLayer + kCtrDown : nullptr, lc + kCtrQKV, slot0 + kCtrQKV,
                         kStreamsPerLayer * l + kStreamQKV, kStreamsPerLayer * l - 1, released, [&] {
                           rinv = load_normed_input(p, l == 0, c.token, x, small);
                           if (pl.hold_until_input)
                             mark_released(released, kStreamsPerLayer * l);  // down of layer l - 1
                           consume_stream<kTraced>(p, st, ring, x, [&](int row, float v) {
                             if (lane == 0) ybuf[row - st.row0] = v;
                           });
                           store_ring_wait<kTraced>(p, slot0 + kCtrQKV, ring);
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
                             EpiQKV::store(e, tile, warp, 0, c.kv_index, ybuf[t * 16 + warp], ybuf[t * 16 + 8 + warp],
                                           rinv, cs.x, cs.y);
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
      trace_mark<kTraced>(p, slot0 + kCtrAttn, 2);
      // attn_prewait: a CTA's first head unit waits for QKV itself, after
      // issuing its committed K/V loads (PreWait); every other CTA waits here.
      bool waited = !(c.whole_heads && pl.attn_prewait);
      if (waited) {
        wait_counter(lc + kCtrQKV, G);
        trace_mark<kTraced>(p, slot0 + kCtrAttn, 0);
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
            if (kTraced && p.trace != nullptr)
              pw.stamp =
                  p.trace + (static_cast<size_t>(slot0 + kCtrAttn) * p.plan.ctas + blockIdx.x) * kMegaTraceStamps;
            waited = true;
          }
          HeadPart hp;
          hp.r = r;
          hp.parts = c.head_parts;
          hp.defer = pl.merge_in_o != 0;
          if (unsigned long long* a = kTraced ? consts->attn_stamps : nullptr)
            hp.stamps = a + static_cast<size_t>(l) * G * kMegaAttnStamps;
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
          trace_mark<kTraced>(p, slot0 + kCtrAttn, 0);
        }
        if (pl.hold_until_input == 2) mark_released(released, kStreamsPerLayer * l + kStreamQKV + 1);
        signal_counter<kTraced>(p, lc + kCtrAttn, slot0 + kCtrAttn);
        if (pl.l2_prefetch_bytes && tid == 0) l2_prefetch_tail(pl, table[kStreamsPerLayer * l + kStreamGateUp]);
        trace_mark<kTraced>(p, slot0 + kCtrMerge, 0);  // no merge: an empty op in the trace
        trace_mark<kTraced>(p, slot0 + kCtrMerge, 1);
      } else {
        for (int u = cta; u < s.num_kv_heads * c.splits; u += G) {
          if (s.head_dim == 64)
            attention_unit<64>(p, c, Ly, u, ybuf);
          else
            attention_unit<128>(p, c, Ly, u, ybuf);
        }
        if (pl.hold_until_input == 2) mark_released(released, kStreamsPerLayer * l + kStreamQKV + 1);
        signal_counter<kTraced>(p, lc + kCtrAttn, slot0 + kCtrAttn);
        if (pl.l2_prefetch_bytes && tid == 0) l2_prefetch_tail(pl, table[kStreamsPerLayer * l + kStreamGateUp]);
        trace_mark<kTraced>(p, slot0 + kCtrMerge, 2);
        wait_counter(lc + kCtrAttn, G);
        trace_mark<kTraced>(p, slot0 + kCtrMerge, 0);
        merge_splits(p, c, cta);
        signal_counter<kTraced>(p, lc + kCtrMerge, slot0 + kCtrMerge);
      }
      // ---- O projection + residual -------------------------------------------------------
      if (l == 0)  // the residual starts as the token's embedding
        for (int i = tid; i < own.row1 - own.row0; i += kConsumers)
          h_own[i] = __bfloat162float(p.embed[static_cast<size_t>(c.token) * H + own.row0 + i]);
      {
        const Stream st = table[kStreamsPerLayer * l + kStreamO];
        gemv_op<kTraced>(p, st, c.whole_heads ? lc + kCtrAttn : lc + kCtrMerge, lc + kCtrO, slot0 + kCtrO,
                         kStreamsPerLayer * l + kStreamO, kStreamsPerLayer * l + kStreamQKV, released, [&] {
                           if (c.whole_heads && c.head_parts > 1 && pl.merge_in_o)
                             load_merged_attn(p.part_o, p.part_ml, s.num_heads, s.head_dim, pl.max_splits, c.head_parts,
                                              x);
                           else
                             load_input(p.attn, s.num_heads * s.head_dim, x);
                           if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * l + kStreamQKV + 1);
                           consume_stream<kTraced>(p, st, ring, x, add_residual);
                           store_ring_wait<kTraced>(p, slot0 + kCtrO, ring);
                         });
      }
      // ---- gate/up + SwiGLU --------------------------------------------------------------
      {
        const Stream st = table[kStreamsPerLayer * l + kStreamGateUp];
        gemv_op<kTraced>(p, st, lc + kCtrO, lc + kCtrGateUp, slot0 + kCtrGateUp, kStreamsPerLayer * l + kStreamGateUp,
                         kStreamsPerLayer * l + kStreamO, released, [&] {
                           rinv = load_normed_input(p, false, c.token, x, small);
                           if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * l + kStreamO + 1);
                           consume_stream<kTraced>(p, st, ring, x, [&](int row, float v) {
                             if (lane == 0) ybuf[row - st.row0] = v;
                           });
                           store_ring_wait<kTraced>(p, slot0 + kCtrGateUp, ring);
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
        gemv_op<kTraced>(p, st, lc + kCtrGateUp, lc + kCtrDown, slot0 + kCtrDown, kStreamsPerLayer * l + kStreamDown,
                         kStreamsPerLayer * l + kStreamGateUp, released, [&] {
                           load_input(p.act, I, x);
                           if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * l + kStreamGateUp + 1);
                           consume_stream<kTraced>(p, st, ring, x, add_residual);
                           store_ring_wait<kTraced>(p, slot0 + kCtrDown, ring);
                         });
      }
    }
    // ---- final norm + LM head + arg-max -------------------------------------------------
    if (p.lm_head) {
      const Stream st = table[kStreamsPerLayer * L];
      unsigned long long best = 0ull;
      if (st.row1 > st.row0) {
        trace_mark<kTraced>(p, L * kCtrPerLayer, 2);
        wait_counter(ctr + (L - 1) * kCtrPerLayer + kCtrDown, G);
        trace_mark<kTraced>(p, L * kCtrPerLayer, 0);
        rinv = load_normed_input(p, false, c.token, x, small);
        if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * L);  // the last down
        consume_stream<kTraced>(p, st, ring, x, [&](int row, float v) {
          if (row < s.vocab) {
            v *= rinv;
            if (lane == 0 && p.logits) p.logits[row] = v;
            const unsigned long long k = argmax_key(v, row);
            best = k > best ? k : best;
          }
        });
        store_ring_wait<kTraced>(p, L * kCtrPerLayer, ring);
      } else {
        trace_mark<kTraced>(p, L * kCtrPerLayer, 0);
        if (pl.hold_until_input) mark_released(released, kStreamsPerLayer * L);
      }
      if (lane == 0) small_key[warp] = best;  // the same in every lane of the warp
      consumer_sync();
      if (tid == 0) {
        for (int w = 0; w < kWarps; ++w) best = small_key[w] > best ? small_key[w] : best;
        if (best != 0ull) atomicMax(p.keys, best);
      }
      trace_mark<kTraced>(p, L * kCtrPerLayer, 1);
    }
  }
  if constexpr (kTraced) clock_trace(p, 2);
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
  if (s.hidden % 16 || s.intermediate % 8 || s.vocab_rows % 16)
    bad("hidden % 16, intermediate % 8 and vocab_rows % 16 must be 0");
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
  if (t.l2_prefetch_bytes < -1 || t.l2_prefetch_bytes > kMaxL2PrefetchBytes ||
      (t.l2_prefetch_bytes > 0 && t.l2_prefetch_bytes % 16 != 0))
    bad("l2_prefetch_bytes must be -1 (the default), 0 (off) or a multiple of 16 up to " +
        std::to_string(kMaxL2PrefetchBytes) + ", got " + std::to_string(t.l2_prefetch_bytes));
  pl.l2_prefetch_bytes = t.l2_prefetch_bytes >= 0 ? t.l2_prefetch_bytes : kDefaultL2PrefetchBytes;
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
  pl.head_keys = head_keys >= 0                          ? head_keys
                 : s.head_dim == 64 || pl.head_parts > 1 ? kHeadKeysDefault64 * pl.head_parts * 64 / s.head_dim
                                                         : 0;
  // The split units' per-warp states, or head_attention's scores and its
  // [kConsumers / (head_dim / 8)][head_dim] partial outputs (2048 floats).
  const size_t attn_floats = std::max(
      static_cast<size_t>(kWarps) * std::min(group, 8) * (s.head_dim + 2),
      pl.head_keys > 0
          ? static_cast<size_t>((pl.head_keys + pl.head_parts - 1) / pl.head_parts + 3) / 4 * 4 + 8 * kConsumers
          : 0);
  // h_own first (the residual rows live across the whole step), then ybuf,
  // which the attention scratch aliases.
  pl.misc_bytes = static_cast<int>(
      align_up(4 * (std::max(static_cast<size_t>(pl.ybuf_rows), attn_floats) + static_cast<size_t>(pl.own_rows)), 128));
  pl.table_bytes =
      static_cast<int>(align_up(sizeof(Stream) * (kStreamsPerLayer * static_cast<size_t>(s.num_layers) + 1), 128));
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
  // Both instantiations (traced or not) get it: a model may be traced later.
  static std::mutex mu;
  static std::map<int, size_t> granted;  // device -> bytes set
  int dev = 0;
  SS_CUDA_CHECK(cudaGetDevice(&dev));
  {
    std::lock_guard<std::mutex> lock(mu);
    size_t& g = granted[dev];
    if (plan.smem_bytes > g) {
      for (const void* fn : {reinterpret_cast<const void*>(decode_megakernel_kernel<false>),
                             reinterpret_cast<const void*>(decode_megakernel_kernel<true>)})
        SS_CUDA_CHECK(
            cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(plan.smem_bytes)));
      g = plan.smem_bytes;
    }
  }
  for (const void* fn : {reinterpret_cast<const void*>(decode_megakernel_kernel<false>),
                         reinterpret_cast<const void*>(decode_megakernel_kernel<true>)}) {
    int blocks = 0;
    SS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kThreads, plan.smem_bytes));
    if (blocks < 1)
      throw CudaError("decode megakernel: a CTA with " + std::to_string(plan.smem_bytes) +
                      " bytes of shared memory does not fit on an SM");
  }
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
  if (p.trace != nullptr)
    SS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_megakernel_kernel<true>, p));
  else
    SS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_megakernel_kernel<false>, p));
}

}  // namespace swiftspec::cuda
