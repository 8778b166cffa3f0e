// TreeVerifier: the target side of speculation — one tree-mode forward, verify, commit.
#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>

#include "swiftspec/error.h"
#include "swiftspec/speculative.h"

namespace swiftspec {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

TreeVerifier::TreeVerifier(Model& target, const SamplingParams& sampling, VerifierBias bias)
    : target_(&target), sampling_(sampling), bias_(bias), cache_(target) {}

int32_t TreeVerifier::start(const std::vector<int32_t>& prompt, Rng& rng, const PrefillControl& control) {
  cache_.clear();
  target_->truncate_committed(0);
  if (!cache_.prefill(prompt, LogitsMode::Last, logits_, control)) return -1;
  return sample_token(logits_.data(), target_->config().vocab_size, sampling_, rng, scratch_);
}

VerificationResult TreeVerifier::verify(const TokenTree& tree, const NodeDistribution& draft_probs, Rng& rng) {
  const int n = tree.size();
  const int vocab = target_->config().vocab_size;
  std::vector<int32_t> nodes(n);
  std::iota(nodes.begin(), nodes.end(), 0);
  cache_.clear();
  // Greedy verification reads one arg-max per node: the backend selects it where the logits
  // are (on the GPU for cuda) instead of handing over [n, vocab] fp32 (Model::forward_top_k).
  const bool greedy = sampling_.greedy() && bias_ == VerifierBias::None;
  // A tree of top-k growth (no expansion draws) under top-k sampling is verified by sampling
  // each visited node's target distribution, which the row's top_k best logits determine
  // (top_k < vocab: a top_k that keeps every token would only rank whole rows for nothing).
  const bool drawless_stochastic =
      !sampling_.greedy() && bias_ == VerifierBias::None &&
      std::none_of(tree.nodes().begin(), tree.nodes().end(), [](const TreeNode& nd) { return !nd.draws.empty(); });
  const bool top_k_sampling = drawless_stochastic && sampling_.top_k >= 1 && sampling_.top_k < vocab;
  // Temperature / top-p alone on such a tree: each visited node's token is drawn by sample_from_head, the
  // map of one uniform that target-only decoding uses, so speculation emits the same tokens for a seed.
  // Its head (the kSampleHeadK best logits and ln Z at the request's temperature) is selected where the
  // logits are (Model::forward_top_k: on the GPU for cuda) and a whole row read (Model::read_logits_row)
  // only when the head does not decide the draw. That needs every row of the pass readable: a tree of
  // more than kReadableLogitsRows rows (the CUDA backend runs it in pieces and keeps the last) takes the
  // whole rows to the host instead and selects each visited node's head there.
  const bool head_sampling = drawless_stochastic && (sampling_.top_k == 0 || sampling_.top_k >= vocab);
  const bool head_on_device = head_sampling && n <= kReadableLogitsRows;
  const int head_k = std::min(kSampleHeadK, vocab);
  const double inv_t = greedy ? 1.0 : 1.0 / sampling_.temperature;
  const int k = greedy ? 1 : sampling_.top_k;  // top_k < vocab when it is used
  const double t0 = now_s();
  int row0;
  if (greedy || top_k_sampling)
    row0 = cache_.forward_nodes_top_k(tree, nodes, LogitsMode::All, k, false, top_);
  else if (head_on_device)
    row0 = cache_.forward_nodes_top_k(tree, nodes, LogitsMode::All, head_k, true, top_, inv_t);
  else
    row0 = cache_.forward_nodes(tree, nodes, LogitsMode::All, logits_);
  time_ += now_s() - t0;
  ++steps_;
  if (!(greedy || top_k_sampling || head_on_device)) whole_rows_read_ += n;  // all of them, to the host
  if (row0 != 0) throw InvalidArgument("TreeVerifier: the target cache had pending tokens");
  VerificationResult r;
  if (greedy) {
    r = verify_greedy(tree, top_.ids);
  } else if (top_k_sampling) {
    r = verify_by_target_sampling(tree, [&](int u) {
      const size_t e = static_cast<size_t>(u) * top_.k;
      return sample_from_top_k(top_.ids.data() + e, top_.logits.data() + e, top_.k, sampling_, rng);
    });
  } else if (head_on_device) {
    r = verify_by_target_sampling(tree, [&](int u) {
      return sample_from_head(top_, u, vocab, sampling_, rng, [&](std::vector<float>& whole) {
        target_->read_logits_row(u, whole);
        ++whole_rows_read_;
      });
    });
  } else if (head_sampling) {
    r = verify_by_target_sampling(tree, [&](int u) {
      const float* row = logits_.data() + static_cast<size_t>(u) * vocab;
      select_top_k_logits(row, 1, vocab, head_k, true, top_, inv_t);
      return sample_from_head(top_, 0, vocab, sampling_, rng,
                              [&](std::vector<float>& whole) { whole.assign(row, row + vocab); });
    });
  } else {
    LazyDistributions target(logits_.data(), n, vocab, sampling_);
    r = verify_stochastic(tree, vocab, std::ref(target), draft_probs, rng, bias_);
  }
  cache_.commit_path(tree, r.accepted_path);
  cache_.clear();
  return r;
}

}  // namespace swiftspec
