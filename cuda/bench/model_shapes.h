// The model shapes of the CUDA latency benchmarks and checks (issue 5):
// Llama-3-8B / 70B, Qwen2.5-1.5B and Qwen2.5-0.5B, as their published
// config.json files give them (random weights are generated on the GPU).
#pragma once
#include <string>

#include "swiftspec/config.h"
#include "swiftspec/error.h"

namespace swiftspec::cuda {

/// "llama3-8b", "llama3-70b", "qwen2.5-1.5b" or "qwen2.5-0.5b"; throws
/// InvalidArgument for another name.
inline ModelConfig shape_config(const std::string& which) {
  ModelConfig c;
  if (which == "llama3-8b" || which == "llama3-70b") {
    c.architecture = "llama";
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 500000.0;
    if (which == "llama3-70b") {
      c.hidden_size = 8192;
      c.intermediate_size = 28672;
      c.num_layers = 80;
      c.num_heads = 64;
    }
    c.rope_scaling.type = RopeScalingType::Llama3;
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-5f;
  } else if (which == "qwen2.5-1.5b") {
    c.architecture = "qwen2";
    c.vocab_size = 151936;
    c.hidden_size = 1536;
    c.intermediate_size = 8960;
    c.num_layers = 28;
    c.num_heads = 12;
    c.num_kv_heads = 2;
    c.head_dim = 128;
    c.rope_theta = 1000000.0;
    c.attention_bias = true;
    c.tie_word_embeddings = true;
  } else if (which == "qwen2.5-0.5b") {
    c.architecture = "qwen2";
    c.vocab_size = 151936;
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_layers = 24;
    c.num_heads = 14;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.rope_theta = 1000000.0;
    c.attention_bias = true;
    c.tie_word_embeddings = true;
  } else {
    throw InvalidArgument("unknown model shape '" + which + "' (llama3-8b, llama3-70b, qwen2.5-1.5b, qwen2.5-0.5b)");
  }
  return c;
}

}  // namespace swiftspec::cuda
