// fp32 CPU reference of a Llama / Qwen2 decoder for the CUDA backend checks
// (independent of the CUDA code: unfolded RMSNorm, HF row order, double RoPE
// frequencies). Token-at-a-time with an explicit KV state so that tree nodes
// can be evaluated as "committed prefix + ancestors".
#pragma once
#include <map>
#include <string>
#include <vector>

#include "swiftspec/config.h"

namespace swiftspec::cuda_check {

struct RefState {
  std::vector<std::vector<float>> k, v;  ///< per layer: [len][kv_heads*head_dim]
  int len = 0;
};

/// Intermediate values of one step, per layer (for locating a mismatch).
struct RefTrace {
  std::vector<std::vector<float>> q;     ///< RoPE'd queries [heads*head_dim]
  std::vector<std::vector<float>> attn;  ///< attention output before o_proj
  std::vector<std::vector<float>> act;   ///< SwiGLU output [intermediate]
  std::vector<float> h_final;            ///< residual after the last layer
};

class RefModel {
 public:
  /// `w` maps checkpoint names to fp32 values (already bf16-rounded by the test).
  RefModel(const ModelConfig& cfg, const std::map<std::string, std::vector<float>>& w);
  RefState empty_state() const;
  /// Runs one token at `position` attending state's keys then itself; appends
  /// its K/V to `st`; returns logits [vocab].
  std::vector<float> step(RefState& st, int token, int position, RefTrace* trace = nullptr) const;

 private:
  const std::vector<float>& w(const std::string& name) const;
  ModelConfig cfg_;
  const std::map<std::string, std::vector<float>>& w_;
  std::vector<double> inv_freq_;
  double rope_scale_ = 1.0;  // cos/sin multiplier (YaRN's attention factor)
};

}  // namespace swiftspec::cuda_check
