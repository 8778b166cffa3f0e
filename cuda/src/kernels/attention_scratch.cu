// The scratch of the split-K attention (attention.h): how many partials of each kind a model of a
// given context and tree size needs, sized once when the model is made.
#include <algorithm>

#include "common.h"
#include "kernels/attention.h"

namespace swiftspec::cuda {

size_t AttnScratchSizes::bytes(int head_dim) const {
  const size_t per_entry = sizeof(float) * head_dim + sizeof(float2);
  return per_entry * (split_entries + super_entries + boundary_entries + tail_entries) + sizeof(int) * super_counters;
}

AttnScratchSizes attention_scratch_sizes(int num_heads, int num_kv_heads, int max_context, int max_tree) {
  AttnScratchSizes s;
  const int splits = (max_context + kAttnSplitKeys - 1) / kAttnSplitKeys;
  s.split_capacity = std::max(kMaxStepTokens * 64, splits);
  s.max_supers = std::max(1, (max_context + kAttnSuperKeys - 1) / kAttnSuperKeys);
  // A token's tiles from floor(C / 64) on: up to 63 committed positions, then its attend list
  // (append mode: up to kMaxStepTokens positions).
  const int list = std::max(kMaxStepTokens, max_tree);
  s.tail_tiles = (63 + list + kAttnTile - 1) / kAttnTile;
  s.split_entries = static_cast<size_t>(s.split_capacity) * num_heads;
  s.super_entries = static_cast<size_t>(s.max_supers) * kMaxStepTokens * num_heads;
  s.boundary_entries = static_cast<size_t>(kMaxStepTokens) * num_heads;
  s.tail_entries = static_cast<size_t>(s.tail_tiles) * kMaxStepTokens * num_heads;
  s.super_counters = static_cast<size_t>(num_kv_heads) * kMaxStepTokens * s.max_supers;
  return s;
}

}  // namespace swiftspec::cuda
