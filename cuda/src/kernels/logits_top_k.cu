// Per-row top-k and log-normalizer of the fp32 logits a step wrote (Model::forward_top_k on
// the GPU; why: cpp/include/swiftspec/top_k_logits.h).
//
// Two launches, both deterministic (no atomics; every reduction in a fixed order):
//   pass 1, grid (kTopKSegments, rows) x 256 threads: a CTA scans one segment of a row. Each
//     thread keeps its k best (value, id) keys in registers, then the CTA merges them in k
//     rounds of a block-wide max; the segment's max m and sum of exp(x - m) (double) follow
//     in a second sweep over the same (L1-resident) segment;
//   pass 2, one warp per row: the segments' keys merged in k rounds of a warp max, and their
//     (m, sum) pairs combined in segment order: ln Z = M + ln sum_s sum_s * exp(m_s - M).
// The normaliser is at an inverse temperature b (1 / T; 1 by default): every exp(x - m) above
// is exp((x - m) * b) and ln Z_b = M * b + ln sum_s sum_s * exp((m_s - M) * b) (the maxima stay
// those of the raw logits: b > 0 keeps the order). At b = 1 each product is exact, so the result
// is bit-identical to the normaliser before b existed; the k selection never reads b.
// Keys are argmax_key()s (common.h): larger value first, ties to the smaller id, exactly the
// host's top_k_indices order; the values returned are re-read from the logits, so they are
// bit-identical to what forward() copies out. A NaN anywhere in a row sets its `nan` flag.
#include <cfloat>
#include <cmath>

#include "common.h"
#include "kernels/kernels.h"

namespace swiftspec::cuda {

namespace {

constexpr int kTopKThreads = 256;

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// Sweep 2 of a segment, shared by both pass-1 kernels: its max m (from the threads' maxima `mx`)
// and the sum of exp((x - m) * inv_t) in double, reduced in a fixed order, into *out.
__device__ void segment_lse_partial(const float* __restrict__ x, int begin, int end, float mx, double inv_t,
                                    double2* out) {
  __shared__ float warp_mx[kTopKThreads / 32];
  __shared__ double warp_sum[kTopKThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  if (lane == 0) warp_mx[warp] = mx;
  __syncthreads();
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kTopKThreads / 32; ++i) m = fmaxf(m, warp_mx[i]);
  double sum = 0.0;
  if (m != -INFINITY) {
    for (int i = begin + tid; i < end; i += kTopKThreads) {
      const float v = x[i];
      if (v == v) sum += exp((static_cast<double>(v) - static_cast<double>(m)) * inv_t);
    }
  }
  sum = warp_sum_f64(sum);
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  if (tid == 0) {
    double total = 0.0;
    for (int i = 0; i < kTopKThreads / 32; ++i) total += warp_sum[i];  // fixed order
    *out = make_double2(static_cast<double>(m), total);
  }
}

// Pass 1 for k <= kTopKListMax: kTopKListSegments CTAs per row; per-thread k-best lists in
// registers merged in k rounds of a block max.
__global__ void __launch_bounds__(kTopKThreads)
    top_k_lists_kernel(const float* __restrict__ logits, int vocab, int k, int with_lse, double inv_t,
                       unsigned long long* __restrict__ part_keys, double2* __restrict__ part_ms,
                       int* __restrict__ part_nan) {
  __shared__ unsigned long long cand[kTopKThreads * kTopKListMax];
  __shared__ unsigned long long warp_best[kTopKThreads / 32];
  constexpr int S = kTopKListSegments;
  const int seg = blockIdx.x, row = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int seg_len = (vocab + S - 1) / S;
  const int begin = seg * seg_len, end = min(vocab, begin + seg_len);
  const float* x = logits + static_cast<size_t>(row) * vocab;

  // Sweep 1: the thread's k best keys (descending; 0 = empty, below every real key), max, NaN.
  unsigned long long best[kTopKListMax];
#pragma unroll
  for (int j = 0; j < kTopKListMax; ++j) best[j] = 0ull;
  unsigned long long kth = 0ull;  // best[k - 1], kept apart: a dynamic index would spill `best`
  float mx = -INFINITY;
  int nan = 0;
  for (int i = begin + tid; i < end; i += kTopKThreads) {
    const float v = x[i];
    if (v != v) {
      nan = 1;
      continue;
    }
    mx = fmaxf(mx, v);
    unsigned long long key = argmax_key(v, i);
    if (key <= kth) continue;
#pragma unroll
    for (int j = 0; j < kTopKListMax; ++j) {  // insertion: the displaced key moves down
      if (j < k && key > best[j]) {
        const unsigned long long t = best[j];
        best[j] = key;
        key = t;
      }
      if (j == k - 1) kth = best[j];
    }
  }
  nan = __syncthreads_or(nan);

  // The CTA's k best: k rounds of a block max over each thread's next unused key.
#pragma unroll
  for (int j = 0; j < kTopKListMax; ++j)
    if (j < k) cand[tid * k + j] = best[j];
  int head = 0;
  unsigned long long* out_keys = part_keys + (static_cast<size_t>(row) * S + seg) * kTopKMax;
  for (int r = 0; r < k; ++r) {
    __syncthreads();
    const unsigned long long mine = head < k ? cand[tid * k + head] : 0ull;
    const unsigned long long w = warp_max_u64(mine);
    if (lane == 0) warp_best[warp] = w;
    __syncthreads();
    unsigned long long top = warp_best[0];
#pragma unroll
    for (int i = 1; i < kTopKThreads / 32; ++i) top = warp_best[i] > top ? warp_best[i] : top;
    if (top != 0ull && mine == top) ++head;  // keys are unique (the id is in them)
    if (tid == 0) out_keys[r] = top;
  }
  if (tid == 0) part_nan[row * S + seg] = nan;
  if (with_lse) segment_lse_partial(x, begin, end, mx, inv_t, &part_ms[row * S + seg]);
}

// Descending bitonic sort of `n` (a power of two) keys in shared memory by the whole CTA.
__device__ void bitonic_sort_desc(unsigned long long* s, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const bool desc = (lo & size) == 0;  // blocks alternate; the last stage is all descending
        const unsigned long long a = s[lo], b = s[hi];
        if ((a < b) == desc && a != b) {
          s[lo] = b;
          s[hi] = a;
        }
      }
    }
  }
  __syncthreads();
}

// Pass 1 for kTopKListMax < k <= kTopKMax: kTopKSortSegments CTAs per row, each sorts its
// segment's keys (<= kTopKSortKeys) in shared memory and keeps the first k.
__global__ void __launch_bounds__(kTopKThreads)
    top_k_sort_kernel(const float* __restrict__ logits, int vocab, int k, int with_lse, double inv_t,
                      unsigned long long* __restrict__ part_keys, double2* __restrict__ part_ms,
                      int* __restrict__ part_nan) {
  __shared__ unsigned long long keys[kTopKSortKeys];
  constexpr int S = kTopKSortSegments;
  const int seg = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
  const int seg_len = (vocab + S - 1) / S;
  const int begin = seg * seg_len, end = min(vocab, begin + seg_len);
  const float* x = logits + static_cast<size_t>(row) * vocab;
  float mx = -INFINITY;
  int nan = 0;
  for (int j = tid; j < kTopKSortKeys; j += kTopKThreads) {
    const int i = begin + j;
    unsigned long long key = 0ull;  // padding and NaN: below every real key
    if (i < end) {
      const float v = x[i];
      if (v != v) {
        nan = 1;
      } else {
        mx = fmaxf(mx, v);
        key = argmax_key(v, i);
      }
    }
    keys[j] = key;
  }
  nan = __syncthreads_or(nan);
  bitonic_sort_desc(keys, kTopKSortKeys);
  unsigned long long* out_keys = part_keys + (static_cast<size_t>(row) * S + seg) * kTopKMax;
  for (int r = tid; r < k; r += kTopKThreads) out_keys[r] = keys[r];
  if (tid == 0) part_nan[row * S + seg] = nan;
  if (with_lse) segment_lse_partial(x, begin, end, mx, inv_t, &part_ms[row * S + seg]);
}

// The row's NaN flag and log-normalizer from its `segments` partials, in segment order.
__device__ void finish_row(int row, int segments, int with_lse, double inv_t, const double2* __restrict__ part_ms,
                           const int* __restrict__ part_nan, TopKRow& o) {
  int nan = 0;
  for (int s = 0; s < segments; ++s) nan |= part_nan[row * segments + s];
  o.nan = nan;
  double lse = 0.0;
  if (with_lse) {
    const double2* ms = part_ms + row * segments;
    double M = -INFINITY;
    for (int s = 0; s < segments; ++s) M = fmax(M, ms[s].x);
    if (M == -INFINITY) {
      lse = -INFINITY;
    } else {
      double total = 0.0;
      for (int s = 0; s < segments; ++s)
        if (ms[s].x != -INFINITY) total += ms[s].y * exp((ms[s].x - M) * inv_t);
      lse = M * inv_t + log(total);
    }
  }
  o.log_normalizer = lse;
}

// Pass 2 after top_k_lists_kernel: one warp per row, k rounds of a warp max over the segments' keys.
__global__ void top_k_merge_lists_kernel(const float* __restrict__ logits, int vocab, int k, int with_lse, double inv_t,
                                         const unsigned long long* __restrict__ part_keys,
                                         const double2* __restrict__ part_ms, const int* __restrict__ part_nan,
                                         TopKRow* __restrict__ out) {
  const int row = blockIdx.x, lane = threadIdx.x;
  constexpr int S = kTopKListSegments;
  const unsigned long long* keys = part_keys + static_cast<size_t>(row) * S * kTopKMax;
  TopKRow& o = out[row];
  // Round r: the largest key below the previous winner (keys are unique).
  unsigned long long below = ~0ull;
  for (int r = 0; r < k; ++r) {
    unsigned long long mine = 0ull;
    for (int c = lane; c < S * kTopKMax; c += 32) {
      if (c % kTopKMax >= k) continue;  // the segment wrote only k keys
      const unsigned long long key = keys[c];
      if (key < below && key > mine) mine = key;
    }
    const unsigned long long top = warp_max_u64(mine);
    below = top;
    if (lane == 0) {
      // top == 0: fewer than k non-NaN entries in the row (only possible with NaN: flagged below)
      const int id = top == 0ull ? 0 : argmax_key_index(top);
      o.ids[r] = id;
      o.values[r] = logits[static_cast<size_t>(row) * vocab + id];
    }
  }
  if (lane == 0) finish_row(row, S, with_lse, inv_t, part_ms, part_nan, o);
}

// Pass 2 after top_k_sort_kernel: one CTA per row sorts the segments' k best (<= kTopKSortKeys).
__global__ void __launch_bounds__(kTopKThreads)
    top_k_merge_sorted_kernel(const float* __restrict__ logits, int vocab, int k, int with_lse, double inv_t,
                              const unsigned long long* __restrict__ part_keys, const double2* __restrict__ part_ms,
                              const int* __restrict__ part_nan, TopKRow* __restrict__ out) {
  __shared__ unsigned long long keys[kTopKSortKeys];
  constexpr int S = kTopKSortSegments;
  static_assert(S * kTopKMax <= kTopKSortKeys, "the merge sorts every segment's k best at once");
  const int row = blockIdx.x, tid = threadIdx.x;
  const unsigned long long* src = part_keys + static_cast<size_t>(row) * S * kTopKMax;
  for (int c = tid; c < kTopKSortKeys; c += kTopKThreads)
    keys[c] = (c < S * kTopKMax && c % kTopKMax < k) ? src[c] : 0ull;
  bitonic_sort_desc(keys, kTopKSortKeys);
  TopKRow& o = out[row];
  for (int r = tid; r < k; r += kTopKThreads) {
    const unsigned long long top = keys[r];
    const int id = top == 0ull ? 0 : argmax_key_index(top);
    o.ids[r] = id;
    o.values[r] = logits[static_cast<size_t>(row) * vocab + id];
  }
  if (tid == 0) finish_row(row, S, with_lse, inv_t, part_ms, part_nan, o);
}

}  // namespace

bool logits_top_k_supported(int k, int vocab) {
  return k >= 1 && k <= kTopKMax && vocab >= kTopKMinVocab &&
         (k <= kTopKListMax || vocab <= kTopKSortSegments * kTopKSortKeys);
}

void launch_logits_top_k(const float* logits, int rows, int vocab, int k, bool with_log_normalizer,
                         const TopKScratch& scratch, TopKRow* out, cudaStream_t stream, double inv_temperature) {
  if (rows < 1 || rows > kMaxStepTokens || !logits_top_k_supported(k, vocab))
    throw InvalidArgument(
        "launch_logits_top_k: rows " + std::to_string(rows) + " (1.." + std::to_string(kMaxStepTokens) + "), k " +
        std::to_string(k) + " (1.." + std::to_string(kTopKMax) + "), vocab " + std::to_string(vocab) +
        " (>= " + std::to_string(kTopKMinVocab) + "; <= " + std::to_string(kTopKSortSegments * kTopKSortKeys) +
        " for k > " + std::to_string(kTopKListMax) + ")");
  if (!(inv_temperature > 0.0) || std::isinf(inv_temperature))
    throw InvalidArgument("launch_logits_top_k: inv_temperature must be a finite number > 0, got " +
                          std::to_string(inv_temperature));
  const int lse = with_log_normalizer ? 1 : 0;
  const double b = inv_temperature;
  if (k <= kTopKListMax) {
    top_k_lists_kernel<<<dim3(kTopKListSegments, rows), kTopKThreads, 0, stream>>>(
        logits, vocab, k, lse, b, scratch.part_keys, scratch.part_ms, scratch.part_nan);
    SS_CUDA_CHECK_LAUNCH("top_k_lists_kernel");
    top_k_merge_lists_kernel<<<rows, 32, 0, stream>>>(logits, vocab, k, lse, b, scratch.part_keys, scratch.part_ms,
                                                      scratch.part_nan, out);
    SS_CUDA_CHECK_LAUNCH("top_k_merge_lists_kernel");
    return;
  }
  top_k_sort_kernel<<<dim3(kTopKSortSegments, rows), kTopKThreads, 0, stream>>>(
      logits, vocab, k, lse, b, scratch.part_keys, scratch.part_ms, scratch.part_nan);
  SS_CUDA_CHECK_LAUNCH("top_k_sort_kernel");
  top_k_merge_sorted_kernel<<<rows, kTopKThreads, 0, stream>>>(logits, vocab, k, lse, b, scratch.part_keys,
                                                               scratch.part_ms, scratch.part_nan, out);
  SS_CUDA_CHECK_LAUNCH("top_k_merge_sorted_kernel");
}

}  // namespace swiftspec::cuda
