// Serial tree generation (SpecExec-style): grow the draft tree, verify it in one
// target pass, commit the accepted path in both models, stream, repeat.
#include <algorithm>
#include <chrono>
#include <string>

#include "generation_loop.h"
#include "swiftspec/error.h"
#include "swiftspec/speculative.h"

namespace swiftspec {

using detail::now_s;

GenerationResult generate_speculative_serial(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                             const GenerationConfig& config, const TokenCallback& on_tokens) {
  return generate_speculative_serial(target, draft, prompt, config, on_tokens, SpeculativeOptions{}, nullptr);
}

GenerationResult generate_speculative_serial(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                             const GenerationConfig& config, const TokenCallback& on_tokens,
                                             const SpeculativeOptions& options, SpeculationReport* report) {
  validate_speculative(target, draft, prompt, config, options);
  SpeculativeOptions opts = options;
  if (opts.min_expand_prob < 0.0) opts.min_expand_prob = SpeculativeOptions::kSerialMinExpandProb;
  GenerationResult result;
  GenerationStats& st = result.stats;
  st.prompt_tokens = static_cast<int>(prompt.size());
  SpeculationReport rep;

  Rng rng(config.sampling.seed);  // first token + verification draws
  DraftTree drafter(draft, config, opts, detail::draft_seed(config.sampling.seed));
  TreeVerifier verifier(target, config.sampling, options.verifier_bias);
  rep.growth = tree_growth_name(drafter.growth());
  rep.expand_width = drafter.expand_width();
  rep.min_expand_prob = opts.min_expand_prob;

  detail::TokenEmitter out(config, on_tokens, result);

  const double t_start = now_s();
  const PrefillControl prefill{config.prefill_chunk, config.cancel_requested};
  const int32_t first = verifier.start(prompt, rng, prefill);
  if (first < 0 || !drafter.start(prompt, first, prefill)) {
    st.prefill_time = now_s() - t_start;
    st.finish_reason = "cancelled";
    if (report) *report = std::move(rep);
    return result;
  }
  const double t_first = now_s();
  st.prefill_time = t_first - t_start;
  out.emit({first});

  while (!out.done()) {
    if (config.cancelled()) {
      out.cancel();
      break;
    }
    const int remaining = out.remaining();
    // A verification emits at most (accepted + 1) tokens: deeper nodes are useless.
    const int depth_limit = std::min(config.max_depth, remaining - 1);
    if (depth_limit >= 1) drafter.grow_to(config.tree_budget, depth_limit);
    std::vector<int32_t> to_draft;
    const TokenTree tree = drafter.select(config.tree_budget, depth_limit, to_draft);
    rep.verified_nodes += tree.size() - 1;
    rep.verified_per_step.push_back(tree.size() - 1);
    const VerificationResult r = verifier.verify(tree, [&](int u) { return drafter.draft_probs(to_draft[u]); }, rng);
    rep.rejection_sampling_nodes += r.rejection_sampling_nodes;
    rep.target_sampling_nodes += r.target_sampling_nodes;
    rep.accepted_per_step.push_back(r.accepted());

    std::vector<int32_t> accepted(r.tokens.begin(), r.tokens.end() - 1);
    out.emit(r.tokens);
    if (!out.done()) rep.reused_nodes += drafter.advance(accepted, r.bonus_token);
  }

  detail::finish_speculative_stats(result, rep, verifier, drafter, t_first,
                                   config.sampling.greedy() && options.verifier_bias == VerifierBias::None);
  if (report) *report = std::move(rep);
  return result;
}

}  // namespace swiftspec
