// The CUDA model's decode megakernel (CudaModelOptions::megakernel): its plan, ring-slot
// tuning, buffers and layer table, the single-token steps it runs, and the context length
// where it hands them to the layered step.
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_model_impl.h"
#include "step_tuner.h"
#include "swiftspec/rope.h"

namespace swiftspec::cuda {

namespace {

/// Ring slot sizes the megakernel's tuner times besides the plan's default
/// (32 KB), each measured faster at some shape on the H200: 53760 B at the
/// 0.5B shape, 35840 B at the 1.5B (two 17.5 KB down rows per slot instead
/// of one), 40960 B at the 0.5B once refills were held at the handoffs; the
/// 8B no faster with any. The plan cannot tell which wins, so the model
/// times them (benchmarks/README.md, the megakernel sections on the ring's
/// slot size and on ring refills held back at the handoffs).
constexpr int kMegakernelSlotOptions[] = {35840, 40960, 53760};

/// The layered step takes a context band from the megakernel only if it is faster there
/// by this fraction (measure_megakernel_hand_over), the step tuner's min_gain.
constexpr double kHandOverMinGain = 0.01;

}  // namespace

/// Whether a single-token step over `keys` keys runs as the decode megakernel (mk_max_keys_,
/// CudaModelOptions::megakernel_max_keys resolved): beyond it the layered step's split-K
/// attention.
bool CudaModelImpl::megakernel_takes(int keys) const { return mk_max_keys_ == 0 || keys <= mk_max_keys_; }

/// Whether the model measures where its megakernel hands single-token steps over
/// (CudaModelOptions::megakernel_max_keys -1 with autotune; an explicit limit is kept).
bool CudaModelImpl::measures_megakernel_hand_over() const {
  return mk_ && copt_.autotune && copt_.use_graphs && copt_.megakernel_max_keys < 0;
}

/// Sets mk_max_keys_ by timing: the megakernel keeps the first context band (untimed: its
/// attention is built for short contexts), then each further band the model reaches, in
/// ascending order, while it wins there (megakernel_wins_band); the limit is the upper
/// boundary of the last band it kept (0, no limit, past the table's last band). The
/// synthetic steps borrow committed_ (tune_all_buckets gives it back).
void CudaModelImpl::measure_megakernel_hand_over() {
  int limit = band_upper(0);
  for (int band = 1; band < kContextBands; ++band) {
    if (band_synthetic_committed(band, 1, opt_.max_context) < 0) break;  // past max_context
    if (!megakernel_wins_band(band)) break;
    limit = band_upper(band);
  }
  mk_max_keys_ = limit;
  tuning_log_ +=
      "megakernel_max_keys: " + std::to_string(limit) + (limit == 0 ? " (measured: no limit)\n" : " (measured)\n");
}

/// Times the megakernel's greedy single-token step (arg-max, no logits) against the
/// layered one (bucket 1 with `band`'s settings and graph) at the band's synthetic committed
/// length, interleaved (time_graphs, medians), and logs both. The megakernel keeps the band
/// unless the layered step is faster by kHandOverMinGain: the two round differently
/// (CudaModelOptions::megakernel), so noise should not move the boundary. A comparison that
/// fails (a capture refused, out of memory) hands the band over: the layered step is the
/// one built for long contexts.
bool CudaModelImpl::megakernel_wins_band(int band) {
  const int committed = band_synthetic_committed(band, 1, opt_.max_context);
  const std::string head = "megakernel vs layered at " + std::to_string(committed) + " keys: ";
  try {
    committed_ = committed;
    ForwardBatch b;
    b.logits = LogitsMode::Last;
    b.tokens.push_back(0);
    b.positions.push_back(committed);
    upload_synthetic_step(b);
    const cudaGraphExec_t mk =
        graphs_.ensure(megakernel_graph_key(LogitsMode::Last, false), stream_,
                       [&](cudaStream_t s) { record_megakernel_step(s, LogitsMode::Last, false); });
    const cudaGraphExec_t layered = step_graph(1, LogitsMode::Last, false, committed);
    const std::vector<double> ms = time_graphs(stream_, {mk, layered});
    const bool wins = !(ms[1] < ms[0] * (1.0 - kHandOverMinGain));
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.4f vs %.4f ms -> %s\n", ms[0], ms[1], wins ? "megakernel" : "layered");
    tuning_log_ += head + buf;
    return wins;
  } catch (const CudaError& e) {
    tuning_log_ += head + "failed, layered: " + e.what() + "\n";
    return false;
  }
}

/// The decode megakernel's shape and plan (CudaModelOptions::megakernel);
/// throws InvalidArgument for a shape it cannot run.
void CudaModelImpl::plan_megakernel() {
  MegaShape ms;
  ms.hidden = cfg_.hidden_size;
  ms.intermediate = cfg_.intermediate_size;
  ms.num_heads = cfg_.num_heads;
  ms.num_kv_heads = cfg_.num_kv_heads;
  ms.head_dim = cfg_.head_dim;
  ms.vocab = cfg_.vocab_size;
  ms.vocab_rows = (cfg_.vocab_size + 15) / 16 * 16;
  ms.num_layers = cfg_.num_layers;
  ms.slots = opt_.max_context + opt_.max_tree;
  ms.max_context = opt_.max_context;
  ms.neox = cfg_.rope_style == RopeStyle::NeoX ? 1 : 0;
  ms.eps = cfg_.rms_norm_eps;
  SS_CUDA_CHECK(cudaDeviceGetAttribute(&mk_max_smem_, cudaDevAttrMaxSharedMemoryPerBlockOptin, copt_.device));
  mk_shape_ = ms;
  mk_plan_ = plan_decode_megakernel(ms, num_sms_, mk_max_smem_, megakernel_tuning(copt_.megakernel_slot_bytes));
}

/// CudaModelOptions' megakernel knobs, with ring slots of `slot_bytes`.
MegaTuning CudaModelImpl::megakernel_tuning(int slot_bytes) const {
  MegaTuning tune;
  tune.head_keys = copt_.megakernel_head_keys;
  tune.head_parts = copt_.megakernel_head_parts;
  tune.max_inflight = copt_.megakernel_max_inflight;
  tune.release_hold = copt_.megakernel_release_hold;
  tune.hold_until_input = copt_.megakernel_hold_until_input;
  tune.attn_short = copt_.megakernel_attn_short;
  tune.attn_prewait = copt_.megakernel_attn_prewait;
  tune.merge_in_o = copt_.megakernel_merge_in_o;
  tune.l2_prefetch_bytes = copt_.megakernel_l2_prefetch_bytes;
  tune.slot_bytes = slot_bytes;
  return tune;
}

/// Chooses the megakernel's ring slot size by timing (autotune, unless
/// CudaModelOptions::megakernel_slot_bytes fixes it) on the step whose
/// descriptor is uploaded: the default plan and each slot option that fits
/// (a slot holds whole rows, the ring at least two), as step_tuner.h
/// chooses a layered step's settings. The slot size changes only how rows
/// are grouped into copies, never a row's arithmetic, so every candidate
/// gives the same bits (autotune_verify checks it). Leaves the winner as
/// the step's graph and plan; a failed candidate keeps the default plan.
void CudaModelImpl::tune_megakernel(LogitsMode mode, bool write_logits) {
  std::vector<MegaPlan> plans{mk_plan_};
  std::vector<std::string> names{"default"};
  for (int sb : kMegakernelSlotOptions) {
    if (sb <= mk_plan_.slot_bytes) continue;
    try {
      plans.push_back(plan_decode_megakernel(mk_shape_, num_sms_, mk_max_smem_, megakernel_tuning(sb)));
      names.push_back(std::to_string(sb));
    } catch (const InvalidArgument&) {
      // a slot shorter than a weight row, or a ring of fewer than two slots: not a candidate
    }
  }
  if (plans.size() < 2) return;
  const MegaPlan keep = mk_plan_;
  const int key = megakernel_graph_key(mode, write_logits);
  try {
    for (const MegaPlan& pl : plans) configure_decode_megakernel(pl);  // outside any capture
    cudaGraphExec_t best = nullptr;
    const StepTuning t = tune_step(
        stream_, {TunerKnob{"mk.slot_bytes", names}}, {},
        [&](const StepSetting& s) {
          mk_plan_ = plans[s[0]];
          return capture_graph(stream_, [&](cudaStream_t st) { record_megakernel_step(st, mode, write_logits); });
        },
        &best, 5, 0.01, tuner_outputs(1));
    mk_plan_ = plans[t.chosen[0]];
    graphs_.put(key, best);
    tuning_log_ += "megakernel: " + t.summary() + "\n";
  } catch (const CudaError& e) {
    mk_plan_ = keep;
    tuning_log_ += std::string("megakernel: tuning failed, default kept: ") + e.what() + "\n";
  }
}

/// The decode megakernel's kernel attribute and scratch buffers (after plan_megakernel()).
void CudaModelImpl::setup_megakernel() {
  configure_decode_megakernel(mk_plan_);
  mk_layers_.allocate(sizeof(MegaLayer) * cfg_.num_layers);
  const size_t parts = static_cast<size_t>(cfg_.num_heads) * mk_plan_.max_splits;
  mk_part_o_.allocate(sizeof(float) * parts * cfg_.head_dim);
  mk_part_ml_.allocate(sizeof(float2) * parts);
  mk_sync_.allocate(sizeof(unsigned) * decode_megakernel_sync_words(mk_shape_));
  SS_CUDA_CHECK(cudaMemsetAsync(mk_sync_.get(), 0, mk_sync_.bytes(), stream_));
  if (copt_.megakernel_trace) {
    mk_trace_.allocate(sizeof(unsigned long long) * mega_trace_words(cfg_.num_layers, mk_plan_.ctas));
    SS_CUDA_CHECK(cudaMemsetAsync(mk_trace_.get(), 0, mk_trace_.bytes(), stream_));
  }
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  mk_ = true;
}

/// The megakernel's table of layer pointers: after loading, since loading
/// may replace buffers (the q/k/v bias).
void CudaModelImpl::upload_megakernel_layers() {
  if (!mk_) return;
  const size_t kv_layer = static_cast<size_t>(cfg_.num_kv_heads) * slots_ * cfg_.head_dim;
  std::vector<MegaLayer> table(cfg_.num_layers);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const Layer& L = layers_[l];
    table[l].qkv = L.qkv.as<__nv_bfloat16>();
    table[l].qkv_bias = L.qkv_bias ? L.qkv_bias.as<float>() : nullptr;
    table[l].o = L.o.as<__nv_bfloat16>();
    table[l].gu = L.gu.as<__nv_bfloat16>();
    table[l].down = L.down.as<__nv_bfloat16>();
    table[l].kcache = kcache_.as<__nv_bfloat16>() + kv_layer * l;
    table[l].vcache = vcache_.as<__nv_bfloat16>() + kv_layer * l;
  }
  SS_CUDA_CHECK(cudaMemcpyAsync(mk_layers_.get(), table.data(), mk_layers_.bytes(), cudaMemcpyHostToDevice, stream_));
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

/// One single-token step as the decode megakernel (its own graph per
/// logits mode). Always a cooperative launch: its CTAs wait on each other, so
/// they must all be resident (a plain launch could deadlock beside another
/// megakernel on the same SMs); there is deliberately no fallback.
void CudaModelImpl::run_megakernel_step(LogitsMode mode, bool write_logits) {
  const int key = megakernel_graph_key(mode, write_logits);
  auto rec = [&](cudaStream_t s) { record_megakernel_step(s, mode, write_logits); };
  if (!copt_.use_graphs)
    rec(stream_);
  else
    graphs_.launch(key, stream_, rec);
}

void CudaModelImpl::record_megakernel_step(cudaStream_t s, LogitsMode mode, bool write_logits) {
  MegaParams p;
  p.s = mk_shape_;
  p.plan = mk_plan_;
  p.layers = mk_layers_.as<MegaLayer>();
  p.embed = embed_.as<__nv_bfloat16>();
  p.lm = lm_.as<__nv_bfloat16>();
  p.inv_freq = inv_freq_.as<float>();
  p.rope_scale = rope_attention_scale(cfg_);
  p.desc = desc_.as<StepDesc>();
  p.h32 = h32_.as<float>();
  p.q = q_.as<__nv_bfloat16>();
  p.attn = attn_.as<__nv_bfloat16>();
  p.act = act_.as<__nv_bfloat16>();
  p.part_o = mk_part_o_.as<float>();
  p.part_ml = mk_part_ml_.as<float2>();
  p.logits = write_logits ? logits_.as<float>() : nullptr;
  p.keys = keys_.as<unsigned long long>();
  p.sync = mk_sync_.as<unsigned>();
  p.lm_head = mode == LogitsMode::None ? 0 : 1;
  p.trace = mk_trace_ ? mk_trace_.as<unsigned long long>() : nullptr;
  launch_decode_megakernel(p, s);
}

}  // namespace swiftspec::cuda
