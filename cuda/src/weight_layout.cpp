#include "weight_layout.h"

#include <cmath>

namespace swiftspec::cuda {

std::vector<int> qkv_row_permutation(int num_heads, int num_kv_heads, int head_dim, RopeStyle style) {
  const int heads = num_heads + 2 * num_kv_heads;
  std::vector<int> perm(static_cast<size_t>(heads) * head_dim);
  for (int h = 0; h < heads; ++h) {
    for (int t = 0; t < head_dim / 16; ++t) {
      for (int r = 0; r < 8; ++r) {
        const int i = 8 * t + r;
        const int dlo = style == RopeStyle::NeoX ? i : 2 * i;
        const int dhi = style == RopeStyle::NeoX ? i + head_dim / 2 : 2 * i + 1;
        perm[static_cast<size_t>(h) * head_dim + 16 * t + r] = h * head_dim + dlo;
        perm[static_cast<size_t>(h) * head_dim + 16 * t + 8 + r] = h * head_dim + dhi;
      }
    }
  }
  return perm;
}

std::vector<int> gate_up_row_permutation(int intermediate) {
  std::vector<int> perm(static_cast<size_t>(2) * intermediate);
  for (int t = 0; t < intermediate / 8; ++t) {
    for (int r = 0; r < 8; ++r) {
      perm[16 * t + r] = 8 * t + r;
      perm[16 * t + 8 + r] = intermediate + 8 * t + r;
    }
  }
  return perm;
}

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<float> f(half);
  const float base = static_cast<float>(cfg.rope_theta);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(cfg.head_dim);
    f[i] = 1.0f / std::pow(base, e);
  }
  if (cfg.rope_scaling.enabled) {
    const double factor = cfg.rope_scaling.factor;
    const double lo = cfg.rope_scaling.low_freq_factor;
    const double hi = cfg.rope_scaling.high_freq_factor;
    const double orig = cfg.rope_scaling.original_max_position_embeddings;
    const double low_wavelen = orig / lo;
    const double high_wavelen = orig / hi;
    for (int i = 0; i < half; ++i) {
      const double freq = f[i];
      const double wavelen = 2.0 * M_PI / freq;
      double out;
      if (wavelen < high_wavelen) {
        out = freq;
      } else if (wavelen > low_wavelen) {
        out = freq / factor;
      } else {
        const double smooth = (orig / wavelen - lo) / (hi - lo);
        out = (1.0 - smooth) * freq / factor + smooth * freq;
      }
      f[i] = static_cast<float>(out);
    }
  }
  return f;
}

}  // namespace swiftspec::cuda
