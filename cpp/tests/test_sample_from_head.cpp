// sample_from_head (sampling.h): temperature / top-p draws from a row's k best logits and its
// normaliser at T, the whole row read only when they do not decide. Synthetic rows here (the
// real-logits checks are in tests/test_sampling.py).
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "swiftspec/error.h"
#include "swiftspec/sampling.h"
#include "swiftspec/top_k_logits.h"
#include "test_framework.h"

namespace swiftspec {
namespace {

struct Head {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  double lse = 0;
};

Head head_of(const std::vector<float>& row, int k, double inv_t) {
  TopKLogits top;
  select_top_k_logits(row.data(), 1, static_cast<int>(row.size()), k, true, top, inv_t);
  return {top.ids, top.logits, top.log_normalizer[0]};
}

std::vector<float> synthetic_row(int vocab, float scale, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> row(vocab);
  for (auto& x : row) x = nd(g);
  return row;
}

// Stratified u (u_i = (i + 0.5) / n): each token's frequency is its interval's length to 1 / n.
void check_stratified(const std::vector<float>& row, const SamplingParams& p, int k, int n, int* reads_out) {
  const int vocab = static_cast<int>(row.size());
  const Head h = head_of(row, k, 1.0 / p.temperature);
  std::vector<float> want;
  sampling_distribution(row.data(), vocab, p, want);
  std::vector<int> count(vocab, 0);
  int reads = 0;
  for (int i = 0; i < n; ++i) {
    bool read = false;
    const int t = sample_from_head(
        h.ids.data(), h.vals.data(), k, h.lse, vocab, p, (i + 0.5) / n, [&](std::vector<float>& r) { r = row; }, &read);
    ++count[t];
    reads += read ? 1 : 0;
  }
  for (int t = 0; t < vocab; ++t) {
    const double err = std::fabs(count[t] / static_cast<double>(n) - want[t]);
    if (!(err <= 1.0 / n + 1e-6))
      throw test::Failure("token " + std::to_string(t) + ": frequency " + std::to_string(count[t] / double(n)) +
                          " vs probability " + std::to_string(want[t]));
  }
  *reads_out = reads;
}

}  // namespace

SWIFTSPEC_TEST(sample_from_head_log_normalizer_at_a_temperature) {
  const std::vector<float> row = synthetic_row(3000, 4.f, 1);
  for (double inv_t : {1.0, 1.0 / 0.7, 4.0, 0.25}) {
    double mx = *std::max_element(row.begin(), row.end()), sum = 0;
    for (float x : row) sum += std::exp((x - mx) * inv_t);
    const double want = mx * inv_t + std::log(sum);
    CHECK(std::fabs(log_normalizer(row.data(), 3000, inv_t) - want) <= 1e-12 * std::fabs(want));
  }
  CHECK(log_normalizer(row.data(), 3000) == log_normalizer(row.data(), 3000, 1.0));
  bool threw = false;
  try {
    TopKLogits top;
    select_top_k_logits(row.data(), 1, 3000, 4, true, top, 0.0);
  } catch (const InvalidArgument&) {
    threw = true;
  }
  CHECK(threw);
}

SWIFTSPEC_TEST(sample_from_head_temperature_alone_is_the_softmax_and_reads_the_row_for_the_tail) {
  SamplingParams p;
  p.temperature = 1.0f;
  // peaked (the 64 best hold ~all the mass) and flat (a heavy tail)
  for (float scale : {6.f, 1.f}) {
    const std::vector<float> row = synthetic_row(2000, scale, 7);
    const Head h = head_of(row, 64, 1.0);
    double ck = 0;
    for (int j = 0; j < 64; ++j) ck += std::exp(h.vals[j] - h.lse);
    int reads = 0;
    const int n = 50000;
    check_stratified(row, p, 64, n, &reads);
    // the row is read exactly for u >= C_k (up to the 1e-8 margins)
    CHECK(std::fabs(reads / static_cast<double>(n) - (1.0 - ck)) <= 2.0 / n + 1e-6);
    if (scale == 1.f) CHECK(reads > n / 2);
  }
}

SWIFTSPEC_TEST(sample_from_head_top_p_reads_the_row_exactly_when_the_nucleus_leaves_the_head) {
  const std::vector<float> row = synthetic_row(2000, 3.f, 3);
  int decided = 0, read = 0;
  for (float temperature : {0.7f, 1.5f}) {
    for (float top_p : {0.5f, 0.8f, 0.95f, 0.999f}) {
      SamplingParams p;
      p.temperature = temperature;
      p.top_p = top_p;
      const Head h = head_of(row, 64, 1.0 / temperature);
      double c64 = 0;
      for (int j = 0; j < 64; ++j) c64 += std::exp(h.vals[j] / static_cast<double>(temperature) - h.lse);
      int reads = 0;
      const int n = 5000;
      check_stratified(row, p, 64, n, &reads);
      const bool inside = c64 >= top_p;
      CHECK_EQ(reads, inside ? 0 : n);  // decided before u is looked at: all or none
      ++(inside ? decided : read);
    }
  }
  CHECK(decided >= 2 && read >= 2);  // both cases were exercised
}

SWIFTSPEC_TEST(sample_from_head_refuses_what_it_cannot_draw_from) {
  const std::vector<float> row = synthetic_row(100, 2.f, 5);
  SamplingParams p;
  p.temperature = 1.0f;
  const Head h = head_of(row, 8, 1.0);
  auto reader = [&](std::vector<float>& r) { r = row; };
  auto throws = [&](const SamplingParams& q, double lse, double u, const std::vector<float>& vals, int vocab) {
    try {
      sample_from_head(h.ids.data(), vals.data(), 8, lse, vocab, q, u, reader);
    } catch (const InvalidArgument&) {
      return true;
    }
    return false;
  };
  CHECK(!throws(p, h.lse, 0.5, h.vals, 100));
  SamplingParams greedy;
  CHECK(throws(greedy, h.lse, 0.5, h.vals, 100));
  SamplingParams topk = p;
  topk.top_k = 10;
  CHECK(throws(topk, h.lse, 0.5, h.vals, 100));
  CHECK(throws(p, h.lse, 1.0, h.vals, 100));
  CHECK(throws(p, h.vals[0] - 1.0, 0.5, h.vals, 100));  // below the largest logit: not the row's
  std::vector<float> bad = h.vals;
  std::swap(bad[0], bad[1]);
  CHECK(throws(p, h.lse, 0.5, bad, 100));
  CHECK(throws(p, h.lse, 0.5, h.vals, 5));  // k > vocab
  // a NaN in the row read for the tail: the error of argmax
  std::vector<float> nan_row = row;
  nan_row[std::find(h.ids.begin(), h.ids.end(), 50) == h.ids.end() ? 50 : 51] = NAN;  // outside the head
  bool nan_error = false;
  try {
    sample_from_head(h.ids.data(), h.vals.data(), 8, h.lse, 100, p, 0.999999,
                     [&](std::vector<float>& r) { r = nan_row; });
  } catch (const InvalidArgument&) {
  } catch (const Error& e) {
    nan_error = std::string(e.what()) == kNanLogitsMessage;
  }
  CHECK(nan_error);
}

// What the head path drew silently from other distributions before: a head naming one id twice
// (its entries' weights summed), a row read for the tail whose largest logit is -inf or +inf (every
// weight NaN: the last id), sampling_distribution of such a row (all NaN). Messages show numbers
// as they read back (std::to_string gave "1.000000" for a top_p of 1.0000001f, "-0.000000" for u
// = -1e-300).
SWIFTSPEC_TEST(sample_from_head_refuses_repeated_ids_and_non_finite_rows) {
  const std::vector<float> row = synthetic_row(100, 2.f, 5);
  SamplingParams p;
  p.temperature = 1.0f;
  const Head h = head_of(row, 8, 1.0);
  auto message = [&](std::vector<int32_t> ids, const std::vector<float>& whole, double u, double lse) -> std::string {
    try {
      sample_from_head(ids.data(), h.vals.data(), 8, lse, 100, p, u, [&](std::vector<float>& r) { r = whole; });
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  std::vector<int32_t> twice = h.ids;
  twice[5] = twice[2];
  CHECK_EQ(message(twice, row, 0.5, h.lse), "sample_from_head: ids[5] repeats ids[2] = " + std::to_string(h.ids[2]) +
                                                " (a row's best entries name each token once)");
  const std::vector<float> low(100, -INFINITY);
  CHECK_EQ(
      message(h.ids, low, 0.5, NAN),
      std::string("sample_from_head: the largest logit of the row is -inf (the model produced non-finite logits)"));
  std::vector<float> high = row;
  high[h.ids[0]] = INFINITY;
  CHECK_EQ(message(h.ids, high, 0.5, NAN),
           std::string("sample_from_head: the largest logit of the row is inf (the model produced non-finite logits)"));
  CHECK_EQ(message(h.ids, row, -1e-300, h.lse), std::string("sample_from_head: u must be in [0, 1), got -1e-300"));
  std::vector<float> probs;
  std::string sd = "no error";
  try {
    sampling_distribution(low.data(), 100, p, probs);
  } catch (const Error& e) {
    sd = e.what();
  }
  CHECK_EQ(sd, std::string("sampling_distribution: the largest logit is -inf (the model produced non-finite logits)"));
  SamplingParams wide = p;
  wide.top_p = 1.0000001f;
  std::string v = "no error";
  try {
    wide.validate();
  } catch (const InvalidArgument& e) {
    v = e.what();
  }
  CHECK_EQ(v, std::string("top_p must be in (0, 1], got 1.0000001"));
}

}  // namespace swiftspec
