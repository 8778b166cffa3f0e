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
    throw Error(kNanLogitsMessage);
  return best;
}

void sampling_distribution(const float* logits, int vocab, const SamplingParams& params,
                           std::vector<float>& probs) {
  if (vocab < 1)  // argmax would read logits[0]
    throw InvalidArgument("sampling_distribution: the logits row is empty (vocab " + std::to_string(vocab) + ")");
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
  auto ranks_before = [&](int a, int b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
  std::vector<int> order;
  int keep_k = vocab;
  double kept_mass = 0;  // the mass top-p takes its fraction of
  if (use_top_k) {
    order.resize(vocab);
    std::iota(order.begin(), order.end(), 0);
    keep_k = params.top_k;
    std::partial_sort(order.begin(), order.begin() + keep_k, order.end(), ranks_before);
    order.resize(keep_k);
    for (int r = 0; r < keep_k; ++r) kept_mass += probs[order[r]];
  } else {
    // Top-p alone: rank only a prefix of the vocabulary. Every token of probability >= t, for
    // any t, is a prefix of the ranking; once such a prefix holds top_p of the mass, the
    // nucleus lies inside it. Sorting all 152k ids took 80 ms per token.
    for (int i = 0; i < vocab; ++i) kept_mass += probs[i];
    const float max_p = probs[argmax(probs.data(), vocab)];
    for (float t = max_p / 1024.0f;; t = t > 1e-30f ? t / 1024.0f : 0.0f) {
      order.clear();
      double mass = 0;
      for (int i = 0; i < vocab; ++i)
        if (probs[i] >= t) {
          order.push_back(i);
          mass += probs[i];
        }
      // (a hair above the threshold: the cut below sums in rank order, this sum in id order)
      if (mass >= params.top_p * kept_mass * (1.0 + 1e-9) || t == 0.0f) break;
    }
    keep_k = static_cast<int>(order.size());
    std::sort(order.begin(), order.end(), ranks_before);
  }
  int keep = keep_k;
  if (use_top_p) {
    double cum = 0;
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

int sample_from_top_k(const int32_t* ids, const float* top_logits, int k, const SamplingParams& params, Rng& rng) {
  if (k < 1) throw InvalidArgument("sample_from_top_k: k must be >= 1, got " + std::to_string(k));
  // The k entries must be what the distribution keeps: a row's min(top_k, vocab) best, largest first
  // (otherwise the draw is silently from another distribution, or NaN weights pick the last id).
  if (params.greedy())
    throw InvalidArgument("sample_from_top_k: temperature must be > 0 (greedy decoding takes ids[0]), got 0");
  if (params.top_k < 1 || k > params.top_k)
    throw InvalidArgument("sample_from_top_k: " + std::to_string(k) + " entries for top_k=" +
                          std::to_string(params.top_k) + " (give a row's min(top_k, vocab) best)");
  for (int j = 0; j < k; ++j) {
    if (ids[j] < 0)
      throw InvalidArgument("sample_from_top_k: ids[" + std::to_string(j) + "] is " + std::to_string(ids[j]) +
                            " (token ids are >= 0)");
    if (std::isnan(top_logits[j]) || (j > 0 && top_logits[j] > top_logits[j - 1]))
      throw InvalidArgument("sample_from_top_k: top_logits must be largest first without NaN, got top_logits[" +
                            std::to_string(j) + "] = " + std::to_string(top_logits[j]) +
                            (j > 0 ? " after " + std::to_string(top_logits[j - 1]) : std::string()));
  }
  if (!std::isfinite(top_logits[0]))  // every weight would be NaN
    throw Error("sample_from_top_k: the largest logit is " + std::to_string(top_logits[0]) +
                " (the model produced non-finite logits)");
  const double inv_t = 1.0 / params.temperature;
  std::vector<double> w(k);
  double total = 0;
  for (int j = 0; j < k; ++j) {
    w[j] = std::exp((static_cast<double>(top_logits[j]) - static_cast<double>(top_logits[0])) * inv_t);
    total += w[j];
  }
  int keep = k;
  if (params.top_p < 1.0f) {
    double cum = 0;
    for (int j = 0; j < k; ++j) {
      cum += w[j];
      if (cum >= params.top_p * total) {
        keep = j + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (int j = 0; j < keep; ++j) kept += w[j];
  const double u = rng.uniform() * kept;
  double cum = 0;
  for (int j = 0; j < keep; ++j) {
    cum += w[j];
    if (u < cum) return ids[j];
  }
  return ids[keep - 1];  // rounding left u at the very top
}

}  // namespace swiftspec
