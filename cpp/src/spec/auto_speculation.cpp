// The auto mode: per round, target-only decoding or a serial tree of the budget the measurements
// favour (SpeculationPolicy, speculation_policy.h); the rounds themselves are serial generation's.
#include <algorithm>
#include <string>
#include <vector>

#include "generation_loop.h"
#include "swiftspec/error.h"
#include "swiftspec/speculation_policy.h"
#include "swiftspec/speculative.h"

namespace swiftspec {

using detail::now_s;

namespace {

// Arms of budget <= kStepArmMaxBudget grow one node per draft step (TopK growth): budget k is k
// one-row draft steps, then the best k nodes, a chain and its siblings; a small tree gets most
// from each node when it is deep (two siblings accept at most one token, a chain of two up to
// two). Larger arms grow as the request's tree shape says (up to expand_width nodes a step). A
// round measures the arms that grow as it does, up to its own budget.
constexpr int kStepArmMaxBudget = 4;

// Accepted tokens of `r` (a verification of the subtree whose nodes are `to_draft` in the draft's
// `grown` tree) that lie in the best `budget` nodes of the first `node_limit` nodes of `grown`
// (depth <= depth_limit): what the tree of that budget, as it stood when it had that budget, would
// have accepted (speculation_policy.h). Exact under greedy and target-sampling verification where
// that tree lies inside the verified one (the target's draws at the shared nodes are the same), as
// it nearly always does; a lower bound where it holds a node the verified tree left out.
int accepted_within(const TokenTree& grown, const std::vector<int32_t>& to_draft, const VerificationResult& r,
                    int budget, int depth_limit, int node_limit) {
  const std::vector<int32_t> best = grown.select_best(budget, depth_limit, node_limit);
  int n = 0;
  for (size_t i = 1; i < r.accepted_path.size(); ++i) {
    if (!std::binary_search(best.begin(), best.end(), to_draft[r.accepted_path[i]])) break;
    ++n;
  }
  return n;
}

}  // namespace

GenerationResult generate_speculative_auto(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                           const GenerationConfig& config, const TokenCallback& on_tokens,
                                           const SpeculativeOptions& options, SpeculationReport* report,
                                           SpeculationPolicy::Memory* memory) {
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
  SpeculationPolicy policy(config.tree_budget, memory);
  const std::vector<int>& budgets = policy.budgets();
  rep.growth = tree_growth_name(drafter.growth());
  rep.expand_width = drafter.expand_width();
  rep.min_expand_prob = opts.min_expand_prob;
  detail::TokenEmitter out(config, on_tokens, result);

  const double t_start = now_s();
  const PrefillControl prefill{config.prefill_chunk, config.cancel_requested};
  // Both models prefill the prompt before the first token, as in serial generation: the second
  // round measures speculation, and a draft prefill there would stall the stream after one token.
  const int32_t first = verifier.start(prompt, rng, prefill);
  if (first < 0 || !drafter.start(prompt, first, prefill)) {
    st.prefill_time = now_s() - t_start;
    out.cancel();
    if (report) *report = std::move(rep);
    return result;
  }
  st.prefill_time = now_s() - t_start;
  const double t_first = now_s();
  out.emit({first});

  // The draft's root is result.tokens[draft_root]; the target's root is always the last emitted
  // token.
  int draft_root = 0;
  while (!out.done()) {
    if (config.cancelled()) {
      out.cancel();
      break;
    }
    // A verification emits at most (accepted + 1) tokens: deeper nodes are useless.
    const int depth_limit = std::min(config.max_depth, out.remaining() - 1);
    const SpeculationPolicy::Choice choice = policy.choose(depth_limit >= 1 ? config.tree_budget : 0);
    rep.budget_per_round.push_back(choice.budget);
    const int32_t root = result.tokens.back();
    const int last = static_cast<int>(result.tokens.size()) - 1;

    if (choice.budget == 0) {
      const double w0 = now_s();
      TokenTree alone;
      alone.reset(root);
      const double t0 = verifier.time();
      const VerificationResult r = verifier.verify(alone, [](int) { return nullptr; }, rng);
      const double pass = verifier.time() - t0;
      rep.target_sampling_nodes += r.target_sampling_nodes;
      rep.accepted_per_step.push_back(0);
      rep.verified_per_step.push_back(0);
      out.emit(r.tokens);
      policy.observe_target_only(pass, std::max(0.0, now_s() - w0 - pass));
      continue;
    }

    // The draft catches up with the tokens of the rounds it sat out, up to the root.
    if (draft_root != last) {
      if (!drafter.catch_up({result.tokens.begin() + draft_root + 1, result.tokens.end() - 1}, root, prefill)) {
        out.cancel();
        break;
      }
      rep.caught_up_tokens += last - draft_root;
      draft_root = last;
    }

    // Grow the chosen arm's tree, noting for each smaller arm that grows alike the draft time at
    // which its tree was there and how many nodes it had (-1: an arm this round does not measure).
    // The round's wall time from here (after the catch-up, a cost of switching, not of the arm)
    // to the draft's taking in the accepted tokens: less its draft and verification times, the
    // arm's overhead (SpeculationPolicy: O_spec).
    const double w0 = now_s();
    const int arms = static_cast<int>(std::find(budgets.begin(), budgets.end(), choice.budget) - budgets.begin()) + 1;
    const bool step_arms = drafter.growth() == TreeGrowth::TopK;
    std::vector<double> draft_at(arms, -1.0);
    std::vector<int> nodes_at(arms, 0);
    const double d0 = drafter.time();
    auto note = [&](int i) {
      draft_at[i] = drafter.time() - d0;
      nodes_at[i] = drafter.tree().size();
    };
    if (step_arms && choice.budget <= kStepArmMaxBudget) {
      int steps = 0;
      for (int i = 0; i < arms; ++i) {
        while (steps < budgets[i] && drafter.can_grow(depth_limit) && drafter.grow_step(depth_limit, -1, 1) > 0)
          ++steps;
        note(i);  // (growth may stop short: then so would a round of that arm)
      }
    } else {
      int reached = 0;
      for (;;) {
        const int have = drafter.selectable_nodes(depth_limit);
        for (; reached < arms && budgets[reached] <= have; ++reached) note(reached);
        if (have >= choice.budget || !drafter.can_grow(depth_limit)) break;
        const int added =
            drafter.grow_step(depth_limit, drafter.growth() == TreeGrowth::Sampled ? choice.budget - have : -1);
        if (added == 0 && !drafter.can_grow(depth_limit)) break;
      }
      for (; reached < arms; ++reached) note(reached);  // growth stopped short
      if (step_arms)
        for (int i = 0; i < arms; ++i)
          if (budgets[i] <= kStepArmMaxBudget) draft_at[i] = -1.0;  // they grow one node a step
    }

    std::vector<int32_t> to_draft;
    const TokenTree tree = drafter.select(choice.budget, depth_limit, to_draft);
    rep.verified_nodes += tree.size() - 1;
    rep.verified_per_step.push_back(tree.size() - 1);
    const double t0 = verifier.time();
    const VerificationResult r = verifier.verify(tree, [&](int u) { return drafter.draft_probs(to_draft[u]); }, rng);
    const double verify_seconds = verifier.time() - t0;
    rep.rejection_sampling_nodes += r.rejection_sampling_nodes;
    rep.target_sampling_nodes += r.target_sampling_nodes;
    rep.accepted_per_step.push_back(r.accepted());
    std::vector<int> accepted_at(arms, -1);
    for (int i = 0; i < arms; ++i)
      if (draft_at[i] >= 0.0)
        accepted_at[i] = accepted_within(drafter.tree(), to_draft, r, budgets[i], depth_limit, nodes_at[i]);

    std::vector<int32_t> accepted(r.tokens.begin(), r.tokens.end() - 1);
    out.emit(r.tokens);
    if (!out.done()) {
      rep.reused_nodes += drafter.advance(accepted, r.bonus_token);
      draft_root = static_cast<int>(result.tokens.size()) - 1;
    }
    // The played arm's draft time is its growth (draft_at[arms - 1]); the rest of the drafter's
    // time this round (selecting, taking in the accepted tokens) and the host's are the overhead.
    const double overhead = now_s() - w0 - verify_seconds - draft_at[arms - 1];
    policy.observe_speculative(choice.budget, tree.size(), verify_seconds, draft_at, accepted_at,
                               std::max(0.0, overhead));
  }

  detail::finish_speculative_stats(result, rep, verifier, drafter, t_first,
                                   config.sampling.greedy() && options.verifier_bias == VerifierBias::None);
  rep.round_reasons = policy.reason_counts();
  if (memory) *memory = policy.memory();
  if (report) *report = std::move(rep);
  return result;
}

}  // namespace swiftspec
