// The launch settings of one layered step that the step tuner chooses
// (step_tuner.h, CudaModelOptions::autotune): per kernel kind, whether it is
// launched with a programmatic-dependent-launch edge, and per GEMM which of
// its plan variants runs. None of them changes the arithmetic. Chosen per token
// bucket and context band (context_bands.h): the first band's choice over every
// knob, the further bands' over the PDL edges only.
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

/// One step's settings: kinds launched without PDL and the plan variant per GEMM
/// kind (0: the planner's; the attention has a single plan).
struct StepChoice {
  unsigned pdl_off = 0;
  int plan[kStepKernels] = {};
  bool pdl(StepKernel k) const { return !(pdl_off & (1u << k)); }
};

/// The knobs of a context band past the first (context_bands.h): the PDL edges only,
/// the first kStepKernels knobs of step_knobs(). Each GEMM keeps the first band's plan:
/// the plans' relative speed does not depend on the context, the attention's overlap with
/// its neighbours does.
inline std::vector<TunerKnob> step_pdl_knobs() {
  std::vector<TunerKnob> knobs;
  for (int k = 0; k < kStepKernels; ++k) knobs.push_back({std::string("pdl.") + step_kernel_name(k), {"on", "off"}});
  return knobs;
}

/// Knob layout: the kStepKernels PDL knobs of step_pdl_knobs() ("pdl.<kind>": on, off),
/// then one plan knob per kind ("plan.<kind>": the names in `plan_options[kind]`, [0] the
/// planner's; one entry or none: nothing to choose).
inline std::vector<TunerKnob> step_knobs(const std::vector<std::string> (&plan_options)[kStepKernels]) {
  std::vector<TunerKnob> knobs = step_pdl_knobs();
  for (int k = 0; k < kStepKernels; ++k) {
    TunerKnob p{std::string("plan.") + step_kernel_name(k), plan_options[k]};
    if (p.options.empty()) p.options.push_back("default");
    knobs.push_back(p);
  }
  return knobs;
}

/// The setting of step_knobs() (`knobs` 2 * kStepKernels) or step_pdl_knobs()
/// (kStepKernels) with every PDL edge off (a candidate of its own: the single-edge
/// candidates do not cover it).
inline StepSetting step_setting_all_pdl_off(int knobs = 2 * kStepKernels) {
  StepSetting s(knobs, 0);
  for (int k = 0; k < kStepKernels; ++k) s[k] = 1;
  return s;
}

/// The setting of step_pdl_knobs() with `c`'s PDL edges.
inline StepSetting step_pdl_setting(const StepChoice& c) {
  StepSetting s(kStepKernels, 0);
  for (int k = 0; k < kStepKernels; ++k) s[k] = c.pdl(static_cast<StepKernel>(k)) ? 0 : 1;
  return s;
}

/// The choice of a setting of step_knobs() (or of its first knobs: the others at their default).
inline StepChoice step_choice_of(const StepSetting& s) {
  StepChoice c;
  for (int k = 0; k < kStepKernels && k < static_cast<int>(s.size()); ++k)
    if (s[k]) c.pdl_off |= 1u << k;
  for (int k = 0; k < kStepKernels && kStepKernels + k < static_cast<int>(s.size()); ++k)
    c.plan[k] = s[kStepKernels + k];
  return c;
}

/// `base` (its GEMM plans) with the PDL edges of `s`, a setting of step_pdl_knobs().
inline StepChoice step_choice_with_pdl(const StepChoice& base, const StepSetting& s) {
  StepChoice c = base;
  c.pdl_off = step_choice_of(s).pdl_off;
  return c;
}

}  // namespace swiftspec::cuda
