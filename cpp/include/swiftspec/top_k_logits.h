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
  int k = 0;                  ///< entries per row (k >= 1 once filled)
  std::vector<int32_t> ids;   ///< [rows, k] token ids, largest logit first; ties: smaller id first
  std::vector<float> logits;  ///< [rows, k] their logits (the values Model::forward returns)
  /// [rows] ln sum_v exp(logit_v * inv_temperature), or empty when not asked for
  std::vector<double> log_normalizer;
  /// The inverse temperature 1 / T the log-normalizer is at (1: the logits' own softmax). With it,
  /// exp(logit * inv_temperature - log_normalizer) is a token's probability under softmax(logits / T).
  double inv_temperature = 1.0;
  int rows() const { return k > 0 ? static_cast<int>(ids.size()) / k : 0; }
};

/// The `k` largest entries of `values` [n] as indices, largest first (ties:
/// smaller index first); fewer when n < k. NaN entries are never selected
/// (callers that must refuse NaN check for it: select_top_k_logits does).
std::vector<int32_t> top_k_indices(const float* values, int n, int k);

/// ln sum_i exp(values[i] * inv_temperature) of `values` [n] (n >= 1), computed as
/// m * inv_temperature + ln sum exp((v - m) * inv_temperature) in double with m the largest value;
/// -inf when every value is -inf. inv_temperature = 1 (default): ln sum exp(v), bit-identical to
/// what it was before the argument existed.
double log_normalizer(const float* values, int n, double inv_temperature = 1.0);

/// Throws InvalidArgument "<who>: inv_temperature must be a finite number > 0, got <x>" otherwise.
void check_inv_temperature(double inv_temperature, const char* who);

/// Throws InvalidArgument "<who>: k must be in [1, vocab=<vocab>], got <k>" unless 1 <= k <= vocab.
void check_top_k(int k, int vocab, const char* who);

/// The host reference of Model::forward_top_k: fills `out` from fp32 `logits`
/// [rows, vocab] (row-major) with each row's top_k_indices(row, vocab, k), their
/// values and, when `with_log_normalizer`, log_normalizer(row, vocab, inv_temperature).
/// Throws InvalidArgument for k outside [1, vocab] or a bad inv_temperature, Error when a row
/// holds NaN (the message of swiftspec::argmax: a silently wrong token otherwise).
void select_top_k_logits(const float* logits, int rows, int vocab, int k, bool with_log_normalizer, TopKLogits& out,
                         double inv_temperature = 1.0);

}  // namespace swiftspec
