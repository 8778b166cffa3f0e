// The per-step batch descriptor that every kernel of a step reads from device
// memory. The host fills it (pinned staging buffer) and copies it to the
// device before launching the step's graph, so one captured graph serves every
// batch of its bucket: token ids, positions, KV slots and tree masks are data,
// not graph parameters.
#pragma once
#include <cstdint>

namespace swiftspec::cuda {

/// Largest number of tokens one graph step processes (the tree budget per
/// verification step; larger batches are split into steps of this size).
constexpr int kMaxStepTokens = 64;
/// Capacity of the tree attend lists of one step (sum of all list lengths).
constexpr int kMaxAttendSlots = kMaxStepTokens * kMaxStepTokens;

struct StepDesc {
  int n;                          ///< tokens in this step, 1..kMaxStepTokens
  int is_tree;                    ///< 1: tree mode (K/V into tree slots, attend lists); 0: append mode
  int committed;                  ///< committed_len() before this step
  int last_row;                   ///< n - 1 (row of the last token, for LogitsMode::Last)
  int tokens[kMaxStepTokens];     ///< token ids
  int positions[kMaxStepTokens];  ///< RoPE positions
  /// KV cache index each token writes: append mode committed+i; tree mode
  /// max_context + tree_slot.
  int kv_index[kMaxStepTokens];
  /// Committed keys each token attends: slots [0, prefix_len). Append mode:
  /// committed + i + 1 (itself included); tree mode: committed.
  int prefix_len[kMaxStepTokens];
  /// Tree mode: token i attends, after its prefix, the tree slots
  /// attend_slots[attend_off[i] .. attend_off[i+1]) (ancestors by depth, itself
  /// last). Append mode: all zero.
  int attend_off[kMaxStepTokens + 1];
  int pad_[3];
  int attend_slots[kMaxAttendSlots];
};

/// Bytes of the descriptor up to (excluding) the attend list.
constexpr int kStepDescHeaderBytes = static_cast<int>(sizeof(int) * (4 + 4 * kMaxStepTokens + kMaxStepTokens + 1 + 3));

}  // namespace swiftspec::cuda
