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

ForwardBatch ForwardBatch::append(const std::vector<int32_t>& tokens, int start_position, LogitsMode mode) {
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

void ForwardBatch::validate(int vocab_size, int64_t committed, int max_context, int max_tree) const {
  const auto str = [](long long v) { return std::to_string(v); };
  const size_t n = tokens.size();
  if (n == 0) throw InvalidArgument("forward: the batch has no tokens");
  if (positions.size() != n)
    throw InvalidArgument("forward: positions has " + str(positions.size()) + " entries for " + str(n) + " tokens");
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      throw InvalidArgument("forward: token id " + str(tokens[i]) + " at index " + str(i) +
                            " is outside the vocabulary [0, " + str(vocab_size) + ")");
    if (positions[i] < 0) throw InvalidArgument("forward: position " + str(positions[i]) + " is negative");
  }
  if (!is_tree()) {
    if (committed + static_cast<int64_t>(n) > max_context)
      throw InvalidArgument("forward: " + str(committed) + " committed + " + str(n) +
                            " new tokens exceed the context of " + str(max_context) + " tokens (max_context)");
    return;
  }
  if (tree_slots.size() != n) throw InvalidArgument("forward: tree_slots must have one slot per token");
  if (attend_offsets.size() != n + 1 || attend_offsets[0] != 0 ||
      attend_offsets[n] != static_cast<int32_t>(attend_slots.size()))
    throw InvalidArgument("forward: attend_offsets must be a CSR index of n+1 entries over attend_slots");
  const auto check_slot = [&](int32_t slot, const char* what) {
    if (slot < 0 || slot >= max_tree)
      throw InvalidArgument(std::string("forward: ") + what + " " + str(slot) + " outside the tree KV [0, " +
                            str(max_tree) + ")");
  };
  // writer[s]: the token of this batch that writes slot s, or -1.
  std::vector<int> writer(static_cast<size_t>(max_tree > 0 ? max_tree : 0), -1);
  for (size_t i = 0; i < n; ++i) {
    check_slot(tree_slots[i], "tree slot");
    int& w = writer[tree_slots[i]];
    if (w >= 0)
      throw InvalidArgument("forward: tokens " + str(w) + " and " + str(i) + " both write tree slot " +
                            str(tree_slots[i]));
    w = static_cast<int>(i);
  }
  // seen[s] == i + 1: slot s is already in token i's attend list.
  std::vector<size_t> seen(writer.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    const int32_t s0 = attend_offsets[i], e = attend_offsets[i + 1];
    if (s0 < 0 || e > static_cast<int32_t>(attend_slots.size()))
      throw InvalidArgument("forward: attend_offsets must be a CSR index of n+1 entries over attend_slots (entry " +
                            str(i + 1) + " = " + str(e) + " of " + str(attend_slots.size()) + " slots)");
    if (e <= s0 || attend_slots[e - 1] != tree_slots[i])
      throw InvalidArgument("forward: the attended tree slots of token " + str(i) + " must end with its own slot " +
                            str(tree_slots[i]));
    for (int32_t j = s0; j < e; ++j) {
      const int32_t slot = attend_slots[j];
      check_slot(slot, "attended tree slot");
      if (seen[slot] == i + 1)
        throw InvalidArgument("forward: token " + str(i) + " attends tree slot " + str(slot) + " twice");
      seen[slot] = i + 1;
      if (writer[slot] > static_cast<int>(i))
        throw InvalidArgument("forward: token " + str(i) + " attends tree slot " + str(slot) +
                              ", written by the later token " + str(writer[slot]) + " of the batch");
    }
  }
}

}  // namespace swiftspec
