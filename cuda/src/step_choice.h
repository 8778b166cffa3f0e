// The launch settings of one layered step that the step tuner chooses
// (step_tuner.h, CudaModelOptions::autotune): per kernel kind, whether it is
// launched with a programmatic-dependent-launch edge, per GEMM which of its
// plan variants runs, and how many query rows the split-K attention puts in one
// main item. None of them changes the arithmetic. Chosen per token bucket and
// context band (context_bands.h): the first band's choice over every knob, the
// further bands' over the PDL edges and the attention's rows.
#pragma once
#include <string>
#include <vector>

#include "step_tuner.h"

namespace swiftspec::cuda {

/// Kernel kinds of a layered step (the embedding, the graph's first node, has
/// no incoming edge and no plan).
enum StepKernel : int { kStepQkv = 0, kStepAttention, kStepOProj, kStepGateUp, kStepDown, kStepLmHead, kStepKernels };

inline const char* step_kernel_name(int k) {
  static const char* const names[kStepKernels] = {"qkv", "attn", "o", "gate_up", "down", "lm_head"};
  return names[k];
}

/// Query rows of one main item of the split-K attention (AttnParams::max_rows) per option
/// of the "attn.rows" knob. More rows per item read a tree's shared prefix fewer times
/// (one read per row group) but give the grid fewer, longer items: which is faster depends
/// on the tree's size and the context (benchmarks/README.md, "step tuner per context band").
constexpr int kAttnRowOptions[] = {64, 128};

/// One step's settings: kinds launched without PDL, the plan variant per GEMM
/// kind (0: the planner's; the attention has a single plan) and the attention's
/// rows per main item (an index into kAttnRowOptions).
struct StepChoice {
  unsigned pdl_off = 0;
  int plan[kStepKernels] = {};
  int attn_rows = 0;
  bool pdl(StepKernel k) const { return !(pdl_off & (1u << k)); }
  int attention_rows() const { return kAttnRowOptions[attn_rows]; }
};

/// The attention's rows knob of token bucket `nt` ("attn.rows": 64, 128). A bucket-1 step
/// (at most 8 rows) fits one row group either way: nothing to choose there.
inline TunerKnob attn_rows_knob(int nt) {
  TunerKnob k{"attn.rows", {"64"}};
  if (nt > 1) k.options.push_back("128");
  return k;
}

/// The knobs of a context band past the first (context_bands.h) for bucket `nt`: the
/// kStepKernels PDL edges ("pdl.<kind>": on, off), then attn_rows_knob(). Each GEMM keeps
/// the first band's plan: the plans' relative speed does not depend on the context; the
/// attention's overlap with its neighbours, and its best row grouping, do.
inline std::vector<TunerKnob> step_band_knobs(int nt) {
  std::vector<TunerKnob> knobs;
  for (int k = 0; k < kStepKernels; ++k) knobs.push_back({std::string("pdl.") + step_kernel_name(k), {"on", "off"}});
  knobs.push_back(attn_rows_knob(nt));
  return knobs;
}

/// Knob layout of the first band: the kStepKernels PDL knobs, then one plan knob per kind
/// ("plan.<kind>": the names in `plan_options[kind]`, [0] the planner's; one entry or none:
/// nothing to choose), then attn_rows_knob(nt).
inline std::vector<TunerKnob> step_knobs(const std::vector<std::string> (&plan_options)[kStepKernels], int nt) {
  std::vector<TunerKnob> knobs = step_band_knobs(nt);
  knobs.pop_back();
  for (int k = 0; k < kStepKernels; ++k) {
    TunerKnob p{std::string("plan.") + step_kernel_name(k), plan_options[k]};
    if (p.options.empty()) p.options.push_back("default");
    knobs.push_back(p);
  }
  knobs.push_back(attn_rows_knob(nt));
  return knobs;
}

/// Sizes of the two knob layouts.
constexpr int kStepKnobs = 2 * kStepKernels + 1;  ///< step_knobs()
constexpr int kBandKnobs = kStepKernels + 1;      ///< step_band_knobs()

/// A setting of `knobs` entries (kStepKnobs or kBandKnobs) with every PDL edge off and the
/// rest at the default (a candidate of its own: the single-edge candidates do not cover it).
inline StepSetting step_setting_all_pdl_off(int knobs = kStepKnobs) {
  StepSetting s(knobs, 0);
  for (int k = 0; k < kStepKernels; ++k) s[k] = 1;
  return s;
}

/// The setting of step_band_knobs() with `c`'s PDL edges and attention rows.
inline StepSetting step_band_setting(const StepChoice& c) {
  StepSetting s(kBandKnobs, 0);
  for (int k = 0; k < kStepKernels; ++k) s[k] = c.pdl(static_cast<StepKernel>(k)) ? 0 : 1;
  s[kStepKernels] = c.attn_rows;
  return s;
}

/// The choice of a setting of step_knobs().
inline StepChoice step_choice_of(const StepSetting& s) {
  StepChoice c;
  for (int k = 0; k < kStepKernels && k < static_cast<int>(s.size()); ++k)
    if (s[k]) c.pdl_off |= 1u << k;
  for (int k = 0; k < kStepKernels && kStepKernels + k < static_cast<int>(s.size()); ++k)
    c.plan[k] = s[kStepKernels + k];
  if (static_cast<int>(s.size()) > 2 * kStepKernels) c.attn_rows = s[2 * kStepKernels];
  return c;
}

/// `base` (its GEMM plans) with the PDL edges and attention rows of `s`, a setting of
/// step_band_knobs().
inline StepChoice step_choice_in_band(const StepChoice& base, const StepSetting& s) {
  StepChoice c = base;
  c.pdl_off = 0;
  for (int k = 0; k < kStepKernels && k < static_cast<int>(s.size()); ++k)
    if (s[k]) c.pdl_off |= 1u << k;
  c.attn_rows = static_cast<int>(s.size()) > kStepKernels ? s[kStepKernels] : 0;
  return c;
}

}  // namespace swiftspec::cuda
