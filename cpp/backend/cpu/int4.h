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

// Block order. The low nibbles of 16 packed bytes are the even elements of a 32-element
// block, the high nibbles the odd ones; a kernel that keeps them apart (instead of
// interleaving them back, one shuffle per 16 values) reduces the K axis in *block order*:
// within each block of 32, elements 0, 2, ..., 30, then 1, 3, ..., 31. The activations are
// put in the same order (block_order_rows), so the products are the same; only the order of
// the sum differs from the natural one, identically for every batch size.

/// Whether `linear` over `w` reduces in block order: int4 with a group size that is a
/// multiple of 32 (so every 32-element block has one scale and one zero point).
inline bool int4_block_order(const WeightMatrix& w) { return w.is_int4() && w.group_size % 32 == 0; }

/// dequantize_int4_rows in block order: out[(n - n0) * k + 32t + p] is element 32t + 2p
/// for p < 16 and element 32t + 2(p - 16) + 1 for p >= 16. Needs int4_block_order(w).
void dequantize_int4_rows_block_order(const WeightMatrix& w, int n0, int n1, float* out);

/// The rows of x (fp32 [rows, k], k a multiple of 32) in block order, into out [rows, k].
void block_order_rows(const float* x, int rows, int k, float* out);

}  // namespace swiftspec::cpu
