// The CUDA backend of swiftspec: a Llama / Qwen2 decoder on one NVIDIA GPU,
// bf16 weights and activations, fp32 accumulation (SwiftSpec, ASPLOS'26 §5,
// "fused, latency-optimized kernels").
//
// What runs per forward step (one CUDA graph per token-count bucket, §5.3):
//   embed -> L x [ RMSNorm+QKV GEMM (+bias, RoPE, K/V written into the cache)
//                  -> attention over committed + tree KV (split over the KV length in
//                     fixed tiles / splits / supers, folded in-kernel: kernels/attention.h)
//                  -> O GEMM (+residual)
//                  -> RMSNorm+gate/up GEMM (+SwiGLU) -> down GEMM (+residual) ]
//   -> final RMSNorm + LM head (+logits, +argmax on the GPU)
// Design, build and how to measure: docs/cuda_backend.md; measured numbers: benchmarks/README.md.
//
// Exactness (model.h): every row of a batch is computed with the same
// arithmetic as a batch of one (the GEMM reduction over K is split into a
// fixed set of slices per weight matrix, summed in a fixed order, whatever the
// batch size), and attention reduces keys in logical order (committed prefix,
// then ancestors by depth) in a fixed tree of 64-key tiles, 256-key splits and
// 2048-key supers (a function of the token's key count only), whether a key
// lives in the committed or the tree region.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "swiftspec/checkpoint.h"
#include "swiftspec/config.h"
#include "swiftspec/error.h"
#include "swiftspec/model.h"

namespace swiftspec {

namespace cuda {
class RowParallel;  // cuda/src/row_parallel.h
}

/// A CUDA runtime / driver call failed, or the device cannot run this backend
/// (no GPU, compute capability below 9.0, out of device memory). The message
/// names the call, the file:line and the CUDA error string.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// One host-resident weight tensor handed to the CUDA backend. Row-major,
/// contiguous; `data` need not be aligned. dtype F32, BF16 or F16; or, for a linear
/// projection of a model with CudaModelOptions::int4_group_size > 0, int4
/// (docs/checkpoint_format.md, "int4 weights"): dtype U8, `shape` the projection's
/// [N, K], `data` the packed values U8 [N][K/2] (byte j of a row: element 2j in the low
/// nibble, 2j + 1 in the high one), `scales` fp16 bits [N][K/group_size], `zeros` U8
/// [N][K/group_size] (0..15), element (n, k) = (q - z) * s.
struct HostWeight {
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  const uint16_t* scales = nullptr;  ///< int4 only
  const uint8_t* zeros = nullptr;    ///< int4 only
  int group_size = 0;                ///< int4 only: K elements per scale / zero point; 0: a float tensor
  bool is_int4() const { return group_size > 0; }
};

/// Looks up a weight by its checkpoint name (docs/checkpoint_format.md) and
/// checks its shape. Must throw CheckpointError when the tensor is missing or
/// its shape differs from `expected_shape`.
using WeightLookup = std::function<HostWeight(const std::string& name, const std::vector<int64_t>& expected_shape)>;
/// Says whether a tensor of that name exists (optional tensors: biases, lm_head).
using WeightExists = std::function<bool(const std::string& name)>;

/// CudaModelOptions::megakernel_max_keys's default where it is not measured (autotune off).
constexpr int kMegakernelDefaultMaxKeys = 8192;

/// Extra options of the CUDA backend (defaults are the fast path).
struct CudaModelOptions {
  int device = 0;          ///< CUDA device ordinal
  bool use_graphs = true;  ///< replay each step as a CUDA graph (false: plain launches)
  bool use_pdl = true;     ///< programmatic dependent launch between kernels of a step
  /// With use_pdl and graphs: for each token bucket and context band
  /// (committed lengths around 512, 4K, 16K, 32K, 64K and 128K keys:
  /// cuda/src/context_bands.h), time the step's graph under candidate launch
  /// settings that change no arithmetic and keep the fastest
  /// (cuda/src/step_tuner.h); a step runs with the settings of its committed
  /// length's band. Done when the model is made, on a synthetic step per
  /// bucket and band at the band's length (~6 replays per candidate), for the
  /// bands max_context reaches. The first band tunes every knob (each kernel
  /// kind's PDL edge off, every edge off, each GEMM's other row-block sizes and
  /// pipeline depths, 128 query rows per attention item instead of 64 (buckets
  /// past 1), then the combination of those that paid: ~21 candidates per
  /// bucket); each further band tunes the PDL edges and the attention's rows,
  /// every GEMM at the first band's plan (at most 11 candidates per bucket:
  /// every edge on, every edge off, the first band's setting, each edge off
  /// alone, 128 rows alone, their combination). With the megakernel and megakernel_max_keys -1 it also
  /// times where the megakernel hands single-token steps to the layered step
  /// (one comparison per further band). The load time this adds:
  /// benchmarks/README.md, the step tuner sections. Off for tensor-parallel
  /// ranks (their all-reduces must pair up). SWIFTSPEC_STEP_TUNE=0 turns it off
  /// (A/B); another value than 0, 1 or empty makes the constructor throw
  /// InvalidArgument. A candidate that fails (a capture refused, memory) leaves
  /// its bucket untuned in that band (debug_step_tuning says why): the first
  /// band at the default setting, a further band at the nearest lower band's.
  bool autotune = true;
  /// Checks: the tuner also replays every candidate once more and requires
  /// the step's outputs (arg-max keys and residual rows) to be bitwise those of
  /// the default setting; the constructor throws Error naming a setting that
  /// changes them.
  bool autotune_verify = false;
  /// SM partition [sm_first, sm_first + sm_count) of logical SMs (sm_partition.h):
  /// the model's stream belongs to a CUDA green context over those SMs, and the
  /// persistent GEMM grids are sized for them (SwiftSpec ASPLOS'26 §4, one-GPU
  /// disaggregation: a draft on its own SMs cannot slow the target). sm_count 0:
  /// up to the last SM; both 0 (default): the whole GPU, a plain stream. The
  /// constructor throws InvalidArgument (message starting "sm_partition") for a
  /// range outside the device, off the driver's 8-SM granularity, or unable to
  /// hold a cluster of 8 CTAs; CudaError if the driver has no green contexts.
  int sm_first = 0;
  int sm_count = 0;
  /// Priority of the model's stream (cudaDeviceGetStreamPriorityRange: lower
  /// numbers are higher priorities, clamped to the range; 0: default). With two
  /// models on one GPU, the block scheduler starts a higher-priority stream's
  /// pending CTAs first (it does not preempt running ones).
  int stream_priority = 0;
  /// Engine of every skinny GEMM of the model (ModelOptions::gemm_engine):
  /// -1 default (gemm_default_engine: wgmma unless SWIFTSPEC_GEMM_ENGINE=mma),
  /// 0 mma.sync, 1 wgmma. Fixed per model: batch invariance.
  int gemm_engine = -1;
  /// Single-token steps run as one persistent kernel (the decode megakernel,
  /// cuda/src/kernels/decode_megakernel.h): weights stream into shared memory
  /// ahead of the arithmetic, the layers' dependencies are global counters
  /// instead of kernel boundaries. Steps of 2+ tokens keep the layered path.
  /// Its reduction order differs from the layered path's, so with it a decode
  /// step is not bitwise equal to a row of a tree step (model.h's exactness
  /// contract is relaxed to bf16 rounding): meant for draft models and
  /// target-only decoding. The constructor throws InvalidArgument (message
  /// starting "decode megakernel") for a shape it cannot run, or together
  /// with row_parallel (tensor parallelism).
  bool megakernel = false;
  /// The megakernel's attention for steps of at most this many keys: one CTA
  /// per query head over all keys, no merge phase (MegaPlan::head_keys).
  /// -1: the default (decode_megakernel.h, plan_decode_megakernel); 0:
  /// always key-split units and a merge.
  int megakernel_head_keys = -1;
  /// CTAs per query head in that mode: 0 the default (4, fewer when they do
  /// not fit the grid), or at most 1, 2, 4 or 8 (benchmarks and checks).
  int megakernel_head_parts = 0;
  /// Weight chunks the megakernel's producer keeps in flight per SM
  /// (MegaPlan::max_inflight): -1 the default, 0 the whole ring, 1..16.
  int megakernel_max_inflight = -1;
  /// Chunks at the end of each op whose ring slots the megakernel refills
  /// only after the op's release (MegaPlan::release_hold): -1 the default,
  /// 0 off, 1..16.
  int megakernel_release_hold = -1;
  /// Those refills wait until the next op's input is loaded instead of the
  /// op's release (MegaPlan::hold_until_input): -1 the default, 0, 1 or 2.
  int megakernel_hold_until_input = -1;
  /// Short attention parts in one round trip (MegaPlan::attn_short): -1 the
  /// default, 0 or 1.
  int megakernel_attn_short = -1;
  /// A head part's committed K/V loads issued before its wait for the QKV op
  /// (MegaPlan::attn_prewait): -1 the default, 0 or 1.
  int megakernel_attn_prewait = -1;
  /// The parts of a query head merged by the O projection's input load
  /// instead of by part 0 (MegaPlan::merge_in_o; the same bits): -1 the
  /// default (0), 0 or 1.
  int megakernel_merge_in_o = -1;
  /// Bytes of its gate/up rows each CTA prefetches into L2 once its attention
  /// is done (MegaPlan::l2_prefetch_bytes): -1 the default (0), 0 off, or a
  /// multiple of 16 up to 4 MiB.
  int megakernel_l2_prefetch_bytes = -1;
  /// Bytes of one ring slot (MegaPlan::slot_bytes): 0 the default, chosen
  /// by timing when the model is made (autotune: 32 KB, 35840, 40960 or 53760 B;
  /// the same bits whichever wins), else the plan's 32 KB; or a fixed size.
  int megakernel_slot_bytes = 0;
  /// The decode megakernel runs single-token steps over at most this many keys; longer ones
  /// take the layered step, whose attention splits the keys over every SM (the megakernel's
  /// attention is sized for short contexts). 0: no limit; a positive value is used as given.
  /// -1 (default): with autotune measured when the model is made: the megakernel keeps the
  /// first context band (cuda/src/context_bands.h) and each further band max_context
  /// reaches, in ascending order, until the layered single-token step (that band's tuned
  /// graph) replays at least 1 % faster at the band's length; the limit is the upper
  /// boundary of the last band it kept (no limit past the last band); debug_step_tuning
  /// logs each comparison and the limit. Without autotune: kMegakernelDefaultMaxKeys.
  int megakernel_max_keys = -1;
  /// Appends of 64+ tokens without every row's logits (prompts) run through the prefill path:
  /// CUTLASS GEMMs over up to kPrefillMaxTokens tokens at once and a causal flash-attention
  /// kernel (cuda/src/prefill/); the K/V it writes equal the decode steps' up to bf16
  /// rounding. false: through the decode step per 64 tokens (bit-identical to decoding them;
  /// checks and A/B). Tensor-parallel ranks always take the decode steps.
  bool large_prefill = true;
  /// Benchmark: the megakernel stamps each op's start and end per CTA (read
  /// with CudaModel::debug_megakernel_trace). Costs a few stores per op.
  bool megakernel_trace = false;
  /// int4 projections (W4A16, issue 31): K elements per scale / zero point of every linear
  /// projection (q/k/v, o, gate/up, down), a multiple of 32 dividing each projection's K
  /// (which must be a multiple of 64); 0 (default): bf16 projections. The lookup then hands
  /// each projection as an int4 HostWeight of this group size; the embedding, norms, biases
  /// and LM head stay bf16. The projections are re-laid for the int4 skinny GEMM at load
  /// (kernels/gemm_int4.h), and the RMSNorm weights, which cannot be folded into int4
  /// weights, scale the GEMMs' bf16 activations instead (h16 = bf16(h32 * g)): the step
  /// keeps its exactness contract but rounds differently from a bf16 model of the same
  /// values. Runs on the layered step only: the constructor throws InvalidArgument (naming
  /// the option) with megakernel, large_prefill or row_parallel, and for shapes the int4
  /// GEMM cannot run. make_cuda_model sets it (and large_prefill = false) from an int4
  /// checkpoint.
  int int4_group_size = 0;
  /// Tensor parallelism (issue 7): with a hook, this model is one rank of a
  /// tensor-parallel group; its ModelConfig is the rank's shard shape (heads,
  /// KV heads, intermediate size and vocabulary divided by the TP degree) and
  /// the attention-output and MLP-down projections go through the hook, which
  /// all-reduces their partial outputs over the group (cuda/src/row_parallel.h;
  /// implementations in cuda/src/multigpu/). Every rank must run the same
  /// steps, concurrently, one thread each. Null (default): one GPU.
  std::shared_ptr<cuda::RowParallel> row_parallel;
};

/// The CUDA model. Implements swiftspec::Model; adds GPU-side greedy decoding
/// (argmax without copying logits to the host) and hooks used by benchmarks.
class CudaModel : public Model {
 public:
  /// Greedy variant of forward(): fills `argmax` with the arg-max token id of
  /// each logits row (rows by batch.logits as in forward()); ties go to the
  /// smallest id. No logits are copied to the host.
  virtual void forward_argmax(const ForwardBatch& batch, std::vector<int32_t>& argmax) = 0;

  /// Benchmark hook: fills committed KV slots [0, len) of every layer with
  /// random values and sets committed_len() = len. Throws InvalidArgument if
  /// len > max_context.
  virtual void debug_fill_committed_random(int len, uint64_t seed) = 0;

  /// Benchmark hook: prepares `batch` (uploads its descriptor, captures the
  /// graph of its bucket) and returns an opaque step id usable with
  /// debug_replay(). Does not change committed_len(). The step replays as it
  /// would run at committed_len() now: its context band's graph (autotune),
  /// the megakernel or the layered step (megakernel_max_keys).
  virtual int debug_prepare(const ForwardBatch& batch, bool write_logits) = 0;
  /// Runs the prepared step `iters` times back to back on the model's stream
  /// (KV slots of the step are rewritten with the same values) and returns the
  /// median device time of one step in milliseconds (CUDA events).
  virtual double debug_replay_ms(int step_id, int iters) = 0;

  /// Test hook: fills the activation, logits and scratch buffers, and the KV
  /// cache past committed_len(), with NaN bytes (0xFF), so that any read of
  /// memory a step did not write shows up as a non-finite output.
  virtual void debug_poison_buffers() = 0;

  /// Test hook: copies the first `rows` token rows of an activation buffer as
  /// fp32: "h32" (residual, [rows][hidden]), "q" (RoPE'd queries of the last
  /// layer run, [rows][heads*head_dim]), "attn" (attention output), "act"
  /// (SwiGLU output, [rows][intermediate]), "ssq" ([rows][hidden/16]).
  virtual void debug_read_activations(const std::string& which, int rows, std::vector<float>& out) = 0;

  /// Test hook: copies a device weight matrix as fp32, in its device layout
  /// (rows permuted, RMSNorm weight folded; see weight_layout.h): "embed", "lm"
  /// (vocab rows padded to 16), or per layer "qkv", "o", "gate_up", "down" (bf16
  /// projections only: InvalidArgument for those of an int4 model).
  virtual void debug_read_weight(const std::string& which, int layer, std::vector<float>& out) = 0;

  /// Benchmark hook: the global-timer stamps (ns) of the last megakernel step,
  /// [(6 * num_layers + 1) * ctas * 3]: start, end, arrival, then [num_layers][ctas][6] the
  /// attention's phases (decode_megakernel.h, MegaParams::trace, kMegaAttnStamps), and the number of CTAs. Throws
  /// InvalidArgument unless the model was made with megakernel_trace.
  virtual int debug_megakernel_trace(std::vector<unsigned long long>& stamps) = 0;

  /// Bytes of weights one decode step reads (all layers, final norm, LM head;
  /// the embedding counts one row).
  virtual size_t weight_bytes_per_step() const = 0;

  /// SMs this model's kernels run on: its green-context partition
  /// (CudaModelOptions::sm_first / sm_count), else the whole GPU.
  virtual int num_sms() const = 0;
  /// Diagnostics: the persistent GEMM launch plans made so far, one line per
  /// (matrix, token bucket): "qkv nt=1 S=2 BR=64 grid=66x2 ctas=132" ("qkv nt=1 int4 S=2
  /// BR=128 ..." for the int4 GEMM's planner choice).
  virtual std::string debug_gemm_plans() const = 0;
  /// Diagnostics: one line per (context band, token bucket) tuned so far
  /// (autotune), the band named by its representative length: the median ms
  /// of each candidate setting and the choice, "band=512 nt=1: default
  /// 4.9120, pdl.attn=off 4.7810, ... -> pdl.attn=off" (or "band=... nt=...:
  /// tuning failed, ..."); with the megakernel also its ring slot size's line,
  /// "megakernel: default 0.7425, mk.slot_bytes=53760 0.7172 ->
  /// mk.slot_bytes=53760", and where megakernel_max_keys is measured one line
  /// per comparison, "megakernel vs layered at 16384 keys: 1.2340 vs 1.4560
  /// ms -> megakernel" (committed keys; ms of the megakernel, then of the
  /// layered step), then "megakernel_max_keys: 23170 (measured)" (0: no
  /// limit). Empty if none.
  virtual std::string debug_step_tuning() const = 0;
  /// Diagnostics: the distinct SM ids (%smid) that `ctas` spinning CTAs
  /// launched on this model's stream ran on (synchronizes the stream).
  virtual std::vector<int> debug_probe_sm_ids(int ctas) = 0;
};

/// CudaModelOptions::gemm_engine of a ModelOptions::gemm_engine name: "" -> -1
/// (default), "mma" -> 0, "wgmma" -> 1. Throws InvalidArgument for another name.
int gemm_engine_code(const std::string& name);

/// Builds the CUDA model from a checkpoint (bf16 or f32 weights; converted
/// to bf16 on the GPU) on ModelOptions::device, in the SM partition
/// ModelOptions::sm_first / sm_count (see CudaModelOptions). An int4 checkpoint
/// (format version 3) loads with CudaModelOptions::int4_group_size = its group size
/// and large_prefill off (prompts take the layered step); every projection's qweight /
/// scales / zeros is validated by the CPU backend's rules (cpu::load_int4_matrix: shapes,
/// the group size dividing K, zero points <= 15, finite scales) before anything is
/// allocated on the GPU. Throws CheckpointError for missing or mis-shaped tensors (naming
/// the tensor and its file), InvalidArgument for unsupported configurations (head_dim not
/// 64 or 128, sizes not multiples of 16, int4 with the megakernel: int4_backend_problem in
/// swiftspec/model.h, or int4 shapes the int4 GEMM cannot run) or a bad SM partition,
/// CudaError for device failures.
std::unique_ptr<Model> make_cuda_model(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options);

/// Same, returning the CUDA model type, with CUDA-specific options (for an int4 checkpoint
/// int4_group_size and large_prefill come from the checkpoint, whatever `cuda_options` say).
std::unique_ptr<CudaModel> make_cuda_model_ex(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options,
                                              const CudaModelOptions& cuda_options);

/// Builds the CUDA model from host tensors given by `lookup` / `exists`
/// (checkpoint names and layouts). Used by tests and by make_cuda_model().
std::unique_ptr<CudaModel> make_cuda_model_from_host(const ModelConfig& config, const WeightLookup& lookup,
                                                     const WeightExists& exists, const ModelOptions& options,
                                                     const CudaModelOptions& cuda_options);

/// Builds a model of `config`'s shape with random weights generated on the
/// GPU (no files): for latency benchmarks. Values are small, finite, nonzero.
std::unique_ptr<CudaModel> make_cuda_model_random(const ModelConfig& config, const ModelOptions& options,
                                                  const CudaModelOptions& cuda_options, uint64_t seed);

}  // namespace swiftspec
