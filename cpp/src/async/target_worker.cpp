// The target group's leader in parallel tree generation (SwiftSpec §4.1):
// prefill, then verify every subtree the draft group sends, one tree-mode
// forward pass each, and answer with the accepted path and the bonus token.
#include <algorithm>

#include "session.h"
#include "swiftspec/worker_group.h"

namespace swiftspec::async_detail {

namespace ev = timeline_event;

void pin_leader(const Model& model) {
  const auto& cores = model.options().cpu_affinity;
  if (!cores.empty()) pin_current_thread({cores[0]});
}

namespace {

// Cuts `tokens` to the request's limits (max_new_tokens, then the first stop
// token), the same rule as serial generation. Returns true when the request
// is finished and sets `reason`.
bool cut_to_limits(const GenerationConfig& cfg, int emitted, std::vector<int32_t>& tokens, std::string& reason) {
  bool finished = false;
  const int room = cfg.max_new_tokens - emitted;
  if (static_cast<int>(tokens.size()) >= room) {
    tokens.resize(std::max(room, 0));
    reason = "length";
    finished = true;
  }
  for (size_t i = 0; i < tokens.size(); ++i)
    if (std::find(cfg.stop_token_ids.begin(), cfg.stop_token_ids.end(), tokens[i]) != cfg.stop_token_ids.end()) {
      tokens.resize(i + 1);
      reason = "stop";
      finished = true;
      break;
    }
  return finished;
}

}  // namespace

void run_target_leader(Model& target, Session& s, TimelineTrack* track, LeaderStats& out) {
  pin_leader(target);
  const GenerationConfig& cfg = s.config;
  Rng rng(cfg.sampling.seed);  // first token + verification draws, as target-only decoding
  TreeVerifier verifier(target, cfg.sampling, s.options.speculative.verifier_bias);

  const double p0 = s.timeline.now();
  const int32_t first = verifier.start(s.prompt, rng, {cfg.prefill_chunk, [&s] { return s.stopped(); }});
  if (first < 0) return;  // the host cancelled the request during the prefill
  const double p1 = s.timeline.now();
  out.prefill_time = p1 - p0;
  if (track) track->add(ev::kPrefill, p0, p1, 0, {{"tokens", static_cast<long long>(s.prompt.size())}});

  int emitted = 0;
  std::vector<int32_t> tokens{first};
  std::string reason;
  bool finished = cut_to_limits(cfg, emitted, tokens, reason);
  emitted += static_cast<int>(tokens.size());
  s.to_draft.send(ResultMessage{0, {}, first, finished});
  s.to_host.send(TokensMessage{tokens, finished, reason});

  const NodeDistribution no_draft_probs;  // top-k trees carry no expansion draws
  while (!finished) {
    const double w0 = s.timeline.now();
    std::optional<SubtreeMessage> msg = s.to_target.receive();
    const double w1 = s.timeline.now();
    if (!msg) break;  // cancelled or shut down
    if (track) track->add(ev::kWaitSubtree, w0, w1, msg->round);

    const VerificationResult r = verifier.verify(msg->tree, no_draft_probs, rng);
    const double v1 = s.timeline.now();
    out.verified_nodes += msg->tree.size() - 1;
    out.target_sampling_nodes += r.target_sampling_nodes;
    out.accepted_per_step.push_back(r.accepted());
    out.verified_per_step.push_back(msg->tree.size() - 1);
    if (track)
      track->add(ev::kVerify, w1, v1, msg->round, {{"nodes", msg->tree.size() - 1}, {"accepted", r.accepted()}});

    tokens = r.tokens;
    finished = cut_to_limits(cfg, emitted, tokens, reason);
    emitted += static_cast<int>(tokens.size());
    // The draft first: its re-root is on the critical path of the next round.
    s.to_draft.send(ResultMessage{msg->round, std::vector<int32_t>(r.tokens.begin(), r.tokens.end() - 1), r.bonus_token,
                                  finished, msg->tree.size() - 1, v1 - w1});
    s.to_host.send(TokensMessage{tokens, finished, reason});
  }
  out.steps = verifier.steps();
  out.time = verifier.time();
}

}  // namespace swiftspec::async_detail
