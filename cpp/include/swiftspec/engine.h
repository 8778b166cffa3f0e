// The engine: owns a target model and optionally a draft model, and decodes
// requests one at a time (the product is single-request, latency-first): a
// request from another thread waits for its turn, cancellable while it waits.
//
// Embedding from C++ (no Python needed):
//   auto ckpt   = swiftspec::Checkpoint::open("/path/to/checkpoint");
//   auto target = swiftspec::load_model(ckpt, "cpu", {});
//   swiftspec::Engine engine(std::move(target));
//   swiftspec::GenerationConfig cfg;  cfg.max_new_tokens = 64;
//   auto result = engine.generate(prompt_ids, cfg);
#pragma once
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "swiftspec/generation.h"
#include "swiftspec/model.h"
#include "swiftspec/speculation_policy.h"

namespace swiftspec {

struct AsyncOptions;  // async_engine.h
struct AsyncReport;

/// How often a request waiting for its turn (and close() waiting for a request) polls its
/// cancellation check, seconds.
inline constexpr double kTurnPollSeconds = 0.02;

class Engine {
 public:
  /// `draft` may be null (then only DecodeMode::TargetOnly is available).
  /// Throws InvalidArgument if the models' vocabularies differ or the target attends an
  /// attention window (ModelOptions::kv_window_recent: a draft's option). The engine
  /// shares the models; do not run them elsewhere while a request runs.
  explicit Engine(std::shared_ptr<Model> target, std::shared_ptr<Model> draft = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// The models. Throw InvalidArgument as check_open does; use them only while holding a Turn
  /// (close() on another thread releases them once no request holds one).
  Model& target();
  Model* draft();

  /// The context of a request in `mode`, tokens: the target's max_context, or the smaller of
  /// the target's and the draft's when the draft speculates (serial, async). A request's
  /// prompt plus max_new_tokens must fit in it (check_request_fits_context, generation.h).
  /// Throws InvalidArgument as check_open does.
  int context_length(DecodeMode mode) const;

  // ------------------------------------------------------------------------------ requests
  // One request at a time: a request waits for its turn behind another thread's, polling its
  // cancellation check (GenerationConfig::cancel_requested) every kTurnPollSeconds; once that
  // returns true it returns at once, without tokens, rather than when the running request ends
  // (minutes, for a long one). A request from the thread that holds the turn (a callback of the
  // running request) is refused: it would wait for itself.

  /// A request's hold on the engine (wait_for_turn); released when destroyed.
  class Turn {
   public:
    Turn(Turn&& other) noexcept : engine_(std::exchange(other.engine_, nullptr)) {}
    Turn& operator=(Turn&&) = delete;
    ~Turn();

   private:
    friend class Engine;
    explicit Turn(Engine* engine) : engine_(engine) {}
    Engine* engine_;
  };

  /// Waits for this engine's turn. `cancel_requested` (may be empty) is polled while another
  /// request holds it (not when the engine is free): once it returns true, returns nullopt.
  /// Throws InvalidArgument on the thread that holds the turn ("generate() was called from a
  /// callback of a request running on this engine ..."; `who` names the call), as check_open does,
  /// and "the engine is closed" once close() released the models while this call waited. What
  /// cancel_requested throws propagates.
  std::optional<Turn> wait_for_turn(const std::function<bool()>& cancel_requested, const char* who = "generate()");

  /// Decodes `prompt` (token ids, non-empty, each < vocab) under `config`, in this engine's turn
  /// (wait_for_turn with config.cancel_requested): cancelled while it waits, it returns no tokens
  /// (finish_reason "cancelled", stats.prompt_tokens set, stats.wall_time the wait).
  /// Each call starts from an empty KV cache. `on_tokens`, when given, is
  /// called with newly final tokens and may cancel; config.cancel_requested,
  /// when set, is polled between prefill chunks (config.prefill_chunk) and
  /// decode steps and may cancel too, also before the first token (the result
  /// then has no tokens, finish_reason "cancelled"). `async_options` (DecodeMode::Async only;
  /// null: the defaults) and `async_report` (filled when given) are generate_speculative_async's;
  /// in DecodeMode::Auto with a draft, `async_report->speculation` receives
  /// generate_speculative_auto's report (its timeline stays empty). DecodeMode::Auto without a
  /// draft decodes target-only.
  /// stats.wall_time: from the request's turn to its end. Throws InvalidArgument for
  /// an empty prompt, out-of-range ids, a prompt plus max_new_tokens longer
  /// than context_length(config.mode) (naming both lengths), a tree_budget beyond the target's
  /// tree KV (max_tree), invalid sampling/tree parameters, a speculative mode without a draft
  /// model, async options in another mode, and as wait_for_turn does. The engine is ready for
  /// the next request after any return or throw.
  GenerationResult generate(const std::vector<int32_t>& prompt, const GenerationConfig& config,
                            const TokenCallback& on_tokens = nullptr, const AsyncOptions* async_options = nullptr,
                            AsyncReport* async_report = nullptr);
  /// The same in a turn the caller holds (a binding that marks more busy while the request runs).
  GenerationResult generate(const Turn& turn, const std::vector<int32_t>& prompt, const GenerationConfig& config,
                            const TokenCallback& on_tokens = nullptr, const AsyncOptions* async_options = nullptr,
                            AsyncReport* async_report = nullptr);
  /// The result of a request cancelled before it ran (while it waited for its turn).
  static GenerationResult cancelled_before_start(int prompt_tokens, double waited_seconds);

  /// Waits for a running request to end (polling `cancel_requested`, when given: once it returns
  /// true, returns false without closing), then releases the engine's models; later calls
  /// throw InvalidArgument "the engine is closed". Returns true once closed (at once when it
  /// was). Throws InvalidArgument on the thread running this engine's request ("close() was
  /// called from a callback ..."). In a fork()ed child it does not wait (the request that ran at
  /// the fork is the parent's).
  bool close(const std::function<bool()>& cancel_requested = nullptr);
  bool closed() const { return closed_.load(); }
  /// Whether the calling thread holds this engine's turn (runs one of its requests: a callback).
  bool running_on_this_thread() const;
  /// Throws InvalidArgument "the engine is closed" after close(), or, in a fork()ed child of the
  /// process that made the engine, that it cannot run there (the models' worker threads did not
  /// survive the fork).
  void check_open() const;

 private:
  GenerationResult run(const std::vector<int32_t>& prompt, const GenerationConfig& config,
                       const TokenCallback& on_tokens, const AsyncOptions* async_options, AsyncReport* async_report);
  GenerationResult generate_target_only(const std::vector<int32_t>& prompt, const GenerationConfig& config,
                                        const TokenCallback& on_tokens);
  void release_turn();
  bool forked() const;

  std::shared_ptr<Model> target_;
  std::shared_ptr<Model> draft_;
  // The auto mode's estimates, handed from each request to the next (speculation_policy.h,
  // "Memory across requests"); touched only by the request holding the turn.
  SpeculationPolicy::Memory auto_memory_;
  pid_t pid_;  // the process that made the engine
  std::atomic<bool> closed_{false};
  mutable std::mutex mu_;  // guards the turn and the model pointers; never held while a callback runs
  std::condition_variable turn_free_;
  bool turn_taken_ = false;
  std::thread::id turn_holder_;
};

}  // namespace swiftspec
