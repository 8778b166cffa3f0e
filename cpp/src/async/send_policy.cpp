// SendPolicy: eager or cost-aware hand-off of the next subtree to an idle target.
#include "send_policy.h"

#include <algorithm>
#include <cmath>

namespace swiftspec::async_detail {

SendPolicy::SendPolicy(const AsyncOptions& options, const GenerationConfig& config)
    : cost_aware_(options.cost_aware_send),
      min_send_nodes_(options.min_send_nodes),
      budget_(config.tree_budget),
      max_depth_(config.max_depth),
      width_(options.speculative.resolve_expand_width(config)),
      branching_(config.branching) {}

void SendPolicy::record_verification(int nodes, double seconds) {
  sn_ += nodes;
  st_ += seconds;
  snn_ += double(nodes) * nodes;
  snt_ += nodes * seconds;
  if (samples_ == 0)
    n_first_ = nodes;
  else if (nodes != n_first_)
    distinct_ = true;
  ++samples_;
}

void SendPolicy::record_draft_step(double seconds, double mass, int expanded, bool target_idle) {
  draft_step_ = draft_step_ < 0 ? seconds : 0.7 * draft_step_ + 0.3 * seconds;
  if (target_idle) draft_step_idle_ = draft_step_idle_ < 0 ? seconds : 0.7 * draft_step_idle_ + 0.3 * seconds;
  mass_sum_ += mass;
  expansions_ += expanded;
}

double SendPolicy::predicted_verify(int n) const {
  if (samples_ < 2 || !distinct_) return -1.0;
  const double k = samples_;
  const double den = k * snn_ - sn_ * sn_;
  if (den <= 0) return -1.0;
  double b = (k * snt_ - sn_ * st_) / den;
  b = std::max(b, 0.0);  // noise can tilt the fit; a verification never gets cheaper with more nodes
  const double a = (st_ - b * sn_) / k;
  return std::max(a + b * n, 1e-6);
}

bool SendPolicy::send_now(const TokenTree& tree, const std::vector<int32_t>& selected, int verify_depth, bool can_grow,
                          int waited) const {
  const int n = static_cast<int>(selected.size()) - 1;
  if (!can_grow || waited >= 2 * max_depth_) return true;  // never wait without bound
  if (n < min_send_nodes_) return false;
  if (!cost_aware_ || waited >= max_depth_ || draft_step_ <= 0) return true;
  const double tv_now = predicted_verify(n);
  if (tv_now < 0) return true;  // no cost model yet: eager

  double expected = 1.0, p_min = 1.0;
  std::vector<char> chosen(tree.size(), 0);
  for (int32_t i : selected) {
    chosen[i] = 1;
    if (i == TokenTree::root()) continue;
    const double p = std::exp(tree.node(i).cum_logprob);
    expected += p;
    p_min = std::min(p_min, p);
  }
  // What the next step would expand: the best unexpanded verifiable nodes.
  std::vector<double> cand;
  for (const TreeNode& nd : tree.nodes())
    if (!nd.expanded && nd.depth < verify_depth) cand.push_back(std::exp(nd.cum_logprob));
  std::sort(cand.rbegin(), cand.rend());
  const double mass = expansions_ > 0 ? mass_sum_ / expansions_ : 0.8;
  double gain = 0;
  for (int k = 0; k < width_ && k < static_cast<int>(cand.size()); ++k) gain += cand[k] * mass;
  int n_next = std::min(budget_, n + (gain > 0 ? width_ * branching_ : 0));
  if (n >= budget_) {  // a full budget: new nodes only replace the weakest ones
    gain = std::max(0.0, gain - p_min);
    n_next = n;
  }
  const double rate_now = expected / tv_now;
  const double step = draft_step_idle_ > 0 ? draft_step_idle_ : draft_step_;
  const double rate_next = (expected + gain) / (step + predicted_verify(n_next));
  return rate_now >= rate_next;
}

}  // namespace swiftspec::async_detail
