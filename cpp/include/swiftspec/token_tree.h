// The token tree of speculative decoding: the draft model's proposals for the
// next tokens, as a prefix-closed tree rooted at the pending token.
//
// Conventions (used by tree_kv_cache.h, verification.h and speculative.h):
//  - The root (index 0, depth 0) is the *pending token*: the last final token
//    of the sequence (a bonus token or the first sampled token), already
//    emitted to the user but whose K/V is not yet in the committed region.
//    A node at depth d sits at RoPE position `base_position + d`, where
//    base_position is the root's position (committed tokens before it).
//  - Every non-root node is a speculative token proposed by the draft as the
//    continuation of its parent. Its `logprob` is the draft's log-probability
//    (natural log) of its token given the path root..parent, and
//    `cum_logprob` the sum of logprobs from the root's children down to it —
//    the draft's estimate of how likely the whole path is (root: 0).
//  - Nodes are stored in topological order: a parent's index is always
//    smaller than its children's. Re-rooting and sub-tree extraction keep the
//    relative order, so index order is always a valid processing order.
//  - Siblings carry distinct tokens (a token tree, not a multiset).
//
// Best prefix-closed sub-tree of at most B nodes: SpecInfer (Miao et al.,
// ASPLOS'24, §3) and SpecExec (Svirschevski et al., NeurIPS'24, §3) verify the
// subtree that maximises the expected number of accepted tokens under the
// draft's own estimate, i.e. the B nodes with the largest cumulative draft
// probability. Because a child's cumulative probability never exceeds its
// parent's, picking greedily from the frontier (a max-heap seeded with the
// root's children) yields exactly that set, and it is prefix-closed by
// construction. SwiftSpec (ASPLOS'26, §4.1) hands such a subtree to the
// target group and then re-roots the draft's tree at the accepted path.
#pragma once
#include <cstdint>
#include <vector>

namespace swiftspec {

/// One node of a token tree.
struct TreeNode {
  int32_t token = 0;              ///< token id
  int32_t parent = -1;            ///< index of the parent; -1 for the root
  int32_t depth = 0;              ///< 0 for the root, parent's depth + 1 otherwise
  float logprob = 0.0f;           ///< draft log-prob of `token` given root..parent (0 for the root)
  double cum_logprob = 0.0;       ///< sum of logprob along root..this node (0 for the root)
  std::vector<int32_t> children;  ///< child indices, in insertion order
  /// The draft has proposed this node's children (its distribution was read).
  bool expanded = false;
  /// Sampled expansion only: the ordered i.i.d. draws from the draft
  /// distribution that produced `children` (repeats kept, so
  /// children == distinct(draws)). Recursive rejection sampling (SpecInfer,
  /// verification.h) needs the draws, not just the distinct tokens. Empty for
  /// top-k expansion, or when the draws no longer describe an unbiased sample
  /// (see subtree() and reroot()).
  std::vector<int32_t> draws;
};

/// A prefix-closed token tree. Cheap to copy (a vector of small nodes).
class TokenTree {
 public:
  /// An empty tree (size 0); call reset() before use.
  TokenTree() = default;
  /// A tree holding only the root `root_token`.
  explicit TokenTree(int32_t root_token) { reset(root_token); }

  /// Drops every node and makes `root_token` the new root.
  void reset(int32_t root_token);

  int size() const { return static_cast<int>(nodes_.size()); }
  bool empty() const { return nodes_.empty(); }
  static constexpr int root() { return 0; }

  /// Node `i`; throws InvalidArgument if `i` is not in [0, size()).
  const TreeNode& node(int i) const;
  const std::vector<TreeNode>& nodes() const { return nodes_; }

  /// Appends a child of `parent` with `token` and draft log-prob `logprob`
  /// (<= 0, natural log). Returns its index (size() - 1). Throws
  /// InvalidArgument for an invalid parent, a negative token, a NaN or
  /// positive logprob, or a token that already is a child of `parent`.
  int add_child(int parent, int32_t token, float logprob);

  /// Index of the child of `parent` carrying `token`, or -1.
  int find_child(int parent, int32_t token) const;

  /// Marks `node` as expanded; `draws` as documented on TreeNode::draws
  /// (every draw must be the token of a child of `node`, else InvalidArgument).
  void set_expanded(int node, std::vector<int32_t> draws = {});

  /// Drops every node's expansion draws (children stay): the tree is then
  /// verified by target sampling only (verification.h).
  void clear_draws();

  /// Indices root..i along the path (depth order, `i` last).
  std::vector<int32_t> path_to(int i) const;
  /// Tokens of path_to(i), root included.
  std::vector<int32_t> path_tokens(int i) const;
  /// Largest depth of any node (0 for a lone root; -1 for an empty tree).
  int max_depth() const;

  /// Dense tree attention mask, row-major [size, size] of 0/1: row i has a 1
  /// at column j iff j is i or an ancestor of i (what node i may attend to
  /// inside the tree, in addition to the whole committed context).
  std::vector<uint8_t> attention_mask() const;
  /// Ancestor lists in CSR form: for node i, offsets[i]..offsets[i+1] index
  /// `values`, which lists path_to(i) (root first, i last). offsets: [size+1].
  void ancestors_csr(std::vector<int32_t>& offsets, std::vector<int32_t>& values) const;
  /// RoPE positions: base_position + depth, [size].
  std::vector<int32_t> positions(int base_position) const;

  /// The best prefix-closed subtree: the root plus at most `budget` non-root
  /// nodes of depth <= `max_depth`, chosen greedily from the frontier by
  /// largest cum_logprob (ties: smaller index first). Returned as indices in
  /// increasing (topological) order, root first. With `node_limit` >= 1 only
  /// nodes of index < node_limit count: the tree as it stood before the later
  /// nodes were appended (a growing tree only appends). Throws
  /// InvalidArgument for budget < 0 or max_depth < 0, or an empty tree.
  std::vector<int32_t> select_best(int budget, int max_depth, int node_limit = -1) const;

  /// A new tree made of `nodes` (must contain the root and be prefix-closed;
  /// any order), re-indexed in increasing old-index order. `new_to_old`, when
  /// given, receives the old index of each new node. Expansion draws are kept
  /// only if `nodes` is the whole tree: a subset chosen by cumulative draft
  /// probability depends on the drawn values, so the draws that remain are no
  /// longer an unbiased sample (see verification.h). Throws InvalidArgument
  /// for an index out of range, a missing root, or a node whose parent is
  /// missing.
  TokenTree subtree(const std::vector<int32_t>& nodes, std::vector<int32_t>* new_to_old = nullptr) const;

  /// Re-roots the tree at `new_root` (SwiftSpec §4.1): keeps `new_root` and
  /// its descendants, drops every other node. The kept nodes are re-indexed
  /// in order, depths and cum_logprob are rebased so the new root has depth 0
  /// and cum_logprob 0, and the new root's logprob becomes 0. Expansion draws
  /// are cleared (the verification that chose this root looked at the tree
  /// they shaped). Returns a map old index -> new index (-1: dropped), sized
  /// by the old size. Throws InvalidArgument if `new_root` is out of range.
  std::vector<int32_t> reroot(int new_root);

  /// Checks every structural invariant (topological order, parent/child
  /// symmetry, depths, distinct sibling tokens, cum_logprob sums within
  /// 1e-9 relative); throws InvalidArgument describing the first violation.
  void check_invariants() const;

 private:
  std::vector<TreeNode> nodes_;
};

}  // namespace swiftspec
