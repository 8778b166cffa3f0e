// Serial tree generation (SpecExec-style): grow the draft tree, verify it in one
// target pass, commit the accepted path in both models, stream, repeat.
#include <algorithm>
#include <chrono>
#include <string>

#include "swiftspec/error.h"
#include "swiftspec/speculative.h"

namespace swiftspec {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seed of the draft's own random source (Sampled growth), derived from the
// request seed so a seed reproduces a whole generation.
uint64_t draft_seed(uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ull; }

std::string join_schemes(bool greedy, int rejection, int target_sampling) {
  if (greedy) return "greedy";
  std::string s;
  if (rejection > 0) s = "rejection_sampling";
  if (target_sampling > 0) s += std::string(s.empty() ? "" : "+") + "target_sampling";
  return s.empty() ? "none" : s;
}

}  // namespace

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
  DraftTree drafter(draft, config, opts, draft_seed(config.sampling.seed));
  TreeVerifier verifier(target, config.sampling, options.verifier_bias);
  rep.growth = tree_growth_name(drafter.growth());
  rep.expand_width = drafter.expand_width();
  rep.min_expand_prob = opts.min_expand_prob;

  // Emits `tokens` (already cut to the limits); false when generation ends.
  bool done = false;
  auto emit = [&](std::vector<int32_t> tokens) {
    const int room = config.max_new_tokens - static_cast<int>(result.tokens.size());
    if (static_cast<int>(tokens.size()) >= room) {
      tokens.resize(room);
      st.finish_reason = "length";
      done = true;
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (std::find(config.stop_token_ids.begin(), config.stop_token_ids.end(), tokens[i]) !=
          config.stop_token_ids.end()) {
        tokens.resize(i + 1);
        st.finish_reason = "stop";
        done = true;
        break;
      }
    }
    result.tokens.insert(result.tokens.end(), tokens.begin(), tokens.end());
    if (on_tokens && !tokens.empty() && !on_tokens(tokens)) {
      st.finish_reason = "cancelled";
      done = true;
    }
  };

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
  emit({first});

  while (!done) {
    if (config.cancelled()) {
      st.finish_reason = "cancelled";
      break;
    }
    const int remaining = config.max_new_tokens - static_cast<int>(result.tokens.size());
    // A verification emits at most (accepted + 1) tokens: deeper nodes are useless.
    const int depth_limit = std::min(config.max_depth, remaining - 1);
    if (depth_limit >= 1) drafter.grow_to(config.tree_budget, depth_limit);
    std::vector<int32_t> to_draft;
    const TokenTree tree = drafter.select(config.tree_budget, depth_limit, to_draft);
    rep.verified_nodes += tree.size() - 1;
    rep.verified_per_step.push_back(tree.size() - 1);
    const VerificationResult r = verifier.verify(
        tree, [&](int u) { return drafter.draft_probs(to_draft[u]); }, rng);
    rep.rejection_sampling_nodes += r.rejection_sampling_nodes;
    rep.target_sampling_nodes += r.target_sampling_nodes;
    rep.accepted_per_step.push_back(r.accepted());

    std::vector<int32_t> accepted(r.tokens.begin(), r.tokens.end() - 1);
    emit(r.tokens);
    if (!done) rep.reused_nodes += drafter.advance(accepted, r.bonus_token);
  }

  st.new_tokens = static_cast<int>(result.tokens.size());
  st.decode_time = now_s() - t_first;
  st.verification_steps = verifier.steps();
  st.target_time = verifier.time();
  st.draft_steps = drafter.steps();
  st.draft_time = drafter.time();
  rep.drafted_nodes = drafter.drafted_nodes();
  rep.draft_batch_rows = drafter.batch_rows();
  rep.verification = join_schemes(config.sampling.greedy() && options.verifier_bias == VerifierBias::None,
                                  rep.rejection_sampling_nodes, rep.target_sampling_nodes);
  if (report) *report = std::move(rep);
  return result;
}

}  // namespace swiftspec
