// The launch settings of one layered step that the step tuner chooses
// (step_tuner.h, CudaModelOptions::autotune): per kernel kind, whether it is
// launched with a programmatic-dependent-launch edge, and per GEMM which of
// its plan variants runs. None of them changes the arithmetic.
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

/// Knob layout: kStepKernels PDL knobs ("pdl.<kind>": on, off), then one plan
/// knob per kind ("plan.<kind>": the names in `plan_options[kind]`, [0] the
/// planner's; one entry or none: nothing to choose).
inline std::vector<TunerKnob> step_knobs(const std::vector<std::string> (&plan_options)[kStepKernels]) {
  std::vector<TunerKnob> knobs;
  for (int k = 0; k < kStepKernels; ++k) knobs.push_back({std::string("pdl.") + step_kernel_name(k), {"on", "off"}});
  for (int k = 0; k < kStepKernels; ++k) {
    TunerKnob p{std::string("plan.") + step_kernel_name(k), plan_options[k]};
    if (p.options.empty()) p.options.push_back("default");
    knobs.push_back(p);
  }
  return knobs;
}

/// The setting of step_knobs() with every PDL edge off (a candidate of its own:
/// the single-edge candidates do not cover it).
inline StepSetting step_setting_all_pdl_off() {
  StepSetting s(2 * kStepKernels, 0);
  for (int k = 0; k < kStepKernels; ++k) s[k] = 1;
  return s;
}

inline StepChoice step_choice_of(const StepSetting& s) {
  StepChoice c;
  for (int k = 0; k < kStepKernels && k < static_cast<int>(s.size()); ++k)
    if (s[k]) c.pdl_off |= 1u << k;
  for (int k = 0; k < kStepKernels && kStepKernels + k < static_cast<int>(s.size()); ++k)
    c.plan[k] = s[kStepKernels + k];
  return c;
}

}  // namespace swiftspec::cuda
