// The CUDA backend's context bands (cuda/src/context_bands.h, docs/long_context.md "Tuning at the
// context in use"), which need no GPU: which band a committed length falls in, each band's
// boundaries, and the committed length of the step tuner's synthetic step per band (a band the
// model's max_context does not reach is not tuned). The header is plain C++, so the CPU build
// checks the rule the CUDA runtime uses.
// (Test names end in "context_band": tests/test_context_capacity.py selects them.)
#include "../../cuda/src/context_bands.h"

#include <climits>

#include "test_framework.h"

namespace swiftspec::test {

using cuda::band_lower;
using cuda::band_synthetic_committed;
using cuda::band_upper;
using cuda::context_band;
using cuda::kBandLengths;
using cuda::kContextBands;

SWIFTSPEC_TEST(lengths_fall_in_their_context_band) {
  // The boundaries are the rounded geometric means of neighbouring tuned-at lengths.
  const int lower[kContextBands] = {0, 1448, 8192, 23170, 46341, 92682};
  for (int b = 0; b < kContextBands; ++b) {
    CHECK_EQ(band_lower(b), lower[b]);
    CHECK_EQ(context_band(lower[b]), b);
    if (b > 0) CHECK_EQ(context_band(lower[b] - 1), b - 1);
    CHECK_EQ(context_band(kBandLengths[b]), b);  // a band holds the length it is tuned at
    CHECK_EQ(band_upper(b), b + 1 < kContextBands ? lower[b + 1] : 0);
  }
  CHECK_EQ(context_band(0), 0);
  CHECK_EQ(context_band(INT_MAX), kContextBands - 1);
}

SWIFTSPEC_TEST(synthetic_step_per_context_band) {
  // Band 0 at 512 keys, or less where the step would pass max_context.
  CHECK_EQ(band_synthetic_committed(0, 8, 40000), 512);
  CHECK_EQ(band_synthetic_committed(0, 8, 320), 312);
  // A further band at its length while the step fits, else at max_context - n if still inside the band.
  CHECK_EQ(band_synthetic_committed(3, 64, 40000), 32768);
  CHECK_EQ(band_synthetic_committed(3, 64, 30000), 29936);
  // Not reached: max_context - n falls below the band (the last keys use the band below).
  CHECK_EQ(band_synthetic_committed(3, 64, 23200), -1);
  CHECK_EQ(band_synthetic_committed(1, 1, 320), -1);
  CHECK_EQ(band_synthetic_committed(4, 1, 40000), -1);
  // The reference pair's 32768-key default context reaches bands 0-3: band 3 at 32768 - n.
  CHECK_EQ(band_synthetic_committed(3, 1, 32768), 32767);
  CHECK_EQ(band_synthetic_committed(3, 64, 32768), 32704);
  CHECK_EQ(band_synthetic_committed(4, 1, 32768), -1);
  // A step larger than the context: never tuned.
  CHECK_EQ(band_synthetic_committed(0, 64, 32), -1);
}

}  // namespace swiftspec::test
