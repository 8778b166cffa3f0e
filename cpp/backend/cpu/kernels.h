// CPU kernels of the reference backend: fp32 arithmetic, fp32 or bf16 weights.
//
// Batch invariance: every output element is computed by the same sequence of
// floating-point operations whatever the number of rows in the batch, the row
// it sits in, or the number of threads. Rows are grouped for weight reuse, but
// each row keeps its own accumulators and reduction order. This is what makes
// a token verified inside a tree bit-identical to the same token decoded alone.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "swiftspec/checkpoint.h"
#include "swiftspec/model.h"

namespace swiftspec::cpu {

/// A weight matrix [N, K] (row-major, out x in), viewed in place: F32 or BF16 values, or
/// int4 (group_size > 0; docs/checkpoint_format.md "int4 weights"): `data` then points at
/// the packed values U8 [N, K/2] (byte j of a row: element 2j in the low nibble, 2j+1 in
/// the high one), `scales` at fp16 bits [N, K/group_size], `zeros` at U8 [N, K/group_size]
/// (each 0..15), and element (n, k) is (q - zeros[n, k/G]) * scales[n, k/G] in fp32.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;          ///< F32 or BF16; U8 for int4
  int n = 0;                         ///< output features
  int k = 0;                         ///< input features
  const uint16_t* scales = nullptr;  ///< int4 only: fp16 bit patterns [n, k/group_size]
  const uint8_t* zeros = nullptr;    ///< int4 only: zero points [n, k/group_size]
  int group_size = 0;                ///< int4 only: K elements per scale; 0 for F32/BF16
  bool is_int4() const { return group_size > 0; }
};

/// Y[m, n] = sum_k X[m, k] * W[n, k] (+ bias[n]) for m < rows. X fp32 [rows, K],
/// Y fp32 [rows, N], bias fp32 [N] or null. Parallel over N. An int4 W is dequantized to
/// fp32 (in registers for up to 4 rows when the build has AVX-512; else 8 weight rows at a
/// time into a buffer) and reduced as an F32 W would be, over K in block order (int4.h)
/// when its group size is a multiple of 32, in natural order otherwise: the result is
/// bit-identical to `linear` over the dequantized F32 matrix with X and W in that K order,
/// whatever the number of rows, so int4 keeps the batch invariance of the F32/BF16 paths.
void linear(const float* x, int rows, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool);

/// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight, fp32 [rows, dim].
void rms_norm(const float* x, const float* weight, int rows, int dim, float eps, float* out);

/// Dot product of fp32 vectors of length n with the fixed reduction order of `linear`.
float dot(const float* a, const float* b, int n);

/// y[i] += a * x[i].
void axpy(float a, const float* x, float* y, int n);

/// The keys and values one query row attends, fp32, row j of a cache at j * stride floats, the
/// pointers already offset to the row's KV head. The row's keys in order are the committed rows
/// [0, n_committed) and then the tree rows tree_slots[0 .. n_tree) (its ancestors and itself);
/// of that sequence it attends [0, sink_end) and [recent_begin, n_committed + n_tree) (all of it
/// under full attention; an attention window, swiftspec::key_window, leaves out the middle).
struct AttendedKeys {
  const float* k_committed;
  const float* v_committed;
  int n_committed;
  const float* k_tree;
  const float* v_tree;
  const int* tree_slots;
  int n_tree;
  int sink_end, recent_begin;
  size_t stride;
};

/// The keys row `i` of `batch` attends in KV head `kv_head` (committed_before keys committed
/// before the batch; a tree row's ancestors from attend_slots), under `options`' attention
/// window (swiftspec::key_window). The caches hold head_dim floats per KV head, `stride` per row.
AttendedKeys row_keys(const ForwardBatch& batch, int i, int committed_before, const ModelOptions& options,
                      const float* k_committed, const float* v_committed, const float* k_tree, const float* v_tree,
                      int kv_head, int head_dim, size_t stride);

/// out[hd] = sum_j softmax_j(q . k_j * scale) v_j over the attended keys of `keys` in their
/// order, fp32: scores by `dot`, one max, exp and sum in key order, values added by `axpy` in
/// key order, so a row's result depends on its keys only, not on its batch. `scores` is scratch.
void attend_row(const float* q, int hd, float scale, const AttendedKeys& keys, std::vector<float>& scores, float* out);

/// Converts `n` elements of `src` (F32 or BF16) to fp32.
void to_float(const void* src, DType dtype, int64_t n, float* dst);

}  // namespace swiftspec::cpu
