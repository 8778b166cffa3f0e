#include "weight_layout.h"

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

}  // namespace swiftspec::cuda
