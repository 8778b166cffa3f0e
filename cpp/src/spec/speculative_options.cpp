// Speculative options: defaults, and validation of a speculative request.
#include <algorithm>
#include <cmath>
#include <string>

#include "swiftspec/error.h"
#include "swiftspec/speculative.h"

namespace swiftspec {

namespace {
std::string str(long long v) { return std::to_string(v); }
}  // namespace

TreeGrowth SpeculativeOptions::resolve_growth(const SamplingParams& sampling) const {
  switch (growth) {
    case Growth::TopK:
      return TreeGrowth::TopK;
    case Growth::Sampled:
      return TreeGrowth::Sampled;
    case Growth::Auto:
      break;
  }
  // Top-k for every request: under sampling it accepted more tokens per verification than sampled
  // growth on the real pair (docs/sampling_speculation.md, "Measured") and reads only the rows' heads.
  (void)sampling;
  return TreeGrowth::TopK;
}

int SpeculativeOptions::resolve_expand_width(const GenerationConfig& config) const {
  if (expand_width > 0) return expand_width;
  const long long per_round = static_cast<long long>(config.branching) * config.max_depth;
  if (per_round <= 0) return 1;
  return static_cast<int>(std::max(1LL, (config.tree_budget + per_round - 1) / per_round));
}

std::string tree_growth_name(TreeGrowth growth) { return growth == TreeGrowth::TopK ? "top_k" : "sampled"; }

void validate_speculative(const Model& target, const Model& draft, const std::vector<int32_t>& prompt,
                          const GenerationConfig& config, const SpeculativeOptions& options) {
  config.validate();
  if (config.tree_budget < 1) throw InvalidArgument("tree_budget must be >= 1, got " + str(config.tree_budget));
  if (config.max_depth < 1) throw InvalidArgument("max_depth must be >= 1, got " + str(config.max_depth));
  if (config.branching < 1) throw InvalidArgument("branching must be >= 1, got " + str(config.branching));
  if (options.expand_width < 0)
    throw InvalidArgument("expand_width must be >= 0 (0: automatic), got " + str(options.expand_width));
  if (std::isnan(options.min_expand_prob) || options.min_expand_prob > 1.0)
    throw InvalidArgument("min_expand_prob must be in [0, 1] (or negative: automatic), got " +
                          std::to_string(options.min_expand_prob));
  const int tv = target.config().vocab_size, dv = draft.config().vocab_size;
  if (tv != dv)
    throw InvalidArgument("the draft model's vocab_size " + str(dv) + " differs from the target's " + str(tv));
  // The target verifies root + tree_budget nodes; the draft also needs a slot
  // for a pending token next to the root.
  if (config.tree_budget + 1 > target.options().max_tree)
    throw InvalidArgument("tree_budget " + str(config.tree_budget) + " needs " + str(config.tree_budget + 1) +
                          " tree slots but the target has max_tree = " + str(target.options().max_tree));
  if (config.tree_budget + 2 > draft.options().max_tree)
    throw InvalidArgument("tree_budget " + str(config.tree_budget) + " needs " + str(config.tree_budget + 2) +
                          " tree slots but the draft has max_tree = " + str(draft.options().max_tree));
  if (prompt.empty()) throw InvalidArgument("prompt must not be empty");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= tv)
      throw InvalidArgument("prompt[" + str(i) + "] = " + str(prompt[i]) + " is outside [0, " + str(tv) + ")");
  for (const Model* m : {&target, &draft})
    check_request_fits_context(static_cast<int64_t>(prompt.size()), config.max_new_tokens, m->options().max_context,
                               m == &target ? "the target's" : "the draft's");
}

}  // namespace swiftspec
