// RoPE tables (swiftspec/rope.h): inverse frequencies and the cos/sin scale of the default,
// llama3 and YaRN RoPE, step for step as HF transformers 5's modeling_rope_utils.py computes
// them, so that the fp32 values agree with HF's bit for bit: every tensor operation there is
// one fp32 operation here (a Python float meeting an fp32 tensor is rounded to fp32 first, and
// `scalar / tensor` is `tensor.reciprocal() * scalar`), and the Python-float arithmetic on
// scalars is done in double. CMake compiles this file with -ffp-contract=off: a fused
// multiply-add would round differently from torch's separate multiply and add.
#include <algorithm>
#include <cmath>
#include <vector>

#include "swiftspec/rope.h"

namespace swiftspec {
namespace {

/// 1 / theta^(2i / head_dim) in fp32, i < head_dim / 2 (HF's default inv_freq; llama3's and
/// YaRN's starting point, YaRN's `inv_freq_extrapolation`).
std::vector<float> default_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> f(half);
  const float theta = static_cast<float>(c.rope_theta);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    f[i] = 1.0f / std::pow(theta, exponent);
  }
  return f;
}

/// Llama 3.1 (Meta's reference apply_scaling; HF _compute_llama3_parameters).
void apply_llama3(const RopeScaling& s, std::vector<float>& inv) {
  const double orig = s.original_max_position_embeddings;
  const float low_wavelen = static_cast<float>(orig / s.low_freq_factor);
  const float high_wavelen = static_cast<float>(orig / s.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * M_PI);
  const float factor = static_cast<float>(s.factor);
  const float origf = static_cast<float>(orig);
  const float lo = static_cast<float>(s.low_freq_factor);
  const float band = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  for (float& f : inv) {
    const float wavelen = (1.0f / f) * two_pi;
    const float kept = wavelen > low_wavelen ? f / factor : f;  // long wavelengths: divided by factor
    if (wavelen < high_wavelen || wavelen > low_wavelen) {
      f = kept;
      continue;
    }
    const float smooth = ((1.0f / wavelen) * origf - lo) / band;
    f = (1.0f - smooth) * kept / factor + smooth * kept;
  }
}

/// YaRN "NTK-by-parts" (paper section 3.2; HF _compute_yarn_parameters).
void apply_yarn(const ModelConfig& c, const RopeScaling& s, std::vector<float>& inv) {
  const int dim = c.head_dim;
  const double base = c.rope_theta;
  const double orig = s.original_max_position_embeddings;
  // The (fractional) dimension whose pair turns `rotations` times over the original context.
  const auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
  const float lowf = static_cast<float>(low);
  const float width = static_cast<float>(high - low);
  const float factor = static_cast<float>(s.factor);
  for (size_t i = 0; i < inv.size(); ++i) {
    // HF's pos_freqs = base ** (2i / d); inv_freq_extrapolation is inv[i] = 1 / pos_freqs.
    const float power = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / power;
    const float interpolation = 1.0f / (factor * power);
    const float ramp = std::clamp((static_cast<float>(i) - lowf) / width, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // HF's inv_freq_extrapolation_factor
    inv[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
}

}  // namespace

double rope_attention_factor(const RopeScaling& s) {
  if (s.type != RopeScalingType::Yarn) return 1.0;
  if (s.attention_factor) return *s.attention_factor;
  const auto mscale = [&](double m) { return s.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) return mscale(s.mscale) / mscale(s.mscale_all_dim);
  return mscale(1.0);
}

float rope_attention_scale(const ModelConfig& c) { return static_cast<float>(rope_attention_factor(c.rope_scaling)); }

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  std::vector<float> inv = default_inv_freq(c);
  switch (c.rope_scaling.type) {
    case RopeScalingType::None:
      break;
    case RopeScalingType::Llama3:
      apply_llama3(c.rope_scaling, inv);
      break;
    case RopeScalingType::Yarn:
      apply_yarn(c, c.rope_scaling, inv);
      break;
  }
  return inv;
}

}  // namespace swiftspec
