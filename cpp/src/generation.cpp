// Validation of generation requests.
#include "swiftspec/generation.h"

#include <string>

#include "swiftspec/error.h"

namespace swiftspec {

void GenerationConfig::validate() const {
  if (max_new_tokens <= 0)
    throw InvalidArgument("max_new_tokens must be > 0, got " + std::to_string(max_new_tokens));
  sampling.validate();
  if (prefill_chunk < 0)
    throw InvalidArgument("prefill_chunk must be >= 0 (0: the model's), got " + std::to_string(prefill_chunk));
  if (mode != DecodeMode::TargetOnly) {
    if (tree_budget < 1) throw InvalidArgument("tree_budget must be >= 1, got " + std::to_string(tree_budget));
    if (max_depth < 1) throw InvalidArgument("max_depth must be >= 1, got " + std::to_string(max_depth));
    if (branching < 1) throw InvalidArgument("branching must be >= 1, got " + std::to_string(branching));
  }
}

}  // namespace swiftspec
