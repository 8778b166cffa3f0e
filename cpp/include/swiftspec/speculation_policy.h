// The `auto` decode mode's decision rule: before every round, choose target-only decoding or a
// speculative tree of some budget, whichever the measurements of this request say gives the most
// tokens per second.
//
// The model (the expected-speedup analysis of speculative decoding: Leviathan et al., ICML'23,
// §3.3-3.4; per-round budget choice as in SpecExec, Svirschevski et al., NeurIPS'24, §3, and
// Sequoia, Chen et al., 2024, §3.2): a round with a tree of budget k emits 1 + A(k) tokens, A(k)
// the expected accepted speculative tokens, and costs D(k) + T(k + 1) seconds: the draft's time to
// grow a tree of k selectable nodes plus one target pass over k + 1 rows (the root and the nodes).
// Target-only decoding emits 1 token per pass of one row, T(1). Each kind of round also costs time
// outside those passes (selecting the tree, the draft taking in the accepted tokens, emitting
// tokens): O_spec per speculative round and O_off per target-only round, measured as the round's
// wall time less its passes. The policy plays the arm with the largest estimated rate
// (1 + A(k)) / (D(k) + T(k + 1) + O_spec), or 1 / (T(1) + O_off) for target-only. A larger tree
// contains a smaller one, so A(k) is taken as at least every smaller arm's estimate.
//
// What it measures (all per request, from the rounds it plays):
//   - T(r): exponential moving averages of the target pass time per row count r (interpolated
//     linearly between measured r, flat beyond them); O_spec and O_off likewise;
//   - D(k), A(k) for every arm k <= the played budget: best-first growth reaches k selectable
//     nodes before it reaches more, so one round at budget K gives the draft time at which each
//     smaller arm was reached; and the counterfactual acceptance of a smaller tree is exact under
//     greedy and target-sampling verification: the best k nodes are a prefix-closed subset
//     (TokenTree::select_best), so that tree accepts the part of the realised accepted path that
//     lies inside it (the target's draws at those nodes are the same).
//
// Exploration: the first decode round is target-only (measures T(1)), the second plays the start
// arm (the largest budget <= max_budget / 4: a large tree is the most expensive round where target
// passes grow with their rows, as on a CPU, and one round measures every arm up to its own).
// Later: while target-only wins, a probe of up to 3 rounds of the best speculative arm comes after
// `probe interval` target-only rounds (4, doubling after each probe that confirms target-only, up
// to 512; a probe round that accepts nothing ends the probe where the arm has accepted next to
// nothing before), so a draft that never agrees costs a few percent; while a speculative arm wins,
// the arm above it is played every 8 rounds (every 2 while it was never measured: the policy climbs
// from the start arm) and target-only every 128 (estimates drift as the context grows).
//
// Memory across requests: pass times are properties of the machine and the models, and acceptance
// of the kind of text an engine serves, so an engine hands each request's final estimates to its
// next request (Memory) as a prior worth a few rounds: a request that starts with a prior skips
// the measuring rounds, and its own measurements outweigh the prior within a few rounds; the probe
// interval carries over too, so a draft that never agrees costs a few percent over many short
// requests as over one long one. Choices depend only on tokens
// already emitted, never on the current round's draws, so every round is a lossless verification of a tree fixed before
// it: greedy output is target-only's token for token; sampled output keeps the target's distribution.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace swiftspec {

class SpeculationPolicy {
 public:
  /// Why a round was played as it was (counted in the report).
  enum class Reason {
    Measure,  ///< the first rounds: target-only, then the largest budget
    Best,     ///< the arm of the largest estimated rate
    Probe,    ///< a speculative round while target-only wins
    Refresh,  ///< the largest budget or target-only again, while another arm wins
    Limit,    ///< the request's remaining tokens allow no speculation (target-only)
  };
  struct Choice {
    int budget = 0;  ///< 0: target-only; else the tree budget (an element of budgets())
    Reason reason = Reason::Measure;
  };

  /// A measured quantity: its moving average and how many measurements it holds (0: none).
  struct Estimate {
    double value = 0.0;
    int count = 0;
    /// Adds a measurement: the plain mean of the first 1 / weight values, then an exponential
    /// moving average of that weight (so the first rounds, a cold one among them, do not dominate).
    void add(double x, double weight);
  };
  /// What a request's policy learned, the next request's prior (see above).
  struct Memory {
    std::vector<int> budgets;              // the arms the estimates below belong to
    std::map<int, Estimate> target_time;   // rows -> seconds of a target pass
    std::vector<Estimate> draft_time;      // per arm, seconds
    std::vector<Estimate> accepted;        // per arm, tokens
    Estimate overhead_off, overhead_spec;  // seconds per round outside the passes
    int probe_interval = 0;                // target-only rounds before the next probe (0: none)
  };

  /// Arms: target-only and the budgets 1, 2, 4, ... below `max_budget`, then `max_budget`.
  /// `prior` (may be null): an earlier request's memory; its target pass times are taken, and its
  /// arms' estimates where its arms are these; each counts as at most a few measurements.
  /// Throws InvalidArgument when max_budget < 1.
  explicit SpeculationPolicy(int max_budget, const Memory* prior = nullptr);

  /// This policy's estimates, to seed the next request's policy.
  Memory memory() const;

  /// The arm the first speculative round plays (the largest budget <= max_budget / 4, at least 1).
  int start_budget() const { return budgets_[start_arm_]; }

  /// The speculative arms' budgets, increasing (the last is max_budget).
  const std::vector<int>& budgets() const { return budgets_; }

  /// The next round's arm. `allowed_budget` (>= 0): the largest budget the round may use (0:
  /// target-only only, e.g. when one token is left to emit).
  Choice choose(int allowed_budget);

  /// A target-only round: one target pass of one row took `seconds`, and the round
  /// `overhead_seconds` more (its wall time less the pass). Throws InvalidArgument for a negative
  /// or NaN time.
  void observe_target_only(double seconds, double overhead_seconds = 0.0);

  /// A speculative round at budget `played` (an element of budgets()): the target pass over
  /// `rows` rows (verified nodes + the root) took `verify_seconds`; `draft_seconds_at[i]` and
  /// `accepted_at[i]` are the draft time at which the tree reached budgets()[i] selectable nodes
  /// (or stopped growing) and the accepted tokens a tree of that budget would have had, for every
  /// arm i with budgets()[i] <= played (sizes: that many arms); both -1 for an arm the round does
  /// not measure (its trees grow otherwise: auto_speculation.cpp); `overhead_seconds`: the round's
  /// wall time less the played arm's draft time and the verification pass. Throws InvalidArgument
  /// for a budget that is not an arm, sizes that do not match, the played arm unmeasured, or other
  /// negative or NaN values.
  void observe_speculative(int played, int rows, double verify_seconds, const std::vector<double>& draft_seconds_at,
                           const std::vector<int>& accepted_at, double overhead_seconds = 0.0);

  /// Estimated tokens per second of target-only decoding (budget 0) or of an arm; 0 while not
  /// measured.
  double estimated_rate(int budget) const;
  /// Estimated target pass seconds over `rows` rows (0 while no pass was measured).
  double target_seconds(int rows) const;

  /// Rounds played per reason, by name ("measure", "best", "probe", "refresh", "limit").
  std::map<std::string, int> reason_counts() const;
  static const char* reason_name(Reason reason);

 private:
  int arm_index(int budget) const;  // -1 when not an arm
  bool any_arm_measured() const;
  int best_speculative(int top) const;
  Choice play(int budget, Reason reason);

  std::vector<int> budgets_;
  int start_arm_ = 0;
  std::map<int, Estimate> target_time_;    // rows -> seconds
  std::vector<Estimate> draft_time_;       // per arm, seconds
  std::vector<Estimate> accepted_;         // per arm, tokens
  std::vector<int> accepted_round_;        // per arm, the round that last measured it
  Estimate overhead_off_, overhead_spec_;  // seconds per round outside the passes
  int rounds_ = 0;
  int off_streak_ = 0;        // target-only rounds since the last speculative one, while it wins
  int probe_interval_ = 0;    // target-only rounds between probes (set by the constructor)
  int probe_left_ = 0;        // rounds left of the probe under way
  int last_above_round_ = 0;  // the round that last refreshed the arm above the best
  int last_off_round_ = -1;   // the round that last measured target-only
  std::map<Reason, int> reasons_;
};

}  // namespace swiftspec
