// Model configuration of the Llama / Qwen2 decoder family.
//
// Read from a checkpoint folder's `config.json`, which uses Hugging Face key
// names (model_type, hidden_size, num_key_value_heads, rope_theta, ...) so a
// converted checkpoint is also loadable by HF transformers, plus a
// `swiftspec` object with engine-specific fields (rope_style).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace swiftspec {

/// How RoPE pairs the dimensions of a head.
///  - NeoX:        dimension i rotates with i + head_dim/2 (HF "rotate_half"; Qwen2, HF Llama).
///  - Interleaved: dimension 2i rotates with 2i+1 (GPT-J / Meta's original Llama layout).
enum class RopeStyle { NeoX, Interleaved };

/// Which RoPE scaling a model uses for contexts past its pretraining length
/// (config.json "rope_scaling" / "rope_parameters" "rope_type", HF transformers' names).
enum class RopeScalingType {
  None,    ///< plain RoPE ("default", or no rope_scaling)
  Llama3,  ///< "llama3": Llama 3.1 frequency scaling (Meta's reference apply_scaling)
  Yarn,    ///< "yarn": Peng et al. 2023, "YaRN: Efficient Context Window Extension of LLMs"
};

/// RoPE scaling parameters as config.json gives them (HF transformers 5 key names). The tables
/// they produce (inverse frequencies, cos/sin scale) are computed by swiftspec/rope.h.
/// validate() refuses values that make the tables meaningless (non-finite, factor < 1,
/// low_freq_factor >= high_freq_factor, beta_fast < beta_slow, a non-positive attention factor).
struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  /// Context extension ratio (both types): llama3 divides long wavelengths by it; YaRN
  /// interpolates its low-frequency dimensions by it (Peng et al. 2023, section 3.2).
  double factor = 1.0;
  /// Pretraining context length (tokens) the scaling is relative to (both types).
  int original_max_position_embeddings = 8192;
  // -- llama3 only: wavelengths longer than original / low_freq_factor are divided by `factor`,
  //    those shorter than original / high_freq_factor kept, the band in between interpolated.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // -- yarn only ("NTK-by-parts", paper section 3.2: a dimension that turns r times over the
  //    original context is kept for r > beta_fast (the paper's beta), fully interpolated for
  //    r < beta_slow (its alpha), ramped linearly in between; HF defaults 32 and 1)
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  /// Multiplier of cos/sin ("attention_factor"; the paper's sqrt(1/t), section 3.4). Empty: not
  /// given, derived from factor, mscale and mscale_all_dim as HF does (rope_attention_scale()).
  std::optional<double> attention_factor;
  double mscale = 0.0;  ///< DeepSeek-style attention factor terms; 0: not given
  double mscale_all_dim = 0.0;
  /// Round the interpolation ramp's ends to whole dimensions (floor / ceil), as HF by default.
  bool truncate = true;
};

struct ModelConfig {
  std::string architecture;  ///< "qwen2" or "llama" (HF model_type)
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;    ///< num_hidden_layers
  int num_heads = 0;     ///< num_attention_heads (query heads)
  int num_kv_heads = 0;  ///< num_key_value_heads (GQA)
  int head_dim = 0;      ///< hidden_size / num_heads unless given
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  RopeStyle rope_style = RopeStyle::NeoX;
  RopeScaling rope_scaling;
  int max_position_embeddings = 0;  ///< longest context the model was trained for; 0: not given
  bool tie_word_embeddings = false;
  bool attention_bias = false;  ///< q/k/v projections carry a bias (Qwen2)
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  /// Parses `path` (a config.json). Throws CheckpointError naming the file and
  /// the missing or invalid field; unknown architectures are rejected.
  static ModelConfig from_json_file(const std::string& path);
  /// Parses JSON text; `origin` names the source in error messages.
  static ModelConfig from_json_text(const std::string& text, const std::string& origin);

  /// The longest context (tokens) the model is meant to run, the default and the bound of
  /// ModelOptions::max_context: max_position_embeddings, or with YaRN scaling
  /// factor * original_max_position_embeddings where that is longer (Qwen2.5 ships 32768 and
  /// documents YaRN factor 4 for 131072; vLLM derives its limit the same way). 0: config.json
  /// gives neither.
  int context_limit() const;

  /// Checks internal consistency (head counts divide, sizes > 0, RoPE scaling parameters usable);
  /// throws CheckpointError "<origin>: field '<name>' ...".
  void validate(const std::string& origin) const;
};

}  // namespace swiftspec
