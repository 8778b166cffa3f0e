// Speculative decoding with a token tree: the draft side (DraftTree: grows,
// selects and re-roots the tree), the target side (TreeVerifier: verifies a
// tree in one forward pass and commits the accepted path) and serial tree
// generation over both (generate_speculative_serial).
//
// Serial tree generation (SpecExec-style: Svirschevski et al., NeurIPS'24; the
// "serial" baseline of SwiftSpec, ASPLOS'26 §4.1), one round:
//   1. grow: the draft expands the token tree best-first — each draft step
//      takes the `expand_width` unexpanded nodes with the largest cumulative
//      draft log-probability (depth < max_depth), runs them through the draft
//      in ONE tree-mode forward pass, and gives each its children — until the
//      tree holds tree_budget non-root nodes or nothing can be expanded (depth
//      limit, or every unexpanded node less likely than min_expand_prob);
//   2. select: the best prefix-closed subtree of at most tree_budget nodes
//      (TokenTree::select_best) is verified by the target in ONE tree-mode
//      forward pass (LogitsMode::All, tree_budget + 1 rows with the root);
//   3. commit: both models append the accepted path (root first) to their
//      committed region; the bonus token becomes the next root. The draft
//      re-roots its tree at the bonus token when it already is a child of the
//      last accepted node, keeping that subtree and its K/V (this is what the
//      asynchronous engine relies on: SwiftSpec §4.1, "tree re-rooting").
//
// The root of every tree is the pending token (token_tree.h): prefill
// processes the prompt in both models and samples the first token from the
// target's last logits; that token is the first root.
//
// Children of an expanded node (TreeGrowth):
//   TopK    — the `branching` most likely tokens of the draft (deterministic);
//             logprob = log softmax of the draft logits (temperature 1) for
//             greedy requests, log of the draft's sampling distribution for
//             stochastic ones (tokens it gives no mass are skipped). Either is
//             taken from each row's head on the device (Model::forward_top_k;
//             stochastic: top_sampling_tokens_from_head, sampling.h), the whole
//             row read only when the head does not decide. A tree of TopK
//             growth has no draws: a stochastic request verifies it by target
//             sampling (SpecInfer's naive sampling, Miao et al. 2024, §4),
//             lossless for any children.
//   Sampled — `branching` i.i.d. draws from the draft's sampling distribution
//             (repeats merged; the draws kept on the node) — verified by
//             SpecInfer's recursive rejection sampling (Miao et al. 2024, §4;
//             verification.h).
// Default (Growth::Auto): TopK for every request. Under sampling (T 0.7, top-p
// 0.8, tree budget 16) the real Qwen2.5-Coder 1.5B / 0.5B pair accepted more
// tokens per verification with TopK growth (target sampling) than with
// Sampled growth (recursive rejection sampling), MT-Bench + HumanEval prompts
// on the CPU (docs/sampling_speculation.md, "Measured"); and TopK reads only
// each drafted row's head where Sampled keeps whole [vocab] rows on the host.
// Sampled growth stops exactly at the budget (the last expansion draws only as
// many tokens as fit), so the verified tree is the whole drafted tree and the
// draws stay an unbiased sample.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "swiftspec/generation.h"
#include "swiftspec/model.h"
#include "swiftspec/sampling.h"
#include "swiftspec/token_tree.h"
#include "swiftspec/tree_kv_cache.h"
#include "swiftspec/verification.h"
#include "swiftspec/speculation_policy.h"

namespace swiftspec {

/// How an expanded node gets its children (see the header comment).
enum class TreeGrowth { TopK, Sampled };

/// Knobs of speculative decoding beyond GenerationConfig.
struct SpeculativeOptions {
  /// Children rule; Auto picks TopK for every request (greedy and stochastic: see the header
  /// comment for the measurement behind it). Sampled stays available for RRS.
  enum class Growth { Auto, TopK, Sampled } growth = Growth::Auto;
  /// Nodes expanded per draft forward pass; 0 picks
  /// ceil(tree_budget / (branching * max_depth)) (at least 1), which reaches
  /// a full tree in about max_depth draft steps.
  int expand_width = 0;
  /// Growth stops expanding nodes whose cumulative draft probability
  /// exp(cum_logprob) is below this (the root is always expanded). On a
  /// serial schedule every draft step delays the target, and expanding a node
  /// that unlikely adds fewer expected accepted tokens than the draft step
  /// costs. 0 disables it (grow until tree_budget). Negative ("auto"): serial
  /// generation uses kSerialMinExpandProb, a DraftTree on its own (the async
  /// engine, whose draft is off the critical path) uses 0. The rule looks
  /// only at values known before a node's children are drawn, so Sampled
  /// growth stays lossless. Auto (< 0) or in [0, 1].
  double min_expand_prob = -1.0;
  /// The serial default of min_expand_prob. Rationale: a draft step costs
  /// about a third of a target verification on the CPU backend (0.5B draft,
  /// 1.5B target), so a node whose path the target accepts with probability
  /// below ~0.3 is not worth a step. Measured against trees grown to their
  /// budget ("-auto" rows vs ":0" rows) in the benchmark record,
  /// benchmarks/README.md, "acceptance length of the chain and tree budgets".
  static constexpr double kSerialMinExpandProb = 0.3;
  /// Test-only negative controls of the losslessness tests (verification.h).
  VerifierBias verifier_bias = VerifierBias::None;

  /// The growth rule for a request of `sampling` (Auto: TopK, whatever the sampling).
  TreeGrowth resolve_growth(const SamplingParams& sampling) const;
  /// The expansion width for `config`.
  int resolve_expand_width(const GenerationConfig& config) const;
};

/// Speculation details of one request, beyond GenerationStats.
struct SpeculationReport {
  std::string growth;        ///< "top_k" or "sampled"
  std::string verification;  ///< "greedy", "target_sampling", "rejection_sampling" or a mix joined by '+'
  int expand_width = 0;
  double min_expand_prob = 0.0;        ///< the expansion threshold in effect
  int rejection_sampling_nodes = 0;    ///< verifier decisions by recursive rejection sampling
  int target_sampling_nodes = 0;       ///< verifier decisions by target sampling
  int verified_nodes = 0;              ///< non-root tree nodes sent to the target, all steps
  int drafted_nodes = 0;               ///< nodes the draft processed (forward passes rows), pending tokens excluded
  int reused_nodes = 0;                ///< nodes kept by re-rooting (already drafted, not recomputed)
  std::vector<int> accepted_per_step;  ///< accepted speculative tokens per verification (bonus excluded)
  std::vector<int> verified_per_step;  ///< non-root nodes verified per verification
  std::vector<int> draft_batch_rows;   ///< rows of each draft forward pass (pending tokens included)
  // The auto mode (generate_speculative_auto) only:
  std::vector<int> budget_per_round;         ///< each round's tree budget; 0: a target-only round
  std::map<std::string, int> round_reasons;  ///< rounds per SpeculationPolicy reason ("best", "probe", ...)
  int caught_up_tokens = 0;                  ///< tokens the draft prefilled after rounds it sat out
};

/// The draft side: the draft model's token tree and tree KV bookkeeping.
/// Grows the tree, hands out the best subtree, re-roots on the accepted path.
/// Single-threaded (one owner); the async engine runs it in the draft group.
class DraftTree {
 public:
  /// `draft` must outlive this. `seed` seeds the draft's own random source
  /// (Sampled growth). Throws InvalidArgument from config/options validation.
  DraftTree(Model& draft, const GenerationConfig& config, const SpeculativeOptions& options, uint64_t seed);

  /// Starts a request: clears the tree bookkeeping, truncates the draft's
  /// committed region to 0, prefills `prompt` (no logits; in chunks, polling
  /// control.cancelled, as TreeKvCache::prefill) and makes `first_token` the
  /// root. Returns false when cancelled (then call start() again before
  /// anything else).
  bool start(const std::vector<int32_t>& prompt, int32_t first_token, const PrefillControl& control = {});

  /// Brings the draft up to date after rounds it sat out (the auto mode's target-only rounds):
  /// appends its pending tokens, the current root and `tokens` (the final tokens after the root,
  /// oldest first) to the committed region in prefill passes (in chunks, polling
  /// control.cancelled), and makes `new_root` the root of a new tree (the old tree's nodes are
  /// dropped). Counts the passes' time in time(). Returns false when cancelled (then call start()
  /// before anything else).
  bool catch_up(const std::vector<int32_t>& tokens, int32_t new_root, const PrefillControl& control = {});

  /// True when another expansion can add nodes: an unexpanded node of depth
  /// < depth_limit and cumulative probability >= min_expand_prob exists and
  /// tree slots are free.
  bool can_grow(int depth_limit) const;
  /// Non-root nodes of depth <= depth_limit.
  int selectable_nodes(int depth_limit) const;
  /// One draft step: expands up to expand_width best unexpanded nodes of
  /// depth < depth_limit (and cumulative probability >= min_expand_prob) in
  /// one draft forward pass. With `max_new_nodes` >= 0
  /// (Sampled growth's exact budget) adds at most that many nodes; with
  /// `max_width` >= 1 expands at most that many nodes (the auto mode's
  /// one-node-per-step arms). Returns the number of nodes added (0: nothing
  /// to expand; no forward pass run).
  int grow_step(int depth_limit, int max_new_nodes = -1, int max_width = -1);
  /// Grows until selectable_nodes(depth_limit) >= budget or nothing can grow.
  void grow_to(int budget, int depth_limit);

  /// The subtree to verify: select_best(budget, depth_limit) as a new tree;
  /// `to_draft` receives each node's index in this tree. Expansion draws are
  /// kept only when the whole tree is selected (TokenTree::subtree). That is
  /// lossless for serial growth, where "the whole tree is selected" never
  /// depends on drawn values (Sampled growth stops at the budget). A caller
  /// that selects while the tree keeps growing (the asynchronous engine) must
  /// call clear_draws() on the result: whether the selection is whole would
  /// then depend on how many distinct tokens the draws produced, which would
  /// bias rejection sampling; target sampling stays lossless.
  TokenTree select(int budget, int depth_limit, std::vector<int32_t>& to_draft) const;
  /// The draft distribution q of expanded node `node` (Sampled growth), or
  /// nullptr.
  const float* draft_probs(int node) const;

  /// Commits the verified outcome: `accepted_tokens` are the accepted
  /// children's tokens from the root down (bonus excluded; each must be in the
  /// tree), `bonus` the bonus token. The accepted path goes to the draft's
  /// committed region (an unprocessed last node becomes a pending token), and
  /// the tree re-roots at `bonus` if it is a child of the last accepted node,
  /// else restarts from `bonus`. Returns the number of kept nodes (0 or more).
  /// Throws InvalidArgument if an accepted token is not on a tree path.
  int advance(const std::vector<int32_t>& accepted_tokens, int32_t bonus);

  const TokenTree& tree() const { return tree_; }
  const TreeKvCache& cache() const { return cache_; }
  TreeGrowth growth() const { return growth_; }
  int expand_width() const { return expand_width_; }
  /// Draft forward passes and their wall time (seconds) since construction,
  /// the prefill of start() excluded.
  int steps() const { return steps_; }
  double time() const { return time_; }
  int drafted_nodes() const { return drafted_nodes_; }
  /// Drafted rows whose whole [vocab] logits were read on the host since construction: every row
  /// of Sampled growth; under TopK growth of a stochastic request only the rows whose head did not
  /// decide the children (top_sampling_tokens_from_head), or every row of a pass of more than
  /// kReadableLogitsRows rows or with branching >= kSampleHeadK; none under greedy TopK growth.
  int whole_rows_read() const { return whole_rows_read_; }
  /// Rows of each draft forward pass since construction (pending tokens included).
  const std::vector<int>& batch_rows() const { return batch_rows_; }

 private:
  bool expandable(const TreeNode& n, int depth_limit) const;
  Model* draft_;
  SamplingParams sampling_;
  TreeGrowth growth_;
  int branching_;
  int expand_width_;
  double min_cum_logprob_;  ///< log(min_expand_prob); -inf when disabled
  Rng rng_;
  TokenTree tree_;
  TreeKvCache cache_;
  std::vector<std::shared_ptr<std::vector<float>>> q_;  ///< per node: draft distribution (Sampled)
  std::vector<float> logits_;
  TopKLogits top_;  ///< the last top-k growth step's heads
  int steps_ = 0;
  double time_ = 0.0;
  int drafted_nodes_ = 0;
  int whole_rows_read_ = 0;
  std::vector<int> batch_rows_;
};

/// The target side: verifies a token tree in one forward pass and commits the
/// accepted path into the target's committed region.
class TreeVerifier {
 public:
  /// `target` must outlive this. `rng` draws the stochastic verifications.
  TreeVerifier(Model& target, const SamplingParams& sampling, VerifierBias bias = VerifierBias::None);

  /// Starts a request: truncates the committed region to 0, prefills
  /// `prompt` (in chunks, polling control.cancelled, as TreeKvCache::prefill),
  /// and returns the first token drawn from the last logits with `rng`
  /// (sample_token); it is the first root. Returns -1 when cancelled (nothing
  /// drawn from `rng`).
  int32_t start(const std::vector<int32_t>& prompt, Rng& rng, const PrefillControl& control = {});

  /// Verifies `tree` (root = the pending token, unprocessed by the target):
  /// one tree-mode forward over all its nodes, then greedy or stochastic
  /// verification; commits the accepted path (root first) and frees every
  /// tree slot. `draft_probs` gives q for nodes with draws (stochastic).
  /// Times the forward pass into time().
  VerificationResult verify(const TokenTree& tree, const NodeDistribution& draft_probs, Rng& rng);

  int steps() const { return steps_; }
  double time() const { return time_; }
  /// Rows of verification passes whose whole [vocab] logits came to the host since construction:
  /// none for greedy and top-k sampling; for temperature / top-p alone on a tree without draws
  /// only the visited rows whose head did not decide the draw (sample_from_head), unless the tree
  /// has more than kReadableLogitsRows nodes; every row of a tree with draws (rejection sampling).
  int whole_rows_read() const { return whole_rows_read_; }

 private:
  Model* target_;
  SamplingParams sampling_;
  VerifierBias bias_;
  TreeKvCache cache_;
  std::vector<float> logits_, scratch_;
  TopKLogits top_;  ///< the last verification's heads (arg-max, top_k or kSampleHeadK per node)
  int steps_ = 0;
  double time_ = 0.0;
  int whole_rows_read_ = 0;
};

/// Validates the speculative parts of a request for the pair: config.validate(),
/// tree_budget / max_depth / branching >= 1, min_expand_prob in [0, 1], tree_budget + 1 <= max_tree of the
/// target and tree_budget + 2 <= max_tree of the draft, equal vocabularies, a
/// non-empty prompt of ids in [0, vocab), prompt + max_new_tokens <= max_context
/// of both models, expand_width >= 0. Throws InvalidArgument naming the field
/// and value.
void validate_speculative(const Model& target, const Model& draft, const std::vector<int32_t>& prompt,
                          const GenerationConfig& config, const SpeculativeOptions& options);

/// Serial tree generation (header comment): prefill both models, then rounds
/// of grow / verify / commit, streaming every round's new tokens through
/// `on_tokens` (returning false cancels). Emits at most
/// config.max_new_tokens tokens (a longer accepted path is cut), stops after
/// a token of config.stop_token_ids. Fills GenerationStats (verification
/// steps, draft steps, draft/target time split, prefill = both prefills).
/// Each call starts from empty KV caches and leaves the models reusable.
/// Throws InvalidArgument as validate_speculative.
GenerationResult generate_speculative_serial(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                             const GenerationConfig& config, const TokenCallback& on_tokens);

/// The same with explicit options; `report`, when given, receives the
/// speculation details.
GenerationResult generate_speculative_serial(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                             const GenerationConfig& config, const TokenCallback& on_tokens,
                                             const SpeculativeOptions& options, SpeculationReport* report);

/// The auto mode (DecodeMode::Auto; speculation_policy.h): before every round a
/// SpeculationPolicy chooses target-only decoding (a verification of the root alone: one target
/// pass of one row) or a serial round (as generate_speculative_serial) with a tree budget of its
/// arms, from the pass times and acceptance measured so far in the request. Both models prefill
/// the prompt before the first token; the draft catches up after target-only rounds
/// (DraftTree::catch_up). Greedy
/// output is target-only's token for token; sampled output keeps the target's distribution.
/// Same contract, statistics and errors as generate_speculative_serial (config.tree_budget is the
/// largest budget); `report`, when given, also receives budget_per_round, round_reasons and
/// caught_up_tokens. `memory` (may be null): read as the policy's prior and, when the request
/// decoded, replaced by what its policy learned (SpeculationPolicy::Memory; an engine keeps one
/// for its next request).
GenerationResult generate_speculative_auto(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                           const GenerationConfig& config, const TokenCallback& on_tokens,
                                           const SpeculativeOptions& options = {}, SpeculationReport* report = nullptr,
                                           SpeculationPolicy::Memory* memory = nullptr);

/// Name of a growth rule ("top_k", "sampled").
std::string tree_growth_name(TreeGrowth growth);

}  // namespace swiftspec
