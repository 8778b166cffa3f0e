// Tree KV bookkeeping: node <-> tree-slot map, batch building, commit and re-root.
#include "swiftspec/tree_kv_cache.h"

#include <algorithm>
#include <string>

#include "swiftspec/error.h"

namespace swiftspec {

namespace {
std::string str(long long v) { return std::to_string(v); }
constexpr int32_t kPendingOwner = -2;
}  // namespace

TreeKvCache::TreeKvCache(Model& model) : model_(&model) {
  const int cap = model.options().max_tree;
  if (cap < 1) throw InvalidArgument("TreeKvCache: the model has max_tree = " + str(cap) + " tree slots (need >= 1)");
  slot_owner_.assign(cap, -1);
  clear();
}

int TreeKvCache::base_position() const { return model_->committed_len() + static_cast<int>(pending_.size()); }

bool TreeKvCache::processed(int node) const { return slot(node) >= 0; }

int32_t TreeKvCache::slot(int node) const {
  if (node < 0 || node >= static_cast<int>(node_slot_.size())) return -1;
  return node_slot_[node];
}

int TreeKvCache::processed_count() const {
  return static_cast<int>(std::count_if(node_slot_.begin(), node_slot_.end(), [](int32_t s) { return s >= 0; }));
}

void TreeKvCache::clear() {
  node_slot_.clear();
  pending_.clear();
  std::fill(slot_owner_.begin(), slot_owner_.end(), -1);
  free_.clear();
  for (int s = capacity() - 1; s >= 0; --s) free_.push_back(s);
}

bool TreeKvCache::prefill(const std::vector<int32_t>& tokens, LogitsMode mode, std::vector<float>& logits,
                          const PrefillControl& control) {
  if (!pending_.empty())
    throw InvalidArgument("TreeKvCache::prefill: " + str(pending_.size()) + " pending tokens must be processed first");
  return swiftspec::prefill(*model_, tokens, mode, logits, control);
}

ForwardBatch TreeKvCache::build_batch(const TokenTree& tree, const std::vector<int32_t>& nodes, LogitsMode mode,
                                      std::vector<int32_t>& slots_out) const {
  const int p = static_cast<int>(pending_.size());
  const int n = static_cast<int>(nodes.size());
  if (p + n > free_slots())
    throw InvalidArgument("TreeKvCache: a batch of " + str(p) + " pending tokens and " + str(n) +
                          " tree nodes needs more tree slots than are free (" + str(free_slots()) + " of " +
                          str(capacity()) + ", the model's max_tree)");
  slots_out.clear();
  for (int i = 0; i < p + n; ++i) slots_out.push_back(free_[free_.size() - 1 - i]);

  ForwardBatch b;
  b.logits = mode;
  b.attend_offsets.push_back(0);
  const int committed = model_->committed_len();
  std::vector<int32_t> pending_slots(slots_out.begin(), slots_out.begin() + p);
  for (int j = 0; j < p; ++j) {  // the pending chain
    b.tokens.push_back(pending_[j]);
    b.positions.push_back(committed + j);
    b.tree_slots.push_back(slots_out[j]);
    b.attend_slots.insert(b.attend_slots.end(), pending_slots.begin(), pending_slots.begin() + j + 1);
    b.attend_offsets.push_back(static_cast<int32_t>(b.attend_slots.size()));
  }
  // Slots of this batch's nodes, by node index, for ancestors processed in it.
  std::vector<int32_t> batch_slot(tree.size(), -1);
  const int base = committed + p;
  for (int k = 0; k < n; ++k) {
    const int i = nodes[k];
    const TreeNode& nd = tree.node(i);  // range check
    if (processed(i))
      throw InvalidArgument("TreeKvCache: node " + str(i) + " already has K/V (slot " + str(slot(i)) + ")");
    if (batch_slot[i] >= 0) throw InvalidArgument("TreeKvCache: node " + str(i) + " is listed twice in one batch");
    if (nd.parent >= 0 && !processed(nd.parent) && batch_slot[nd.parent] < 0)
      throw InvalidArgument("TreeKvCache: node " + str(i) + " is listed but its parent " + str(nd.parent) +
                            " has no K/V and is not listed before it");
    batch_slot[i] = slots_out[p + k];
    b.tokens.push_back(nd.token);
    b.positions.push_back(base + nd.depth);
    b.tree_slots.push_back(slots_out[p + k]);
    b.attend_slots.insert(b.attend_slots.end(), pending_slots.begin(), pending_slots.end());
    for (int32_t a : tree.path_to(i)) b.attend_slots.push_back(batch_slot[a] >= 0 ? batch_slot[a] : slot(a));
    b.attend_offsets.push_back(static_cast<int32_t>(b.attend_slots.size()));
  }
  return b;
}

int TreeKvCache::forward_nodes(const TokenTree& tree, const std::vector<int32_t>& nodes, LogitsMode mode,
                               std::vector<float>& logits) {
  logits.clear();
  return record_pass(tree, nodes, mode, [&](const ForwardBatch& batch) { model_->forward(batch, logits); });
}

int TreeKvCache::forward_nodes_top_k(const TokenTree& tree, const std::vector<int32_t>& nodes, LogitsMode mode, int k,
                                     bool with_log_normalizer, TopKLogits& top, double inv_temperature) {
  top = TopKLogits{};
  return record_pass(tree, nodes, mode, [&](const ForwardBatch& batch) {
    model_->forward_top_k(batch, k, with_log_normalizer, top, inv_temperature);
  });
}

int TreeKvCache::record_pass(const TokenTree& tree, const std::vector<int32_t>& nodes, LogitsMode mode,
                             const std::function<void(const ForwardBatch&)>& pass) {
  const int p = static_cast<int>(pending_.size());
  if (nodes.empty() && p == 0) return 0;
  std::vector<int32_t> slots;
  ForwardBatch batch = build_batch(tree, nodes, mode, slots);
  pass(batch);
  // Record: the slots handed out are the last p + n entries of free_, in order.
  free_.resize(free_.size() - slots.size());
  for (int j = 0; j < p; ++j) slot_owner_[slots[j]] = kPendingOwner;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const int i = nodes[k];
    if (static_cast<int>(node_slot_.size()) <= i) node_slot_.resize(i + 1, -1);
    node_slot_[i] = slots[p + k];
    slot_owner_[slots[p + k]] = i;
  }
  if (p > 0) {  // the pending tokens now have K/V: move them to the committed region
    std::vector<int32_t> ps(slots.begin(), slots.begin() + p);
    model_->commit_tree_slots(ps);
    for (int32_t s : ps) {
      slot_owner_[s] = -1;
      free_.push_back(s);
    }
    pending_.clear();
  }
  return p;
}

int TreeKvCache::commit_path(const TokenTree& tree, const std::vector<int32_t>& path) {
  if (path.empty() || path[0] != TokenTree::root())
    throw InvalidArgument("TreeKvCache::commit_path: the accepted path must start at the root (0)");
  for (size_t k = 1; k < path.size(); ++k)
    if (tree.node(path[k]).parent != path[k - 1])
      throw InvalidArgument("TreeKvCache::commit_path: node " + str(path[k]) + " is not a child of node " +
                            str(path[k - 1]));
  std::vector<int32_t> slots;
  size_t k = 0;
  for (; k < path.size() && processed(path[k]); ++k) slots.push_back(slot(path[k]));
  // A processed node's ancestors and the pending tokens before it were all
  // processed in its batch or earlier, so pending tokens mean an unprocessed root.
  if (!slots.empty() && !pending_.empty())
    throw InvalidArgument("TreeKvCache::commit_path: node " + str(path[0]) + " has K/V but " + str(pending_.size()) +
                          " pending tokens before it do not");
  if (!slots.empty()) model_->commit_tree_slots(slots);
  for (size_t j = k; j < path.size(); ++j) pending_.push_back(tree.node(path[j]).token);
  return static_cast<int>(slots.size());
}

void TreeKvCache::remap(const std::vector<int32_t>& old_to_new) {
  // node_slot_ may be shorter than the old tree (unprocessed tail nodes).
  if (old_to_new.size() < node_slot_.size())
    throw InvalidArgument("TreeKvCache::remap: the map has " + str(old_to_new.size()) +
                          " entries but nodes up to index " + str(node_slot_.size() - 1) + " have slots");
  std::vector<int32_t> next;
  for (size_t i = 0; i < node_slot_.size(); ++i) {
    const int32_t s = node_slot_[i];
    if (s < 0) continue;
    const int32_t ni = old_to_new[i];
    if (ni < 0) {
      slot_owner_[s] = -1;
      free_.push_back(s);
    } else {
      if (static_cast<int>(next.size()) <= ni) next.resize(ni + 1, -1);
      next[ni] = s;
      slot_owner_[s] = ni;
    }
  }
  node_slot_ = std::move(next);
}

}  // namespace swiftspec
