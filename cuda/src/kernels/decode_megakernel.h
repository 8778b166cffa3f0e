// The decode megakernel: one single-token step of the whole model (all
// layers, the LM head and the arg-max) as ONE persistent kernel, one CTA per
// SM (SwiftSpec ASPLOS'26 §5: latency-optimized kernels; the "megakernel"
// design of persistent LLM decoders, e.g. Hazy Research 2025, Mirage MPK).
//
// Why: at batch 1 a layer of a 0.5B model reads 30 MB of weights, a few
// microseconds of HBM time, but each of five dependent kernels costs about as
// much again in launch, ramp-up and drain (docs/cuda_backend.md). Here the
// weights do not wait for the activations: every CTA streams ITS rows of
// every matrix of the step, in step order, into a ring of shared-memory slots
// with TMA bulk copies, as far ahead as the ring holds (~200 KB per SM, ~26 MB
// over the GPU: most of a 0.5B layer). Only the arithmetic waits, on global
// counters that the producing CTAs release (acquire/release at GPU scope)
// instead of kernel boundaries.
//
// Inside a CTA, 8 consumer warps do the arithmetic and one producer warp
// streams the weights (warp specialization): consumer warp w owns rows
// i % 8 == w of each of the CTA's streams, so chunks need no CTA barrier.
//
// Work split, per layer (G = CTAs):
//   QKV    rows in 16-row tiles (RoPE pairs, weight_layout.h) over the CTAs;
//          each CTA computes 1/rms of the residual itself (RMSNorm folded
//          into the weights), adds the bias, applies RoPE, writes q and K/V
//   attn   up to MegaPlan::head_keys keys: 1-8 CTAs per query head (part 0
//          merges the others' states), output written directly; longer
//          contexts: (kv head, key
//          split) units write partial softmax states, then every CTA merges
//          the splits of a slice of the output elements
//   O      single rows; adds into the fp32 residual stream (owner-computes)
//   gate/up 16-row tiles (gate and up rows interleaved); SwiGLU
//   down   single rows; residual add
// then the LM head (16-row tiles of the vocabulary; logits optional; a
// deterministic arg-max through atomicMax of (value, index) keys).
//
// Numerics: bf16 weights and GEMM inputs, fp32 accumulation and residual, as
// the layered path; but the reduction order differs, so a single-token step
// of the megakernel is NOT bitwise equal to a row of a multi-token step of
// the layered path (the exactness contract of model.h holds only with the
// megakernel off). The megakernel itself is deterministic (no floating-point
// atomics).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "step_desc.h"

namespace swiftspec::cuda {

/// Device pointers of one decoder layer, in the layouts of weight_layout.h.
struct MegaLayer {
  const __nv_bfloat16* qkv = nullptr;   ///< [nq + 2 nkv][hidden], rows permuted, input norm folded
  const float* qkv_bias = nullptr;      ///< [nq + 2 nkv] (permuted) or null
  const __nv_bfloat16* o = nullptr;     ///< [hidden][nq]
  const __nv_bfloat16* gu = nullptr;    ///< [2 intermediate][hidden], interleaved by 8, norm folded
  const __nv_bfloat16* down = nullptr;  ///< [hidden][intermediate]
  __nv_bfloat16* kcache = nullptr;      ///< this layer: [kv_heads][slots][head_dim]
  __nv_bfloat16* vcache = nullptr;
};

/// Stamps per (op slot, CTA) of MegaParams::trace: start, end, arrival.
constexpr int kMegaTraceStamps = 3;
/// Stamps per (layer, CTA) of head_attention's phases in MegaParams::trace
/// (after the op stamps), of the CTA's last head unit of the layer: 0 entry,
/// 1 the QKV wait over, 2 the scores done (the K rows landed), 3 the softmax's
/// max and sum done, 4 P V done and the part's state (or output) stored, 5
/// done (part 0: the merged output stored; others: their arrival released).
/// 0 where the CTA ran no head unit.
constexpr int kMegaAttnStamps = 6;
/// Words per (op slot, CTA) of the ring's waits in MegaParams::trace (after
/// the phase stamps), in SM clock cycles (clock64), each summed over the
/// blocked waits only: 0 consumer warp 0 waiting for a chunk of the op to
/// land (its full barrier); the producer, before refilling a slot that holds
/// one of the op's chunks: 1 waiting for that chunk to land (the ring at full
/// depth with bytes still in flight: HBM or latency bound), 2 waiting for the
/// landed chunk to be consumed (the consumers are behind, or wait for a
/// dependency; newer chunks may still be landing), 3 of word 2, the time
/// after every chunk in the ring had landed too ("idle": this SM's weight
/// stream stood still), 4 waiting for the release of a slot held for the op
/// (MegaPlan::release_hold; the stream stands still too). Not timed: the
/// wait of MegaPlan::max_inflight (off by default). QKV, O, gate/up, down and
/// the LM head slots only; 0 where none.
constexpr int kMegaRingWords = 5;
/// Words per CTA after the ring waits: clock64 and the global timer (ns) at
/// the consumers' start, then at their end: the CTA's cycles-to-ns ratio.
constexpr int kMegaClockWords = 4;
#if defined(__CUDACC__)
#define SWIFTSPEC_MEGA_HD __host__ __device__
#else
#define SWIFTSPEC_MEGA_HD
#endif
/// Offsets of MegaParams::trace's parts, in words (after the op stamps).
SWIFTSPEC_MEGA_HD inline size_t mega_trace_attn_offset(int num_layers, int ctas) {
  return (6 * static_cast<size_t>(num_layers) + 1) * ctas * kMegaTraceStamps;
}
SWIFTSPEC_MEGA_HD inline size_t mega_trace_ring_offset(int num_layers, int ctas) {
  return mega_trace_attn_offset(num_layers, ctas) + static_cast<size_t>(num_layers) * ctas * kMegaAttnStamps;
}
SWIFTSPEC_MEGA_HD inline size_t mega_trace_clock_offset(int num_layers, int ctas) {
  return mega_trace_ring_offset(num_layers, ctas) + (6 * static_cast<size_t>(num_layers) + 1) * ctas * kMegaRingWords;
}
/// Words of MegaParams::trace for a plan of `ctas` CTAs.
SWIFTSPEC_MEGA_HD inline size_t mega_trace_words(int num_layers, int ctas) {
  return mega_trace_clock_offset(num_layers, ctas) + static_cast<size_t>(ctas) * kMegaClockWords;
}

/// Model shape as the megakernel needs it.
struct MegaShape {
  int hidden = 0, intermediate = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int vocab = 0, vocab_rows = 0;  ///< vocab_rows: vocabulary padded to 16 (LM head rows)
  int num_layers = 0;
  int slots = 0, max_context = 0;  ///< KV cache slots per kv head; tree slots start at max_context
  int neox = 1;                    ///< RoPE pairing (1: NeoX halves, 0: interleaved)
  float eps = 1e-6f;               ///< RMSNorm epsilon
};

/// Launch plan: grid, shared-memory carve-up. Made once per model.
struct MegaPlan {
  int ctas = 0;        ///< CTAs (= SMs of the model's partition), one per SM
  int slot_bytes = 0;  ///< one weight chunk (whole rows) per ring slot
  int num_slots = 0;   ///< ring depth (>= 2)
  /// Weight chunks the producer keeps in flight at most (issued, not yet
  /// landed); 0 (the default): as many as the ring has free slots. A cap
  /// shortens the queue that the step's latency-critical loads and stores
  /// wait behind, but slows the weight stream: one chunk was faster at the
  /// 0.5B but slower at the 1.5B (benchmarks/README.md, "where the
  /// megakernel's handoffs go"). A knob for A/B.
  int max_inflight = 0;
  /// The last this-many chunks of each op's stream in a CTA: their slots are
  /// refilled with later ops' chunks only once the op's outputs are out
  /// (hold_until_input), so that the op's release (whose fence waits for its
  /// stores) and the next op's first loads do not queue behind the refills
  /// the op's own last chunks freed. 0: off. Default 2 (plan_decode_megakernel).
  int release_hold = 0;
  /// When those refills go: 0 after the op's release; 1 once the next op has
  /// loaded its input (QKV's: once the O projection has), so that its
  /// latency-critical loads (the residual, the attention output) do not queue
  /// behind them either; 2 as 1, except QKV's: once the CTA's attention units
  /// are done (at once in a CTA without units). Default 1.
  int hold_until_input = 0;
  /// 1: a query head's part of at most 256 keys (head_dim 64; 128 at 128)
  /// loads all its K and V rows at once and keeps scores in registers (one
  /// dependent round trip instead of two); 0: the batched loop only.
  int attn_short = 1;
  /// 1: a short head part (attn_short) issues the loads of its K/V rows
  /// written before this launch and only then waits for the QKV op; the q row
  /// and the step's own K/V row are loaded after the wait. 0: all after it.
  /// (Batched parts always load after the wait.)
  int attn_prewait = 1;
  /// 1: the parts of a query head (head_parts > 1) all leave their softmax
  /// states, and the O projection's input load merges them (the same bits as
  /// part 0's merge): no part waits for another. 0: part 0 merges.
  int merge_in_o = 0;
  /// > 0: once its attention is done, a CTA prefetches into L2 the last (at
  /// most) this many bytes of its gate/up rows of the layer (one bulk
  /// prefetch), so that HBM streams while the ring is full and the O
  /// projection waits; only rows beyond the num_slots chunks the ring itself
  /// fetches first (none at the 0.5B shape). 0: off. Changes no arithmetic.
  int l2_prefetch_bytes = 0;
  int x_bytes = 0;       ///< GEMV input vector (bf16, the longest K)
  int ybuf_rows = 0;     ///< per-CTA output rows of a QKV or gate/up op (fp32)
  int own_rows = 0;      ///< per-CTA residual rows (O and down), kept in shared memory
  int misc_bytes = 0;    ///< own rows, then ybuf or the attention scratch (aliased)
  int table_bytes = 0;   ///< the CTA's weight streams (rows of each matrix)
  int layers_bytes = 0;  ///< a copy of the layer table (MegaLayer per layer)
  size_t smem_bytes = 0;
  int max_splits = 0;  ///< key splits per kv head (partial buffers are sized for it)
  /// Steps with at most this many keys run each query head's attention in one
  /// CTA over all keys (no partial states, no merge phase: one grid-wide
  /// handoff less per layer); longer ones use (kv head, split) units and the
  /// merge. 0: always the split units.
  int head_keys = 0;
  /// CTAs per query head in that mode (1, 2, 4 or 8, as many as fit the grid):
  /// each takes a slice of the keys; parts 1.. hand their softmax states to
  /// part 0 through a per-head arrival counter, part 0 merges them.
  int head_parts = 1;
};

/// The plan's tuning knobs (CudaModelOptions::megakernel_*); the defaults are
/// the measured best on the H200 (benchmarks/README.md).
struct MegaTuning {
  /// MegaPlan::head_keys: -1 the default (576 keys per part at head_dim 64,
  /// 288 at 128; 0 at 128 with one part per head, where whole heads measured
  /// no faster), 0 never (always the split units and the merge).
  int head_keys = -1;
  /// At most this many CTAs per head (MegaPlan::head_parts; halved until
  /// head_parts x num_heads <= num_sms): 0 the default 4, or 1, 2, 4, 8.
  int head_parts = 0;
  /// MegaPlan::max_inflight: -1 the default, 0 the whole ring, or 1..16 chunks.
  int max_inflight = -1;
  /// MegaPlan::release_hold: -1 the default, 0 off, or 1..16 chunks.
  int release_hold = -1;
  /// MegaPlan::hold_until_input: -1 the default, 0, 1 or 2.
  int hold_until_input = -1;
  /// MegaPlan::attn_short: -1 the default (1 at head_dim 64, else 0), 0 or 1.
  int attn_short = -1;
  /// MegaPlan::attn_prewait: -1 the default (1), 0 or 1.
  int attn_prewait = -1;
  /// MegaPlan::merge_in_o: -1 the default (0), 0 or 1.
  int merge_in_o = -1;
  /// MegaPlan::l2_prefetch_bytes: -1 the default (0), 0 off, or a multiple of
  /// 16 up to 4 MiB.
  int l2_prefetch_bytes = -1;
  /// MegaPlan::slot_bytes: 0 the default (32 KB, or one row of the longest
  /// K if larger), else a multiple of 128 of at least that row.
  int slot_bytes = 0;
};

/// Plans the megakernel of `s` on `num_sms` SMs with `max_smem` bytes of
/// opt-in shared memory per CTA. Throws InvalidArgument (message starting
/// "decode megakernel") when the shape does not fit: a weight row longer
/// than 96 KB, head_dim not 64 or 128, more than 16 query heads per kv head,
/// no layer, or fewer than two ring slots; or for a knob of `t` out of its
/// range (MegaTuning), naming it.
MegaPlan plan_decode_megakernel(const MegaShape& s, int num_sms, int max_smem, const MegaTuning& t = MegaTuning{});

/// 32-bit words of the synchronization area (counters per layer and op, one
/// completion counter). Zero it once at allocation: every launch leaves it
/// zeroed again.
size_t decode_megakernel_sync_words(const MegaShape& s);

struct MegaParams {
  MegaShape s;
  MegaPlan plan;
  const MegaLayer* layers = nullptr;     ///< device array [num_layers]
  const __nv_bfloat16* embed = nullptr;  ///< [vocab][hidden]
  const __nv_bfloat16* lm = nullptr;     ///< [vocab_rows][hidden], final norm folded
  const float* inv_freq = nullptr;       ///< [head_dim / 2] RoPE inverse frequencies
  float rope_scale = 1.0f;               ///< cos/sin multiplier (EpiQKV::Params::rope_scale)
  const StepDesc* desc = nullptr;        ///< n = 1: tokens[0], positions[0], kv_index[0], prefix_len[0], attend list
  float* h32 = nullptr;                  ///< [hidden] fp32 residual stream (scratch)
  __nv_bfloat16* q = nullptr;            ///< [num_heads * head_dim] RoPE'd query (scratch)
  __nv_bfloat16* attn = nullptr;         ///< [num_heads * head_dim] attention output (scratch)
  __nv_bfloat16* act = nullptr;          ///< [intermediate] SwiGLU output (scratch)
  float* part_o = nullptr;               ///< [num_heads][max_splits][head_dim] (scratch)
  float2* part_ml = nullptr;             ///< [num_heads][max_splits] (max, sum) (scratch)
  float* logits = nullptr;               ///< [vocab] fp32, or null (arg-max only)
  unsigned long long* keys = nullptr;    ///< [1] arg-max key of the step (argmax_key_index)
  unsigned* sync = nullptr;              ///< decode_megakernel_sync_words(s) words, zero
  int lm_head = 1;                       ///< 0: stop after the last layer (no logits, no arg-max)
  /// Null, or mega_trace_words(num_layers, ctas) global-timer stamps (ns):
  /// [(6 * num_layers + 1) * ctas * kMegaTraceStamps] per op slot (per layer:
  /// QKV, attention units, split merge, O, gate/up, down; then the LM head)
  /// and CTA, its start (after its wait), its end, and its arrival at the
  /// wait (before it; 0 where an op has none); then [num_layers][ctas]
  /// [kMegaAttnStamps] head_attention's phases; then [6 * num_layers + 1]
  /// [ctas][kMegaRingWords] the ring's waits (cycles); then [ctas]
  /// [kMegaClockWords] (offsets: mega_trace_*_offset). A traced launch runs
  /// decode_megakernel_kernel<true>, the untraced one has no trace code.
  unsigned long long* trace = nullptr;
};

/// Sets the kernel's shared-memory size on the current device and checks
/// that one CTA fits on an SM (CudaError otherwise). Call before the first
/// launch on each device (outside graph capture).
void configure_decode_megakernel(const MegaPlan& plan);

/// Launches one step (desc->n must be 1) on `stream` as a cooperative launch:
/// the driver guarantees that all CTAs are co-resident, which their waits on
/// each other need (a plain launch beside another kernel on the same SMs could
/// deadlock). Graph-capturable. Throws CudaError on a launch failure. A CTA
/// that waits more than ~10 s for another traps (a bug, never a hang).
void launch_decode_megakernel(const MegaParams& p, cudaStream_t stream);

}  // namespace swiftspec::cuda
