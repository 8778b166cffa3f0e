// What serial and auto speculative generation share (internal to cpp/src/spec/): emitting a
// round's tokens under the request's limits, the draft's seed, the verification scheme's name,
// the statistics a request ends with.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "swiftspec/generation.h"
#include "swiftspec/speculative.h"

namespace swiftspec::detail {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seed of the draft's own random source (Sampled growth), derived from the request seed so a seed
// reproduces a whole generation.
inline uint64_t draft_seed(uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ull; }

// "greedy", or the stochastic schemes that decided nodes joined by '+' ("none" when none did).
inline std::string verification_scheme(bool greedy, int rejection, int target_sampling) {
  if (greedy) return "greedy";
  std::string s;
  if (rejection > 0) s = "rejection_sampling";
  if (target_sampling > 0) s += std::string(s.empty() ? "" : "+") + "target_sampling";
  return s.empty() ? "none" : s;
}

// The statistics of a speculative request once its rounds are over: tokens, decode time (from
// `t_first`, the first token's emission), the models' steps and times, the draft's node counts and
// the verification scheme (`greedy_unbiased`: greedy verification without a verifier bias).
inline void finish_speculative_stats(GenerationResult& result, SpeculationReport& rep, const TreeVerifier& verifier,
                                     const DraftTree& drafter, double t_first, bool greedy_unbiased) {
  GenerationStats& st = result.stats;
  st.new_tokens = static_cast<int>(result.tokens.size());
  st.decode_time = now_s() - t_first;
  st.verification_steps = verifier.steps();
  st.target_time = verifier.time();
  st.draft_steps = drafter.steps();
  st.draft_time = drafter.time();
  rep.drafted_nodes = drafter.drafted_nodes();
  rep.draft_batch_rows = drafter.batch_rows();
  rep.verification = verification_scheme(greedy_unbiased, rep.rejection_sampling_nodes, rep.target_sampling_nodes);
}

// Appends each round's final tokens to `result`, cut at config.max_new_tokens (finish_reason
// "length") and after a stop token ("stop"), and streams them through `on_tokens` (returning
// false: "cancelled"). done() once generation must end.
class TokenEmitter {
 public:
  TokenEmitter(const GenerationConfig& config, const TokenCallback& on_tokens, GenerationResult& result)
      : config_(config), on_tokens_(on_tokens), result_(result) {}

  void emit(std::vector<int32_t> tokens) {
    GenerationStats& st = result_.stats;
    const int room = config_.max_new_tokens - static_cast<int>(result_.tokens.size());
    if (static_cast<int>(tokens.size()) >= room) {
      tokens.resize(room);
      st.finish_reason = "length";
      done_ = true;
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (std::find(config_.stop_token_ids.begin(), config_.stop_token_ids.end(), tokens[i]) !=
          config_.stop_token_ids.end()) {
        tokens.resize(i + 1);
        st.finish_reason = "stop";
        done_ = true;
        break;
      }
    }
    result_.tokens.insert(result_.tokens.end(), tokens.begin(), tokens.end());
    if (on_tokens_ && !tokens.empty() && !on_tokens_(tokens)) cancel();
  }
  void cancel() {
    result_.stats.finish_reason = "cancelled";
    done_ = true;
  }
  bool done() const { return done_; }
  int remaining() const { return config_.max_new_tokens - static_cast<int>(result_.tokens.size()); }

 private:
  const GenerationConfig& config_;
  const TokenCallback& on_tokens_;
  GenerationResult& result_;
  bool done_ = false;
};

}  // namespace swiftspec::detail
