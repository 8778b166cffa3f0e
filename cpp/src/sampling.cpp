// Greedy and temperature / top-k / top-p sampling.
#include "swiftspec/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "swiftspec/error.h"

namespace swiftspec {

void SamplingParams::validate() const {
  if (std::isnan(temperature) || temperature < 0.0f || std::isinf(temperature))
    throw InvalidArgument("temperature must be a finite number >= 0, got " + std::to_string(temperature));
  if (top_k < 0) throw InvalidArgument("top_k must be >= 0 (0 disables it), got " + std::to_string(top_k));
  if (std::isnan(top_p) || top_p <= 0.0f || top_p > 1.0f)
    throw InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
}

int argmax(const float* logits, int vocab) {
  int best = 0;
  bool nan = std::isnan(logits[0]);
  for (int i = 1; i < vocab; ++i) {
    nan = nan || std::isnan(logits[i]);
    if (logits[i] > logits[best]) best = i;
  }
  // NaN compares false with everything: the "largest" logit would be an
  // arbitrary token (token 0 when all are NaN), a silently wrong answer.
  if (nan)
    throw Error("the model produced NaN logits: its weights (or inputs) hold non-finite values; check the "
                "checkpoint (e.g. convert it again)");
  return best;
}

void sampling_distribution(const float* logits, int vocab, const SamplingParams& params,
                           std::vector<float>& probs) {
  probs.assign(vocab, 0.0f);
  if (params.greedy()) {
    probs[argmax(logits, vocab)] = 1.0f;
    return;
  }
  // Softmax at temperature T, in double for a stable normaliser.
  const double inv_t = 1.0 / params.temperature;
  float max_logit = logits[argmax(logits, vocab)];
  double total = 0;
  for (int i = 0; i < vocab; ++i) {
    double p = std::exp((static_cast<double>(logits[i]) - max_logit) * inv_t);
    probs[i] = static_cast<float>(p);
    total += p;
  }
  for (int i = 0; i < vocab; ++i) probs[i] = static_cast<float>(probs[i] / total);

  const bool use_top_k = params.top_k > 0 && params.top_k < vocab;
  const bool use_top_p = params.top_p < 1.0f;
  if (!use_top_k && !use_top_p) return;

  // Rank tokens by probability (ties: smaller id first) to apply top-k then top-p.
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  const int keep_k = use_top_k ? params.top_k : vocab;
  std::partial_sort(order.begin(), order.begin() + keep_k, order.end(), [&](int a, int b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
  int keep = keep_k;
  if (use_top_p) {
    double cum = 0, kept_mass = 0;
    for (int r = 0; r < keep_k; ++r) kept_mass += probs[order[r]];
    for (int r = 0; r < keep_k; ++r) {
      cum += probs[order[r]];
      if (cum >= params.top_p * kept_mass) { keep = r + 1; break; }
    }
  }
  double kept = 0;
  for (int r = 0; r < keep; ++r) kept += probs[order[r]];
  std::vector<float> out(vocab, 0.0f);
  for (int r = 0; r < keep; ++r) out[order[r]] = static_cast<float>(probs[order[r]] / kept);
  probs.swap(out);
}

int Rng::categorical(const float* p, int n) {
  double total = 0;
  for (int i = 0; i < n; ++i) total += p[i];
  double u = uniform() * total, cum = 0;
  int last_nonzero = 0;
  for (int i = 0; i < n; ++i) {
    if (p[i] <= 0) continue;
    cum += p[i];
    last_nonzero = i;
    if (u < cum) return i;
  }
  return last_nonzero;  // rounding left u at the very top
}

int sample_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng,
                 std::vector<float>& scratch) {
  if (params.greedy()) return argmax(logits, vocab);
  sampling_distribution(logits, vocab, params, scratch);
  return rng.categorical(scratch.data(), vocab);
}

}  // namespace swiftspec
