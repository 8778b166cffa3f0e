// Int4 (W4A16) kernels of the CPU backend: dequantization and the int4 linear.
//  - fp16_to_float (and the kernels' inline fp16_to_float_fast) is exact on every finite
//    half-precision pattern, infinities and NaN;
//  - dequantize_int4_rows (AVX-512 for groups of 32 and more, scalar otherwise) equals the
//    documented formula (q - z) * s element by element, for group sizes 8..128;
//  - linear over an int4 matrix is bit-identical to linear over its dequantized F32 copy
//    (with K in block order, activations and weights alike, when the group size is a
//    multiple of 32), for every row count (1..9: the 4-row tiles and the tail; up to 4 rows
//    the AVX-512 build dequantizes in registers, beyond that through a buffer), N not a
//    multiple of 8 and threads 1 or 2: the int4 path inherits the F32 path's batch
//    invariance, whichever of its code paths runs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cpu/int4.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "test_framework.h"

namespace swiftspec::test {
namespace {

struct Int4Data {
  int n, k, g;
  std::vector<uint8_t> q, zeros;
  std::vector<uint16_t> scales;
  cpu::WeightMatrix view() const {
    cpu::WeightMatrix w;
    w.data = q.data();
    w.dtype = DType::U8;
    w.n = n;
    w.k = k;
    w.scales = scales.data();
    w.zeros = zeros.data();
    w.group_size = g;
    return w;
  }
};

// Random packed values, zero points 0..15 and normal fp16 scales in [2^-10, 2^-3).
Int4Data random_int4(int n, int k, int g, uint32_t seed) {
  std::mt19937 rng(seed);
  Int4Data d{n, k, g, {}, {}, {}};
  d.q.resize(size_t(n) * k / 2);
  for (auto& b : d.q) b = static_cast<uint8_t>(rng() & 0xFF);
  d.zeros.resize(size_t(n) * (k / g));
  d.scales.resize(d.zeros.size());
  for (size_t i = 0; i < d.zeros.size(); ++i) {
    d.zeros[i] = static_cast<uint8_t>(rng() % 16);
    const uint16_t exp = static_cast<uint16_t>(5 + rng() % 7);  // biased exponent 5..11: 2^-10..2^-3
    d.scales[i] = static_cast<uint16_t>((exp << 10) | (rng() & 0x3FF) | ((rng() & 1) << 15));
  }
  return d;
}

// The documented formula, element by element.
float reference_element(const Int4Data& d, int n, int k) {
  const uint8_t byte = d.q[size_t(n) * (d.k / 2) + k / 2];
  const int q = (k % 2 == 0) ? (byte & 15) : (byte >> 4);
  const size_t gi = size_t(n) * (d.k / d.g) + k / d.g;
  return static_cast<float>(q - d.zeros[gi]) * cpu::fp16_to_float(d.scales[gi]);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

}  // namespace

SWIFTSPEC_TEST(int4_fp16_to_float_is_exact) {
  CHECK_EQ(cpu::fp16_to_float(0x3C00), 1.0f);
  CHECK_EQ(cpu::fp16_to_float(0xC000), -2.0f);
  CHECK_EQ(cpu::fp16_to_float(0x7BFF), 65504.0f);
  CHECK_EQ(cpu::fp16_to_float(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  CHECK_EQ(cpu::fp16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK_EQ(cpu::fp16_to_float(0x03FF), std::ldexp(1023.0f, -24));
  CHECK(same_bits(cpu::fp16_to_float(0x8000), -0.0f));
  CHECK(std::isinf(cpu::fp16_to_float(0x7C00)) && cpu::fp16_to_float(0xFC00) < 0);
  CHECK(std::isnan(cpu::fp16_to_float(0x7E00)));
  // Every finite pattern: value = (-1)^s * m * 2^(e-25) with the implicit bit for e > 0.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) continue;
    const float mag = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(m | 1024), int(e) - 25);
    CHECK(same_bits(cpu::fp16_to_float(static_cast<uint16_t>(h)), (h & 0x8000) ? -mag : mag));
    CHECK(same_bits(cpu::fp16_to_float_fast(static_cast<uint16_t>(h)), (h & 0x8000) ? -mag : mag));
  }
  CHECK(std::isinf(cpu::fp16_to_float_fast(0x7C00)) && std::isnan(cpu::fp16_to_float_fast(0x7E00)));
}

SWIFTSPEC_TEST(int4_dequantize_matches_the_formula) {
  // Known values: bytes 0x21 -> elements 1, 2; zero point 3, scale 0.5.
  Int4Data d{1, 8, 8, {0x21, 0xF0, 0x00, 0x3C}, {3}, {0x3800}};
  std::vector<float> out(8);
  cpu::dequantize_int4_rows(d.view(), 0, 1, out.data());
  const std::vector<float> want{-1.0f, -0.5f, -1.5f, 6.0f, -1.5f, -1.5f, 4.5f, 0.0f};
  CHECK(out == want);
  for (int g : {8, 16, 24, 32, 64, 96, 128}) {
    const Int4Data r = random_int4(5, g * 3, g, 1234u + g);
    std::vector<float> rows(size_t(3) * r.k);
    cpu::dequantize_int4_rows(r.view(), 1, 4, rows.data());
    for (int n = 1; n < 4; ++n)
      for (int k = 0; k < r.k; ++k) CHECK(same_bits(rows[size_t(n - 1) * r.k + k], reference_element(r, n, k)));
  }
}

SWIFTSPEC_TEST(int4_linear_is_bit_identical_to_f32_over_dequantized_weights) {
  for (auto [n, k, g] :
       {std::tuple{13, 256, 128}, std::tuple{11, 96, 32}, std::tuple{21, 72, 24}, std::tuple{9, 40, 8}}) {
    const Int4Data d = random_int4(n, k, g, 99u + n);
    std::vector<float> dense(size_t(n) * k);
    cpu::dequantize_int4_rows(d.view(), 0, n, dense.data());
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> x(size_t(9) * k), bias(n);
    for (auto& v : x) v = normal(rng);
    for (auto& v : bias) v = normal(rng);
    // The F32 reference over the same K order: block order when the group size allows it.
    const bool block = cpu::int4_block_order(d.view());
    CHECK_EQ(block, g % 32 == 0);
    std::vector<float> xref = x, wref = dense;
    if (block) {
      cpu::block_order_rows(x.data(), 9, k, xref.data());
      cpu::block_order_rows(dense.data(), n, k, wref.data());
      std::vector<float> direct(size_t(n) * k);
      cpu::dequantize_int4_rows_block_order(d.view(), 0, n, direct.data());
      CHECK(std::memcmp(direct.data(), wref.data(), direct.size() * 4) == 0);
    }
    const cpu::WeightMatrix f32{wref.data(), DType::F32, n, k};
    for (int threads : {1, 2}) {
      cpu::ThreadPool pool(threads);
      for (int rows = 1; rows <= 9; ++rows) {
        std::vector<float> y4(size_t(rows) * n), y32(size_t(rows) * n), y1(n);
        cpu::linear(x.data(), rows, d.view(), bias.data(), y4.data(), pool);
        cpu::linear(xref.data(), rows, f32, bias.data(), y32.data(), pool);
        CHECK(std::memcmp(y4.data(), y32.data(), y4.size() * 4) == 0);
        // Batch invariance: the last row alone gives the same bits.
        cpu::linear(x.data() + size_t(rows - 1) * k, 1, d.view(), bias.data(), y1.data(), pool);
        CHECK(std::memcmp(y1.data(), y4.data() + size_t(rows - 1) * n, size_t(n) * 4) == 0);
      }
    }
  }
}

}  // namespace swiftspec::test
