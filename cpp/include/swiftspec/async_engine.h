// Parallel tree generation (SwiftSpec, ASPLOS'26 §4.1): the draft group and
// the target group run at the same time, each on its own devices, and talk
// only through messages.
//
//   draft group:  grow ─┬─ grow ─ grow ─┬─ re-root(result k) ─ grow ─┬─ ...
//                       │ subtree k      │                            │ subtree k+1
//   target group:       └─ verify k ─────┴─ commit, send result k ────┴─ verify k+1
//
// Threads of one request (created per request, joined before returning):
//   target leader  prefills the prompt, samples the first token, then loops:
//                  receive a subtree, verify it in ONE tree-mode forward pass
//                  (TreeVerifier), commit the accepted path, send the result
//                  to the draft (first: it is on the critical path), then the
//                  new tokens to the host. Stops at EOS / max_new_tokens.
//   draft leader   prefills the prompt, roots the token tree at the first
//                  token, then loops: whenever the target is idle, send it the
//                  best prefix-closed subtree within the tree budget
//                  (DraftTree::select, TokenTree::select_best); otherwise
//                  grow the tree one draft step (best-first, expand_width
//                  nodes per forward pass, up to growth_depth below the root);
//                  on a result, commit the accepted path and re-root at the
//                  bonus token when it is in the tree (keeping that subtree
//                  and its tree KV, §4.2), else restart from the bonus token.
//   host           the caller's thread: streams the tokens through the
//                  TokenCallback (off the target's critical path) and handles
//                  cancellation.
// The leader of a group is rank 0 of its model; a tensor-parallel model
// (tp_model.h) runs its other ranks on its own parked threads. A leader pins
// itself to the first core of its model's ModelOptions::cpu_affinity.
//
// Messages (channel.h): target <- subtree to verify (a TokenTree); draft <-
// verification result (accepted tokens, bonus token, finished); host <- new
// tokens. No model, tree or cache is touched by two threads.
//
// Exactness: the target verifies with greedy verification (argmax) on a
// batch-invariant backend, so the output equals target-only greedy decoding
// token for token, whatever subtree the timing produced. Sampling requests
// use top-k growth and target-sampling verification (every emitted token is
// one rng.categorical() draw from the target's distribution, as in
// target-only decoding), so a seeded sampled request also reproduces
// target-only sampling exactly. Sampled growth (SpecInfer rejection
// sampling) is not offered here: it would need the draft distributions
// shipped with every subtree.
//
// Cancellation and limits: EOS (config.stop_token_ids), max_new_tokens, a
// TokenCallback returning false, and config.cancel_requested (polled by the
// host while it waits, at least every 20 ms) all end the request; the threads
// are joined before generate returns (a cancel waits for at most the
// verification or the prefill chunk in flight: both leaders prefill in chunks
// and stop at the next one), and both models are reusable for the next request.
#pragma once
#include <cstdint>
#include <vector>

#include "swiftspec/generation.h"
#include "swiftspec/model.h"
#include "swiftspec/speculative.h"
#include "swiftspec/timeline.h"

namespace swiftspec {

/// Knobs of parallel tree generation beyond GenerationConfig.
struct AsyncOptions {
  /// Growth rule (Auto and TopK: top-k; Sampled is rejected) and nodes per
  /// draft forward pass (expand_width, 0: automatic as in serial mode).
  SpeculativeOptions speculative;
  /// Depth limit, below the current root, of the draft's continuous growth
  /// (0: 3 * max_depth). Nodes deeper than max_depth are not verified yet
  /// but become verifiable after a re-root.
  int growth_depth = 0;
  /// The draft hands out a subtree once it holds at least this many
  /// verifiable nodes, or cannot grow any more (>= 1).
  int min_send_nodes = 1;
  /// Before handing an idle target a subtree, let the draft take one more
  /// step while that raises the expected token rate (expected accepted
  /// tokens under the draft's probabilities / fitted verification time);
  /// see cpp/src/async/send_policy.h. False: send as soon as
  /// min_send_nodes are ready.
  bool cost_aware_send = true;
  /// Records the per-round timeline into AsyncReport::timeline.
  bool record_timeline = true;

  /// Throws InvalidArgument naming the field.
  void validate() const;
};

/// Details of one asynchronous request.
struct AsyncReport {
  SpeculationReport speculation;
  Timeline timeline;  ///< tracks "target", "draft", "host" (when recorded)
};

/// Parallel tree generation with default AsyncOptions (the engine's
/// DecodeMode::Async). Same contract as generate_speculative_serial:
/// streams through `on_tokens`, emits at most config.max_new_tokens tokens,
/// stops after a stop token, fills GenerationStats (prefill_time is the
/// target's prefill: the time to first token), starts from empty KV caches
/// and leaves both models reusable. `target` and `draft` must not be used
/// elsewhere during the call. Throws InvalidArgument as validate_speculative
/// (and AsyncOptions::validate); an error inside a group is rethrown here
/// after both groups have stopped.
GenerationResult generate_speculative_async(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                            const GenerationConfig& config, const TokenCallback& on_tokens);

/// The same with explicit options; `report`, when given, receives the
/// speculation details and the timeline.
GenerationResult generate_speculative_async(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                            const GenerationConfig& config, const TokenCallback& on_tokens,
                                            const AsyncOptions& options, AsyncReport* report);

}  // namespace swiftspec
