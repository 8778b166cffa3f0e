// Parallel tree generation: the host side. Starts the two group leaders,
// streams their tokens through the callback, shuts them down and joins them.
#include "swiftspec/async_engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "session.h"
#include "swiftspec/error.h"

namespace swiftspec {

using namespace async_detail;
namespace ev = timeline_event;

void AsyncOptions::validate() const {
  if (growth_depth < 0)
    throw InvalidArgument("growth_depth must be >= 0 (0: 2 * max_depth), got " + std::to_string(growth_depth));
  if (min_send_nodes < 1) throw InvalidArgument("min_send_nodes must be >= 1, got " + std::to_string(min_send_nodes));
  if (speculative.growth == SpeculativeOptions::Growth::Sampled)
    throw InvalidArgument(
        "async mode grows the token tree with top-k expansion; sampled growth (SpecInfer rejection sampling) "
        "would need the draft distributions in every message: use growth 'auto' or 'top_k'");
  if (speculative.expand_width < 0)
    throw InvalidArgument("expand_width must be >= 0 (0: automatic), got " + std::to_string(speculative.expand_width));
}

GenerationResult generate_speculative_async(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                            const GenerationConfig& config, const TokenCallback& on_tokens) {
  return generate_speculative_async(target, draft, prompt, config, on_tokens, AsyncOptions{}, nullptr);
}

GenerationResult generate_speculative_async(Model& target, Model& draft, const std::vector<int32_t>& prompt,
                                            const GenerationConfig& config, const TokenCallback& on_tokens,
                                            const AsyncOptions& options_in, AsyncReport* report) {
  options_in.validate();
  AsyncOptions options = options_in;
  options.speculative.growth = SpeculativeOptions::Growth::TopK;
  validate_speculative(target, draft, prompt, config, options.speculative);

  AsyncReport local;
  AsyncReport& rep = report ? *report : local;
  rep = AsyncReport{};
  Timeline& tl = rep.timeline;
  tl.start();
  TimelineTrack* host_track = options.record_timeline ? &tl.track("host") : nullptr;
  TimelineTrack* target_track = options.record_timeline ? &tl.track("target") : nullptr;
  TimelineTrack* draft_track = options.record_timeline ? &tl.track("draft") : nullptr;

  Session s(prompt, config, options, tl);
  LeaderStats tst, dst;
  std::thread target_thread([&] {
    try {
      run_target_leader(target, s, target_track, tst);
    } catch (...) {
      s.fail(std::current_exception());
    }
  });
  std::thread draft_thread([&] {
    try {
      run_draft_leader(draft, s, draft_track, dst);
    } catch (...) {
      s.fail(std::current_exception());
    }
  });

  GenerationResult result;
  GenerationStats& st = result.stats;
  st.prompt_tokens = static_cast<int>(prompt.size());
  double t_first = -1, t_last = -1;
  std::exception_ptr host_error;
  // The caller's cancellation check runs here, on the caller's thread, never on a group's:
  // while a group prefills or verifies, the host polls it every kCancelPoll.
  constexpr auto kCancelPoll = std::chrono::milliseconds(20);
  try {
    for (;;) {
      std::optional<TokensMessage> m;
      if (config.cancel_requested) {
        m = s.to_host.receive_for(kCancelPoll);
        if (!m && !s.to_host.closed()) {  // nothing yet
          if (config.cancelled()) {
            st.finish_reason = "cancelled";
            break;
          }
          continue;
        }
      } else {
        m = s.to_host.receive();
      }
      if (!m) break;  // a group failed
      const double t = tl.now();
      if (t_first < 0) t_first = t;
      t_last = t;
      result.tokens.insert(result.tokens.end(), m->tokens.begin(), m->tokens.end());
      if (m->finished) st.finish_reason = m->finish_reason;
      if (on_tokens && !m->tokens.empty()) {
        const bool keep = on_tokens(m->tokens);
        if (host_track)
          host_track->add(ev::kEmit, t, tl.now(), -1, {{"tokens", static_cast<long long>(m->tokens.size())}});
        if (!keep) {
          st.finish_reason = "cancelled";
          break;
        }
      }
      if (m->finished) break;
      if (config.cancelled()) {
        st.finish_reason = "cancelled";
        break;
      }
    }
  } catch (...) {
    host_error = std::current_exception();  // the callback threw: stop the groups first
  }
  s.shutdown();
  target_thread.join();
  draft_thread.join();
  if (host_error) std::rethrow_exception(host_error);
  if (std::exception_ptr e = s.error()) std::rethrow_exception(e);

  st.new_tokens = static_cast<int>(result.tokens.size());
  st.prefill_time = tst.prefill_time;
  st.decode_time = t_last > t_first ? t_last - t_first : 0.0;
  st.verification_steps = tst.steps;
  st.target_time = tst.time;
  st.draft_steps = dst.steps;
  st.draft_time = dst.time;

  SpeculationReport& sp = rep.speculation;
  sp.growth = tree_growth_name(TreeGrowth::TopK);
  sp.verification = config.sampling.greedy() && options.speculative.verifier_bias == VerifierBias::None
                        ? "greedy"
                        : "target_sampling";
  sp.expand_width = options.speculative.resolve_expand_width(config);
  // Negative (auto) is 0 for a DraftTree of its own (speculative.h).
  sp.min_expand_prob = std::max(options.speculative.min_expand_prob, 0.0);
  sp.target_sampling_nodes = tst.target_sampling_nodes;
  sp.verified_nodes = tst.verified_nodes;
  sp.drafted_nodes = dst.drafted_nodes;
  sp.reused_nodes = dst.reused_nodes;
  sp.accepted_per_step = tst.accepted_per_step;
  sp.verified_per_step = tst.verified_per_step;
  sp.draft_batch_rows = dst.draft_batch_rows;
  return result;
}

}  // namespace swiftspec
