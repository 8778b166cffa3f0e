// Tree KV bookkeeping for one model (SwiftSpec, ASPLOS'26 §4.2, "tree-aware
// KV cache"): which token-tree node owns which tree KV slot of the model,
// which nodes already have K/V, and how an accepted path moves into the
// committed region.
//
// The model (model.h) owns the memory: a committed region and `max_tree` tree
// slots. This class owns the *meaning* of the tree slots for one TokenTree:
//
//   committed region   [0, committed_len)    accepted context
//   pending tokens     final tokens whose K/V is not computed yet (at most a
//                      few: an accepted node the draft never processed);
//                      positions committed_len, committed_len + 1, ...
//   token tree         root at base_position() = committed_len + #pending;
//                      node at depth d at position base_position() + d.
//
// forward_nodes() processes tree nodes in one tree-mode forward pass. The
// pending tokens ride along at the front of the same batch (as a chain in
// tree slots) and are moved into the committed region right after it, so an
// accepted-but-unprocessed node costs no extra forward pass. Every row attends
// the committed region then its ancestors in depth order, itself last — the
// same keys in the same order as plain decoding, which is what keeps the K/V
// of a node bit-identical to decoding its path one token at a time on a
// batch-invariant backend (model.h, "Exactness").
//
// After a verification: commit_path() appends the K/V of the accepted path
// (root first) to the committed region with Model::commit_tree_slots — nodes
// the model never processed become pending tokens instead — then remap()
// follows TokenTree::reroot()/reset(): slots of dropped nodes return to the
// free list, kept nodes keep their slots and K/V (their keys and positions are
// unchanged by the move, so nothing is recomputed).
//
// Single-threaded: one owner per model (the async engine gives each worker
// group its own cache).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "swiftspec/model.h"
#include "swiftspec/token_tree.h"

namespace swiftspec {

class TreeKvCache {
 public:
  /// Bookkeeping for `model`'s tree slots; all `model.options().max_tree`
  /// slots start free and no node is processed. The model must outlive this.
  explicit TreeKvCache(Model& model);

  Model& model() const { return *model_; }
  /// Number of tree slots of the model (max_tree).
  int capacity() const { return static_cast<int>(slot_owner_.size()); }
  /// Slots not owned by a node or a pending token.
  int free_slots() const { return static_cast<int>(free_.size()); }
  /// RoPE position of the tree root: committed_len + pending tokens.
  int base_position() const;
  /// Final tokens not yet in the committed region (oldest first); they are
  /// processed at the front of the next forward_nodes() batch.
  const std::vector<int32_t>& pending_tokens() const { return pending_; }

  /// True when node `i` of the current tree has K/V in a tree slot.
  bool processed(int node) const;
  /// Tree slot of node `i`, or -1 when it has none.
  int32_t slot(int node) const;
  /// Number of nodes with K/V.
  int processed_count() const;

  /// Forgets every node and pending token and frees all slots (does not
  /// touch the committed region). Call before a new request or a new tree
  /// that is not a re-rooted version of the last one.
  void clear();

  /// Appends `tokens` to the committed region (prefill) with swiftspec::prefill():
  /// append-mode forward passes of control.chunk tokens (0: the model's), polling
  /// control.cancelled before each. Requires no pending tokens. `logits` as one
  /// Model::forward over all of `tokens`. Returns false when cancelled (the committed
  /// region then holds a prefix of `tokens`, `logits` is empty).
  bool prefill(const std::vector<int32_t>& tokens, LogitsMode mode, std::vector<float>& logits,
               const PrefillControl& control = {});

  /// Builds the ForwardBatch that processes the pending tokens (rows 0..p-1)
  /// then `nodes` of `tree` (rows p..p+n-1), in tree mode; allocates their
  /// slots only in `slots_out` (nothing is recorded). Each node must be
  /// unprocessed, listed once, and have a processed parent or a parent
  /// listed before it; the root may be listed (it attends only the committed
  /// region, the pending tokens and itself). Throws InvalidArgument naming
  /// the node and the violated rule, or when fewer than p + n slots are free.
  ForwardBatch build_batch(const TokenTree& tree, const std::vector<int32_t>& nodes, LogitsMode mode,
                           std::vector<int32_t>& slots_out) const;

  /// Processes `nodes` (see build_batch) in one Model::forward and records
  /// their slots; then commits the pending tokens' K/V into the committed
  /// region and frees their slots. `logits` receives Model::forward's output:
  /// with LogitsMode::All, [p + n, vocab] fp32 where p = pending tokens before
  /// the call. Returns p, the row of nodes[0]. With an empty `nodes` and no
  /// pending tokens, does nothing and returns 0.
  int forward_nodes(const TokenTree& tree, const std::vector<int32_t>& nodes, LogitsMode mode,
                    std::vector<float>& logits);
  /// forward_nodes() through Model::forward_top_k: `top` receives each logits row's
  /// `k` largest entries (and log-normalizer at `inv_temperature` when asked) instead of the
  /// rows; Model::read_logits_row can then copy a whole row of the pass (row p + i: nodes[i]).
  /// With an empty `nodes` and no pending tokens, does nothing (top.rows() == 0) and returns 0.
  /// Throws what Model::forward_top_k throws (a bad k or inv_temperature before any slot is
  /// recorded).
  int forward_nodes_top_k(const TokenTree& tree, const std::vector<int32_t>& nodes, LogitsMode mode, int k,
                          bool with_log_normalizer, TopKLogits& top, double inv_temperature = 1.0);

  /// Commits the accepted path `path` (tree indices, root first, each the
  /// parent of the next): the longest processed prefix is appended to the
  /// committed region with Model::commit_tree_slots (in path order); the
  /// tokens of the remaining (unprocessed) suffix become pending tokens.
  /// The committed nodes keep their (now stale) slots until remap(). With
  /// pending tokens left from an earlier commit (no forward pass since), the
  /// root is unprocessed and the whole path extends the pending chain. Returns
  /// the number of nodes committed. Throws InvalidArgument if `path` does not
  /// start at the root or is not a parent chain.
  int commit_path(const TokenTree& tree, const std::vector<int32_t>& path);

  /// Follows a change of the tree's indices: `old_to_new[i]` is node i's new
  /// index or -1 (TokenTree::reroot's return value; all -1 for a reset).
  /// Slots of dropped nodes are freed. Throws InvalidArgument if the map is
  /// not sized like the old tree.
  void remap(const std::vector<int32_t>& old_to_new);

 private:
  /// forward_nodes' body: `pass` runs the model over the built batch.
  int record_pass(const TokenTree& tree, const std::vector<int32_t>& nodes, LogitsMode mode,
                  const std::function<void(const ForwardBatch&)>& pass);

  Model* model_;
  std::vector<int32_t> node_slot_;   ///< node index -> slot, -1 (sized by the largest index seen)
  std::vector<int32_t> slot_owner_;  ///< slot -> node index, -1 free, -2 pending token
  std::vector<int32_t> free_;        ///< free slots; the back is handed out first
  std::vector<int32_t> pending_;     ///< pending tokens, oldest first
};

}  // namespace swiftspec
