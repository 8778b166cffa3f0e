// RoPE tables of a model (Su et al. 2021, "RoFormer"), shared by the CPU and CUDA backends so
// both rotate with the same bits.
//
// Computed as HF transformers 5 computes them (modeling_rope_utils.py: _compute_default /
// _compute_llama3 / _compute_yarn_parameters, fp32 tensor arithmetic with the host-side
// scalars in double), so logits match HF fp32 at any position:
//   default: inv_freq[i] = 1 / theta^(2i / head_dim)
//   llama3:  Llama 3.1 scaling (Meta's reference apply_scaling): wavelengths 2 pi / inv_freq
//            above original / low_freq_factor divided by factor, below original /
//            high_freq_factor kept, interpolated in between.
//   yarn:    Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
//            Models": "NTK-by-parts" interpolation (section 3.2) of inv_freq between
//            1 / theta^(2i/d) and that / factor, with cos and sin multiplied by the attention
//            factor (section 3.4, sqrt(1/t) = 0.1 ln(factor) + 1 unless given).
#pragma once
#include <vector>

#include "swiftspec/config.h"

namespace swiftspec {

/// RoPE inverse frequencies in radians per position, fp32 [head_dim / 2]: pair i of a head turns
/// by position * inv_freq[i]. Expects a config that passed ModelConfig::validate().
std::vector<float> rope_inv_freq(const ModelConfig& config);

/// The factor every cos and sin of the rotation is multiplied by (fp32; 1.0f exactly unless the
/// config's YaRN scaling makes it otherwise), i.e. q and k each scaled by it after rotation.
float rope_attention_scale(const ModelConfig& config);

/// rope_attention_scale() before rounding to fp32 (double, as HF's Python float); used by
/// ModelConfig::validate() to refuse an attention factor that is not finite and > 0.
double rope_attention_factor(const RopeScaling& scaling);

}  // namespace swiftspec
