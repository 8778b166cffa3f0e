// The CUDA model's layered step: one step's kernels recorded into a CUDA graph per token
// bucket and context band, the GEMM plans they launch with, and the tuning of each bucket's
// launch settings per context band (context_bands.h).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_model_impl.h"
#include "kernels/epilogues.h"
#include "row_parallel.h"
#include "step_tuner.h"
#include "swiftspec/rope.h"
#include "tma_map.h"

namespace swiftspec::cuda {

/// AttnParams' scratch arrays in attn_part_o_ / attn_part_ml_ / attn_counters_.
void CudaModelImpl::set_attention_scratch(AttnParams& p) const {
  float* o = attn_part_o_.as<float>();
  float2* ml = attn_part_ml_.as<float2>();
  const size_t hd = static_cast<size_t>(cfg_.head_dim);
  size_t at = 0;
  for (auto [arr, n] :
       {std::pair{&p.split, attn_sizes_.split_entries}, std::pair{&p.super, attn_sizes_.super_entries},
        std::pair{&p.boundary, attn_sizes_.boundary_entries}, std::pair{&p.tail, attn_sizes_.tail_entries}}) {
    arr->o = o + at * hd;
    arr->ml = ml + at;
    at += n;
  }
  p.super_counters = attn_counters_.as<int>();
  p.split_capacity = attn_sizes_.split_capacity;
  p.max_supers = attn_sizes_.max_supers;
  p.tail_tiles = attn_sizes_.tail_tiles;
}

const int* CudaModelImpl::desc_field(size_t offset) const {
  return reinterpret_cast<const int*>(desc_.as<unsigned char>() + offset);
}

const CUtensorMap& CudaModelImpl::tmap(const void* base, int rows, int cols, int box_rows) {
  const auto k = std::make_tuple(base, rows, cols, box_rows);
  auto it = maps_.find(k);
  if (it != maps_.end()) return it->second;
  return maps_.emplace(k, make_tma_map_bf16(base, rows, cols, cols, box_rows)).first->second;
}

template <class Epi>
const GemmConfig& CudaModelImpl::plan(int kind, int N, int K, int nt) {
  const int k = kind * 16 + nt;
  auto it = plans_.find(k);
  if (it != plans_.end()) return it->second;
  GemmPlanHint hint;
  hint.engine = copt_.gemm_engine;  // per model, the same for every bucket (batch invariance)
  return plans_.emplace(k, plan_gemm<Epi>(N, K, nt, num_sms_, hint)).first->second;
}

/// The plans a GEMM may run with in bucket `nt`: [0] the planner's, then
/// the distinct ones with the other row-block size (warpgroups) and
/// pipeline depths 3 / 4. The K slices, and so every output's reduction
/// order, are the same in all of them (gemm_slices).
template <class Epi>
const std::vector<GemmConfig>& CudaModelImpl::plan_variants(int kind, int N, int K, int nt) {
  const int k = kind * 16 + nt;
  auto it = plan_variants_.find(k);
  if (it != plan_variants_.end()) return it->second;
  std::vector<GemmConfig> v{plan<Epi>(kind, N, K, nt)};
  if (v[0].engine == GemmEngine::Wgmma) {
    for (int wg : {1, 2})
      for (int stages : {3, 4}) {
        GemmPlanHint hint;
        hint.engine = copt_.gemm_engine;
        hint.wg = wg;
        hint.stages = stages;
        GemmConfig c;
        try {
          c = plan_gemm<Epi>(N, K, nt, num_sms_, hint);
        } catch (const InvalidArgument&) {
          continue;  // does not fit this shape
        }
        const bool seen = std::any_of(v.begin(), v.end(), [&](const GemmConfig& o) {
          return o.WR == c.WR && o.BR == c.BR && o.stages == c.stages && o.xres == c.xres && o.palias == c.palias &&
                 o.grid_x == c.grid_x && o.S == c.S;
        });
        if (!seen && c.S == v[0].S) v.push_back(c);
      }
  }
  return plan_variants_.emplace(k, std::move(v)).first->second;
}

std::vector<std::string> CudaModelImpl::variant_names(const std::vector<GemmConfig>& v) {
  std::vector<std::string> names;
  for (const GemmConfig& c : v)
    names.push_back("br" + std::to_string(c.BR) + "st" + std::to_string(c.stages) + (c.palias ? "pa" : ""));
  return names;
}

/// Launches GEMM `kind` with plan variant `variant` of its bucket (0: the planner's).
template <class Epi>
void CudaModelImpl::gemm(int kind, const void* w, int N, int K, const void* x, int nt, const GemmArgs& args,
                         const typename Epi::Params& ep, bool pdl, int variant, cudaStream_t s) {
  const GemmConfig& c = variant == 0 ? plan<Epi>(kind, N, K, nt) : plan_variants<Epi>(kind, N, K, nt).at(variant);
  launch_gemm<Epi>(c, tmap(w, N, K, c.BR), tmap(x, kRows, K, 8 * nt), args, ep, pdl, s);
}

/// The plans an int4 GEMM may run with in bucket `nt` (planned once per bucket): [0]
/// plan_gemm_int4's, then the distinct ones with the other warps per CTA (row-block sizes).
/// The K slices are gemm_int4_slices' (the shape only) in all of them, so every output's
/// reduction order is the same: the step tuner may pick any.
template <class Epi>
const std::vector<Int4GemmConfig>& CudaModelImpl::plan4_variants(int kind, int N, int K, int nt) {
  const int k = kind * 16 + nt;
  auto it = plans4_.find(k);
  if (it != plans4_.end()) return it->second;
  const int G = copt_.int4_group_size;
  std::vector<Int4GemmConfig> v{plan_gemm_int4<Epi>(N, K, G, nt, num_sms_)};
  for (int warps : {2, 4, 8}) {
    Int4PlanHint hint;
    hint.warps = warps;
    const Int4GemmConfig c = plan_gemm_int4<Epi>(N, K, G, nt, num_sms_, hint);
    const bool seen = std::any_of(v.begin(), v.end(), [&](const Int4GemmConfig& o) { return o.WR == c.WR; });
    if (!seen && c.S == v[0].S) v.push_back(c);
  }
  return plans4_.emplace(k, std::move(v)).first->second;
}

std::vector<std::string> CudaModelImpl::variant_names(const std::vector<Int4GemmConfig>& v) {
  std::vector<std::string> names;
  for (const Int4GemmConfig& c : v) names.push_back("br" + std::to_string(c.BR) + "st" + std::to_string(c.stages));
  return names;
}

/// Launches the int4 GEMM `kind` over `w` with plan variant `variant` of its bucket.
template <class Epi>
void CudaModelImpl::gemm4(int kind, const Int4Matrix& w, const void* x, int nt, const GemmArgs& args,
                          const typename Epi::Params& ep, bool pdl, int variant, cudaStream_t s) {
  const Int4GemmConfig& c = plan4_variants<Epi>(kind, w.N, w.K, nt).at(variant);
  launch_gemm_int4<Epi>(c, w.view(), tmap(x, kRows, w.K, 8 * nt), args, ep, pdl, s);
}

/// Records one layered step with the launch settings `choice` (PDL edges,
/// GEMM plan variants; no PDL at all when it is off for the model).
void CudaModelImpl::record_step(cudaStream_t s, int nt, LogitsMode mode, bool write_logits, const StepChoice& choice) {
  auto pdl = [&](StepKernel k) { return pdl_ && choice.pdl(k); };
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
  const int rows = 8 * nt;
  const StepDesc* desc = desc_.as<StepDesc>();
  const int* n_ptr = desc_field(offsetof(StepDesc, n));
  const size_t kv_layer = static_cast<size_t>(cfg_.num_kv_heads) * slots_ * hd;

  // int4 models: the first QKV GEMM's norm weight on its activations (EpiResidualNormed's rule)
  const float* gamma0 = int4_ && !layers_.empty() ? layers_[0].norm_in.as<float>() : nullptr;
  launch_embedding(embed_.as<__nv_bfloat16>(), H, desc, rows, h32_.as<float>(), h16_.as<__nv_bfloat16>(),
                   ssq_.as<float>(), keys_.as<unsigned long long>(), s, gamma0);

  GemmArgs norm_args;
  norm_args.K = H;
  norm_args.m_active_ptr = n_ptr;
  norm_args.m_active_max = rows;
  norm_args.ssq = ssq_.as<float>();
  norm_args.ssq_stride = H / 16;
  norm_args.hidden = H;
  norm_args.eps = cfg_.rms_norm_eps;

  for (int l = 0; l < cfg_.num_layers; ++l) {
    Layer& L = layers_[l];
    __nv_bfloat16* kc = kcache_.as<__nv_bfloat16>() + kv_layer * l;
    __nv_bfloat16* vc = vcache_.as<__nv_bfloat16>() + kv_layer * l;
    {
      GemmArgs a = norm_args;
      a.N = nq + 2 * nkv;
      EpiQKV::Params e;
      e.bias = L.qkv_bias ? L.qkv_bias.as<float>() : nullptr;
      e.q = q_.as<__nv_bfloat16>();
      e.kcache = kc;
      e.vcache = vc;
      e.desc = desc;
      e.inv_freq = inv_freq_.as<float>();
      e.rope_scale = rope_attention_scale(cfg_);
      e.num_heads = cfg_.num_heads;
      e.num_kv_heads = cfg_.num_kv_heads;
      e.head_dim = hd;
      e.slots = slots_;
      e.neox = cfg_.rope_style == RopeStyle::NeoX ? 1 : 0;
      if (int4_)
        gemm4<EpiQKV>(kStepQkv, L.qkv4, h16_.get(), nt, a, e, pdl(kStepQkv), choice.plan[kStepQkv], s);
      else
        gemm<EpiQKV>(kStepQkv, L.qkv.get(), a.N, H, h16_.get(), nt, a, e, pdl(kStepQkv), choice.plan[kStepQkv], s);
    }
    {
      AttnParams p;
      p.q = q_.as<__nv_bfloat16>();
      p.kcache = kc;
      p.vcache = vc;
      p.out = attn_.as<__nv_bfloat16>();
      p.desc = desc;
      set_attention_scratch(p);
      p.num_heads = cfg_.num_heads;
      p.num_kv_heads = cfg_.num_kv_heads;
      p.head_dim = hd;
      p.group = cfg_.num_heads / cfg_.num_kv_heads;
      p.slots = slots_;
      p.max_context = opt_.max_context;
      p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      p.max_tokens = std::min(rows, kMaxStepTokens);
      p.max_rows = choice.attention_rows();
      launch_attention(p, attn_ctas_, pdl(kStepAttention), pdl_, s);
    }
    EpiResidual::Params res;
    res.h32 = h32_.as<float>();
    res.h16 = h16_.as<__nv_bfloat16>();
    res.ssq = ssq_.as<float>();
    res.hidden = H;
    // int4 models: h16 carries the weight of the norm that reads it next (EpiResidualNormed):
    // after O the post-attention norm, after down the next layer's input norm (none after the
    // last layer: the LM head's final norm is folded into its bf16 weights).
    EpiResidual::Params res_o = res, res_down = res;
    if (int4_) {
      res_o.gamma = L.norm_post.as<float>();
      res_down.gamma = l + 1 < cfg_.num_layers ? layers_[l + 1].norm_in.as<float>() : nullptr;
    }
    {
      GemmArgs a;
      a.N = H;
      a.K = nq;
      a.m_active_ptr = n_ptr;
      a.m_active_max = rows;
      if (int4_)
        gemm4<EpiResidualNormed>(kStepOProj, L.o4, attn_.get(), nt, a, res_o, pdl(kStepOProj), choice.plan[kStepOProj],
                                 s);
      else if (copt_.row_parallel)
        copt_.row_parallel->residual_gemm(RowParallel::kAttnOut, L.o.get(), attn_.get(), nt, a, res, pdl(kStepOProj),
                                          s);
      else
        gemm<EpiResidual>(kStepOProj, L.o.get(), H, nq, attn_.get(), nt, a, res, pdl(kStepOProj),
                          choice.plan[kStepOProj], s);
    }
    {
      GemmArgs a = norm_args;
      a.N = 2 * I;
      EpiSwiGLU::Params e;
      e.act = act_.as<__nv_bfloat16>();
      e.intermediate = I;
      if (int4_)
        gemm4<EpiSwiGLU>(kStepGateUp, L.gu4, h16_.get(), nt, a, e, pdl(kStepGateUp), choice.plan[kStepGateUp], s);
      else
        gemm<EpiSwiGLU>(kStepGateUp, L.gu.get(), 2 * I, H, h16_.get(), nt, a, e, pdl(kStepGateUp),
                        choice.plan[kStepGateUp], s);
    }
    {
      GemmArgs a;
      a.N = H;
      a.K = I;
      a.m_active_ptr = n_ptr;
      a.m_active_max = rows;
      if (int4_)
        gemm4<EpiResidualNormed>(kStepDown, L.down4, act_.get(), nt, a, res_down, pdl(kStepDown),
                                 choice.plan[kStepDown], s);
      else if (copt_.row_parallel)
        copt_.row_parallel->residual_gemm(RowParallel::kMlpDown, L.down.get(), act_.get(), nt, a, res, pdl(kStepDown),
                                          s);
      else
        gemm<EpiResidual>(kStepDown, L.down.get(), H, I, act_.get(), nt, a, res, pdl(kStepDown), choice.plan[kStepDown],
                          s);
    }
  }
  if (mode == LogitsMode::None) return;
  GemmArgs a = norm_args;
  a.N = vocab_rows_;
  EpiLMHead::Params e;
  e.logits = write_logits ? logits_.as<float>() : nullptr;
  e.vocab = cfg_.vocab_size;
  e.keys = keys_.as<unsigned long long>();
  if (mode == LogitsMode::Last) {
    a.m_active_ptr = nullptr;
    a.m_active_max = 1;
    a.x_row0_ptr = desc_field(offsetof(StepDesc, last_row));
    gemm<EpiLMHead>(kStepLmHead, lm_.get(), vocab_rows_, H, h16_.get(), 1, a, e, pdl(kStepLmHead), 0, s);
  } else {
    gemm<EpiLMHead>(kStepLmHead, lm_.get(), vocab_rows_, H, h16_.get(), nt, a, e, pdl(kStepLmHead),
                    choice.plan[kStepLmHead], s);
  }
}

/// Runs a layered step of bucket `nt` over `committed` committed keys, with the graph and
/// launch settings of its context band (step_graph()).
void CudaModelImpl::run_step(int nt, LogitsMode mode, bool write_logits, int committed) {
  if (!copt_.use_graphs) {
    record_step(stream_, nt, mode, write_logits, StepChoice{});
    return;
  }
  try {
    // A bucket no synthetic step covered when the model was made (its steps do not fit the
    // context there) is tuned on its first step, in the first band only.
    if (needs_tuning(0, nt)) tune_bucket_or_keep(0, nt, mode, write_logits);
    SS_CUDA_CHECK(cudaGraphLaunch(step_graph(nt, mode, write_logits, committed), stream_));
  } catch (const CudaError&) {
    if (!pdl_) throw;
    // Some drivers refuse programmatic edges in captured graphs: fall back
    // (and keep the planner's plans: tuned choices were timed with PDL).
    pdl_ = false;
    graphs_.clear();
    tuned_.clear();
    SS_CUDA_CHECK(cudaGraphLaunch(step_graph(nt, mode, write_logits, committed), stream_));
  }
}

/// The band whose settings and graphs a step of bucket `nt` in context band `band` runs
/// with: the nearest band at or below it tuned for the bucket (0 when none is, e.g.
/// without autotune: then every context shares one graph per step kind).
int CudaModelImpl::tuned_band(int band, int nt) const {
  for (int b = band; b > 0; --b)
    if (tuned_.count({b, nt})) return b;
  return 0;
}

/// Band `band`'s tuned settings of bucket `nt`; the default setting where it has none.
StepChoice CudaModelImpl::tuned_choice(int band, int nt) const {
  const auto it = tuned_.find({band, nt});
  return it == tuned_.end() ? StepChoice{} : it->second;
}

/// The graph of a layered step of bucket `nt` over `committed` committed keys (a tree
/// step's ancestors in the tree do not count), captured on first use with the settings of
/// its band (tuned_band()).
cudaGraphExec_t CudaModelImpl::step_graph(int nt, LogitsMode mode, bool write_logits, int committed) {
  const int band = tuned_band(context_band(committed), nt);
  const StepChoice choice = tuned_choice(band, nt);
  return graphs_.ensure(step_graph_key(band, nt, mode, write_logits), stream_,
                        [&](cudaStream_t s) { record_step(s, nt, mode, write_logits, choice); });
}

bool CudaModelImpl::needs_tuning(int band, int nt) const {
  return pdl_ && copt_.autotune && !copt_.row_parallel && !tuned_.count({band, nt});
}

namespace {

/// The head of a tuning line (debug_step_tuning): "band=16384 nt=1: ".
std::string tuning_line_head(int band, int nt) {
  return "band=" + std::to_string(kBandLengths[band]) + " nt=" + std::to_string(nt) + ": ";
}

}  // namespace

/// tune_bucket(), whose failure (a candidate's capture refused, out of memory) leaves the
/// first band at the default setting and a further band untuned (its steps then take the
/// nearest lower band's settings); a driver that refuses PDL altogether fails the default
/// capture in run_step, which falls back there.
void CudaModelImpl::tune_bucket_or_keep(int band, int nt, LogitsMode mode, bool write_logits) {
  try {
    tune_bucket(band, nt, mode, write_logits);
  } catch (const CudaError& e) {
    if (band == 0) tuned_[{0, nt}] = StepChoice{};
    tuning_log_ += tuning_line_head(band, nt) + "tuning failed, " +
                   (band == 0 ? "default kept: " : "a lower band's setting kept: ") + e.what() + "\n";
  }
}

/// Chooses bucket `nt`'s launch settings in context band `band` by timing the current
/// step's graph under each candidate setting (step_tuner.h); the step's descriptor is
/// already uploaded and replaying it is idempotent. Leaves the winner as the band's graph
/// of the step.
void CudaModelImpl::tune_bucket(int band, int nt, LogitsMode mode, bool write_logits) {
  cudaGraphExec_t best = nullptr;
  const StepTuning t =
      band == 0 ? tune_first_band(nt, mode, write_logits, &best) : tune_further_band(nt, mode, write_logits, &best);
  graphs_.put(step_graph_key(band, nt, mode, write_logits), best);  // owned by the cache from here on
  tuned_[{band, nt}] = band == 0 ? step_choice_of(t.chosen) : step_choice_in_band(tuned_choice(0, nt), t.chosen);
  tuning_log_ += tuning_line_head(band, nt) + t.summary() + "\n";
}

/// The first band: every knob, the PDL edges and the GEMMs' plan variants. The LM head's
/// plan is tuned only in steps with every row's logits (a Last-logits step runs it at one
/// row, the decode bucket's plan).
StepTuning CudaModelImpl::tune_first_band(int nt, LogitsMode mode, bool write_logits, cudaGraphExec_t* best) {
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int nq = cfg_.num_heads * cfg_.head_dim, nkv = cfg_.num_kv_heads * cfg_.head_dim;
  std::vector<std::string> options[kStepKernels];
  if (int4_) {
    options[kStepQkv] = variant_names(plan4_variants<EpiQKV>(kStepQkv, nq + 2 * nkv, H, nt));
    options[kStepOProj] = variant_names(plan4_variants<EpiResidualNormed>(kStepOProj, H, nq, nt));
    options[kStepGateUp] = variant_names(plan4_variants<EpiSwiGLU>(kStepGateUp, 2 * I, H, nt));
    options[kStepDown] = variant_names(plan4_variants<EpiResidualNormed>(kStepDown, H, I, nt));
  } else {
    options[kStepQkv] = variant_names(plan_variants<EpiQKV>(kStepQkv, nq + 2 * nkv, H, nt));
    options[kStepOProj] = variant_names(plan_variants<EpiResidual>(kStepOProj, H, nq, nt));
    options[kStepGateUp] = variant_names(plan_variants<EpiSwiGLU>(kStepGateUp, 2 * I, H, nt));
    options[kStepDown] = variant_names(plan_variants<EpiResidual>(kStepDown, H, I, nt));
  }
  if (mode == LogitsMode::All)
    options[kStepLmHead] = variant_names(plan_variants<EpiLMHead>(kStepLmHead, vocab_rows_, H, nt));
  return tune_step(
      stream_, step_knobs(options, nt), {step_setting_all_pdl_off()},
      [&](const StepSetting& setting) {
        const StepChoice c = step_choice_of(setting);
        return capture_graph(stream_, [&](cudaStream_t s) { record_step(s, nt, mode, write_logits, c); });
      },
      best, 5, 0.01, tuner_outputs(8 * nt));
}

/// A band past the first: the PDL edges and the attention's rows per main item, each GEMM at
/// the first band's plan (its speed relative to the other plans does not depend on the
/// context). Candidates: every edge on, every edge off, the first band's setting (where
/// that is none of the others), each edge off alone, 128 rows alone (buckets past 1), and
/// the combination of the options that paid alone (tune_step).
StepTuning CudaModelImpl::tune_further_band(int nt, LogitsMode mode, bool write_logits, cudaGraphExec_t* best) {
  const StepChoice first = tuned_choice(0, nt);
  const StepSetting first_band = step_band_setting(first);
  std::vector<StepSetting> extra{step_setting_all_pdl_off(kBandKnobs)};
  // The first band's setting, unless a candidate already: no edge or one edge off at the default rows.
  const int edges_off = static_cast<int>(std::count(first_band.begin(), first_band.begin() + kStepKernels, 1));
  if ((edges_off >= 2 || first.attn_rows != 0) && first_band != extra[0]) extra.push_back(first_band);
  return tune_step(
      stream_, step_band_knobs(nt), extra,
      [&](const StepSetting& setting) {
        const StepChoice c = step_choice_in_band(first, setting);
        return capture_graph(stream_, [&](cudaStream_t s) { record_step(s, nt, mode, write_logits, c); });
      },
      best, 5, 0.01, tuner_outputs(8 * nt));
}

/// What the tuners compare bitwise with autotune_verify (tune_step's
/// `outputs`): the arg-max keys of a step's first `rows` rows and their
/// residual stream after the last layer; without autotune_verify, nothing.
std::function<std::vector<uint8_t>()> CudaModelImpl::tuner_outputs(int rows) {
  if (!copt_.autotune_verify) return {};
  return [this, rows] {
    const size_t kb = sizeof(unsigned long long) * rows, hb = sizeof(float) * rows * cfg_.hidden_size;
    std::vector<uint8_t> out(kb + hb);
    SS_CUDA_CHECK(cudaMemcpy(out.data(), keys_.get(), kb, cudaMemcpyDeviceToHost));
    SS_CUDA_CHECK(cudaMemcpy(out.data() + kb, h32_.get(), hb, cudaMemcpyDeviceToHost));
    return out;
  };
}

namespace {

/// A synthetic step of `n` tokens after `committed` keys: a tree (forks along chains, as
/// drafts grow; slots 0..n-1) or an append.
ForwardBatch synthetic_batch(int n, int committed, bool tree) {
  ForwardBatch b;
  b.logits = LogitsMode::All;
  std::vector<int> depth(n, 0), parent(n, -1);
  for (int i = 0; i < n; ++i) {
    b.tokens.push_back(0);
    if (!tree) {
      b.positions.push_back(committed + i);
      continue;
    }
    parent[i] = i == 0 ? -1 : (i % 4 == 0 ? i / 2 : i - 1);
    depth[i] = i == 0 ? 0 : depth[parent[i]] + 1;
    b.positions.push_back(committed + depth[i]);
    b.tree_slots.push_back(i);
  }
  if (tree) {
    b.attend_offsets.push_back(0);
    for (int i = 0; i < n; ++i) {
      std::vector<int> chain;
      for (int j = i; j >= 0; j = parent[j]) chain.push_back(j);
      b.attend_slots.insert(b.attend_slots.end(), chain.rbegin(), chain.rend());
      b.attend_offsets.push_back(static_cast<int>(b.attend_slots.size()));
    }
  }
  return b;
}

}  // namespace

/// Tokens of the synthetic step that tunes bucket `nt` in `band`: for bucket 1 a
/// single-token decode, but a tree of 8 in the first band of a model with the megakernel
/// (which takes the decode steps there; further bands it may hand over:
/// measure_megakernel_hand_over); trees of 16 / 32 / 64 nodes for the others, or prefill
/// pieces where max_tree is smaller.
int CudaModelImpl::synthetic_tokens(int band, int nt) const {
  if (nt > 1) return 8 * nt;
  return mk_ && band == 0 ? 8 : 1;
}

/// Tunes bucket `nt` in context band `band` on a synthetic step at the band's
/// representative length (band_synthetic_committed: no more than max_context - n keys, so
/// a tree's deepest node stays inside the context); a band the model's context does not
/// reach is not tuned. Only the timing matters, not the values the KV cache holds; the
/// step writes tree slots or slots past the committed length and commits nothing.
void CudaModelImpl::tune_band_bucket(int band, int nt) {
  if (!needs_tuning(band, nt)) return;
  const int n = synthetic_tokens(band, nt);
  const int committed = band_synthetic_committed(band, n, opt_.max_context);
  if (committed < 0) return;
  committed_ = committed;
  upload_synthetic_step(synthetic_batch(n, committed, n > 1 && n <= opt_.max_tree));
  tune_bucket_or_keep(band, nt, LogitsMode::All, false);
  run_step(nt, LogitsMode::All, false, committed);  // a driver refusing PDL shows here (run_step's fallback)
}

/// Tunes every token bucket in every context band the model reaches now (autotune), so
/// that no request pays for it: tuned lazily, a bucket's first step paid for the tuning,
/// and in the real-pair benchmark the first requests of a configuration ran several times
/// slower (benchmarks/README.md, "the real pair with the step tuner ... tuning moved to
/// model load"). Then, with the megakernel, where it hands single-token steps over
/// (measure_megakernel_hand_over). The synthetic steps borrow committed_.
void CudaModelImpl::tune_all_buckets() {
  if (!copt_.use_graphs) return;
  ModelScope scope(copt_.device, green_.get());
  struct RestoreCommitted {  // the synthetic steps borrow committed_; give it back whatever happens
    int& ref;
    int saved;
    ~RestoreCommitted() { ref = saved; }
  } restore{committed_, committed_};
  if (mk_ && copt_.autotune && copt_.megakernel_slot_bytes == 0 && !copt_.row_parallel && opt_.max_context >= 2) {
    // The megakernel's ring: a greedy decode step (arg-max, no logits) after up to 512 keys.
    committed_ = std::min(kBandLengths[0], opt_.max_context - 1);
    ForwardBatch b;
    b.logits = LogitsMode::Last;
    b.tokens.push_back(0);
    b.positions.push_back(committed_);
    upload_synthetic_step(b);
    tune_megakernel(LogitsMode::Last, false);
  }
  for (int band = 0; band < kContextBands; ++band)  // ascending: a further band starts from the first's plans
    for (int nt : {1, 2, 4, 8}) tune_band_bucket(band, nt);
  if (measures_megakernel_hand_over()) measure_megakernel_hand_over();
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

/// The descriptor of tune_all_buckets' synthetic step `b` onto the device.
void CudaModelImpl::upload_synthetic_step(const ForwardBatch& b) {
  validate(b);
  auto d = std::make_unique<StepDesc>();  // ~17 KB: not on the stack
  const int na = fill_desc(*d, b, 0, static_cast<int>(b.tokens.size()));
  forget_logits_rows();  // the step rewrites logits_ / keys_
  upload_desc(*d, na);
}

}  // namespace swiftspec::cuda
