// Constructors of ForwardBatch (model.h): the batches every backend takes.
//
// Their own library (swiftspec_forward_batch) because both the runtime and the
// CUDA kernel core's stand-alone benches build batches, and the kernel core does
// not link the runtime.
#include <string>
#include <vector>

#include "swiftspec/error.h"
#include "swiftspec/model.h"

namespace swiftspec {

ForwardBatch ForwardBatch::append(const std::vector<int32_t>& tokens, int start_position,
                                  LogitsMode mode) {
  ForwardBatch b;
  b.tokens = tokens;
  b.positions.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) b.positions[i] = start_position + static_cast<int>(i);
  b.logits = mode;
  return b;
}

ForwardBatch ForwardBatch::tree(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                                int start_position, LogitsMode mode) {
  if (tokens.size() != parents.size())
    throw InvalidArgument("ForwardBatch::tree: " + std::to_string(tokens.size()) + " tokens but " +
                          std::to_string(parents.size()) + " parents");
  const int n = static_cast<int>(tokens.size());
  ForwardBatch b;
  b.tokens = tokens;
  b.logits = mode;
  b.attend_offsets.push_back(0);
  std::vector<int> depth(n);
  std::vector<int32_t> chain;
  for (int i = 0; i < n; ++i) {
    const int parent = parents[i];
    if (parent < -1 || parent >= i)
      throw InvalidArgument("ForwardBatch::tree: node " + std::to_string(i) + " has parent " + std::to_string(parent) +
                            " (must be -1 or an earlier node)");
    depth[i] = parent < 0 ? 0 : depth[parent] + 1;
    b.positions.push_back(start_position + depth[i]);
    b.tree_slots.push_back(i);
    chain.clear();
    for (int j = i; j >= 0; j = parents[j]) chain.push_back(j);
    b.attend_slots.insert(b.attend_slots.end(), chain.rbegin(), chain.rend());
    b.attend_offsets.push_back(static_cast<int32_t>(b.attend_slots.size()));
  }
  return b;
}

}  // namespace swiftspec
