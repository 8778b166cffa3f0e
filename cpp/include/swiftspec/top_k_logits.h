// The k largest logits of each row, and each row's log-normalizer: all that greedy
// decoding, greedy verification and top-k tree growth read of a logits row.
//
// Model::forward_top_k (model.h) returns this instead of the [rows, vocab] logits, so a
// backend can select on its device: at a 152k vocabulary a row is 608 KB of fp32, which
// on the CUDA backend would cross PCIe and then be scanned on the host (an exp per entry
// for the normalizer) — more time per draft step than the step itself (benchmarks/README.md,
// "top-k on the GPU").
#pragma once
#include <cstdint>
#include <vector>

namespace swiftspec {

/// The top-k of `rows` logits rows.
struct TopKLogits {
  int k = 0;                           ///< entries per row (k >= 1 once filled)
  std::vector<int32_t> ids;            ///< [rows, k] token ids, largest logit first; ties: smaller id first
  std::vector<float> logits;           ///< [rows, k] their logits (the values Model::forward returns)
  std::vector<double> log_normalizer;  ///< [rows] ln sum_v exp(logit_v), or empty when not asked for
  int rows() const { return k > 0 ? static_cast<int>(ids.size()) / k : 0; }
};

/// The `k` largest entries of `values` [n] as indices, largest first (ties:
/// smaller index first); fewer when n < k. NaN entries are never selected
/// (callers that must refuse NaN check for it: select_top_k_logits does).
std::vector<int32_t> top_k_indices(const float* values, int n, int k);

/// ln sum_i exp(values[i]) of `values` [n] (n >= 1), computed as m + ln sum exp(v - m) in
/// double with m the largest value; -inf when every value is -inf.
double log_normalizer(const float* values, int n);

/// Throws InvalidArgument "<who>: k must be in [1, vocab=<vocab>], got <k>" unless 1 <= k <= vocab.
void check_top_k(int k, int vocab, const char* who);

/// The host reference of Model::forward_top_k: fills `out` from fp32 `logits`
/// [rows, vocab] (row-major) with each row's top_k_indices(row, vocab, k), their
/// values and, when `with_log_normalizer`, log_normalizer(row, vocab).
/// Throws InvalidArgument for k outside [1, vocab], Error when a row holds NaN
/// (the message of swiftspec::argmax: a silently wrong token otherwise).
void select_top_k_logits(const float* logits, int rows, int vocab, int k, bool with_log_normalizer,
                         TopKLogits& out);

}  // namespace swiftspec
