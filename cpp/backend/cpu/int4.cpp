#include "backend/cpu/int4.h"

#include <immintrin.h>

#include <cstring>

namespace swiftspec::cpu {

float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: value mant * 2^-24; normalise the mantissa.
    int e = 113;  // exponent field of 2^-14 in fp32
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --e;
    }
    bits = sign | (uint32_t(e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace {

// One group of `g` elements (g a multiple of 8) from g/2 packed bytes: the reference path.
inline void dequantize_group_scalar(const uint8_t* q, int g, int z, float s, float* out) {
  for (int j = 0; j < g / 2; ++j) {
    const int b = q[j];
    out[2 * j] = static_cast<float>((b & 15) - z) * s;
    out[2 * j + 1] = static_cast<float>((b >> 4) - z) * s;
  }
}

#if defined(__AVX512F__)
// 32 elements from 16 packed bytes: widen the bytes to 16 int32 lanes, split the nibbles,
// interleave them back into element order (lo0, hi0, lo1, hi1, ...), subtract the zero
// point in integers, convert (exact) and multiply: the same operations as the scalar path.
inline void dequantize_32(const uint8_t* q, __m512i z, __m512 s, float* out) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m512i lo = _mm512_and_si512(bytes, _mm512_set1_epi32(15));
  const __m512i hi = _mm512_srli_epi32(bytes, 4);
  const __m512i first = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i second = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  const __m512i e0 = _mm512_sub_epi32(_mm512_permutex2var_epi32(lo, first, hi), z);
  const __m512i e1 = _mm512_sub_epi32(_mm512_permutex2var_epi32(lo, second, hi), z);
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_cvtepi32_ps(e0), s));
  _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(e1), s));
}
#endif

}  // namespace

void dequantize_int4_rows(const WeightMatrix& w, int n0, int n1, float* out) {
  const int k = w.k, g = w.group_size, groups = k / g;
  const auto* qbase = static_cast<const uint8_t*>(w.data);
  for (int n = n0; n < n1; ++n) {
    const uint8_t* q = qbase + size_t(n) * (k / 2);
    const uint16_t* sc = w.scales + size_t(n) * groups;
    const uint8_t* zr = w.zeros + size_t(n) * groups;
    float* o = out + size_t(n - n0) * k;
    for (int gi = 0; gi < groups; ++gi) {
      const float s = fp16_to_float_fast(sc[gi]);
      const int z = zr[gi];
      const uint8_t* qg = q + size_t(gi) * (g / 2);
      float* og = o + size_t(gi) * g;
      int done = 0;
#if defined(__AVX512F__)
      const __m512i zv = _mm512_set1_epi32(z);
      const __m512 sv = _mm512_set1_ps(s);
      for (; done + 32 <= g; done += 32) dequantize_32(qg + done / 2, zv, sv, og + done);
#endif
      dequantize_group_scalar(qg + done / 2, g - done, z, s, og + done);
    }
  }
}

void dequantize_int4_rows_block_order(const WeightMatrix& w, int n0, int n1, float* out) {
  const int k = w.k, g = w.group_size, groups = k / g;
  const auto* qbase = static_cast<const uint8_t*>(w.data);
  for (int n = n0; n < n1; ++n) {
    const uint8_t* q = qbase + size_t(n) * (k / 2);
    float* o = out + size_t(n - n0) * k;
    for (int gi = 0; gi < groups; ++gi) {
      const float s = fp16_to_float_fast(w.scales[size_t(n) * groups + gi]);
      const int z = w.zeros[size_t(n) * groups + gi];
#if defined(__AVX512F__)
      // The 16 values (q - z) * s as a table, one lookup per nibble: the same products.
      const __m512 table = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(z))),
          _mm512_set1_ps(s));
      for (int b = gi * g; b < (gi + 1) * g; b += 32) {
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b / 2)));
        _mm512_storeu_ps(o + b, _mm512_permutexvar_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)), table));
        _mm512_storeu_ps(o + b + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table));
      }
#else
      for (int b = gi * g; b < (gi + 1) * g; b += 32) {
        const uint8_t* qb = q + b / 2;
        for (int p = 0; p < 16; ++p) {
          o[b + p] = static_cast<float>((qb[p] & 15) - z) * s;
          o[b + 16 + p] = static_cast<float>((qb[p] >> 4) - z) * s;
        }
      }
#endif
    }
  }
}

void block_order_rows(const float* x, int rows, int k, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * k;
    float* o = out + size_t(r) * k;
    for (int b = 0; b < k; b += 32)
      for (int p = 0; p < 16; ++p) {
        o[b + p] = xr[b + 2 * p];
        o[b + 16 + p] = xr[b + 2 * p + 1];
      }
  }
}

}  // namespace swiftspec::cpu
