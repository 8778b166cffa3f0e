// Greedy and temperature / top-k / top-p sampling.
#include "swiftspec/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include "swiftspec/error.h"

namespace swiftspec {

GivenNumber GivenNumber::real(double value) { return real(value, show_number(value)); }

GivenNumber GivenNumber::real(double value, std::string shown) {
  GivenNumber g;
  g.kind = Kind::Real;
  g.value = value;
  g.shown = std::move(shown);
  return g;
}

GivenNumber GivenNumber::integer(int64_t value) {
  GivenNumber g;
  g.kind = Kind::Integer;
  g.value = static_cast<double>(value);
  if (value >= 0) g.exact = static_cast<uint64_t>(value);
  g.shown = std::to_string(value);
  return g;
}

GivenNumber GivenNumber::integer(uint64_t value) {
  GivenNumber g;
  g.kind = Kind::Integer;
  g.value = static_cast<double>(value);
  g.exact = value;
  g.shown = std::to_string(value);
  return g;
}

namespace {

// printf's %.Ng of a number (Python's f"{x:.4g}": "3.403e+38").
std::string show_g(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}

bool is_number(const GivenNumber& g) { return g.kind != GivenNumber::Kind::Other; }

// The ranges of SamplingRequest::params; `request`: also the bounds of a request's values as the
// runtime samples with them (float32's range and normal numbers, top_k's 32 bits, the seeds' 64),
// false: only what the sampling functions need (SamplingParams::validate, whose fields hold a
// denormal temperature: the best token alone, there).
void check_ranges(const SamplingRequest& r, bool request) {
  const GivenNumber &temperature = r.temperature, &top_p = r.top_p, &top_k = r.top_k, &seed = r.seed;
  const SamplingNames& names = r.names;
  const bool explain = r.explain;
  const double float_max = std::numeric_limits<float>::max(), float_min = std::numeric_limits<float>::min();
  const std::string& t = names.temperature;
  const std::string domain =
      t + " must be a finite number >= 0" + (explain ? " (0: greedy decoding)" : "") + ", got " + temperature.shown;
  if (!is_number(temperature))
    throw InvalidArgument(explain ? domain : t + " must be a number, got " + temperature.shown);
  const double temp = temperature.value;  // an Integer is finite whatever its size
  if (!(temp >= 0) || (temperature.kind == GivenNumber::Kind::Real && std::isinf(temp))) throw InvalidArgument(domain);
  if (request && temp > float_max)
    throw InvalidArgument(t + " must be at most " + show_g(float_max, 4) + " (the runtime samples in float32), got " +
                          temperature.shown);
  if (request && temp > 0 && temp < float_min)  // float32 reads it as 0 (greedy) or a denormal: logits / T overflow
    throw InvalidArgument(t + " must be 0 (greedy decoding) or at least " + show_g(float_min, 8) +
                          " (the runtime samples in float32), got " + temperature.shown);

  const std::string& p = names.top_p;
  if (!is_number(top_p) || !(top_p.value > 0 && top_p.value <= 1)) {  // NaN fails
    if (explain) throw InvalidArgument(p + " must be a number in (0, 1] (1: off), got " + top_p.shown);
    if (!is_number(top_p)) throw InvalidArgument(p + " must be a number, got " + top_p.shown);
    throw InvalidArgument(p + " must be in (0, 1], got " + top_p.shown);
  }

  const std::string& k = names.top_k;
  if (top_k.kind != GivenNumber::Kind::Integer || top_k.value < 0)
    throw InvalidArgument(k + " must be an integer >= 0 (0: off), got " + top_k.shown);
  constexpr uint64_t top_k_max = std::numeric_limits<int32_t>::max();
  if (request && (!top_k.exact || *top_k.exact > top_k_max))
    throw InvalidArgument(k + " must be at most " + std::to_string(top_k_max) +
                          " (a 32-bit count; any top-k of at least the vocabulary keeps every token), got " +
                          top_k.shown);

  const std::string& s = names.seed;
  if (seed.kind != GivenNumber::Kind::Integer || seed.value < 0)
    throw InvalidArgument(s + " must be an integer >= 0, got " + seed.shown);
  const uint64_t seed_max = std::numeric_limits<uint64_t>::max() - (std::max<uint64_t>(r.seeds, 1) - 1);
  if (request && (!seed.exact || *seed.exact > seed_max))
    throw InvalidArgument(s + " must be at most " + std::to_string(seed_max) + " (" +
                          (r.seed_note.empty() ? "" : r.seed_note + ", ") + "a 64-bit seed), got " + seed.shown);
}

}  // namespace

void SamplingParams::validate() const {
  SamplingRequest r;
  r.temperature = GivenNumber::real(temperature, show_number(temperature));
  r.top_p = GivenNumber::real(top_p, show_number(top_p));
  r.top_k = GivenNumber::integer(int64_t{top_k});
  r.seed = GivenNumber::integer(seed);
  check_ranges(r, false);
}

SamplingParams SamplingRequest::params() const {
  check_ranges(*this, true);
  SamplingParams out;
  out.temperature = static_cast<float>(temperature.value);
  // Below float32's smallest normal number, top_p keeps the same nucleus (the most likely token
  // alone) at that number; in float32 it would be 0 or a denormal.
  const double float_min = std::numeric_limits<float>::min();
  out.top_p = top_p.value < float_min ? std::numeric_limits<float>::min() : static_cast<float>(top_p.value);
  out.top_k = static_cast<int>(*top_k.exact);
  out.seed = *seed.exact;
  return out;
}

void SamplingRequest::refuse_unused_under_greedy(const std::vector<std::string>& given) const {
  if (!is_number(temperature) || temperature.value != 0) return;
  std::vector<std::string> shown;
  for (const auto& [key, name, value] :
       {std::tuple{"top_p", &names.top_p, &top_p}, std::tuple{"top_k", &names.top_k, &top_k},
        std::tuple{"seed", &names.seed, &seed}}) {
    if (std::find(given.begin(), given.end(), key) == given.end()) continue;
    // A flag reads "--top-p 0.9", a keyword "top_p=0.9".
    shown.push_back(*name + (name->rfind("-", 0) == 0 ? " " : "=") + value->shown);
  }
  if (shown.empty()) return;
  std::string list;
  for (const std::string& one : shown) list += (list.empty() ? "" : ", ") + one;
  const bool one = shown.size() == 1;
  const std::string& t = names.temperature;
  throw InvalidArgument(list + (one ? " has" : " have") + " no effect under greedy decoding (" + t + " 0); give " + t +
                        " > 0 to sample, or drop " + (one ? "it" : "them"));
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
  if (nan) throw Error(kNanLogitsMessage);
  return best;
}

void sampling_distribution(const float* logits, int vocab, const SamplingParams& params, std::vector<float>& probs) {
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
  if (!std::isfinite(max_logit))  // every probability would be NaN (inf - inf, or -inf - -inf)
    throw Error("sampling_distribution: the largest logit is " + show_number(max_logit) +
                " (the model produced non-finite logits)");
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
    // nucleus lies inside it. Sorting the whole vocabulary cost more per token than many GPU
    // decode steps (benchmarks/README.md, "host cost of a sampled token per logits row").
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
      if (cum >= params.top_p * kept_mass) {
        keep = r + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (int r = 0; r < keep; ++r) kept += probs[order[r]];
  std::vector<float> out(vocab, 0.0f);
  for (int r = 0; r < keep; ++r) out[order[r]] = static_cast<float>(probs[order[r]] / kept);
  probs.swap(out);
}

int Rng::categorical(const float* p, int n) { return categorical_at(p, n, uniform()); }

int categorical_at(const float* p, int n, double u01) {
  double total = 0;
  for (int i = 0; i < n; ++i) total += p[i];
  double u = u01 * total, cum = 0;
  int last_nonzero = 0;
  for (int i = 0; i < n; ++i) {
    if (p[i] <= 0) continue;
    cum += p[i];
    last_nonzero = i;
    if (u < cum) return i;
  }
  return last_nonzero;  // rounding left u at the very top
}

int sample_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng, std::vector<float>& scratch) {
  if (params.greedy()) return argmax(logits, vocab);
  sampling_distribution(logits, vocab, params, scratch);
  return rng.categorical(scratch.data(), vocab);
}

namespace {

// The k entries of a row's head: distinct ids >= 0 (and < vocab when vocab >= 0), logits largest
// first, no NaN. (A repeated id was drawn with its entries' summed weight: another distribution.)
void check_head(const int32_t* ids, const float* top_logits, int k, int vocab, const char* who) {
  std::vector<std::pair<int32_t, int>> seen(k);
  for (int j = 0; j < k; ++j) seen[j] = {ids[j], j};
  std::sort(seen.begin(), seen.end());
  for (int j = 1; j < k; ++j)
    if (seen[j].first == seen[j - 1].first)
      throw InvalidArgument(std::string(who) + ": ids[" + std::to_string(seen[j].second) + "] repeats ids[" +
                            std::to_string(seen[j - 1].second) + "] = " + std::to_string(seen[j].first) +
                            " (a row's best entries name each token once)");
  for (int j = 0; j < k; ++j) {
    if (ids[j] < 0)
      throw InvalidArgument(std::string(who) + ": ids[" + std::to_string(j) + "] is " + std::to_string(ids[j]) +
                            " (token ids are >= 0)");
    if (vocab >= 0 && ids[j] >= vocab)
      throw InvalidArgument(std::string(who) + ": ids[" + std::to_string(j) + "] is " + std::to_string(ids[j]) +
                            ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    if (std::isnan(top_logits[j]) || (j > 0 && top_logits[j] > top_logits[j - 1]))
      throw InvalidArgument(std::string(who) + ": top_logits must be largest first without NaN, got top_logits[" +
                            std::to_string(j) + "] = " + show_number(top_logits[j]) +
                            (j > 0 ? " after " + show_number(top_logits[j - 1]) : std::string()));
  }
}

}  // namespace

int sample_from_top_k(const int32_t* ids, const float* top_logits, int k, const SamplingParams& params, Rng& rng) {
  if (k < 1) throw InvalidArgument("sample_from_top_k: k must be >= 1, got " + std::to_string(k));
  // The k entries must be what the distribution keeps: a row's min(top_k, vocab) best, largest first
  // (otherwise the draw is silently from another distribution, or NaN weights pick the last id).
  if (params.greedy())
    throw InvalidArgument("sample_from_top_k: temperature must be > 0 (greedy decoding takes ids[0]), got 0");
  if (params.top_k < 1 || k > params.top_k)
    throw InvalidArgument("sample_from_top_k: " + std::to_string(k) + " entries for top_k=" +
                          std::to_string(params.top_k) + " (give a row's min(top_k, vocab) best)");
  check_head(ids, top_logits, k, -1, "sample_from_top_k");
  if (!std::isfinite(top_logits[0]))  // every weight would be NaN
    throw Error("sample_from_top_k: the largest logit is " + show_number(top_logits[0]) +
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

namespace {

// Margins of sample_from_head: how close to a boundary the head's masses (double, from a
// log-normalizer good to ~1e-12 relative) may come before the whole row decides instead.
// Top-p's cut is compared with sampling_distribution's, whose probabilities are fp32 (each
// ~6e-8 relative): 1e-6 keeps both on the same side. The temperature walk is compared with its
// own full-row version in double: 1e-8.
constexpr double kTopPMargin = 1e-6;
constexpr double kWalkMargin = 1e-8;

// The temperature-only draw from the whole row: the token whose interval holds u, intervals of
// weight exp((l - max) / T) laid out with the head's k ids first (rank order), then every other
// id in id order; the last nonzero weight when rounding leaves u at the very top.
int walk_whole_row(const float* row, int vocab, const int32_t* ids, int k, double inv_t, double u) {
  const float mx = row[argmax(row, vocab)];  // (throws on NaN)
  if (!std::isfinite(mx))                    // every weight would be NaN: the last id was drawn
    throw Error("sample_from_head: the largest logit of the row is " + show_number(mx) +
                " (the model produced non-finite logits)");
  std::vector<double> w(vocab);
  double total = 0;
  for (int i = 0; i < vocab; ++i) {
    w[i] = std::exp((static_cast<double>(row[i]) - mx) * inv_t);
    total += w[i];
  }
  const double target = u * total;
  double cum = 0;
  int last = ids[0];
  std::vector<char> in_head(vocab, 0);
  for (int j = 0; j < k; ++j) {
    in_head[ids[j]] = 1;
    if (w[ids[j]] <= 0) continue;
    cum += w[ids[j]];
    last = ids[j];
    if (target < cum) return ids[j];
  }
  for (int i = 0; i < vocab; ++i) {
    if (in_head[i] || w[i] <= 0) continue;
    cum += w[i];
    last = i;
    if (target < cum) return i;
  }
  return last;
}

// c = log_normalizer - v0 / T = ln sum_v exp((l_v - v0) / T) is >= 0 for the row's own normaliser at T
// (up to rounding); below it, the normaliser is another row's or another temperature's.
void check_log_normalizer(double c, double log_normalizer, double v0_inv_t, float temperature, const char* who) {
  if (c < -1e-9 * std::max(1.0, std::fabs(log_normalizer)))
    throw InvalidArgument(std::string(who) + ": log_normalizer " + show_number(log_normalizer) +
                          " is below the largest logit / T = " + show_number(v0_inv_t) +
                          " (not the row's normaliser at temperature " + show_number(temperature) + ")");
}

// Row `row` of `top` must exist and carry its log-normalizer at inverse temperature 1 / T.
void check_head_row(const TopKLogits& top, int row, const SamplingParams& params, const char* who) {
  if (row < 0 || row >= top.rows())
    throw InvalidArgument(std::string(who) + ": row " + std::to_string(row) +
                          " is outside [0, rows=" + std::to_string(top.rows()) + ") of the top-k");
  if (static_cast<int>(top.log_normalizer.size()) != top.rows())
    throw InvalidArgument(std::string(who) + ": the top-k holds no log-normalizer (forward_top_k with_log_normalizer)");
  if (params.greedy() || top.inv_temperature != 1.0 / params.temperature)
    throw InvalidArgument(std::string(who) + ": the log-normalizer is at inverse temperature " +
                          show_number(top.inv_temperature) + ", the request samples at temperature " +
                          show_number(params.temperature) + " (forward_top_k with inv_temperature = 1 / T)");
}

// The whole logits row through `read_row`, which must hand over `vocab` entries.
void read_whole_logits_row(const LogitsRowReader& read_row, int vocab, std::vector<float>& row, const char* who) {
  read_row(row);
  if (static_cast<int>(row.size()) != vocab)
    throw InvalidArgument(std::string(who) + ": the logits row has " + std::to_string(row.size()) +
                          " entries for a vocabulary of " + std::to_string(vocab));
}

}  // namespace

int sample_from_head(const int32_t* ids, const float* top_logits, int k, double log_normalizer, int vocab,
                     const SamplingParams& params, double u, const LogitsRowReader& read_row, bool* read_whole_row) {
  const char* who = "sample_from_head";
  if (read_whole_row) *read_whole_row = false;
  if (k < 1 || k > vocab)
    throw InvalidArgument(std::string(who) + ": k must be in [1, vocab=" + std::to_string(vocab) + "], got " +
                          std::to_string(k));
  if (params.greedy())
    throw InvalidArgument(std::string(who) + ": temperature must be > 0 (greedy decoding takes ids[0]), got 0");
  if (params.top_k >= 1 && params.top_k < vocab)
    throw InvalidArgument(std::string(who) + ": top_k=" + std::to_string(params.top_k) +
                          " keeps fewer than the vocabulary (draw with sample_from_top_k)");
  if (!(u >= 0.0 && u < 1.0)) throw InvalidArgument(std::string(who) + ": u must be in [0, 1), got " + show_number(u));
  check_head(ids, top_logits, k, vocab, who);
  const double inv_t = 1.0 / params.temperature;
  const double v0 = top_logits[0];
  // c = ln sum_v exp((l_v - v0) / T) >= 0: q_j = exp((v_j - v0) / T - c)
  const double c = log_normalizer - v0 * inv_t;
  const bool usable = std::isfinite(v0) && std::isfinite(log_normalizer);
  if (usable) check_log_normalizer(c, log_normalizer, v0 * inv_t, params.temperature, who);
  auto whole_row = [&](std::vector<float>& row) {
    if (read_whole_row) *read_whole_row = true;
    read_whole_logits_row(read_row, vocab, row, who);
  };
  std::vector<float> row;
  if (params.top_p < 1.0f) {
    if (usable) {
      const double top_p = params.top_p;
      double cum = 0;
      int keep = 0;  // 0: undecided (the nucleus reaches past the head, or a mass near the cut)
      for (int j = 0; j < k; ++j) {
        cum += std::exp((static_cast<double>(top_logits[j]) - v0) * inv_t - c);
        if (cum >= top_p - kTopPMargin) {
          if (cum >= top_p + kTopPMargin) keep = j + 1;
          break;
        }
      }
      if (keep > 0) {
        double kept = 0;
        std::vector<double> w(keep);
        for (int j = 0; j < keep; ++j) kept += w[j] = std::exp((static_cast<double>(top_logits[j]) - v0) * inv_t);
        const double x = u * kept;
        double acc = 0;
        for (int j = 0; j < keep; ++j) {
          acc += w[j];
          if (x < acc) return ids[j];
        }
        return ids[keep - 1];  // rounding left x at the very top
      }
    }
    whole_row(row);
    std::vector<float> probs;
    sampling_distribution(row.data(), vocab, params, probs);
    return categorical_at(probs.data(), vocab, u);
  }
  if (usable) {
    double cum = 0;
    for (int j = 0; j < k; ++j) {
      if (j > 0 && std::fabs(u - cum) <= kWalkMargin) break;  // u near an interval's end: the row decides
      cum += std::exp((static_cast<double>(top_logits[j]) - v0) * inv_t - c);
      if (u < cum - kWalkMargin) return ids[j];
    }
    // here u >= C_k - margin: the tail, or too close to call
  }
  whole_row(row);
  return walk_whole_row(row.data(), vocab, ids, k, inv_t, u);
}

int sample_from_head(const TopKLogits& top, int row, int vocab, const SamplingParams& params, Rng& rng,
                     const LogitsRowReader& read_row, bool* read_whole_row) {
  check_head_row(top, row, params, "sample_from_head");
  const size_t e = static_cast<size_t>(row) * top.k;
  return sample_from_head(top.ids.data() + e, top.logits.data() + e, top.k, top.log_normalizer[row], vocab, params,
                          rng.uniform(), read_row, read_whole_row);
}

void top_sampling_tokens(const float* logits, int vocab, const SamplingParams& params, int count,
                         std::vector<int32_t>& tokens, std::vector<float>& probs) {
  if (count < 0) throw InvalidArgument("top_sampling_tokens: count must be >= 0, got " + std::to_string(count));
  std::vector<float> q;
  sampling_distribution(logits, vocab, params, q);
  tokens.clear();
  probs.clear();
  for (int32_t t : top_k_indices(q.data(), vocab, count))
    if (q[t] > 0.0f) {
      tokens.push_back(t);
      probs.push_back(q[t]);
    }
}

namespace {

// Margins of top_sampling_tokens_from_head. kStrictMargin: two probabilities computed from the head
// (each within 1 ulp of the host's: 1.2e-7 relative; a renormalised one within 4 ulps) are surely
// apart in the host's too when they differ by more than this, relatively. kLnZError: the relative
// error of a log-normalizer from Model::forward_top_k (its contract: 1e-12; 4x for safety).
constexpr double kStrictMargin = 1e-6;
constexpr double kLnZError = 4e-12;

// True when every double within relative `eps` of `d` rounds to the same float as `d` (no float
// rounding boundary - a midpoint between two floats - within reach); false for subnormal or zero.
bool rounds_stably(double d, double eps) {
  const float f = static_cast<float>(d);
  if (!(f >= std::numeric_limits<float>::min()) || std::isinf(f)) return false;
  const double lo = (static_cast<double>(f) + std::nextafter(f, 0.0f)) / 2;
  const double hi = (static_cast<double>(f) + std::nextafter(f, std::numeric_limits<float>::infinity())) / 2;
  return d * (1 - eps) > lo && d * (1 + eps) < hi;
}

}  // namespace

bool top_sampling_tokens_from_head(const int32_t* ids, const float* top_logits, int k, double log_normalizer, int vocab,
                                   const SamplingParams& params, int count, std::vector<int32_t>& tokens,
                                   std::vector<float>& probs) {
  const char* who = "top_sampling_tokens_from_head";
  tokens.clear();
  probs.clear();
  if (k < 1 || k > vocab)
    throw InvalidArgument(std::string(who) + ": k must be in [1, vocab=" + std::to_string(vocab) + "], got " +
                          std::to_string(k));
  if (params.greedy())
    throw InvalidArgument(std::string(who) + ": temperature must be > 0 (greedy growth takes the head's ids), got 0");
  if (count < 0) throw InvalidArgument(std::string(who) + ": count must be >= 0, got " + std::to_string(count));
  check_head(ids, top_logits, k, vocab, who);
  const double inv_t = 1.0 / params.temperature;
  const float v0 = top_logits[0];
  if (!std::isfinite(v0) || !std::isfinite(log_normalizer)) return false;  // the row decides (or throws)
  const double c = log_normalizer - static_cast<double>(v0) * inv_t;       // ln Z_T, Z_T = sum exp((l - v0) / T)
  check_log_normalizer(c, log_normalizer, v0 * inv_t, params.temperature, who);
  if (count == 0) return true;
  const double total = std::exp(c);
  const double eps = kLnZError * std::max(1.0, std::fabs(log_normalizer));
  // p[j]: sampling_distribution's untruncated probability of ids[j], rounded as it rounds it;
  // exact[j]: surely bit-identical to it (the normaliser's error cannot move the rounding)
  std::vector<float> p(k);
  std::vector<char> exact(k);
  for (int j = 0; j < k; ++j) {
    const float e = static_cast<float>(std::exp((static_cast<double>(top_logits[j]) - v0) * inv_t));
    const double d = e / total;
    p[j] = static_cast<float>(d);
    exact[j] = rounds_stably(d, eps);
  }
  // The host ranks ids[a] strictly before every token that ranks after ids[b] (a < b: p non-increasing).
  auto strictly_above = [&](int a, int b) {
    return exact[a] && exact[b] ? p[a] > p[b] : static_cast<double>(p[a]) > p[b] * (1.0 + kStrictMargin);
  };
  // The host's L best tokens are the head's first L, as a set: every token after them (the head's
  // and all outside it, whose logits are at most the head's last) has a strictly smaller p.
  auto boundary = [&](int L) { return L >= vocab || (L < k && strictly_above(L - 1, L)); };

  const bool use_top_k = params.top_k > 0 && params.top_k < vocab;
  const bool use_top_p = params.top_p < 1.0f;
  int set = vocab;         // the tokens top-k keeps (all without it)
  double kept_mass = 1.0;  // their mass, top-p's reference (the whole row's: 1 to ~1e-7)
  if (use_top_k) {
    set = params.top_k;
    if (!boundary(set)) return false;
    kept_mass = 0;
    for (int j = 0; j < set; ++j) kept_mass += p[j];
  }
  int keep = set;
  if (use_top_p) {
    const double cut = params.top_p * kept_mass, margin = kTopPMargin * kept_mass;
    double cum = 0;
    keep = 0;  // 0: undecided
    for (int j = 0; j < std::min(set, k); ++j) {
      cum += p[j];
      if (use_top_k && j == set - 1) {  // the host's sum reaches all of the kept mass here: never later
        keep = set;
        break;
      }
      if (cum >= cut - margin) {
        if (cum >= cut + margin) keep = j + 1;
        break;
      }
    }
    if (keep == 0 || !boundary(keep)) return false;
  }
  const int n = std::min(count, keep);  // the children
  // q = p renormalised over the kept tokens (none when nothing is truncated: q = p). Every value
  // returned or summed must be the host's exactly, summed in the host's order (its ranking).
  const bool renormalised = use_top_k || use_top_p;
  const int need = renormalised ? keep : n;
  if (need > k) return false;
  for (int j = 0; j < need; ++j) {
    if (!exact[j]) return false;
    if (j + 1 < need && !(p[j] > p[j + 1] || (p[j] == p[j + 1] && ids[j] < ids[j + 1]))) return false;
  }
  std::vector<float> q(need);
  if (renormalised) {
    double kept = 0;
    for (int j = 0; j < keep; ++j) kept += p[j];
    for (int j = 0; j < keep; ++j) q[j] = static_cast<float>(p[j] / kept);
  } else {
    for (int j = 0; j < n; ++j) q[j] = p[j];
  }
  // The children: the n largest q (ties to the smaller id), in that order. q is non-increasing
  // along the ranking; renormalising can merge neighbours into a tie, broken by id.
  for (int j = 0; j + 1 < n; ++j)
    if (!(q[j] > q[j + 1] || (q[j] == q[j + 1] && ids[j] < ids[j + 1]))) return false;
  if (n < keep) {  // the n-th child must beat every other kept token
    if (n >= k) return false;
    const bool above = renormalised ? q[n - 1] > q[n] : boundary(n);
    if (!above) return false;
  }
  for (int j = 0; j < n; ++j) {
    if (!(q[j] > 0.0f)) return false;  // (the host skips tokens of q 0: let it decide)
    tokens.push_back(ids[j]);
    probs.push_back(q[j]);
  }
  return true;
}

void top_sampling_tokens_from_head(const TopKLogits& top, int row, int vocab, const SamplingParams& params, int count,
                                   const LogitsRowReader& read_row, std::vector<int32_t>& tokens,
                                   std::vector<float>& probs, bool* read_whole_row) {
  const char* who = "top_sampling_tokens_from_head";
  if (read_whole_row) *read_whole_row = false;
  check_head_row(top, row, params, who);
  const size_t e = static_cast<size_t>(row) * top.k;
  if (top_sampling_tokens_from_head(top.ids.data() + e, top.logits.data() + e, top.k, top.log_normalizer[row], vocab,
                                    params, count, tokens, probs))
    return;
  if (read_whole_row) *read_whole_row = true;
  std::vector<float> whole;
  read_whole_logits_row(read_row, vocab, whole, who);
  top_sampling_tokens(whole.data(), vocab, params, count, tokens, probs);
}

}  // namespace swiftspec
