// Generation requests, streaming callbacks and per-request statistics, shared
// by target-only decoding and speculative decoding (serial and async).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "swiftspec/sampling.h"

namespace swiftspec {

/// How a request is decoded.
enum class DecodeMode {
  TargetOnly,  ///< plain autoregressive decoding with the target model
  Serial,      ///< speculative, serial tree generation (SpecExec-style): draft, then verify
  Async,       ///< speculative, parallel tree generation (SwiftSpec §4.1): draft and target concurrently
  /// per round, target-only decoding or a serial tree of the budget the measurements favour
  /// (speculation_policy.h); target-only without a draft model
  Auto,
};

/// Every decode mode, in the order the API lists them.
inline constexpr DecodeMode kDecodeModes[] = {DecodeMode::Auto, DecodeMode::TargetOnly, DecodeMode::Serial,
                                              DecodeMode::Async};

/// "target", "serial", "async" or "auto": the mode as the Python API names it.
const char* decode_mode_name(DecodeMode mode);
/// The mode of a name decode_mode_name gives; throws InvalidArgument naming `name` and the modes.
DecodeMode parse_decode_mode(const std::string& name);

/// Parameters of one generation request.
struct GenerationConfig {
  int max_new_tokens = 128;             ///< > 0
  SamplingParams sampling;              ///< greedy when temperature == 0
  std::vector<int32_t> stop_token_ids;  ///< generation ends after emitting one of these (EOS)
  DecodeMode mode = DecodeMode::TargetOnly;
  // Token-tree shape (speculative modes).
  int tree_budget = 16;  ///< nodes verified per target step (>= 1)
  int max_depth = 8;     ///< depth limit of the token tree (>= 1)
  int branching = 2;     ///< children added per expanded node (top-k of the draft); 1 = chain

  /// Tokens per prefill forward pass (>= 0; 0: the model's Model::prefill_chunk_tokens()).
  /// The prompt is processed in chunks so that cancel_requested is seen during a long
  /// prefill; on a batch-invariant backend the chunk size changes no result (model.h).
  int prefill_chunk = 0;
  /// Polled on the thread that called generate: before every prefill chunk, before every
  /// decode step (serial: every round), and in async mode whenever that thread waits for
  /// the worker groups (at least every 20 ms). Returning true cancels the request:
  /// finish_reason "cancelled", the tokens emitted so far (none during the prefill), the
  /// models reusable. Empty: never polled. What it throws propagates out of generate.
  std::function<bool()> cancel_requested;

  /// Whether cancel_requested is set and returns true now (what it throws propagates).
  bool cancelled() const { return cancel_requested && cancel_requested(); }

  /// Throws InvalidArgument naming the field and value.
  void validate() const;
};

/// The one rule for a request's length: its prompt plus max_new_tokens must fit the context
/// (`context` tokens of KV cache: Engine::context_length). Throws InvalidArgument naming both
/// lengths: "the prompt of 40000 tokens is longer than the context of 32768 tokens
/// (max_context) ...", "... fills the context ...", or "the prompt of 30000 tokens plus
/// max_new_tokens 4096 exceeds the context of 32768 tokens (max_context): ...". `whose`, when
/// not empty, says which model's context it is ("the target's", "the draft's").
void check_request_fits_context(int64_t prompt_tokens, int64_t max_new_tokens, int context,
                                const std::string& whose = "");

/// Timing and speculation statistics of one request. Times in seconds.
struct GenerationStats {
  int prompt_tokens = 0;
  int new_tokens = 0;
  int verification_steps = 0;  ///< target forward passes after prefill (= decode steps for target-only)
  int draft_steps = 0;         ///< draft forward passes after prefill
  double prefill_time = 0;     ///< prompt processing until the first new token is known (TTFT)
  double decode_time = 0;      ///< from the first new token to the last
  double target_time = 0;      ///< wall time inside target forward passes (decode phase)
  double draft_time = 0;       ///< wall time inside draft forward passes (decode phase)
  /// Engine::generate: the request's wall time, from its turn to its end (waiting for the turn
  /// excluded; cancelled while waiting: the wait); 0 from the decoding functions themselves.
  double wall_time = 0;
  std::string finish_reason;  ///< "length", "stop" (stop token), "cancelled"

  /// Mean tokens committed per target verification (>= 1 for speculation, 1 for target-only).
  double acceptance_length() const {
    return verification_steps > 0 ? static_cast<double>(new_tokens - 1) / verification_steps : 0.0;
  }
};

struct GenerationResult {
  std::vector<int32_t> tokens;  ///< the new tokens (prompt excluded)
  GenerationStats stats;
};

/// Streaming callback: receives newly committed tokens, in order, as soon as
/// they are final. Returning false cancels the request (finish_reason "cancelled").
/// (To cancel before any token, e.g. during a long prefill, use
/// GenerationConfig::cancel_requested.)
using TokenCallback = std::function<bool(const std::vector<int32_t>& new_tokens)>;

}  // namespace swiftspec
