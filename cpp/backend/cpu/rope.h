// Rotary position embedding (RoPE; Su et al. 2021, "RoFormer") for the CPU backend.
#pragma once
#include <vector>

#include "swiftspec/config.h"

namespace swiftspec::cpu {

/// Per-pair inverse frequencies of one head, computed in fp32 the way HF
/// transformers does (inv_freq_j = 1 / theta^(2j / head_dim)), with Llama-3
/// frequency scaling applied when the config enables it.
class Rope {
 public:
  explicit Rope(const ModelConfig& config);
  /// Rotates `heads` consecutive heads of `x` (fp32 [heads, head_dim]) in place
  /// for `position`, NeoX (half-split) or interleaved (adjacent-pair) style.
  void apply(float* x, int heads, int position) const;

 private:
  int head_dim_;
  RopeStyle style_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
};

}  // namespace swiftspec::cpu
