// The model interface every backend implements: one decoder-only transformer
// (Llama / Qwen2 family) with its own KV cache.
//
// KV cache layout (the tree-aware KV cache of SwiftSpec, ASPLOS'26 §4.2):
//   committed region  slots [0, committed_len()) hold the accepted context, in
//                     position order;
//   tree region       `max_tree` independent slots holding speculative nodes.
// A forward pass either appends tokens to the committed region (prefill and
// plain decode: token i attends committed slots [0, committed_len()+i]), or
// writes tree nodes into tree slots (token i attends the committed region then
// the tree slots listed for it: its ancestors in depth order, itself last).
// Which tree slots are free is the caller's bookkeeping (see tree_kv_cache.h).
//
// Exactness: backends compute every row of a batch with the same arithmetic
// and reduction order as a batch of one (batch invariance) and attend keys in
// the same order whether they sit in the committed or the tree region, so a
// token verified inside a tree gets bit-identical logits and K/V to the same
// token decoded alone. This is what makes greedy speculation lossless.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "swiftspec/checkpoint.h"
#include "swiftspec/config.h"
#include "swiftspec/memory_plan.h"
#include "swiftspec/top_k_logits.h"

namespace swiftspec {

/// Which rows of a forward pass produce logits.
enum class LogitsMode {
  None,  ///< no LM head (e.g. a prefill whose last token is decoded later)
  Last,  ///< only the last row
  All,   ///< every row
};

/// One forward pass over `tokens.size()` new tokens.
struct ForwardBatch {
  std::vector<int32_t> tokens;     ///< [n] token ids, each in [0, vocab_size)
  std::vector<int32_t> positions;  ///< [n] RoPE positions

  /// Tree mode when non-empty: token i writes its K/V into tree slot
  /// tree_slots[i] and attends committed [0, committed_len()) followed by the
  /// tree slots attend_slots[attend_offsets[i] .. attend_offsets[i+1]), which
  /// must end with tree_slots[i]. Empty: append mode (causal, into committed).
  std::vector<int32_t> tree_slots;      ///< [n] or empty
  std::vector<int32_t> attend_offsets;  ///< [n+1] CSR offsets (tree mode)
  std::vector<int32_t> attend_slots;    ///< CSR values (tree mode)

  LogitsMode logits = LogitsMode::Last;

  bool is_tree() const { return !tree_slots.empty(); }
  /// Checks the batch against a model's limits before any of it runs, the
  /// same rules on every backend: at least one token, one position (>= 0)
  /// per token, ids in [0, vocab_size); append mode: `committed` + n <=
  /// `max_context`; tree mode: one tree slot per token, each in [0,
  /// `max_tree`) and none written twice, attend_offsets a CSR index of n+1
  /// entries over attend_slots, each token's list non-empty, ending with its
  /// own slot, its slots in range and distinct, and a slot this batch writes
  /// attended only by its writer or a later token (ancestors come first: a
  /// backend may run the batch in pieces of tokens). Throws InvalidArgument
  /// naming the field, the token and the value.
  void validate(int vocab_size, int64_t committed, int max_context, int max_tree) const;
  /// Builds a plain append batch: tokens at positions start, start+1, ...
  static ForwardBatch append(const std::vector<int32_t>& tokens, int start_position,
                             LogitsMode mode = LogitsMode::Last);
  /// Builds a tree batch of a whole token tree with nothing of it cached yet:
  /// node i (token tokens[i], parent parents[i] < i, -1 for a root) goes to
  /// tree slot i at position start_position + its depth, and attends its
  /// ancestors' slots root first, then its own. Throws InvalidArgument when
  /// the sizes differ or a parent does not come before its child.
  static ForwardBatch tree(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents, int start_position,
                           LogitsMode mode = LogitsMode::All);
};

/// Model::read_logits_row can return every row of a forward_top_k pass of at most this many
/// rows, on every backend: the default keeps all of a pass's rows, the CUDA backend keeps the last
/// piece of a pass (a pass over more tokens runs in pieces of 64; its earlier pieces' rows are
/// overwritten). A caller that may need any row of a pass (a sampler whose head does not decide:
/// sample_from_head, top_sampling_tokens_from_head) takes the head path only for passes this small.
constexpr int kReadableLogitsRows = 64;

/// Options a backend needs to instantiate a model.
struct ModelOptions {
  /// Committed KV capacity (tokens), at most the model's max_position_embeddings (the
  /// positions it was trained for). 0 (default): max_position_embeddings (kFallbackMaxContext
  /// when config.json gives none), capped to what the memory free on the model's device holds
  /// (plan_contexts, memory_plan.h). An explicit value that does not fit is refused before
  /// loading. A loaded model reports the resolved value.
  int max_context = 0;
  int max_tree = 256;             ///< tree KV capacity (nodes)
  int num_threads = 0;            ///< CPU backend worker threads (0: all cores)
  std::vector<int> cpu_affinity;  ///< CPU backend: cores to pin its threads to (empty: none)
  int device = 0;                 ///< CUDA backend: device ordinal
  /// CUDA backend: the model's SM partition on its GPU, [sm_first, sm_first + sm_count),
  /// run through a CUDA green context (SwiftSpec ASPLOS'26: draft and target disaggregated on
  /// one GPU). sm_count 0: up to the last SM; [0, 0]: the whole GPU, no green context.
  /// Bounds and granularity are checked against the device (placement.h, resolve_sm_partition);
  /// the cpu backend rejects a partition (InvalidArgument).
  int sm_first = 0;
  int sm_count = 0;
  /// CUDA backend: priority of the model's stream (lower is higher, clamped to
  /// cudaDeviceGetStreamPriorityRange; 0: default). A target at a higher
  /// priority than the draft gets free SMs first on a shared GPU.
  int stream_priority = 0;
  /// CUDA backend: the engine of the model's skinny GEMMs (a tensor-parallel
  /// model's row-parallel GEMMs keep the default): "" (default,
  /// the wgmma engine), "wgmma", or "mma" (mma.sync: measured faster on
  /// single-token decode steps, slower on trees; benchmarks/README.md, "CUDA
  /// backend"). One engine per model, never per step, so the model stays
  /// batch-invariant; a draft that mostly decodes single tokens can take "mma"
  /// while the target that verifies trees keeps "wgmma". The cpu backend rejects
  /// it (InvalidArgument), as does an unknown name.
  std::string gemm_engine;
  /// CUDA backend: single-token steps run as one persistent kernel (the
  /// decode megakernel; CudaModelOptions::megakernel); steps of 2+ tokens keep
  /// the layered path. Its reduction order differs from multi-token steps', so
  /// with it a decode step is not bitwise equal to a row of a tree step (the
  /// exactness contract above is relaxed to bf16 rounding): meant for draft
  /// models and target-only decoding. On a target, greedy speculative output
  /// can then differ from target-only decoding at near-ties. Default false.
  /// The cpu backend rejects it (InvalidArgument), as does tensor parallelism
  /// (tp > 1) and a model shape the megakernel cannot run.
  bool megakernel = false;
  /// An attention window for a draft model (attention sinks plus a recent window: StreamingLLM,
  /// Xiao et al., ICLR 2024, sec. 3.2; as a draft's cache in TriForce, Sun et al., COLM 2024,
  /// sec. 4): with kv_window_recent > 0 a row attends only the first kv_window_sinks of its keys
  /// and the last kv_window_recent (key_window below), so a step's attention reads a bounded
  /// number of keys however long the context grows. Keys keep the positions they were written
  /// at (the window masks, it does not re-position), and every committed K/V is still stored.
  /// The model's logits differ from full attention's: meant for a draft, whose proposals the
  /// target verifies with its full KV, so outputs stay the target's. 0 / 0 (default): full
  /// attention. Bounds (check_kv_window): sinks and recent in [0, kMaxKvWindow], sinks only with
  /// a window. The cuda backend rejects a window (InvalidArgument; kv_window_backend_problem) for now.
  int kv_window_sinks = 0;
  int kv_window_recent = 0;
};

/// Largest kv_window_sinks / kv_window_recent accepted (a window this wide is full attention at
/// every context a model of today is trained for).
constexpr int kMaxKvWindow = 1 << 20;

/// The keys a row attends under `options`' attention window. A row's keys in order are its
/// committed keys and then, in a tree step, its tree ancestors (root first, itself last): n keys
/// in all, the same sequence a decode step of the same token at the same position sees. It
/// attends [0, sink_end) and [recent_begin, n) of that sequence, sink_end <= recent_begin <= n:
/// the first kv_window_sinks keys and the last kv_window_recent, so a tree row attends what the
/// same token decoded alone attends (batch invariance holds under a window). Without a window
/// (kv_window_recent 0) sink_end = recent_begin = n: all n keys.
struct KeyWindow {
  int sink_end;
  int recent_begin;
};
inline KeyWindow key_window(const ModelOptions& options, int n) {
  if (options.kv_window_recent <= 0) return {n, n};
  const int sink_end = n < options.kv_window_sinks ? n : options.kv_window_sinks;
  const int recent = n - options.kv_window_recent;
  return {sink_end, recent > sink_end ? recent : sink_end};
}

/// Why `backend` cannot run a model with an attention window of `recent` recent keys ("kv_window:
/// <why>": the cuda backend, for now, issue 27), or "" when it can (or recent is 0: no window).
/// The caller prefixes where the window was set; load_model_pair refuses it before loading either
/// model, and Python asks it first (swiftspec_core.placement_backend_problems).
std::string kv_window_backend_problem(const std::string& backend, int recent);

/// Throws InvalidArgument naming the field (ModelOptions.kv_window_sinks / kv_window_recent)
/// when the window's sizes are outside [0, kMaxKvWindow], sinks are given without a window, or
/// `backend` does not implement the window (kv_window_backend_problem).
void check_kv_window(const ModelOptions& options, const std::string& backend);

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ModelOptions& options() const = 0;
  /// A short name of the backend ("cpu", "cuda").
  virtual std::string backend_name() const = 0;

  /// Runs the layers over `batch` and writes logits, fp32, row-major
  /// [rows, vocab_size] into `logits` (rows: 0, 1 or n by batch.logits).
  /// Append mode grows the committed region by n. Throws InvalidArgument
  /// naming the field for out-of-range tokens, positions, slots, or a batch
  /// that would overflow the committed region. (Non-virtual: it forgets the rows
  /// read_logits_row() keeps, then runs the backend's run_forward().)
  void forward(const ForwardBatch& batch, std::vector<float>& logits);

  /// forward() reduced to what greedy decoding and top-k tree growth read: each
  /// logits row's `k` largest entries (TopKLogits: ids and fp32 values, ties to the
  /// smaller id) and, when `with_log_normalizer`, its ln sum exp(logit * inv_temperature)
  /// (the normaliser of softmax(logits / T) for inv_temperature = 1 / T; out.inv_temperature
  /// records it). Same pass, same KV effects, same logits as forward(): ids and values equal
  /// select_top_k_logits() of forward()'s rows exactly; the log-normalizer agrees
  /// to ~1e-12 relative (a backend may sum in another order). The default runs
  /// forward() and selects on the host; the CUDA backend selects on the GPU and
  /// copies [rows, k] entries instead of [rows, vocab] (top_k_logits.h says why).
  /// Afterwards read_logits_row() can copy out a whole row of the same pass.
  /// Throws InvalidArgument for k outside [1, vocab] or inv_temperature not finite and > 0
  /// (before the pass) and what forward() throws; Error when a row holds NaN.
  /// (Every override declares the same default inv_temperature = 1.)
  virtual void forward_top_k(const ForwardBatch& batch, int k, bool with_log_normalizer, TopKLogits& out,
                             double inv_temperature = 1.0);

  /// Copies row `row` (0-based among the rows that pass returned) of the fp32 logits of this
  /// model's most recent forward_top_k() into `out` [vocab_size]: bit-identical to the row
  /// forward() would have returned. What a sampler reads when a row's top-k does not determine
  /// its draw (sample_from_head). Valid until the next pass of this model: any later
  /// forward(), forward_top_k() (or other pass) replaces or forgets the rows. The default keeps
  /// the rows forward() returned to forward_top_k; the CUDA backend copies one row from its
  /// device logits buffer, which holds the pass's last piece of up to 64 tokens (a pass over
  /// more tokens runs in pieces). Throws InvalidArgument, naming the case, when no
  /// forward_top_k ran yet, a later pass forgot its rows, that pass kept none (a k = 1
  /// pass without log-normalizer: the CUDA backend then writes no logits, so no backend keeps
  /// them), `row` is outside [0, rows), or (CUDA) a later piece of the pass overwrote it.
  virtual void read_logits_row(int row, std::vector<float>& out);

  /// Number of committed KV entries.
  virtual int committed_len() const = 0;
  /// Appends the K/V of `tree_slots` (in order) to the committed region — the
  /// accepted path of a verification. Slots stay valid until overwritten.
  virtual void commit_tree_slots(const std::vector<int32_t>& tree_slots) = 0;
  /// Drops committed entries past `len` (len <= committed_len()).
  virtual void truncate_committed(int len) = 0;

  /// Copies the K and V of `layer` for committed slots [0, committed_len()) as
  /// fp32 [committed_len, num_kv_heads, head_dim] each (tests and debugging).
  virtual void read_committed_kv(int layer, std::vector<float>& k, std::vector<float>& v) const = 0;
  /// Same for the tree slots `slots`, [slots.size(), num_kv_heads, head_dim].
  virtual void read_tree_kv(int layer, const std::vector<int32_t>& slots, std::vector<float>& k,
                            std::vector<float>& v) const = 0;

  /// Tokens per forward pass when a prompt is prefilled in chunks (prefill() below): a
  /// backend picks a size whose pass takes well under a second yet keeps its arithmetic
  /// efficient. Generation checks for cancellation between chunks.
  virtual int prefill_chunk_tokens() const { return 512; }

 protected:
  /// The backend's forward pass (forward() above documents it).
  virtual void run_forward(const ForwardBatch& batch, std::vector<float>& logits) = 0;
  /// Forgets the rows the default forward_top_k keeps for read_logits_row. forward() calls
  /// it; a backend calls it too when a pass of its own (not through forward()) reuses the
  /// logits, so that no stale row is ever read.
  void forget_kept_logits() {
    kept_rows_ = 0;
    kept_state_ = kept_state_ == KeptState::NeverRan ? KeptState::NeverRan : KeptState::Forgotten;
    kept_logits_.clear();
  }
  /// Records that the last forward_top_k kept no logits (a k = 1 pass without
  /// log-normalizer), so read_logits_row() names that case; for a backend whose
  /// own forward_top_k takes such a pass without the default.
  void note_no_logits_kept() {
    forget_kept_logits();
    kept_state_ = KeptState::NoneKept;
  }

 private:
  enum class KeptState { NeverRan, Kept, NoneKept, Forgotten };
  KeptState kept_state_ = KeptState::NeverRan;
  int kept_rows_ = 0;
  std::vector<float> kept_logits_;  ///< [kept_rows_, vocab] of the default forward_top_k's pass
};

/// How prefill() cuts a prompt into forward passes and when it stops early.
struct PrefillControl {
  /// Tokens per forward pass (> 0); 0: the model's prefill_chunk_tokens().
  int chunk = 0;
  /// Polled before every chunk; returning true stops the prefill there.
  std::function<bool()> cancelled;
};

/// Appends `tokens` to `model`'s committed region in append-mode forward passes of at most
/// `control.chunk` tokens each, in order. Each token attends the same keys in the same order
/// as in one pass, so on a batch-invariant backend (see "Exactness") the K/V and the logits
/// are bit-identical to a single forward over all of `tokens`. `logits` receives what that
/// single pass would return for `mode` (Last: the last token's row; All: every row; None:
/// nothing). Returns false when `control.cancelled` stopped it: the committed region then
/// holds a prefix of `tokens` (whole chunks) and `logits` is empty. Throws what
/// Model::forward throws, and InvalidArgument for a negative chunk; an id outside the
/// vocabulary or a prompt beyond max_context is refused before the first chunk (nothing
/// computed or committed, as with one pass).
bool prefill(Model& model, const std::vector<int32_t>& tokens, LogitsMode mode, std::vector<float>& logits,
             const PrefillControl& control = {});

/// A model about to load, as the context plan sees it: what it needs on each device it uses.
struct ModelMemory {
  std::string name;    ///< how messages name it (its checkpoint folder's name)
  std::string origin;  ///< its config.json (named when max_context exceeds max_position_embeddings)
  int trained = 0;     ///< ModelConfig::context_limit() (max_position_embeddings; longer with YaRN; 0: not given)
  /// (device, need there): device "cpu" (the machine's RAM) or "cuda:<ordinal>".
  std::vector<std::pair<std::string, MemoryNeed>> needs;
};

/// Bytes of the weight files (*.safetensors) in the checkpoint folder `dir`; 0 for none.
uint64_t checkpoint_weight_bytes(const std::string& dir);

/// What a model over `checkpoint` needs on `backend` ("cpu": cpu_memory_need, in RAM; "cuda":
/// cuda_memory_need, on GPU options.device) with `options` (max_tree, threads, megakernel...;
/// max_context is not read). Throws InvalidArgument for an unknown or unavailable backend.
ModelMemory model_memory(const Checkpoint& checkpoint, const std::string& backend, const ModelOptions& options);

/// The contexts of models that load together (an engine's target and draft): measures the
/// memory free on each device they use (cpu_free_memory, cuda_free_memory; once per device)
/// and applies plan_contexts (memory_plan.h) with `requested[i]` the max_context asked of
/// models[i] (0: its default). Throws InvalidArgument as plan_contexts does.
ContextPlan plan_model_contexts(const std::vector<ModelMemory>& models, const std::vector<int>& requested);

/// `options` with max_context resolved for one model (plan_model_contexts of it alone): 0
/// becomes its default, bounded by free memory; an explicit value is checked (trained length,
/// memory). `note`, when given, receives the plan's note (empty unless memory capped the
/// default). Every loader below calls it before allocating the KV cache.
ModelOptions resolve_max_context(const ModelOptions& options, const ModelMemory& memory, std::string* note = nullptr);

/// Why a model with int4 weights (an int4 checkpoint, WeightQuantization::int4) cannot load
/// on `backend` with the decode megakernel `megakernel` (ModelOptions::megakernel) and `tp`
/// tensor-parallel ranks (issue 31), or "" when it can. The cpu backend takes every
/// combination. The cuda backend runs int4 projections on its layered step of one GPU: the
/// decode megakernel streams bf16 weight rows, and the tensor-parallel ranks' row-parallel
/// GEMMs read bf16 weights, so both are refused. The message starts with the field, for the
/// caller to prefix with where it was set: "megakernel: int4 weights run on ..." or
/// "tp 2: int4 weights run on ...". Loaders refuse a non-empty answer with InvalidArgument
/// before anything is allocated (load_model as "ModelOptions.<message>", load_model_pair
/// and load_group_model as "placement.<group>.<message>", make_cuda_model); Python asks it
/// before converting a model to int4 (swiftspec_core.int4_backend_problem).
std::string int4_backend_problem(const std::string& backend, bool megakernel, int tp);

/// Creates a model on the named backend ("cpu"; "cuda" when built with CUDA).
/// Throws InvalidArgument for an unknown or unavailable backend, for an int4 checkpoint
/// with options the backend cannot run it with (int4_backend_problem), or for a
/// max_context the model cannot take (resolve_max_context: beyond its trained length, or
/// more than the memory free holds), before anything large is allocated.
std::unique_ptr<Model> load_model(std::shared_ptr<const Checkpoint> checkpoint, const std::string& backend,
                                  const ModelOptions& options);

}  // namespace swiftspec
