// Host top-k of logits rows (top_k_logits.h) and the default Model::forward_top_k.
//
// In the model-API library (not the runtime) because the CUDA kernel core, which does not
// link the runtime, implements Model and so needs the default's definition.
#include "swiftspec/top_k_logits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "swiftspec/error.h"
#include "swiftspec/model.h"

namespace swiftspec {

std::vector<int32_t> top_k_indices(const float* values, int n, int k) {
  k = std::max(0, std::min(k, n));
  auto better = [values](int32_t a, int32_t b) { return values[a] > values[b] || (values[a] == values[b] && a < b); };
  if (k > 256) {
    // A large k (top-k sampling with top_k near the vocabulary): inserting into the sorted list
    // moves O(k) entries per token, far too slow for a 152k row at k = vocab; a partial sort is
    // O(n log k).
    std::vector<int32_t> all;
    all.reserve(n);
    for (int32_t i = 0; i < n; ++i)
      if (!std::isnan(values[i])) all.push_back(i);
    const auto kept = std::min(all.size(), static_cast<size_t>(k));
    std::partial_sort(all.begin(), all.begin() + kept, all.end(), better);
    all.resize(kept);
    return all;
  }
  std::vector<int32_t> best;  // kept sorted: largest first, ties smaller index first
  best.reserve(k + 1);
  for (int32_t i = 0; i < n && k > 0; ++i) {
    if (std::isnan(values[i])) continue;
    if (static_cast<int>(best.size()) == k && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (static_cast<int>(best.size()) > k) best.pop_back();
  }
  return best;
}

double log_normalizer(const float* values, int n, double inv_temperature) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, values[i]);
  if (mx == -std::numeric_limits<float>::infinity()) return -std::numeric_limits<double>::infinity();
  double sum = 0.0;
  // (x * 1.0 is exact: at inv_temperature 1 this is m + ln sum exp(v - m), as it always was)
  for (int i = 0; i < n; ++i) sum += std::exp((static_cast<double>(values[i]) - mx) * inv_temperature);
  return static_cast<double>(mx) * inv_temperature + std::log(sum);
}

void check_inv_temperature(double inv_temperature, const char* who) {
  if (!(inv_temperature > 0.0) || std::isinf(inv_temperature))
    throw InvalidArgument(std::string(who) + ": inv_temperature must be a finite number > 0, got " +
                          show_number(inv_temperature));
}

void check_top_k(int k, int vocab, const char* who) {
  if (k < 1 || k > vocab)
    throw InvalidArgument(std::string(who) + ": k must be in [1, vocab=" + std::to_string(vocab) + "], got " +
                          std::to_string(k));
}

void select_top_k_logits(const float* logits, int rows, int vocab, int k, bool with_log_normalizer, TopKLogits& out,
                         double inv_temperature) {
  check_top_k(k, vocab, "top-k logits");
  check_inv_temperature(inv_temperature, "top-k logits");
  out.k = k;
  out.inv_temperature = inv_temperature;
  out.ids.clear();
  out.logits.clear();
  out.log_normalizer.clear();
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + static_cast<size_t>(r) * vocab;
    if (std::any_of(row, row + vocab, [](float v) { return std::isnan(v); })) throw Error(kNanLogitsMessage);
    for (int32_t t : top_k_indices(row, vocab, k)) {
      out.ids.push_back(t);
      out.logits.push_back(row[t]);
    }
    if (with_log_normalizer) out.log_normalizer.push_back(log_normalizer(row, vocab, inv_temperature));
  }
}

void Model::forward(const ForwardBatch& batch, std::vector<float>& logits) {
  forget_kept_logits();
  run_forward(batch, logits);
}

void Model::forward_top_k(const ForwardBatch& batch, int k, bool with_log_normalizer, TopKLogits& out,
                          double inv_temperature) {
  const int vocab = config().vocab_size;
  check_top_k(k, vocab, "forward_top_k");  // before the pass: a bad k must not advance the KV cache
  check_inv_temperature(inv_temperature, "forward_top_k");
  forward(batch, kept_logits_);  // forgets the previous pass's rows first
  select_top_k_logits(kept_logits_.data(), static_cast<int>(kept_logits_.size() / vocab), vocab, k, with_log_normalizer,
                      out, inv_temperature);
  // (as the CUDA backend, which writes no logits for a lone arg-max)
  if (k == 1 && !with_log_normalizer) {
    note_no_logits_kept();
    return;
  }
  kept_rows_ = static_cast<int>(kept_logits_.size() / vocab);
  kept_state_ = KeptState::Kept;
}

void Model::read_logits_row(int row, std::vector<float>& out) {
  switch (kept_state_) {
    case KeptState::NeverRan:
      throw InvalidArgument("read_logits_row: no forward_top_k has run on this model yet");
    case KeptState::Forgotten:
      throw InvalidArgument(
          "read_logits_row: a later pass of this model replaced the logits of its last forward_top_k");
    case KeptState::NoneKept:
      throw InvalidArgument("read_logits_row: the last forward_top_k (k = 1 without log-normalizer) kept no logits");
    case KeptState::Kept:
      break;
  }
  if (row < 0 || row >= kept_rows_)
    throw InvalidArgument("read_logits_row: row " + std::to_string(row) +
                          " is outside [0, rows=" + std::to_string(kept_rows_) + ") of the last forward_top_k");
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  const float* src = kept_logits_.data() + static_cast<size_t>(row) * vocab;
  out.assign(src, src + vocab);
}

}  // namespace swiftspec
