#include "backend/cpu/rope.h"

#include <cmath>

namespace swiftspec::cpu {

Rope::Rope(const ModelConfig& c) : head_dim_(c.head_dim), style_(c.rope_style) {
  const int half = head_dim_ / 2;
  inv_freq_.resize(half);
  const float theta = static_cast<float>(c.rope_theta);
  for (int j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim_);
    inv_freq_[j] = 1.0f / std::pow(theta, exponent);
  }
  if (c.rope_scaling.enabled) {
    // Llama 3.1 scaling: long wavelengths are divided by `factor`, short ones
    // kept, the band in between interpolated smoothly.
    const auto& s = c.rope_scaling;
    const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    for (int j = 0; j < half; ++j) {
      const double f = inv_freq_[j];
      const double wavelen = 2.0 * M_PI / f;
      double scaled = f;
      if (wavelen > low_wavelen) {
        scaled = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        scaled = (1.0 - smooth) * f / s.factor + smooth * f;
      }
      inv_freq_[j] = static_cast<float>(scaled);
    }
  }
}

void Rope::apply(float* x, int heads, int position) const {
  const int half = head_dim_ / 2;
  // cos/sin of fp32 angles, as the HF reference computes them.
  float cos_buf[512], sin_buf[512];
  std::vector<float> cos_vec, sin_vec;
  float* cs = cos_buf;
  float* sn = sin_buf;
  if (half > 512) {
    cos_vec.resize(half);
    sin_vec.resize(half);
    cs = cos_vec.data();
    sn = sin_vec.data();
  }
  for (int j = 0; j < half; ++j) {
    const float angle = static_cast<float>(position) * inv_freq_[j];
    cs[j] = std::cos(angle);
    sn[j] = std::sin(angle);
  }
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim_;
    if (style_ == RopeStyle::NeoX) {
      for (int j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a * cs[j] - b * sn[j];
        v[j + half] = b * cs[j] + a * sn[j];
      }
    } else {
      for (int j = 0; j < half; ++j) {
        const float a = v[2 * j], b = v[2 * j + 1];
        v[2 * j] = a * cs[j] - b * sn[j];
        v[2 * j + 1] = b * cs[j] + a * sn[j];
      }
    }
  }
}

}  // namespace swiftspec::cpu
