// Internal to the asynchronous engine: when the draft group hands an idle
// target group its next subtree (SwiftSpec §4.1 sends "the best subtree within
// the budget when the target is free"; this decides whether one more draft
// step first would pay off).
//
// Eager rule: send as soon as the tree holds min_send_nodes verifiable nodes.
// Cost-aware rule (AsyncOptions::cost_aware_send), on top of it: estimate
// the token rate of sending now and after one more draft step, and wait while
// the second is higher. With S the selected subtree (n nodes besides the root):
//   E(S)   = 1 + sum over S of exp(cum_logprob)   expected tokens of the round
//            (the draft's probability that the target accepts each node, plus
//            the bonus token);
//   Tv(n)  = a + b n                              the target's verification
//            time, fitted by least squares to this request's rounds (the
//            target reports each verification's duration in its result);
//   Td     = the draft step time while the target is idle (moving average;
//            steps taken during verifications until there is one: on a
//            machine where the two groups slow each other down, a step taken
//            alone is the faster);
//   gain   = exp(cum_logprob) of the nodes the next step would expand, times
//            the mean probability mass an expansion adds (measured).
// Wait iff (E + gain) / (Td + Tv(n')) > E / Tv(n), and at most max_depth steps
// in a row (2 * max_depth for min_send_nodes). Before two distinct tree sizes were verified, the rule is eager.
// On a GPU, or CPU cores that do not slow each other down, the draft is far
// faster than a verification, the kept subtree is deep, and the rule sends at
// once; on a machine where the draft step is a large share of a verification
// it converges towards serial tree generation, which is then the faster.
#pragma once
#include <cstdint>
#include <vector>

#include "swiftspec/async_engine.h"
#include "swiftspec/token_tree.h"

namespace swiftspec::async_detail {

class SendPolicy {
 public:
  SendPolicy(const AsyncOptions& options, const GenerationConfig& config);

  /// A verification of `nodes` non-root nodes took `seconds` (target's report).
  void record_verification(int nodes, double seconds);
  /// A draft step took `seconds` (`target_idle`: while no verification was
  /// running) and added children whose draft probability (given their
  /// parent) sums to `mass` over `expanded` expanded nodes.
  void record_draft_step(double seconds, double mass, int expanded, bool target_idle);

  /// Whether to send `selected` (indices into `tree`, root first, from
  /// TokenTree::select_best) now. `can_grow`: another step could add
  /// verifiable nodes; `waited`: steps already spent waiting this round.
  bool send_now(const TokenTree& tree, const std::vector<int32_t>& selected, int verify_depth, bool can_grow,
                int waited) const;

  /// Predicted verification time of n nodes (seconds); < 0 without a model.
  double predicted_verify(int n) const;

 private:
  bool cost_aware_;
  int min_send_nodes_;
  int budget_, max_depth_, width_, branching_;
  // Least-squares sums of (n, t) samples.
  double sn_ = 0, st_ = 0, snn_ = 0, snt_ = 0;
  int samples_ = 0, n_first_ = -1;
  bool distinct_ = false;
  double draft_step_ = -1;       // EMA over every step, seconds
  double draft_step_idle_ = -1;  // EMA over steps taken while the target was idle
  double mass_sum_ = 0;          // probability mass added per expansion, summed
  int expansions_ = 0;
};

}  // namespace swiftspec::async_detail
