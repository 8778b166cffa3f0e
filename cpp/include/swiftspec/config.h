// Model configuration of the Llama / Qwen2 decoder family.
//
// Read from a checkpoint folder's `config.json`, which uses Hugging Face key
// names (model_type, hidden_size, num_key_value_heads, rope_theta, ...) so a
// converted checkpoint is also loadable by HF transformers, plus a
// `swiftspec` object with engine-specific fields (rope_style).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace swiftspec {

/// How RoPE pairs the dimensions of a head.
///  - NeoX:        dimension i rotates with i + head_dim/2 (HF "rotate_half"; Qwen2, HF Llama).
///  - Interleaved: dimension 2i rotates with 2i+1 (GPT-J / Meta's original Llama layout).
enum class RopeStyle { NeoX, Interleaved };

/// Llama-3 style frequency scaling of RoPE ("rope_scaling": {"rope_type": "llama3", ...}).
struct RopeScaling {
  bool enabled = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;       ///< "qwen2" or "llama" (HF model_type)
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;             ///< num_hidden_layers
  int num_heads = 0;              ///< num_attention_heads (query heads)
  int num_kv_heads = 0;           ///< num_key_value_heads (GQA)
  int head_dim = 0;               ///< hidden_size / num_heads unless given
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  RopeStyle rope_style = RopeStyle::NeoX;
  RopeScaling rope_scaling;
  int max_position_embeddings = 0;  ///< longest context the model was trained for; 0: not given
  bool tie_word_embeddings = false;
  bool attention_bias = false;    ///< q/k/v projections carry a bias (Qwen2)
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  /// Parses `path` (a config.json). Throws CheckpointError naming the file and
  /// the missing or invalid field; unknown architectures are rejected.
  static ModelConfig from_json_file(const std::string& path);
  /// Parses JSON text; `origin` names the source in error messages.
  static ModelConfig from_json_text(const std::string& text, const std::string& origin);

  /// Checks internal consistency (head counts divide, sizes > 0); throws CheckpointError.
  void validate(const std::string& origin) const;
};

}  // namespace swiftspec
