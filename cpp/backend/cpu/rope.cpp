#include "backend/cpu/rope.h"

#include <cmath>

#include "swiftspec/rope.h"

namespace swiftspec::cpu {

Rope::Rope(const ModelConfig& c)
    : head_dim_(c.head_dim), style_(c.rope_style), inv_freq_(rope_inv_freq(c)), scale_(rope_attention_scale(c)) {}

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
  if (scale_ != 1.0f) {  // YaRN: HF multiplies the fp32 cos and sin by the attention factor
    for (int j = 0; j < half; ++j) {
      cs[j] *= scale_;
      sn[j] *= scale_;
    }
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
