// Context bands: the ranges of committed lengths over which one tuned layered step (step
// tuner, CudaModelOptions::autotune) and one megakernel hand-over decision hold.
//
// Why: how much of a step is attention grows with the committed length, so which kernels
// gain from overlapping their neighbours (PDL edges) depends on it; a choice made at a short
// context measured slower than none at 32K keys on the 1.5B shape. So the tuner times each
// band on a synthetic step at the band's representative length and a step runs with the
// choice of the band its committed length falls in (docs/long_context.md, "Tuning at the
// context in use").
//
// The table: representative lengths 512, 4K, 16K, 32K, 64K and 128K keys; each boundary is
// the geometric mean of its two neighbours, rounded (a length is in the band whose
// representative it is nearest to in ratio):
//   band 0: [0, 1448)   band 1: [1448, 8192)    band 2: [8192, 23170)
//   band 3: [23170, 46341)   band 4: [46341, 92682)   band 5: [92682, ...)
#pragma once

namespace swiftspec::cuda {

constexpr int kContextBands = 6;
constexpr int kBandLengths[kContextBands] = {512, 4096, 16384, 32768, 65536, 131072};

namespace detail {

/// round(sqrt(a * b)) for positive a, b (a constant expression).
constexpr int geometric_mean(long long a, long long b) {
  const long long p = a * b;
  long long lo = 0, hi = 1LL << 32;  // lo * lo <= p < hi * hi
  while (hi - lo > 1) {
    const long long mid = (lo + hi) / 2;
    (mid * mid <= p ? lo : hi) = mid;
  }
  return static_cast<int>(p - lo * lo > lo ? lo + 1 : lo);  // p > (lo + 1/2)^2 <=> p - lo^2 > lo (integers)
}

}  // namespace detail

/// The first committed length of each band (kBandLower[0] = 0).
constexpr int kBandLower[kContextBands] = {
    0,
    detail::geometric_mean(kBandLengths[0], kBandLengths[1]),
    detail::geometric_mean(kBandLengths[1], kBandLengths[2]),
    detail::geometric_mean(kBandLengths[2], kBandLengths[3]),
    detail::geometric_mean(kBandLengths[3], kBandLengths[4]),
    detail::geometric_mean(kBandLengths[4], kBandLengths[5]),
};

/// The first committed length of band `b` (0 for band 0).
constexpr int band_lower(int b) { return kBandLower[b]; }

/// The first committed length past band `b`; 0 for the last band (no upper boundary).
constexpr int band_upper(int b) { return b + 1 >= kContextBands ? 0 : kBandLower[b + 1]; }

static_assert(band_lower(1) == 1448 && band_lower(2) == 8192 && band_lower(3) == 23170 && band_lower(4) == 46341 &&
                  band_lower(5) == 92682,
              "the band table in this header's comment");

/// The band of a step over `committed` committed keys (a tree step's ancestors in the tree
/// do not count: every node of a tree shares its committed prefix).
constexpr int context_band(int committed) {
  int b = 0;
  while (b + 1 < kContextBands && committed >= band_lower(b + 1)) ++b;
  return b;
}

/// The committed length of the tuner's synthetic step of `n` tokens in band `b` of a model
/// of `max_context` keys: the band's representative length, less where the step would not
/// fit (committed + n <= max_context, so a tree's deepest node stays below max_context);
/// -1 where that length falls below the band (the model does not reach it: not tuned).
constexpr int band_synthetic_committed(int b, int n, int max_context) {
  const int c = kBandLengths[b] < max_context - n ? kBandLengths[b] : max_context - n;
  return c >= band_lower(b) ? c : -1;
}

}  // namespace swiftspec::cuda
