// Rotary position embedding (RoPE; Su et al. 2021, "RoFormer") for the CPU backend.
#pragma once
#include <vector>

#include "swiftspec/config.h"

namespace swiftspec::cpu {

/// Rotates query and key heads by their position with the model's RoPE tables (swiftspec/rope.h:
/// fp32 inverse frequencies as HF transformers computes them, with llama3 or YaRN scaling when the
/// config sets it, and YaRN's attention factor multiplying cos and sin).
class Rope {
 public:
  explicit Rope(const ModelConfig& config);
  /// Rotates `heads` consecutive heads of `x` (fp32 [heads, head_dim]) in place
  /// for `position`, NeoX (half-split) or interleaved (adjacent-pair) style.
  void apply(float* x, int heads, int position) const;

 private:
  int head_dim_;
  RopeStyle style_;
  std::vector<float> inv_freq_;  // [head_dim / 2] radians per position
  float scale_;                  // cos/sin multiplier (1 unless YaRN)
};

}  // namespace swiftspec::cpu
