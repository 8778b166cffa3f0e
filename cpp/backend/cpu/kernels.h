// CPU kernels of the reference backend: fp32 arithmetic, fp32 or bf16 weights.
//
// Batch invariance: every output element is computed by the same sequence of
// floating-point operations whatever the number of rows in the batch, the row
// it sits in, or the number of threads. Rows are grouped for weight reuse, but
// each row keeps its own accumulators and reduction order. This is what makes
// a token verified inside a tree bit-identical to the same token decoded alone.
#pragma once
#include <cstdint>

#include "backend/cpu/thread_pool.h"
#include "swiftspec/checkpoint.h"

namespace swiftspec::cpu {

/// A weight matrix [N, K] (row-major, out x in) in F32 or BF16, viewed in place.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int n = 0;  ///< output features
  int k = 0;  ///< input features
};

/// Y[m, n] = sum_k X[m, k] * W[n, k] (+ bias[n]) for m < rows. X fp32 [rows, K],
/// Y fp32 [rows, N], bias fp32 [N] or null. Parallel over N.
void linear(const float* x, int rows, const WeightMatrix& w, const float* bias, float* y,
            ThreadPool& pool);

/// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight, fp32 [rows, dim].
void rms_norm(const float* x, const float* weight, int rows, int dim, float eps, float* out);

/// Dot product of fp32 vectors of length n with the fixed reduction order of `linear`.
float dot(const float* a, const float* b, int n);

/// y[i] += a * x[i].
void axpy(float a, const float* x, float* y, int n);

/// Converts `n` elements of `src` (F32 or BF16) to fp32.
void to_float(const void* src, DType dtype, int64_t n, float* dst);

}  // namespace swiftspec::cpu
