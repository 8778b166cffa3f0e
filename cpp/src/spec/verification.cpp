// Greedy and stochastic (lossless) verification of token trees.
#include "swiftspec/verification.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "swiftspec/error.h"

namespace swiftspec {

namespace {

void check_tree(const TokenTree& tree, int vocab, const char* who) {
  if (tree.empty()) throw InvalidArgument(std::string(who) + ": the token tree is empty");
  if (vocab <= 0) throw InvalidArgument(std::string(who) + ": vocab must be > 0, got " + std::to_string(vocab));
}

// One step down the tree: follow the child carrying `x` or end with bonus x.
bool step(const TokenTree& tree, int& u, int32_t x, VerificationResult& r) {
  const int c = tree.find_child(u, x);
  r.tokens.push_back(x);
  if (c < 0) {
    r.bonus_token = x;
    return false;
  }
  r.accepted_path.push_back(c);
  u = c;
  return true;
}

// SpecInfer multi-step speculative sampling at node u (see verification.h).
// Returns the next token; `residual` is scratch.
int32_t rejection_sample(const TreeNode& nd, int u, int vocab, const float* p, const float* q, Rng& rng,
                         VerifierBias bias, std::vector<float>& residual) {
  residual.assign(p, p + vocab);
  for (int32_t t : nd.draws) {
    if (!(q[t] > 0.0f))
      throw InvalidArgument("verify_stochastic: node " + std::to_string(u) + " has draw " + std::to_string(t) +
                            " whose draft probability is " + show_number(q[t]) + " (must be > 0)");
    const double u01 = rng.uniform();
    // accept with probability min(1, r(t) / q(t))
    if (u01 * static_cast<double>(q[t]) < static_cast<double>(residual[t])) return t;
    // reject: r <- norm(max(0, r - q))
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) {
      const float d = residual[i] - q[i];
      residual[i] = d > 0.0f ? d : 0.0f;
      sum += residual[i];
    }
    if (sum > 0.0) {
      const float inv = static_cast<float>(1.0 / sum);
      for (int i = 0; i < vocab; ++i) residual[i] *= inv;
    } else {
      // Only reachable through fp32 rounding (p == q up to rounding, yet a
      // draw was rejected): fall back to the target distribution.
      residual.assign(p, p + vocab);
    }
  }
  if (bias == VerifierBias::NoResidual) return rng.categorical(p, vocab);
  return rng.categorical(residual.data(), vocab);
}

}  // namespace

VerificationResult verify_greedy(const TokenTree& tree, const float* target_logits, int vocab) {
  check_tree(tree, vocab, "verify_greedy");
  VerificationResult r;
  r.accepted_path.push_back(0);
  int u = 0;
  while (step(tree, u, argmax(target_logits + static_cast<size_t>(u) * vocab, vocab), r)) {
  }
  return r;
}

VerificationResult verify_greedy(const TokenTree& tree, const std::vector<int32_t>& target_argmax) {
  if (tree.empty()) throw InvalidArgument("verify_greedy: the token tree is empty");
  if (target_argmax.size() != static_cast<size_t>(tree.size()))
    throw InvalidArgument("verify_greedy: " + std::to_string(target_argmax.size()) + " arg-max ids for a tree of " +
                          std::to_string(tree.size()) + " nodes");
  for (size_t u = 0; u < target_argmax.size(); ++u)
    if (target_argmax[u] < 0)  // would be accepted as the bonus token
      throw InvalidArgument("verify_greedy: arg-max id " + std::to_string(target_argmax[u]) + " of node " +
                            std::to_string(u) + " is negative");
  VerificationResult r;
  r.accepted_path.push_back(0);
  int u = 0;
  while (step(tree, u, target_argmax[u], r)) {
  }
  return r;
}

VerificationResult verify_by_target_sampling(const TokenTree& tree, const std::function<int32_t(int)>& draw) {
  if (tree.empty()) throw InvalidArgument("verify_by_target_sampling: the token tree is empty");
  // Every node, not only the visited ones: whether a tree is refused must not depend on the draws.
  for (int u = 0; u < tree.size(); ++u)
    if (!tree.node(u).draws.empty())
      throw InvalidArgument("verify_by_target_sampling: node " + std::to_string(u) +
                            " has expansion draws (verify it by rejection sampling: verify_stochastic)");
  VerificationResult r;
  r.accepted_path.push_back(0);
  int u = 0;
  for (;;) {
    const TreeNode& nd = tree.node(u);
    const int32_t x = draw(u);
    if (!nd.children.empty()) ++r.target_sampling_nodes;
    if (!step(tree, u, x, r)) break;
  }
  return r;
}

VerificationResult verify_stochastic(const TokenTree& tree, int vocab, const NodeDistribution& target_probs,
                                     const NodeDistribution& draft_probs, Rng& rng, VerifierBias bias) {
  check_tree(tree, vocab, "verify_stochastic");
  if (!target_probs) throw InvalidArgument("verify_stochastic: target_probs is required");
  VerificationResult r;
  r.accepted_path.push_back(0);
  std::vector<float> residual;
  int u = 0;
  for (;;) {
    const TreeNode& nd = tree.node(u);
    int32_t x;
    if (nd.children.empty()) {
      x = rng.categorical(target_probs(u), vocab);  // a leaf: the bonus token, no candidate to verify
    } else if (bias == VerifierBias::AcceptFirstChild) {
      x = tree.node(nd.children[0]).token;
    } else if (!nd.draws.empty()) {
      if (!draft_probs)
        throw InvalidArgument("verify_stochastic: node " + std::to_string(u) +
                              " has expansion draws but no draft distribution was given");
      const float* q = draft_probs(u);
      if (!q) throw InvalidArgument("verify_stochastic: no draft distribution for node " + std::to_string(u));
      x = rejection_sample(nd, u, vocab, target_probs(u), q, rng, bias, residual);
      ++r.rejection_sampling_nodes;
    } else {
      x = rng.categorical(target_probs(u), vocab);
      ++r.target_sampling_nodes;
    }
    if (!step(tree, u, x, r)) break;
  }
  return r;
}

LazyDistributions::LazyDistributions(const float* logits, int rows, int vocab, const SamplingParams& params)
    : logits_(logits), rows_(rows), vocab_(vocab), params_(params), cache_(rows) {}

const float* LazyDistributions::operator()(int row) {
  if (row < 0 || row >= rows_)
    throw InvalidArgument("LazyDistributions: row " + std::to_string(row) + " out of range [0, " +
                          std::to_string(rows_) + ")");
  auto& d = cache_[row];
  if (d.empty()) sampling_distribution(logits_ + static_cast<size_t>(row) * vocab_, vocab_, params_, d);
  return d.data();
}

void log_softmax(const float* logits, int n, std::vector<float>& out) {
  out.resize(n);
  const double lse = log_normalizer(logits, n);
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(logits[i]) - lse);
}

std::vector<int32_t> draw_iid(const float* q, int n, int count, Rng& rng) {
  std::vector<int32_t> out;
  out.reserve(std::max(count, 0));
  for (int i = 0; i < count; ++i) out.push_back(rng.categorical(q, n));
  return out;
}

std::string verifier_bias_name(VerifierBias bias) {
  switch (bias) {
    case VerifierBias::None:
      return "none";
    case VerifierBias::AcceptFirstChild:
      return "accept_first_child";
    case VerifierBias::NoResidual:
      return "no_residual";
  }
  return "unknown";
}

}  // namespace swiftspec
