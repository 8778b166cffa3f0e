// SpeculationPolicy (speculation_policy.h): its schedule and its choices on simulated machines
// whose pass times and acceptance are known, against every fixed choice on the same draws. The
// auto mode on the real models is measured by tools/bench_auto_mode.py and tested in
// tests/test_auto_mode.py.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "swiftspec/error.h"
#include "swiftspec/speculation_policy.h"
#include "test_framework.h"

namespace swiftspec {
namespace {

// A machine: a target pass over r rows costs target_a + target_b * r seconds, a draft step
// draft_step seconds and a tree of budget k needs ceil(log2(k)) + 1 steps; each speculative round
// the target would accept L tokens of the draft's best chain, L geometric with rate `alpha`, so a
// tree of budget k accepts min(k, L).
struct Machine {
  double target_a, target_b, draft_step, alpha;
  double target(int rows) const { return target_a + target_b * rows; }
  double draft(int k) const { return draft_step * (std::ceil(std::log2(static_cast<double>(k))) + 1); }
};

struct Run {
  double seconds = 0;
  int tokens = 0;
  int speculative_rounds = 0;
  double rate() const { return tokens / seconds; }
};

// Decodes `tokens` tokens on `m`, each round's arm from the policy (fixed < 0) or fixed; with
// `memory`, the policy starts from it and leaves its own there (a request of an engine).
Run simulate(const Machine& m, int max_budget, int tokens, int fixed = -1, unsigned seed = 7,
             SpeculationPolicy::Memory* memory = nullptr) {
  SpeculationPolicy policy(max_budget, memory);
  std::mt19937 rng(seed);
  std::bernoulli_distribution accept(m.alpha);
  Run run;
  while (run.tokens < tokens) {
    int L = 0;
    while (L < max_budget && accept(rng)) ++L;  // drawn every round: fixed and auto see the same text
    const int budget = fixed >= 0 ? fixed : policy.choose(max_budget).budget;
    if (budget == 0) {
      run.seconds += m.target(1);
      run.tokens += 1;
      policy.observe_target_only(m.target(1));
      continue;
    }
    ++run.speculative_rounds;
    std::vector<double> draft_at;
    std::vector<int> accepted_at;
    for (int b : policy.budgets()) {
      if (b > budget) break;
      draft_at.push_back(m.draft(b));
      accepted_at.push_back(std::min(b, L));
    }
    run.seconds += m.draft(budget) + m.target(budget + 1);
    run.tokens += 1 + std::min(budget, L);
    policy.observe_speculative(budget, budget + 1, m.target(budget + 1), draft_at, accepted_at);
  }
  if (memory) *memory = policy.memory();
  return run;
}

// `requests` requests of `tokens` tokens each on one engine (the memory carried from each to the
// next), against the same requests with a fixed choice; returns tokens per second over all.
double simulate_requests(const Machine& m, int max_budget, int requests, int tokens, int fixed) {
  SpeculationPolicy::Memory memory;
  double seconds = 0;
  int emitted = 0;
  for (int r = 0; r < requests; ++r) {
    const Run run = simulate(m, max_budget, tokens, fixed, 100 + r, &memory);
    seconds += run.seconds;
    emitted += run.tokens;
  }
  return emitted / seconds;
}

// The best fixed choice on `m` (target-only or one budget of the policy's arms), by rate.
double best_fixed_rate(const Machine& m, int max_budget, int tokens) {
  double best = simulate(m, max_budget, tokens, 0).rate();
  const SpeculationPolicy arms(max_budget);
  for (int b : arms.budgets()) best = std::max(best, simulate(m, max_budget, tokens, b).rate());
  return best;
}

SWIFTSPEC_TEST(speculation_policy_arms_are_powers_of_two_then_the_budget) {
  CHECK(SpeculationPolicy(16).budgets() == std::vector<int>({1, 2, 4, 8, 16}));
  CHECK(SpeculationPolicy(12).budgets() == std::vector<int>({1, 2, 4, 8, 12}));
  CHECK(SpeculationPolicy(1).budgets() == std::vector<int>({1}));
  CHECK_THROWS(SpeculationPolicy(0), InvalidArgument);
}

SWIFTSPEC_TEST(speculation_policy_measures_target_only_then_the_start_budget) {
  SpeculationPolicy p(16);
  CHECK_EQ(p.start_budget(), 4);
  CHECK_EQ(SpeculationPolicy(64).start_budget(), 16);
  CHECK_EQ(SpeculationPolicy(3).start_budget(), 1);
  SpeculationPolicy::Choice c = p.choose(16);
  CHECK_EQ(c.budget, 0);
  CHECK(c.reason == SpeculationPolicy::Reason::Measure);
  p.observe_target_only(0.010);
  c = p.choose(16);
  CHECK_EQ(c.budget, 4);
  CHECK(c.reason == SpeculationPolicy::Reason::Measure);
  // No room for speculation: target-only, whatever was measured.
  c = p.choose(0);
  CHECK_EQ(c.budget, 0);
  CHECK(c.reason == SpeculationPolicy::Reason::Limit);
  // A smaller allowed budget measures the largest arm within it.
  c = p.choose(3);
  CHECK_EQ(c.budget, 2);
  CHECK_EQ(p.reason_counts().at("measure"), 3);
  CHECK_EQ(p.reason_counts().at("limit"), 1);
}

SWIFTSPEC_TEST(speculation_policy_charges_each_round_its_overhead) {
  // The same passes as below, plus the rounds' time outside them: a speculative round's overhead
  // (selecting the tree, the draft taking in the accepted tokens) can turn a winning arm into a
  // losing one, and a target-only round's lowers target-only's rate.
  SpeculationPolicy p(4);  // arms 1, 2, 4
  p.observe_target_only(0.010, 0.002);
  p.observe_speculative(4, 5, 0.018, {0.001, 0.002, 0.003}, {1, 2, 2}, 0.030);
  CHECK(std::abs(p.estimated_rate(0) - 1.0 / 0.012) < 1e-9);
  CHECK(std::abs(p.estimated_rate(4) - 3.0 / (0.003 + 0.018 + 0.030)) < 1e-9);
  CHECK(std::abs(p.estimated_rate(2) - 3.0 / (0.002 + 0.014 + 0.030)) < 1e-9);
  // Without the overheads arm 2 wins (rates_follow_the_model); with them target-only does.
  CHECK(p.estimated_rate(0) > p.estimated_rate(2));
  CHECK_EQ(p.choose(4).budget, 0);
  // The overheads carry over to the next request.
  const SpeculationPolicy::Memory m = p.memory();
  CHECK(std::abs(m.overhead_off.value - 0.002) < 1e-12 && std::abs(m.overhead_spec.value - 0.030) < 1e-12);
  SpeculationPolicy next(4, &m);
  CHECK(std::abs(next.estimated_rate(2) - p.estimated_rate(2)) < 1e-9);
  CHECK_THROWS(p.observe_target_only(0.01, -1.0), InvalidArgument);
  CHECK_THROWS(p.observe_speculative(4, 5, 0.01, {0.001, 0.002, 0.003}, {1, 1, 2}, std::nan("")), InvalidArgument);
}

SWIFTSPEC_TEST(speculation_policy_acceptance_decays_per_round) {
  // Two policies see the same measurements of arm 4, the last one after 1 round in one and after
  // 9 rounds in the other: the later measurement outweighs more of the old average (an arm
  // refreshed every few rounds follows the text as one played every round would).
  auto run = [](int gap) {
    SpeculationPolicy p(4);  // arms 1, 2, 4
    p.choose(4);
    p.observe_target_only(0.010);
    for (int i = 0; i < 20; ++i) {
      p.choose(4);
      p.observe_speculative(4, 5, 0.018, {0.001, 0.002, 0.003}, {0, 0, 0});
    }
    for (int i = 1; i < gap; ++i) {
      p.choose(0);
      p.observe_target_only(0.010);
    }
    p.choose(4);
    p.observe_speculative(4, 5, 0.018, {-1.0, -1.0, 0.003}, {-1, -1, 4});
    return p.estimated_rate(4) * (0.003 + 0.018) - 1.0;  // the accepted-tokens estimate
  };
  const double a1 = run(1), a9 = run(9);
  CHECK(std::abs(a1 - 0.1 * 4) < 1e-9);
  CHECK(std::abs(a9 - (1.0 - std::pow(0.9, 9)) * 4) < 1e-9);
}

SWIFTSPEC_TEST(speculation_policy_rates_follow_the_model) {
  SpeculationPolicy p(4);  // arms 1, 2, 4
  p.observe_target_only(0.010);
  p.observe_speculative(4, 5, 0.018, {0.001, 0.002, 0.003}, {1, 2, 2});
  CHECK(std::abs(p.estimated_rate(0) - 100.0) < 1e-9);
  // T(5) measured; T(2), T(3) interpolated between T(1) = 0.010 and T(5) = 0.018.
  CHECK(std::abs(p.target_seconds(3) - 0.014) < 1e-12);
  CHECK(std::abs(p.estimated_rate(4) - 3.0 / (0.003 + 0.018)) < 1e-9);
  CHECK(std::abs(p.estimated_rate(2) - 3.0 / (0.002 + 0.014)) < 1e-9);
  CHECK(std::abs(p.estimated_rate(1) - 2.0 / (0.001 + 0.012)) < 1e-9);
  // Beyond the largest measured row count: flat.
  CHECK(std::abs(p.target_seconds(40) - 0.018) < 1e-12);
  // Arm 2 has the best rate: chosen.
  const SpeculationPolicy::Choice c = p.choose(4);
  CHECK_EQ(c.budget, 2);
  CHECK(c.reason == SpeculationPolicy::Reason::Best);
}

SWIFTSPEC_TEST(speculation_policy_climbs_from_the_start_arm_while_the_largest_measured_wins) {
  // Every node is accepted and target passes cost the same whatever their rows: the largest tree
  // is best, and the policy climbs there from the start arm within a few rounds.
  SpeculationPolicy p(16);
  const Machine m{0.010, 0.0, 0.001, 1.0};
  std::vector<int> played;
  for (int i = 0; i < 12; ++i) {
    const int budget = p.choose(16).budget;
    played.push_back(budget);
    if (budget == 0) {
      p.observe_target_only(m.target(1));
      continue;
    }
    std::vector<double> draft_at;
    std::vector<int> accepted_at;
    for (int b : p.budgets())
      if (b <= budget) draft_at.push_back(m.draft(b)), accepted_at.push_back(b);
    p.observe_speculative(budget, budget + 1, m.target(budget + 1), draft_at, accepted_at);
  }
  CHECK_EQ(played[1], 4);
  int first16 = -1;
  for (int i = 0; i < static_cast<int>(played.size()) && first16 < 0; ++i)
    if (played[i] == 16) first16 = i;
  if (!(first16 >= 0 && first16 <= 8))
    throw test::Failure("the largest arm first played in round " + std::to_string(first16));
  CHECK_EQ(played.back(), 16);
}

SWIFTSPEC_TEST(speculation_policy_memory_seeds_the_next_request) {
  SpeculationPolicy first(16);
  first.observe_target_only(0.010);
  for (int i = 0; i < 20; ++i) first.observe_speculative(8, 9, 0.012, {0.001, 0.002, 0.003, 0.004}, {1, 2, 3, 3});
  const SpeculationPolicy::Memory mem = first.memory();
  CHECK(mem.budgets == first.budgets());
  CHECK_EQ(mem.accepted[3].count, 20);
  // The next request skips the measuring rounds and plays the arm its prior favours.
  SpeculationPolicy next(16, &mem);
  const SpeculationPolicy::Choice c = next.choose(16);
  CHECK(c.reason != SpeculationPolicy::Reason::Measure);
  CHECK(c.budget > 0);
  CHECK(std::abs(next.estimated_rate(8) - first.estimated_rate(8)) < 1e-9);
  // The prior counts as a few measurements: the request's own take over.
  const SpeculationPolicy::Memory carried = next.memory();
  CHECK_EQ(carried.target_time.at(1).count, 1);  // measured once
  CHECK_EQ(carried.target_time.at(9).count, 3);
  CHECK_EQ(carried.draft_time[3].count, 3);
  CHECK_EQ(carried.accepted[3].count, 2);
  // Other arms (another tree budget): only the target pass times carry over.
  SpeculationPolicy other(8, &mem);
  CHECK(std::abs(other.target_seconds(9) - 0.012) < 1e-12);
  CHECK_EQ(other.estimated_rate(8), 0.0);
  CHECK(other.choose(8).reason == SpeculationPolicy::Reason::Measure);
}

SWIFTSPEC_TEST(speculation_policy_short_requests_with_memory_are_near_the_best_fixed_choice) {
  // 30 requests of 96 tokens on one engine (the CPU bench's requests): with the memory carried,
  // exploration is paid about once, not per request.
  const Machine machines[] = {
      {0.010, 0.0020, 0.002, 0.60},  // CPU-like: rows cost, a fair draft
      {0.010, 0.0010, 0.004, 0.30},  // a slow, poor draft: target-only
      {0.010, 0.0002, 0.001, 0.85},  // GPU-like: the largest tree
  };
  for (const Machine& m : machines) {
    const SpeculationPolicy arms(16);
    double best = simulate_requests(m, 16, 30, 96, 0);
    for (int b : arms.budgets()) best = std::max(best, simulate_requests(m, 16, 30, 96, b));
    const double got = simulate_requests(m, 16, 30, 96, -1);
    if (got < 0.93 * best)
      throw test::Failure("auto " + std::to_string(got) + " tok/s < 0.93 x best fixed " + std::to_string(best) +
                          " (alpha " + std::to_string(m.alpha) + ")");
  }
}

SWIFTSPEC_TEST(speculation_policy_skips_the_arms_a_round_does_not_measure) {
  SpeculationPolicy p(16);  // arms 1, 2, 4, 8, 16
  p.observe_target_only(0.010);
  // A round of budget 16 whose trees grow otherwise than arms 1-4: only arms 8 and 16 measured.
  p.observe_speculative(16, 17, 0.020, {-1.0, -1.0, -1.0, 0.004, 0.006}, {-1, -1, -1, 3, 4});
  CHECK_EQ(p.estimated_rate(4), 0.0);
  CHECK(std::abs(p.estimated_rate(16) - 5.0 / 0.026) < 1e-9);
  const SpeculationPolicy::Memory m = p.memory();
  CHECK_EQ(m.accepted[2].count, 0);
  CHECK_EQ(m.accepted[3].count, 1);
  // The played arm must be measured; an arm half measured is refused.
  CHECK_THROWS(p.observe_speculative(4, 5, 0.01, {0.001, 0.002, -1.0}, {1, 1, -1}), InvalidArgument);
  CHECK_THROWS(p.observe_speculative(4, 5, 0.01, {0.001, -1.0, 0.003}, {1, 1, 2}), InvalidArgument);
}

SWIFTSPEC_TEST(speculation_policy_refuses_observations_that_do_not_fit_its_arms) {
  SpeculationPolicy p(8);
  CHECK_THROWS(p.observe_speculative(3, 4, 0.01, {0.0, 0.0}, {0, 0}), InvalidArgument);   // not an arm
  CHECK_THROWS(p.observe_speculative(4, 5, 0.01, {0.0, 0.0}, {0, 0}), InvalidArgument);   // 3 arms <= 4
  CHECK_THROWS(p.observe_speculative(2, 3, -1.0, {0.0, 0.0}, {0, 0}), InvalidArgument);   // negative time
  CHECK_THROWS(p.observe_speculative(2, 3, 0.01, {0.0, 0.0}, {0, -1}), InvalidArgument);  // negative count
  CHECK_THROWS(p.observe_target_only(std::nan("")), InvalidArgument);
}

SWIFTSPEC_TEST(speculation_policy_a_draft_that_never_agrees_costs_little) {
  // The draft step costs a third of a target pass and nothing is accepted: after the two
  // measuring rounds, speculation runs only as probes, ever rarer, each ended by its first round
  // (it accepts nothing).
  const Machine m{0.010, 0.001, 0.003, 0.0};
  const Run auto_run = simulate(m, 16, 2000);
  const Run target_only = simulate(m, 16, 2000, 0);
  CHECK(auto_run.speculative_rounds <= 1 + 9);  // the measure round; probes of 1 after 4, 8, ... 512
  CHECK(auto_run.rate() >= 0.97 * target_only.rate());
}

// Acceptance here is i.i.d. per round, the hardest case for a moving average (real text keeps its
// acceptance for many rounds; the real models are measured by tools/bench_auto_mode.py): where
// arms' rates lie within a few percent of each other, its noise picks a neighbour of the best.
SWIFTSPEC_TEST(speculation_policy_is_within_7_percent_of_the_best_fixed_choice) {
  const Machine machines[] = {
      {0.010, 0.0002, 0.001, 0.85},  // GPU-like: flat target passes, a good draft: the largest tree
      {0.010, 0.0020, 0.002, 0.60},  // CPU-like: rows cost, a fair draft: a middle budget
      {0.010, 0.0010, 0.004, 0.30},  // a slow, poor draft: target-only
      {0.010, 0.0010, 0.003, 0.00},  // a draft that never agrees
      {0.010, 0.0010, 0.002, 0.50}, {0.010, 0.0005, 0.002, 0.70},
  };
  for (const Machine& m : machines) {
    const double best = best_fixed_rate(m, 16, 4000);
    const double got = simulate(m, 16, 4000).rate();
    if (got < 0.93 * best)
      throw test::Failure("auto " + std::to_string(got) + " tok/s < 0.93 x best fixed " + std::to_string(best) +
                          " (alpha " + std::to_string(m.alpha) + ")");
  }
}

SWIFTSPEC_TEST(speculation_policy_plays_a_probe_on_while_it_accepts) {
  // Target-only wins (the draft is slow); a probe whose rounds accept keeps its 3 rounds, one
  // whose first round accepts nothing ends there.
  for (const bool agrees : {true, false}) {
    SpeculationPolicy p(8);
    const Machine slow{0.010, 0.0005, 0.030, 0.0};
    int probe_rounds = 0;
    for (int i = 0; i < 40; ++i) {
      const SpeculationPolicy::Choice c = p.choose(8);
      if (c.budget == 0) {
        p.observe_target_only(slow.target(1));
        continue;
      }
      if (c.reason == SpeculationPolicy::Reason::Probe) ++probe_rounds;
      std::vector<double> draft_at;
      std::vector<int> accepted_at;
      for (int b : p.budgets())
        if (b <= c.budget)
          draft_at.push_back(slow.draft(b)),
              accepted_at.push_back(agrees && c.reason != SpeculationPolicy::Reason::Measure ? 1 : 0);
      p.observe_speculative(c.budget, c.budget + 1, slow.target(c.budget + 1), draft_at, accepted_at);
    }
    // 40 rounds: probes after 4, 8 and 16 target-only rounds
    if (probe_rounds != (agrees ? 9 : 3)) throw test::Failure("probe rounds " + std::to_string(probe_rounds));
  }
}

SWIFTSPEC_TEST(speculation_policy_follows_acceptance_that_changes_mid_request) {
  // A code block (the draft agrees) then prose it cannot predict: the policy turns speculation
  // off within 25 rounds (the moving average forgets a tenth per round), and on again when the
  // draft agrees again (probes come after 4 target-only rounds at first).
  SpeculationPolicy p(8);
  const Machine good{0.010, 0.0005, 0.001, 1.0};
  auto round = [&](bool agrees) {
    const int budget = p.choose(8).budget;
    if (budget == 0) {
      p.observe_target_only(good.target(1));
      return 0;
    }
    std::vector<double> draft_at;
    std::vector<int> accepted_at;
    for (int b : p.budgets())
      if (b <= budget) draft_at.push_back(good.draft(b)), accepted_at.push_back(agrees ? b : 0);
    p.observe_speculative(budget, budget + 1, good.target(budget + 1), draft_at, accepted_at);
    return budget;
  };
  for (int i = 0; i < 40; ++i) round(true);
  CHECK(round(true) > 0);
  int first_off = -1;
  for (int i = 0; i < 40 && first_off < 0; ++i)
    if (round(false) == 0) first_off = i;
  if (!(first_off >= 0 && first_off <= 25)) throw test::Failure("off after " + std::to_string(first_off));
  int back_on = -1;
  for (int i = 0; i < 100 && back_on < 0; ++i)
    if (round(true) > 0) back_on = i;
  if (!(back_on >= 0 && back_on <= 10)) throw test::Failure("on after " + std::to_string(back_on));
}

}  // namespace
}  // namespace swiftspec
