// Token tree: construction, selection of the best prefix-closed subtree, re-rooting.
#include "swiftspec/token_tree.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <string>

#include "swiftspec/error.h"

namespace swiftspec {

namespace {
std::string idx(int i) { return std::to_string(i); }
}  // namespace

void TokenTree::reset(int32_t root_token) {
  if (root_token < 0) throw InvalidArgument("TokenTree: root token must be >= 0, got " + idx(root_token));
  nodes_.clear();
  TreeNode root;
  root.token = root_token;
  nodes_.push_back(std::move(root));
}

const TreeNode& TokenTree::node(int i) const {
  if (i < 0 || i >= size())
    throw InvalidArgument("TokenTree: node index " + idx(i) + " out of range [0, " + idx(size()) + ")");
  return nodes_[i];
}

int TokenTree::add_child(int parent, int32_t token, float logprob) {
  if (parent < 0 || parent >= size())
    throw InvalidArgument("TokenTree::add_child: parent " + idx(parent) + " out of range [0, " + idx(size()) + ")");
  if (token < 0) throw InvalidArgument("TokenTree::add_child: token must be >= 0, got " + idx(token));
  if (std::isnan(logprob) || logprob > 0.0f)
    throw InvalidArgument("TokenTree::add_child: logprob must be <= 0, got " + std::to_string(logprob));
  if (find_child(parent, token) >= 0)
    throw InvalidArgument("TokenTree::add_child: node " + idx(parent) + " already has a child with token " +
                          idx(token));
  TreeNode n;
  n.token = token;
  n.parent = parent;
  n.depth = nodes_[parent].depth + 1;
  n.logprob = logprob;
  n.cum_logprob = nodes_[parent].cum_logprob + static_cast<double>(logprob);
  const int index = size();
  nodes_.push_back(std::move(n));
  nodes_[parent].children.push_back(index);
  return index;
}

int TokenTree::find_child(int parent, int32_t token) const {
  for (int32_t c : node(parent).children)
    if (nodes_[c].token == token) return c;
  return -1;
}

void TokenTree::set_expanded(int i, std::vector<int32_t> draws) {
  node(i);  // range check
  for (int32_t t : draws)
    if (find_child(i, t) < 0)
      throw InvalidArgument("TokenTree::set_expanded: draw " + idx(t) + " of node " + idx(i) +
                            " is not the token of one of its children");
  nodes_[i].expanded = true;
  nodes_[i].draws = std::move(draws);
}

void TokenTree::clear_draws() {
  for (auto& n : nodes_) n.draws.clear();
}

std::vector<int32_t> TokenTree::path_to(int i) const {
  node(i);
  std::vector<int32_t> path;
  for (int j = i; j >= 0; j = nodes_[j].parent) path.push_back(j);
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<int32_t> TokenTree::path_tokens(int i) const {
  std::vector<int32_t> out;
  for (int32_t j : path_to(i)) out.push_back(nodes_[j].token);
  return out;
}

int TokenTree::max_depth() const {
  int d = -1;
  for (const auto& n : nodes_) d = std::max(d, n.depth);
  return d;
}

std::vector<uint8_t> TokenTree::attention_mask() const {
  const int n = size();
  std::vector<uint8_t> mask(static_cast<size_t>(n) * n, 0);
  for (int i = 0; i < n; ++i)
    for (int j = i; j >= 0; j = nodes_[j].parent) mask[static_cast<size_t>(i) * n + j] = 1;
  return mask;
}

void TokenTree::ancestors_csr(std::vector<int32_t>& offsets, std::vector<int32_t>& values) const {
  offsets.assign(1, 0);
  values.clear();
  for (int i = 0; i < size(); ++i) {
    const auto p = path_to(i);
    values.insert(values.end(), p.begin(), p.end());
    offsets.push_back(static_cast<int32_t>(values.size()));
  }
}

std::vector<int32_t> TokenTree::positions(int base_position) const {
  std::vector<int32_t> pos(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) pos[i] = base_position + nodes_[i].depth;
  return pos;
}

std::vector<int32_t> TokenTree::select_best(int budget, int max_depth, int node_limit) const {
  if (empty()) throw InvalidArgument("TokenTree::select_best: the tree is empty");
  if (budget < 0) throw InvalidArgument("TokenTree::select_best: budget must be >= 0, got " + idx(budget));
  if (max_depth < 0) throw InvalidArgument("TokenTree::select_best: max_depth must be >= 0, got " + idx(max_depth));
  // Max-heap on (cum_logprob, -index): best cumulative probability first, then
  // the older node (smaller index) — deterministic whatever the heap does.
  auto worse = [this](int32_t a, int32_t b) {
    if (nodes_[a].cum_logprob != nodes_[b].cum_logprob) return nodes_[a].cum_logprob < nodes_[b].cum_logprob;
    return a > b;
  };
  std::priority_queue<int32_t, std::vector<int32_t>, decltype(worse)> frontier(worse);
  const int32_t limit = node_limit >= 1 ? node_limit : size();
  std::vector<int32_t> chosen{0};
  if (max_depth >= 1)
    for (int32_t c : nodes_[0].children)
      if (c < limit) frontier.push(c);
  while (static_cast<int>(chosen.size()) - 1 < budget && !frontier.empty()) {
    const int32_t best = frontier.top();
    frontier.pop();
    chosen.push_back(best);
    if (nodes_[best].depth < max_depth)
      for (int32_t c : nodes_[best].children)
        if (c < limit) frontier.push(c);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

TokenTree TokenTree::subtree(const std::vector<int32_t>& nodes, std::vector<int32_t>* new_to_old) const {
  if (empty()) throw InvalidArgument("TokenTree::subtree: the tree is empty");
  std::vector<int32_t> old_to_new(nodes_.size(), -1);
  std::vector<int32_t> order(nodes);
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  for (int32_t i : order) node(i);  // range check
  if (order.empty() || order[0] != 0)
    throw InvalidArgument("TokenTree::subtree: the node list must contain the root (0)");
  const bool whole = static_cast<int>(order.size()) == size();
  TokenTree out;
  out.nodes_.reserve(order.size());
  for (int32_t old : order) {
    const TreeNode& src = nodes_[old];
    if (old != 0 && old_to_new[src.parent] < 0)
      throw InvalidArgument("TokenTree::subtree: node " + idx(old) + " is listed but its parent " + idx(src.parent) +
                            " is not (the node set must be prefix-closed)");
    TreeNode n = src;
    n.children.clear();
    if (!whole) n.draws.clear();
    n.parent = old == 0 ? -1 : old_to_new[src.parent];
    const int32_t index = out.size();
    old_to_new[old] = index;
    out.nodes_.push_back(std::move(n));
    if (old != 0) out.nodes_[out.nodes_[index].parent].children.push_back(index);
  }
  if (new_to_old) *new_to_old = order;
  return out;
}

std::vector<int32_t> TokenTree::reroot(int new_root) {
  node(new_root);
  std::vector<int32_t> old_to_new(nodes_.size(), -1);
  std::vector<TreeNode> kept;
  const int32_t base_depth = nodes_[new_root].depth;
  const double base_cum = nodes_[new_root].cum_logprob;
  // Topological order: a descendant of new_root has a larger index and a
  // kept parent, so one forward sweep finds the whole subtree.
  for (int i = new_root; i < size(); ++i) {
    if (i != new_root && (nodes_[i].parent < 0 || old_to_new[nodes_[i].parent] < 0)) continue;
    TreeNode n = std::move(nodes_[i]);
    n.children.clear();
    n.draws.clear();
    if (i == new_root) {
      n.parent = -1;
      n.logprob = 0.0f;
    } else {
      n.parent = old_to_new[n.parent];
    }
    n.depth -= base_depth;
    n.cum_logprob = i == new_root ? 0.0 : n.cum_logprob - base_cum;
    old_to_new[i] = static_cast<int32_t>(kept.size());
    kept.push_back(std::move(n));
    if (i != new_root) kept[kept.back().parent].children.push_back(old_to_new[i]);
  }
  nodes_ = std::move(kept);
  return old_to_new;
}

void TokenTree::check_invariants() const {
  auto fail = [](const std::string& what) { throw InvalidArgument("TokenTree invariant violated: " + what); };
  if (empty()) return;
  if (nodes_[0].parent != -1 || nodes_[0].depth != 0 || nodes_[0].cum_logprob != 0.0)
    fail("root must have parent -1, depth 0, cum_logprob 0");
  for (int i = 0; i < size(); ++i) {
    const TreeNode& n = nodes_[i];
    if (i > 0) {
      if (n.parent < 0 || n.parent >= i) fail("node " + idx(i) + " has parent " + idx(n.parent) + " (must precede it)");
      const TreeNode& p = nodes_[n.parent];
      if (n.depth != p.depth + 1) fail("node " + idx(i) + " depth " + idx(n.depth) + " != parent depth + 1");
      if (std::count(p.children.begin(), p.children.end(), i) != 1)
        fail("node " + idx(i) + " is not listed exactly once among its parent's children");
      const double expect = p.cum_logprob + static_cast<double>(n.logprob);
      if (std::fabs(n.cum_logprob - expect) > 1e-9 * (1.0 + std::fabs(expect)))
        fail("node " + idx(i) + " cum_logprob " + std::to_string(n.cum_logprob) + " != parent's + logprob " +
             std::to_string(expect));
    }
    for (size_t a = 0; a < n.children.size(); ++a) {
      const int32_t c = n.children[a];
      if (c <= i || c >= size() || nodes_[c].parent != i) fail("node " + idx(i) + " lists a wrong child " + idx(c));
      for (size_t b = a + 1; b < n.children.size(); ++b)
        if (nodes_[n.children[b]].token == nodes_[c].token)
          fail("node " + idx(i) + " has two children with token " + idx(nodes_[c].token));
    }
    for (int32_t t : n.draws)
      if (find_child(i, t) < 0) fail("node " + idx(i) + " has draw " + idx(t) + " without a child");
  }
}

}  // namespace swiftspec
