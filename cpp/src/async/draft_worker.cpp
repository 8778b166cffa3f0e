// The draft group's leader in parallel tree generation (SwiftSpec §4.1): grow
// the token tree continuously, hand the best subtree to the target group
// whenever it is idle, and re-root on every verification result.
#include <algorithm>
#include <cmath>

#include "send_policy.h"
#include "session.h"

namespace swiftspec::async_detail {

namespace ev = timeline_event;

namespace {

// Seed of the draft's own random source, derived from the request seed as in
// serial generation (only sampled growth draws from it).
uint64_t draft_seed(uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ull; }

using Args = std::vector<std::pair<std::string, long long>>;

// The decode-phase loop of the draft leader; returns when the request ends.
class DraftLoop {
 public:
  // `first_token_pending`: the tree is rooted at the last prompt token and the
  // target's prefill (round 0) is in flight; its result carries the first token.
  DraftLoop(DraftTree& drafter, Session& s, TimelineTrack* track, LeaderStats& out, bool first_token_pending)
      : d_(drafter), s_(s), cfg_(s.config), opt_(s.options), track_(track), out_(out), policy_(s.options, s.config) {
    growth_depth_ = opt_.growth_depth > 0 ? opt_.growth_depth : 3 * cfg_.max_depth;
    emitted_ = first_token_pending ? 0 : 1;
    target_busy_ = first_token_pending;
  }

  void run() {
    for (;;) {
      const int remaining = cfg_.max_new_tokens - emitted_;
      // A round emits at most accepted + 1 tokens: deeper nodes are useless.
      const int verify_depth = std::max(0, std::min(cfg_.max_depth, remaining - 1));
      const int grow_depth = std::max(0, std::min(growth_depth_, remaining - 1));

      if (!target_busy_) {
        // The target is idle: hand it the best subtree, unless one more draft
        // step is expected to pay for the wait (cpp/src/async/send_policy.h).
        std::vector<int32_t> selected = d_.tree().select_best(cfg_.tree_budget, verify_depth);
        if (policy_.send_now(d_.tree(), selected, verify_depth, d_.can_grow(verify_depth), waited_)) {
          if (!send(selected)) return;
          continue;
        }
        ++waited_;
      } else if (std::optional<ResultMessage> r = s_.to_draft.try_receive()) {
        if (!apply(*r)) return;
        continue;
      } else if (s_.to_draft.closed()) {
        return;
      }

      if (grow_depth >= 1 && d_.can_grow(grow_depth)) {
        const double t0 = s_.timeline.now();
        const int before = d_.tree().size();
        const int added = d_.grow_step(grow_depth);
        record_step(t0, before);
        rec(ev::kGrow, t0, round_, {{"added", added}, {"tree", d_.tree().size() - 1}});
        continue;
      }
      // Nothing left to grow: wait for the verification in flight.
      const double w0 = s_.timeline.now();
      std::optional<ResultMessage> r = s_.to_draft.receive();
      rec(ev::kWaitResult, w0, round_);
      if (!r || !apply(*r)) return;
    }
  }

 private:
  void rec(const char* name, double begin, int round, Args args = {}) {
    if (track_) track_->add(name, begin, s_.timeline.now(), round, std::move(args));
  }

  // The policy's view of a draft step: its duration and the draft
  // probability mass it added per expanded node.
  void record_step(double t0, int before) {
    const TokenTree& t = d_.tree();
    double mass = 0;
    std::vector<int32_t> parents;
    for (int i = before; i < t.size(); ++i) {
      mass += std::exp(static_cast<double>(t.node(i).logprob));
      if (std::find(parents.begin(), parents.end(), t.node(i).parent) == parents.end())
        parents.push_back(t.node(i).parent);
    }
    policy_.record_draft_step(s_.timeline.now() - t0, mass, static_cast<int>(parents.size()), !target_busy_);
  }

  // Sends the subtree made of `selected` (TokenTree::select_best); false if shut down.
  bool send(const std::vector<int32_t>& selected) {
    const double t0 = s_.timeline.now();
    SubtreeMessage msg{++round_, d_.tree().subtree(selected)};
    const long long nodes = msg.tree.size() - 1;
    if (!s_.to_target.send(std::move(msg))) return false;
    target_busy_ = true;
    rec(ev::kSend, t0, round_, {{"nodes", nodes}, {"tree", d_.tree().size() - 1}, {"waited_steps", waited_}});
    return true;
  }

  // Commits a verification result and re-roots; false when the request is over.
  bool apply(const ResultMessage& r) {
    if (r.finished) return false;
    if (r.round > 0) policy_.record_verification(r.nodes, r.seconds);
    waited_ = 0;
    const double t0 = s_.timeline.now();
    out_.reused_nodes += d_.advance(r.accepted, r.bonus);
    emitted_ += static_cast<int>(r.accepted.size()) + 1;
    target_busy_ = false;
    rec(ev::kReroot, t0, r.round,
        {{"accepted", static_cast<long long>(r.accepted.size())}, {"kept", d_.tree().size() - 1}});
    return true;
  }

  DraftTree& d_;
  Session& s_;
  const GenerationConfig& cfg_;
  const AsyncOptions& opt_;
  TimelineTrack* track_;
  LeaderStats& out_;
  SendPolicy policy_;
  int growth_depth_ = 0;
  int waited_ = 0;   // draft steps taken while the target was idle, this round
  int emitted_ = 1;  // tokens emitted so far (the root's token included)
  int round_ = 0;    // last round sent
  bool target_busy_ = false;
};

}  // namespace

void run_draft_leader(Model& draft, Session& s, TimelineTrack* track, LeaderStats& out) {
  pin_leader(draft);
  DraftTree drafter(draft, s.config, s.options.speculative, draft_seed(s.config.sampling.seed));
  const std::vector<int32_t>& prompt = s.prompt;
  const PrefillControl stoppable{s.config.prefill_chunk, [&s] { return s.stopped(); }};

  if (prompt.size() >= 2) {
    // Draft while the target prefills: root the tree at the last prompt token
    // (a pending token: its K/V is computed when the root is first expanded)
    // and grow it — its children guess the first token. The first token
    // arrives as the round-0 result and re-roots the tree like any other.
    const double p0 = s.timeline.now();
    if (!drafter.start(std::vector<int32_t>(prompt.begin(), prompt.end() - 1), prompt.back(), stoppable))
      return;  // the host cancelled the request during the prefill
    out.prefill_time = s.timeline.now() - p0;
    if (track)
      track->add(ev::kPrefill, p0, s.timeline.now(), 0, {{"tokens", static_cast<long long>(prompt.size() - 1)}});
    const int steps0 = drafter.steps();
    const double time0 = drafter.time();
    DraftLoop(drafter, s, track, out, /*first_token_pending=*/true).run();
    out.steps = drafter.steps() - steps0;
    out.time = drafter.time() - time0;
    out.drafted_nodes = drafter.drafted_nodes();
    out.draft_batch_rows = drafter.batch_rows();
    return;
  }
  // A one-token prompt: nothing to prefill ahead; root the tree at the first token.
  const double w0 = s.timeline.now();
  std::optional<ResultMessage> first = s.to_draft.receive();
  if (track) track->add(ev::kWaitResult, w0, s.timeline.now(), 0);
  if (!first || first->finished) return;
  const double p0 = s.timeline.now();
  if (!drafter.start(prompt, first->bonus, stoppable)) return;
  out.prefill_time = s.timeline.now() - p0;
  if (track) track->add(ev::kPrefill, p0, s.timeline.now(), 0, {{"tokens", static_cast<long long>(prompt.size())}});
  const int steps0 = drafter.steps();
  const double time0 = drafter.time();
  DraftLoop(drafter, s, track, out, /*first_token_pending=*/false).run();
  out.steps = drafter.steps() - steps0;
  out.time = drafter.time() - time0;
  out.drafted_nodes = drafter.drafted_nodes();
  out.draft_batch_rows = drafter.batch_rows();
}

}  // namespace swiftspec::async_detail
