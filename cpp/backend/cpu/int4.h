// Int4 (AWQ-style W4A16) weights on the CPU backend: dequantization to fp32.
//
// Storage (docs/checkpoint_format.md, "int4 weights"), for a projection [N, K] with
// group size G (a multiple of 8 dividing K):
//   qweight U8  [N, K/2]  byte j of row n holds element 2j in bits 0-3, 2j+1 in bits 4-7
//   scales  F16 [N, K/G]  IEEE half-precision bit patterns
//   zeros   U8  [N, K/G]  integer zero points, 0..15
// Element (n, k) is w = (q - z) * s with q the nibble, z = zeros[n, k/G] and
// s = scales[n, k/G] widened to fp32: the integer difference is exact in fp32, so the one
// rounding is the fp32 product. A numpy reference `(q.astype(f32) - z) * s.astype(f32)`
// gives the same bits.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels.h"

namespace swiftspec::cpu {

/// IEEE half-precision bits -> fp32, exactly (subnormals, infinities and NaN included).
float fp16_to_float(uint16_t h);

/// The same, inline for the kernels: the F16C instruction where the build has it (exact
/// for every finite value and infinities; the payload of a NaN may change, and NaN scales
/// are refused at load time), else fp16_to_float.
inline float fp16_to_float_fast(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return fp16_to_float(h);
#endif
}

/// Rows [n0, n1) of the int4 matrix `w` (w.is_int4()) as fp32, written to
/// out[(n - n0) * w.k + k]. The values are those of the formula above, whatever SIMD
/// path computes them.
void dequantize_int4_rows(const WeightMatrix& w, int n0, int n1, float* out);

}  // namespace swiftspec::cpu
