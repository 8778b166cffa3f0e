// Validation of generation requests.
#include "swiftspec/generation.h"

#include <string>

#include "swiftspec/error.h"

namespace swiftspec {

const char* decode_mode_name(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::TargetOnly:
      return "target";
    case DecodeMode::Serial:
      return "serial";
    case DecodeMode::Async:
      return "async";
    case DecodeMode::Auto:
      return "auto";
  }
  return "unknown";
}

DecodeMode parse_decode_mode(const std::string& name) {
  std::string known;
  for (DecodeMode m : kDecodeModes) {
    if (name == decode_mode_name(m)) return m;
    known += std::string(known.empty() ? "" : ", ") + "'" + decode_mode_name(m) + "'";
  }
  throw InvalidArgument("mode must be one of " + known + ", got '" + name + "'");
}

void GenerationConfig::validate() const {
  if (max_new_tokens <= 0) throw InvalidArgument("max_new_tokens must be > 0, got " + std::to_string(max_new_tokens));
  sampling.validate();
  if (prefill_chunk < 0)
    throw InvalidArgument("prefill_chunk must be >= 0 (0: the model's), got " + std::to_string(prefill_chunk));
  if (mode != DecodeMode::TargetOnly) {
    if (tree_budget < 1) throw InvalidArgument("tree_budget must be >= 1, got " + std::to_string(tree_budget));
    if (max_depth < 1) throw InvalidArgument("max_depth must be >= 1, got " + std::to_string(max_depth));
    if (branching < 1) throw InvalidArgument("branching must be >= 1, got " + std::to_string(branching));
  }
}

void check_request_fits_context(int64_t prompt_tokens, int64_t max_new_tokens, int context, const std::string& whose) {
  if (prompt_tokens + max_new_tokens <= context) return;
  const std::string p = std::to_string(prompt_tokens), c = std::to_string(context);
  const std::string ctx = "the context of " + c + " tokens (" + (whose.empty() ? "" : whose + " ") + "max_context)";
  if (prompt_tokens > context)
    throw InvalidArgument("the prompt of " + p + " tokens is longer than " + ctx +
                          ": shorten it, or load the models with a larger max_context");
  if (prompt_tokens == context)
    throw InvalidArgument("the prompt of " + p + " tokens fills " + ctx +
                          ", leaving no room for new tokens: shorten it, or load the models with a larger max_context");
  throw InvalidArgument("the prompt of " + p + " tokens plus max_new_tokens " + std::to_string(max_new_tokens) +
                        " exceeds " + ctx + ": lower max_new_tokens to at most " +
                        std::to_string(context - prompt_tokens) + ", or shorten the prompt");
}

}  // namespace swiftspec
