// Launchers of the non-GEMM kernels of the CUDA backend. All launch on the
// given stream (graph-capturable) and throw CudaError on a launch failure.
// Dtypes: bf16 = __nv_bfloat16. Shapes are given per argument.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention.h"
#include "step_desc.h"

namespace swiftspec::cuda {

/// K slices (1..8) of an N x K GEMM: a function of the matrix shape only, so
/// that results do not depend on the batch size (see gemm_slices.cu).
int gemm_slices(int N, int K);

// ---------------------------------------------------------------------------
// embedding.cu
// ---------------------------------------------------------------------------
/// h32[m] = float(table[token_m]), h16[m] = table[token_m], ssq[m][t] = sum of
/// squares of columns 16t..16t+15 (fp32, in column order), for m < desc->n;
/// rows n..rows-1 are zeroed. Also zeroes the 64 arg-max keys of the step.
/// table [vocab][hidden] bf16; h32 [64][hidden]; h16 [64][hidden]; ssq [64][hidden/16].
/// `gamma` (fp32 [hidden], or null): int4 models, whose first RMSNorm weight cannot be
/// folded into the QKV weights, get h16[m][k] = bf16(h32[m][k] * gamma[k]) instead
/// (EpiResidualNormed, epilogues.h).
void launch_embedding(const __nv_bfloat16* table, int hidden, const StepDesc* desc, int rows, float* h32,
                      __nv_bfloat16* h16, float* ssq, unsigned long long* argmax_keys, cudaStream_t stream,
                      const float* gamma = nullptr);

// ---------------------------------------------------------------------------
// logits_top_k.cu — Model::forward_top_k on the GPU: each logits row's k best
// (value, id) and its log-normalizer, without copying the row to the host.
// ---------------------------------------------------------------------------
/// The most entries per row selected on the GPU (larger k: the host path).
constexpr int kTopKMax = 64;
/// k <= kTopKListMax: kTopKListSegments CTAs per row keep per-thread k-best lists in registers.
constexpr int kTopKListMax = 16;
constexpr int kTopKListSegments = 16;
/// Larger k: kTopKSortSegments CTAs per row sort their segment (<= kTopKSortKeys keys) in shared
/// memory; the merge sorts the segments' k best (kTopKSortSegments * kTopKMax <= kTopKSortKeys).
constexpr int kTopKSortSegments = 64;
constexpr int kTopKSortKeys = 4096;
/// The smallest vocabulary the GPU selection takes (smaller: the host path).
constexpr int kTopKMinVocab = 64;
/// Largest segment count of either pass (scratch sizing).
constexpr int kTopKSegments = kTopKSortSegments;

/// One row's result (device memory, copied to the host as a block).
struct TopKRow {
  int ids[kTopKMax];       ///< the k best ids, largest logit first, ties to the smaller id
  float values[kTopKMax];  ///< their logits, bit-identical to the logits buffer
  double log_normalizer;   ///< ln sum_v exp(logit_v * inv_temperature) (0 when not asked for)
  int nan;                 ///< 1 when the row holds a NaN (ids / values are then meaningless)
  int pad;
};

/// Scratch of launch_logits_top_k, sized for kMaxStepTokens rows.
struct TopKScratch {
  unsigned long long* part_keys = nullptr;  ///< [kMaxStepTokens][kTopKSegments][kTopKMax]
  double2* part_ms = nullptr;               ///< [kMaxStepTokens][kTopKSegments] (max, sum exp(x - max))
  int* part_nan = nullptr;                  ///< [kMaxStepTokens][kTopKSegments]
};

/// Whether launch_logits_top_k takes k for a vocabulary of `vocab` (otherwise select on the host).
bool logits_top_k_supported(int k, int vocab);

/// out[r] = the top-k and log-normalizer (when asked; at `inv_temperature`: ln sum exp(x / T)
/// for inv_temperature = 1 / T) of logits row r, r < rows, of fp32 `logits` [rows][vocab].
/// Deterministic; inv_temperature = 1 is bit-identical to the normaliser without the argument
/// (x * 1.0 is exact), and the selection never depends on it. Throws InvalidArgument unless
/// 1 <= rows <= kMaxStepTokens, 1 <= k <= kTopKMax and vocab >= kTopKMinVocab (and, for
/// k > kTopKListMax, vocab <= kTopKSortSegments * kTopKSortKeys = 262144), or for an
/// inv_temperature that is not finite and > 0.
void launch_logits_top_k(const float* logits, int rows, int vocab, int k, bool with_log_normalizer,
                         const TopKScratch& scratch, TopKRow* out, cudaStream_t stream, double inv_temperature = 1.0);

// ---------------------------------------------------------------------------
// kv_cache.cu
// ---------------------------------------------------------------------------
/// For every layer and kv head: cache[dst0 + i] = cache[src_index[i]], i < n,
/// for K and V. cache layout [layers][kv_heads][slots][head_dim] bf16.
void launch_kv_copy(__nv_bfloat16* kcache, __nv_bfloat16* vcache, int layers, int kv_heads, int slots, int head_dim,
                    const int* src_index, int n, int dst0, cudaStream_t stream);
/// Fills slots [0, len) of every layer / kv head with random bf16 in (-1, 1).
void launch_kv_fill_random(__nv_bfloat16* kcache, __nv_bfloat16* vcache, int layers, int kv_heads, int slots,
                           int head_dim, int len, uint64_t seed, cudaStream_t stream);

// ---------------------------------------------------------------------------
// weights.cu
// ---------------------------------------------------------------------------
enum class SrcType { F32 = 0, BF16 = 1, F16 = 2 };
/// dst[n][k] = bf16(float(src[perm ? perm[n] : n][k]) * (gamma ? gamma[k] : 1)).
/// src [*][K] of type `st` (device memory), dst [N][K], perm [N] int (device) or
/// null, gamma [K] fp32 (device) or null.
void launch_weight_transform(const void* src, SrcType st, __nv_bfloat16* dst, int N, int K, const int* perm,
                             const float* gamma, cudaStream_t stream);
/// dst[i] = bf16(scale * u_i), u_i uniform in (-1, 1) \ (-0.05, 0.05), from a
/// counter-based hash of (seed, i): never zero.
void launch_fill_random_bf16(__nv_bfloat16* dst, size_t count, float scale, uint64_t seed, cudaStream_t stream);
/// Same for fp32.
void launch_fill_random_f32(float* dst, size_t count, float scale, uint64_t seed, cudaStream_t stream);

}  // namespace swiftspec::cuda
