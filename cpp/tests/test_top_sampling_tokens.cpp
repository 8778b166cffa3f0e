// top_sampling_tokens_from_head (sampling.h): the children of top-k tree growth under sampling from a
// row's head (its 64 best logits and ln Z at T) must be bit-identical to top_sampling_tokens of the
// whole row, or the head must say it cannot decide. Synthetic rows here (peaked, flat, with exact
// ties); the real draft's rows are checked in tests/test_sampling.py.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "swiftspec/error.h"
#include "swiftspec/sampling.h"
#include "swiftspec/top_k_logits.h"
#include "test_framework.h"

namespace swiftspec {
namespace {

// Bitwise equality (memcmp of an empty vector's null data() is undefined: UBSan reports it).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<float> synthetic_row(int vocab, float scale, uint64_t seed, float quantum = 0.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> row(vocab);
  for (auto& x : row) {
    x = nd(g);
    if (quantum > 0) x = std::round(x / quantum) * quantum;  // many exact ties
  }
  return row;
}

SamplingParams params(float t, int top_k, float top_p) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

std::string describe(const std::vector<int32_t>& ids, const std::vector<float>& q) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += std::to_string(ids[i]) + ":" + std::to_string(q[i]) + " ";
  return s;
}

struct Tally {
  int rows = 0, decided = 0;
};

// The head's answer (when it gives one) and the wrapper's (always) equal the host's, bitwise.
void check_row(const std::vector<float>& row, const SamplingParams& p, int count, Tally& tally) {
  const int vocab = static_cast<int>(row.size());
  const int k = std::min(kSampleHeadK, vocab);
  TopKLogits top;
  select_top_k_logits(row.data(), 1, vocab, k, true, top, 1.0 / p.temperature);
  std::vector<int32_t> want_ids, got_ids;
  std::vector<float> want_q, got_q;
  top_sampling_tokens(row.data(), vocab, p, count, want_ids, want_q);
  const bool decided = top_sampling_tokens_from_head(top.ids.data(), top.logits.data(), k, top.log_normalizer[0], vocab,
                                                     p, count, got_ids, got_q);
  const std::string what = "T " + std::to_string(p.temperature) + " top_k " + std::to_string(p.top_k) + " top_p " +
                           std::to_string(p.top_p) + " count " + std::to_string(count);
  if (decided) {
    if (got_ids != want_ids || !same_bits(got_q, want_q))
      throw test::Failure(what + ": head " + describe(got_ids, got_q) + "!= whole row " + describe(want_ids, want_q));
  } else if (!got_ids.empty() || !got_q.empty()) {
    throw test::Failure(what + ": an undecided head left " + std::to_string(got_ids.size()) + " tokens");
  }
  bool read = false;
  top_sampling_tokens_from_head(
      top, 0, vocab, p, count, [&](std::vector<float>& r) { r = row; }, got_ids, got_q, &read);
  CHECK(read == !decided);
  CHECK(got_ids == want_ids);
  CHECK(same_bits(got_q, want_q));
  ++tally.rows;
  tally.decided += decided ? 1 : 0;
}

}  // namespace

SWIFTSPEC_TEST(top_sampling_tokens_from_head_equal_the_whole_rows) {
  // peaked rows (scale 4: the nucleus a few tokens), flatter ones (scale 1.5: often beyond the
  // head), rows of exact ties (logits on a grid of 0.5); every sampling setting growth can see
  Tally peaked, all;
  uint64_t seed = 1;
  for (float scale : {4.0f, 1.5f}) {
    for (float quantum : {0.0f, 0.5f}) {
      for (int r = 0; r < 6; ++r) {
        const std::vector<float> row = synthetic_row(3000, scale, seed++, quantum);
        for (float t : {0.7f, 1.0f, 0.1f})
          for (int top_k : {0, 1, 3, 40, 63, 64, 200})
            for (float top_p : {1.0f, 0.8f, 0.95f, 0.3f})
              for (int count : {0, 1, 2, 4, 70}) {
                check_row(row, params(t, top_k, top_p), count, all);
                if (scale == 4.0f && quantum == 0.0f && top_k < 64 && count < 64)
                  check_row(row, params(t, top_k, top_p), count, peaked);
              }
      }
    }
  }
  // The head decides nearly every peaked row without ties, and not everything anywhere.
  CHECK(peaked.decided >= peaked.rows * 9 / 10);
  CHECK(all.decided < all.rows);
}

SWIFTSPEC_TEST(top_sampling_tokens_from_head_reads_the_row_exactly_when_the_head_does_not_decide) {
  const int vocab = 1000;
  // A nucleus of more than 64 tokens: logits all equal but the first. The head cannot hold it.
  std::vector<float> flat(vocab, 0.0f);
  flat[7] = 1.0f;
  std::vector<int32_t> ids;
  std::vector<float> q;
  TopKLogits top;
  select_top_k_logits(flat.data(), 1, vocab, 64, true, top, 1.0);
  CHECK(!top_sampling_tokens_from_head(top.ids.data(), top.logits.data(), 64, top.log_normalizer[0], vocab,
                                       params(1.0f, 0, 0.9f), 2, ids, q));
  CHECK(ids.empty());
  // Temperature alone: two children of a peaked row come from the head; 64 children would need the
  // 65th token to tell the 64th from it.
  std::vector<float> peaked = synthetic_row(vocab, 4.0f, 99);
  select_top_k_logits(peaked.data(), 1, vocab, 64, true, top, 1.0);
  CHECK(top_sampling_tokens_from_head(top.ids.data(), top.logits.data(), 64, top.log_normalizer[0], vocab,
                                      params(1.0f, 0, 1.0f), 2, ids, q));
  CHECK_EQ(ids.size(), size_t{2});
  CHECK_EQ(ids[0], top.ids[0]);
  CHECK(!top_sampling_tokens_from_head(top.ids.data(), top.logits.data(), 64, top.log_normalizer[0], vocab,
                                       params(1.0f, 0, 1.0f), 64, ids, q));
  // Exact logit ties never mislead the head (it lists them by id, as the host ranks them). A near tie
  // does: token 9 at logit x and token 5 at the next float below, whose probabilities round to the
  // same fp32 value, so the host ranks 5 (the smaller id) first while the head lists 9 first.
  std::vector<float> near(vocab, -9.0f);
  near[3] = 1.5f;
  const SamplingParams p1 = params(1.0f, 0, 0.9f);
  std::vector<float> want_q;
  bool found = false;
  for (float x = 0.3f; x < 0.4f && !found; x = std::nextafter(x, 1.0f)) {
    near[9] = x;
    near[5] = std::nextafter(x, 0.0f);
    sampling_distribution(near.data(), vocab, params(1.0f, 0, 1.0f), want_q);
    found = want_q[5] == want_q[9];
  }
  CHECK(found);
  std::vector<int32_t> want_ids;
  top_sampling_tokens(near.data(), vocab, p1, 2, want_ids, want_q);
  CHECK(want_ids == std::vector<int32_t>({3, 5}));
  select_top_k_logits(near.data(), 1, vocab, 64, true, top, 1.0);
  CHECK_EQ(top.ids[1], 9);
  // top_p 0.9: both in the nucleus (the tie inside the children, or at their boundary); 0.7: the
  // nucleus ends between them
  for (const auto& [top_p, count] : {std::pair{0.9f, 2}, std::pair{0.9f, 3}, std::pair{0.7f, 2}, std::pair{0.7f, 1}}) {
    bool read = false;
    const SamplingParams pp = params(1.0f, 0, top_p);
    top_sampling_tokens_from_head(top, 0, vocab, pp, count, [&](std::vector<float>& r) { r = near; }, ids, q, &read);
    CHECK(read);
    top_sampling_tokens(near.data(), vocab, pp, count, want_ids, want_q);
    CHECK(ids == want_ids);
    const std::vector<int32_t> order{3, 5, 9};  // the host ranking
    CHECK(ids == std::vector<int32_t>(order.begin(), order.begin() + count));
  }
}

SWIFTSPEC_TEST(top_sampling_tokens_from_head_refuses_what_it_cannot_decide_from) {
  const int vocab = 100;
  std::vector<float> row = synthetic_row(vocab, 2.0f, 5);
  const SamplingParams p = params(0.7f, 0, 0.8f);
  TopKLogits top;
  select_top_k_logits(row.data(), 1, vocab, 8, true, top, 1.0 / p.temperature);
  std::vector<int32_t> ids;
  std::vector<float> q;
  auto message = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "(no error)";
  };
  CHECK_EQ(message([&] {
             top_sampling_tokens_from_head(top.ids.data(), top.logits.data(), 8, top.log_normalizer[0], vocab,
                                           params(0.0f, 0, 0.8f), 2, ids, q);
           }),
           std::string(
               "top_sampling_tokens_from_head: temperature must be > 0 (greedy growth takes the head's ids), got 0"));
  CHECK_EQ(message([&] {
             top_sampling_tokens_from_head(top.ids.data(), top.logits.data(), 8, top.log_normalizer[0], vocab, p, -1,
                                           ids, q);
           }),
           std::string("top_sampling_tokens_from_head: count must be >= 0, got -1"));
  CHECK(message([&] {
          top_sampling_tokens_from_head(top.ids.data(), top.logits.data(), 8, top.log_normalizer[0] - 50.0, vocab, p, 2,
                                        ids, q);
        }).find("is below the largest logit / T") != std::string::npos);
  // the wrapper: a normaliser at another temperature, a row of the wrong size
  CHECK(message([&] {
          top_sampling_tokens_from_head(top, 0, vocab, params(1.0f, 0, 0.8f), 2, [](std::vector<float>&) {}, ids, q);
        }).find("the log-normalizer is at inverse temperature") != std::string::npos);
  std::vector<float> flat(vocab, 0.0f);
  select_top_k_logits(flat.data(), 1, vocab, 8, true, top, 1.0 / p.temperature);
  CHECK_EQ(message([&] {
             top_sampling_tokens_from_head(
                 top, 0, vocab, p, 2, [](std::vector<float>& r) { r.assign(5, 0.0f); }, ids, q);
           }),
           std::string("top_sampling_tokens_from_head: the logits row has 5 entries for a vocabulary of 100"));
}

}  // namespace swiftspec
