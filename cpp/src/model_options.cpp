// ModelOptions resolved against a model's config (the KV capacity).
#include <algorithm>
#include <string>

#include "swiftspec/error.h"
#include "swiftspec/model.h"

namespace swiftspec {

ModelOptions resolve_max_context(const ModelOptions& options, const ModelConfig& config, const std::string& origin) {
  ModelOptions out = options;
  const int limit = config.max_position_embeddings;  // 0: config.json does not say
  if (out.max_context < 0)
    throw InvalidArgument("max_context must be >= 1 (0: the model's default), got " +
                          std::to_string(out.max_context));
  if (out.max_context == 0) {
    out.max_context = limit > 0 ? std::min(kDefaultMaxContext, limit) : kDefaultMaxContext;
  } else if (limit > 0 && out.max_context > limit) {
    throw InvalidArgument("max_context " + std::to_string(out.max_context) +
                          " exceeds the model's max_position_embeddings " + std::to_string(limit) + " (" + origin +
                          "): it was not trained for longer contexts; use at most " + std::to_string(limit));
  }
  return out;
}

}  // namespace swiftspec
