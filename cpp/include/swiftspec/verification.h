// Verification of a token tree against the target model's output for every
// node (one tree-mode target forward pass with LogitsMode::All; row i of the
// logits belongs to tree node i, whose row predicts the token *after* node i).
//
// Every verifier walks down from the root. At each node u it decides the next
// token x (from the target) and either moves to u's child carrying x (the
// child is *accepted*) or stops: x is then the *bonus token*. The result is
// the accepted path (root first) and the new final tokens = the accepted
// children's tokens followed by the bonus token. The root itself was final
// before the verification (see token_tree.h).
//
// Which verifier applies:
//
//  * Greedy (temperature 0) — verify_greedy: x = argmax of the target logits
//    at u (ties to the smaller id, as swiftspec::argmax). The output equals
//    target-only greedy decoding token for token on a batch-invariant backend.
//
//  * Stochastic — verify_stochastic, per node u:
//    - "recursive rejection sampling" when u carries its expansion draws
//      (TreeNode::draws: the children were drawn i.i.d. from the draft
//      distribution q_u). Multi-step speculative sampling of SpecInfer (Miao
//      et al., "SpecInfer: Accelerating Large Language Model Serving with
//      Tree-based Speculative Inference and Verification", ASPLOS'24, §4.2,
//      Algorithm 2, Theorem 4.2): for each draw t in order, accept t with
//      probability min(1, r(t) / q_u(t)), else replace the residual r by
//      norm(max(0, r - q_u)); r starts as the target distribution p_u; when
//      every draw is rejected, x ~ r. A repeated draw after its token was
//      rejected has r(t) = 0 and is rejected again (its residual update still
//      applies), exactly as the i.i.d. multiset of the proof. Lossless when
//      the draws are i.i.d. q_u and nothing that depends on their values
//      decided whether u is reached — true for serial tree generation, where
//      the verified tree is the whole drafted tree (TokenTree::subtree and
//      ::reroot drop the draws otherwise, so this rule then falls back to the
//      next one).
//    - "target sampling" otherwise (children chosen deterministically, e.g.
//      the draft's top-k, or draws no longer unbiased): x ~ p_u and the child
//      carrying x is followed if there is one (the verification of SpecExec,
//      Svirschevski et al., "SpecExec: Massively Parallel Speculative Decoding
//      for Interactive LLM Inference on Consumer Devices", NeurIPS'24, §3.2).
//      Each emitted token is an exact sample of p_u, so it is lossless for any
//      candidate set that does not depend on the target's random draws, and
//      its acceptance probability p_u(children) is the largest any lossless
//      scheme can reach for a fixed candidate set.
//
// The random source: one Rng per request; the draws each verifier makes are
// documented per function so that a seed reproduces a generation exactly.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "swiftspec/sampling.h"
#include "swiftspec/token_tree.h"
#include "swiftspec/top_k_logits.h"  // top_k_indices

namespace swiftspec {

/// Outcome of verifying one token tree.
struct VerificationResult {
  std::vector<int32_t> accepted_path;  ///< tree indices, root first (size >= 1)
  std::vector<int32_t> tokens;         ///< accepted children's tokens, then the bonus token
  int32_t bonus_token = -1;
  /// Nodes with children whose outcome recursive rejection sampling decided.
  int rejection_sampling_nodes = 0;
  /// Nodes with children whose outcome target sampling decided (stochastic
  /// only). A childless node on the walk only draws the bonus token from p_u
  /// and counts in neither.
  int target_sampling_nodes = 0;

  /// Accepted speculative tokens (the root excluded).
  int accepted() const { return static_cast<int>(accepted_path.size()) - 1; }
};

/// Greedy verification. `target_logits`: fp32 [tree.size(), vocab], row i for
/// node i. Throws InvalidArgument for an empty tree or vocab <= 0.
VerificationResult verify_greedy(const TokenTree& tree, const float* target_logits, int vocab);
/// Greedy verification from the target's arg-max per node (`target_argmax` [tree.size()],
/// e.g. TopKLogits::ids with k = 1): the same walk without the logits. Throws
/// InvalidArgument for an empty tree, a size that is not tree.size() or a negative id.
VerificationResult verify_greedy(const TokenTree& tree, const std::vector<int32_t>& target_argmax);

/// A probability row for a tree node: fp32 [vocab], non-negative, summing to
/// 1 (within fp32 rounding). Must stay valid until the verifier returns.
using NodeDistribution = std::function<const float*(int node)>;

/// Deliberately wrong verifiers, for the negative controls of the
/// losslessness tests only. Never use them in generation.
enum class VerifierBias {
  None,              ///< the lossless verifier
  AcceptFirstChild,  ///< always accepts the first child ("accept-always")
  NoResidual,        ///< rejection sampling that draws the bonus from p_u instead of the residual
};

/// Stochastic verification (scheme per node as described above).
/// `target_probs(u)`: the target's sampling distribution p_u at node u
/// (sampling_distribution of its logits); called only for nodes on the walk.
/// `draft_probs(u)`: the draft distribution q_u the draws of u came from;
/// called only for nodes with draws (may be empty otherwise).
/// Random draws per node: rejection sampling uses one rng.uniform() per draw
/// it examines and, if all are rejected, one rng.categorical(); target
/// sampling and a childless node use one rng.categorical(). Throws InvalidArgument for an empty
/// tree, vocab <= 0, a missing draft_probs for a node with draws, or a draw
/// whose draft probability is 0.
VerificationResult verify_stochastic(const TokenTree& tree, int vocab, const NodeDistribution& target_probs,
                                     const NodeDistribution& draft_probs, Rng& rng,
                                     VerifierBias bias = VerifierBias::None);

/// Stochastic verification of a tree without expansion draws (top-k growth) by target sampling:
/// at node u the next token is `draw(u)`, a sample from the target's distribution there, as
/// verify_stochastic draws it from target_probs(u) (one draw per visited node; draws at inner
/// nodes count as target_sampling_nodes). Lets a verifier sample from each row's top-k
/// (sample_from_top_k) without the [n, vocab] distributions. Throws InvalidArgument for an empty
/// tree or a node that has draws (any node, visited or not).
VerificationResult verify_by_target_sampling(const TokenTree& tree, const std::function<int32_t(int)>& draw);

/// Sampling distributions of logits rows, computed on first use and cached:
/// sampling_distribution(logits + row * vocab, vocab, params). Keeps a
/// pointer to `logits` (fp32 [rows, vocab]), which must outlive it.
class LazyDistributions {
 public:
  LazyDistributions(const float* logits, int rows, int vocab, const SamplingParams& params);
  /// The distribution of `row`; throws InvalidArgument for a row out of range.
  const float* operator()(int row);

 private:
  const float* logits_;
  int rows_, vocab_;
  SamplingParams params_;
  std::vector<std::vector<float>> cache_;
};

/// log-softmax of `logits` [n] into `out` (natural log, fp32; computed in
/// double for the normaliser).
void log_softmax(const float* logits, int n, std::vector<float>& out);

/// `count` i.i.d. draws from the (normalised or not) weights `q` [n], in draw
/// order: one rng.categorical() each.
std::vector<int32_t> draw_iid(const float* q, int n, int count, Rng& rng);

/// The name of a verifier bias ("none", "accept_first_child", "no_residual").
std::string verifier_bias_name(VerifierBias bias);

}  // namespace swiftspec
