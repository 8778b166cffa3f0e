// DraftTree: best-first growth of the draft's token tree, subtree selection, re-rooting.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "swiftspec/error.h"
#include "swiftspec/speculative.h"

namespace swiftspec {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

DraftTree::DraftTree(Model& draft, const GenerationConfig& config, const SpeculativeOptions& options, uint64_t seed)
    : draft_(&draft),
      sampling_(config.sampling),
      growth_(options.resolve_growth(config.sampling)),
      branching_(config.branching),
      expand_width_(options.resolve_expand_width(config)),
      min_cum_logprob_(options.min_expand_prob > 0.0 ? std::log(options.min_expand_prob)
                                                     : -std::numeric_limits<double>::infinity()),
      rng_(seed),
      cache_(draft) {
  if (branching_ < 1) throw InvalidArgument("branching must be >= 1, got " + std::to_string(branching_));
}

bool DraftTree::start(const std::vector<int32_t>& prompt, int32_t first_token, const PrefillControl& control) {
  cache_.clear();
  draft_->truncate_committed(0);
  tree_.reset(first_token);
  q_.clear();
  return cache_.prefill(prompt, LogitsMode::None, logits_, control);
}

bool DraftTree::catch_up(const std::vector<int32_t>& tokens, int32_t new_root, const PrefillControl& control) {
  std::vector<int32_t> sequence = cache_.pending_tokens();
  sequence.push_back(tree_.node(TokenTree::root()).token);
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  cache_.clear();  // the root's and the old tree's K/V: recomputed in order below
  tree_.reset(new_root);
  q_.clear();
  const double t0 = now_s();
  const bool done = cache_.prefill(sequence, LogitsMode::None, logits_, control);
  time_ += now_s() - t0;
  return done;
}

bool DraftTree::expandable(const TreeNode& n, int depth_limit) const {
  return !n.expanded && n.depth < depth_limit && (n.depth == 0 || n.cum_logprob >= min_cum_logprob_);
}

bool DraftTree::can_grow(int depth_limit) const {
  const int need = static_cast<int>(cache_.pending_tokens().size()) + 1;
  if (cache_.free_slots() < need) return false;
  for (const TreeNode& n : tree_.nodes())
    if (expandable(n, depth_limit)) return true;
  return false;
}

int DraftTree::selectable_nodes(int depth_limit) const {
  int n = 0;
  for (const TreeNode& nd : tree_.nodes())
    if (nd.depth >= 1 && nd.depth <= depth_limit) ++n;
  return n;
}

int DraftTree::grow_step(int depth_limit, int max_new_nodes, int max_width) {
  // Best-first: unexpanded nodes by cumulative draft log-prob, then age.
  std::vector<int32_t> cand;
  for (int i = 0; i < tree_.size(); ++i)
    if (expandable(tree_.node(i), depth_limit)) cand.push_back(i);
  std::stable_sort(cand.begin(), cand.end(),
                   [this](int32_t a, int32_t b) { return tree_.node(a).cum_logprob > tree_.node(b).cum_logprob; });
  const int slots = cache_.free_slots() - static_cast<int>(cache_.pending_tokens().size());
  int width = std::min({expand_width_, static_cast<int>(cand.size()), slots});
  if (max_width >= 1) width = std::min(width, max_width);
  // Sampled growth with an exact budget: decide every node's number of draws
  // before drawing (so each node's draws stay an i.i.d. sample).
  std::vector<int> draws_per_node;
  if (max_new_nodes >= 0) {
    int left = max_new_nodes;
    for (int k = 0; k < width && left > 0; ++k) {
      draws_per_node.push_back(std::min(branching_, left));
      left -= draws_per_node.back();
    }
    width = static_cast<int>(draws_per_node.size());
  }
  if (width <= 0) return 0;
  cand.resize(width);
  for (int32_t i : cand)
    if (cache_.processed(i))
      throw InvalidArgument("DraftTree: node " + std::to_string(i) + " has K/V but was never expanded");

  const int rows = width + static_cast<int>(cache_.pending_tokens().size());
  batch_rows_.push_back(rows);
  const int vocab = draft_->config().vocab_size;
  // Top-k growth reads only each row's head where the logits are (Model::forward_top_k: on the GPU
  // for cuda) instead of handing over [rows, vocab] fp32. Greedy: the `branching` best tokens and
  // the normaliser at temperature 1. Stochastic: the kSampleHeadK best and the normaliser at the
  // request's temperature, from which top_sampling_tokens_from_head takes the children the whole
  // row would give; it reads a row (Model::read_logits_row) only when the head does not decide,
  // which needs every row of the pass readable (kReadableLogitsRows).
  const bool top_k_only = growth_ == TreeGrowth::TopK && sampling_.greedy();
  const int head_k = std::min(kSampleHeadK, vocab);
  const bool top_k_head =
      growth_ == TreeGrowth::TopK && !sampling_.greedy() && rows <= kReadableLogitsRows && branching_ < head_k;
  const double t0 = now_s();
  int row0;
  if (top_k_only)
    row0 = cache_.forward_nodes_top_k(tree_, cand, LogitsMode::All, std::min(branching_, vocab), true, top_);
  else if (top_k_head)
    row0 = cache_.forward_nodes_top_k(tree_, cand, LogitsMode::All, head_k, true, top_, 1.0 / sampling_.temperature);
  else
    row0 = cache_.forward_nodes(tree_, cand, LogitsMode::All, logits_);
  time_ += now_s() - t0;
  ++steps_;
  drafted_nodes_ += width;

  const int before = tree_.size();
  std::vector<int32_t> kids;
  std::vector<float> kid_q;
  for (int k = 0; k < width; ++k) {
    const int node = cand[k];
    const int count = draws_per_node.empty() ? branching_ : draws_per_node[k];
    if (top_k_only) {
      // log softmax at temperature 1 of the top tokens
      const int row = row0 + k;
      for (int j = 0; j < std::min(count, top_.k); ++j) {
        const size_t e = static_cast<size_t>(row) * top_.k + j;
        tree_.add_child(
            node, top_.ids[e],
            std::min(0.0f, static_cast<float>(static_cast<double>(top_.logits[e]) - top_.log_normalizer[row])));
      }
      tree_.set_expanded(node);
      continue;
    }
    if (growth_ == TreeGrowth::TopK) {
      // top-k growth of a stochastic request: the top tokens of its sampling distribution q, log q each
      if (top_k_head) {
        bool read = false;
        top_sampling_tokens_from_head(
            top_, row0 + k, vocab, sampling_, count,
            [&](std::vector<float>& whole) { draft_->read_logits_row(row0 + k, whole); }, kids, kid_q, &read);
        whole_rows_read_ += read ? 1 : 0;
      } else {
        top_sampling_tokens(logits_.data() + static_cast<size_t>(row0 + k) * vocab, vocab, sampling_, count, kids,
                            kid_q);
        ++whole_rows_read_;
      }
      for (size_t j = 0; j < kids.size(); ++j) tree_.add_child(node, kids[j], std::min(0.0f, std::log(kid_q[j])));
      tree_.set_expanded(node);
      continue;
    }
    // Sampled growth: `count` i.i.d. draws from q, kept whole for recursive rejection sampling
    const float* row = logits_.data() + static_cast<size_t>(row0 + k) * vocab;
    auto q = std::make_shared<std::vector<float>>();
    sampling_distribution(row, vocab, sampling_, *q);
    ++whole_rows_read_;
    std::vector<int32_t> draws = draw_iid(q->data(), vocab, count, rng_);
    for (int32_t t : draws)
      if (tree_.find_child(node, t) < 0) tree_.add_child(node, t, std::min(0.0f, std::log((*q)[t])));
    tree_.set_expanded(node, std::move(draws));
    if (static_cast<int>(q_.size()) <= node) q_.resize(node + 1);
    q_[node] = std::move(q);
  }
  return tree_.size() - before;
}

void DraftTree::grow_to(int budget, int depth_limit) {
  for (;;) {
    const int have = selectable_nodes(depth_limit);
    if (have >= budget || !can_grow(depth_limit)) return;
    const int added = grow_step(depth_limit, growth_ == TreeGrowth::Sampled ? budget - have : -1);
    if (added == 0 && !can_grow(depth_limit)) return;
  }
}

TokenTree DraftTree::select(int budget, int depth_limit, std::vector<int32_t>& to_draft) const {
  return tree_.subtree(tree_.select_best(budget, std::max(depth_limit, 0)), &to_draft);
}

const float* DraftTree::draft_probs(int node) const {
  if (node < 0 || node >= static_cast<int>(q_.size()) || !q_[node]) return nullptr;
  return q_[node]->data();
}

int DraftTree::advance(const std::vector<int32_t>& accepted_tokens, int32_t bonus) {
  std::vector<int32_t> path{TokenTree::root()};
  for (int32_t t : accepted_tokens) {
    const int c = tree_.find_child(path.back(), t);
    if (c < 0)
      throw InvalidArgument("DraftTree::advance: accepted token " + std::to_string(t) + " is not a child of node " +
                            std::to_string(path.back()) + " of the draft tree");
    path.push_back(c);
  }
  cache_.commit_path(tree_, path);
  const int keep = tree_.find_child(path.back(), bonus);
  std::vector<int32_t> old_to_new;
  if (keep >= 0) {
    old_to_new = tree_.reroot(keep);
  } else {
    old_to_new.assign(tree_.size(), -1);
    tree_.reset(bonus);
  }
  cache_.remap(old_to_new);
  std::vector<std::shared_ptr<std::vector<float>>> q(tree_.size());
  for (size_t i = 0; i < q_.size() && i < old_to_new.size(); ++i)
    if (old_to_new[i] >= 0) q[old_to_new[i]] = std::move(q_[i]);
  q_ = std::move(q);
  return keep >= 0 ? tree_.size() : 0;
}

}  // namespace swiftspec
