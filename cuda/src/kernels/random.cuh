// Counter-based pseudo-random numbers for GPU-side random weights / KV
// (benchmarks, tests): a 64-bit mix of (seed, index), no state.
#pragma once
#include <cstdint>

namespace swiftspec::cuda {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/// Uniform in (-1, 1) with |u| >= 0.05: never zero.
__device__ __forceinline__ float rand_sym(uint64_t seed, uint64_t i) {
  const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull);
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  const float mag = 0.05f + 0.95f * u;
  return (h & 1ull) ? mag : -mag;
}

}  // namespace swiftspec::cuda
