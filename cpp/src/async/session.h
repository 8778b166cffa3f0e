// Internal to the asynchronous engine (cpp/src/async/): the messages between the
// worker groups, and the per-request session that holds the channels.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "swiftspec/async_engine.h"
#include "swiftspec/channel.h"
#include "swiftspec/token_tree.h"

namespace swiftspec::async_detail {

/// draft -> target: verify this subtree (root = the pending token).
struct SubtreeMessage {
  int round = 0;  ///< 1, 2, ... (verification rounds)
  TokenTree tree;
};

/// target -> draft: the outcome of a round. Round 0 carries the first token
/// (sampled from the prefill) as `bonus` with no accepted tokens.
struct ResultMessage {
  int round = 0;
  std::vector<int32_t> accepted;  ///< accepted speculative tokens, root's child first
  int32_t bonus = -1;             ///< the token after them: the next root
  bool finished = false;          ///< EOS or max_new_tokens reached: stop
  int nodes = 0;                  ///< non-root nodes verified (0 for round 0)
  double seconds = 0;             ///< the verification's duration (forward + verify + commit)
};

/// target -> host: new final tokens (already cut to the request's limits).
struct TokensMessage {
  std::vector<int32_t> tokens;
  bool finished = false;
  std::string finish_reason;  ///< "length" or "stop" when finished
};

/// What one request's threads share: immutable inputs, the channels, the
/// first error. Nothing else crosses threads.
struct Session {
  Session(const std::vector<int32_t>& p, const GenerationConfig& c, const AsyncOptions& o, Timeline& t)
      : prompt(p), config(c), options(o), timeline(t) {}

  const std::vector<int32_t>& prompt;
  const GenerationConfig& config;
  const AsyncOptions& options;
  Timeline& timeline;  ///< read-only clock for the threads; each writes its own track

  Channel<SubtreeMessage> to_target;
  Channel<ResultMessage> to_draft;
  Channel<TokensMessage> to_host;

  /// Closes every channel: each thread stops at its next message wait (or,
  /// during a prefill, at its next chunk: stopped()).
  void shutdown() {
    stopped_.store(true, std::memory_order_release);
    to_target.close();
    to_draft.close();
    to_host.close();
  }
  /// True once shutdown() was called (the request is over or cancelled).
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  /// Records the first error and shuts the session down.
  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = e;
    }
    shutdown();
  }
  std::exception_ptr error() {
    std::lock_guard<std::mutex> lock(error_mu_);
    return error_;
  }

 private:
  std::atomic<bool> stopped_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

/// Counters a group leader reports when it returns.
struct LeaderStats {
  int steps = 0;    ///< forward passes after prefill
  double time = 0;  ///< seconds in those forward passes
  double prefill_time = 0;
  int drafted_nodes = 0;               ///< draft only
  int reused_nodes = 0;                ///< draft only: nodes kept by re-rooting
  int verified_nodes = 0;              ///< target only: non-root nodes verified
  int target_sampling_nodes = 0;       ///< target only
  std::vector<int> accepted_per_step;  ///< target only
  std::vector<int> verified_per_step;  ///< target only: non-root nodes of each verified subtree
  std::vector<int> draft_batch_rows;   ///< draft only: rows of each draft forward pass
};

/// The target group's leader loop (target_worker.cpp).
void run_target_leader(Model& target, Session& s, TimelineTrack* track, LeaderStats& out);
/// The draft group's leader loop (draft_worker.cpp).
void run_draft_leader(Model& draft, Session& s, TimelineTrack* track, LeaderStats& out);
/// Pins the calling thread to the first core of `model`'s cpu_affinity, if any.
void pin_leader(const Model& model);

}  // namespace swiftspec::async_detail
