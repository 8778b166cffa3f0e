// Request dispatch and target-only autoregressive decoding.
#include "swiftspec/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "swiftspec/error.h"
#if __has_include("swiftspec/speculative.h")
#include "swiftspec/speculative.h"
#define SWIFTSPEC_HAS_SPECULATIVE 1
#endif
#if __has_include("swiftspec/async_engine.h")
#include "swiftspec/async_engine.h"
#define SWIFTSPEC_HAS_ASYNC 1
#endif

namespace swiftspec {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Engine::Engine(std::shared_ptr<Model> target, std::shared_ptr<Model> draft)
    : target_(std::move(target)), draft_(std::move(draft)), pid_(getpid()) {
  if (!target_) throw InvalidArgument("Engine: the target model is required");
  if (target_->options().kv_window_recent > 0)
    throw InvalidArgument(
        "Engine: the target model attends an attention window (kv_window_recent " +
        std::to_string(target_->options().kv_window_recent) +
        "); the target verifies the draft's proposals with its full KV, so only a draft may have one");
  if (draft_ && draft_->config().vocab_size != target_->config().vocab_size)
    throw InvalidArgument("Engine: draft vocabulary (" + std::to_string(draft_->config().vocab_size) +
                          ") differs from the target's (" + std::to_string(target_->config().vocab_size) +
                          "); speculative decoding needs one tokenizer");
}

Engine::~Engine() = default;

bool Engine::forked() const { return getpid() != pid_; }

void Engine::check_open() const {
  if (closed_) throw InvalidArgument("the engine is closed");
  if (forked())
    throw InvalidArgument("this engine was made in process " + std::to_string(pid_) + ", and this process (" +
                          std::to_string(getpid()) +
                          ") is a fork() of it: the models' worker threads did not survive the fork, so it cannot "
                          "run here; make the engine in this process (multiprocessing: the 'spawn' or 'forkserver' "
                          "start method, or make the engine in each worker)");
}

Model& Engine::target() {
  check_open();
  std::lock_guard<std::mutex> lock(mu_);
  if (!target_) throw InvalidArgument("the engine is closed");
  return *target_;
}

Model* Engine::draft() {
  check_open();
  std::lock_guard<std::mutex> lock(mu_);
  return draft_.get();
}

int Engine::context_length(DecodeMode mode) const {
  check_open();
  std::lock_guard<std::mutex> lock(mu_);
  if (!target_) throw InvalidArgument("the engine is closed");
  int context = target_->options().max_context;
  if (draft_ && mode != DecodeMode::TargetOnly) context = std::min(context, draft_->options().max_context);
  return context;
}

// ---------------------------------------------------------------------------------- the turn
bool Engine::running_on_this_thread() const {
  std::lock_guard<std::mutex> lock(mu_);
  return turn_taken_ && turn_holder_ == std::this_thread::get_id();
}

std::optional<Engine::Turn> Engine::wait_for_turn(const std::function<bool()>& cancel_requested, const char* who) {
  check_open();  // (in a fork()ed child before mu_, which a parent's thread may have held at the fork)
  const std::string call = who;
  std::unique_lock<std::mutex> lock(mu_);
  if (turn_taken_ && turn_holder_ == std::this_thread::get_id())
    throw InvalidArgument(call +
                          " was called from a callback of a request running on this engine (it would wait "
                          "for itself); " +
                          (call == "close()" ? "close the engine" : "call it") + " after that request returns");
  const auto poll = std::chrono::duration<double>(kTurnPollSeconds);
  while (turn_taken_) {
    if (cancel_requested) {
      lock.unlock();  // the check may take the GIL: never while holding mu_
      const bool cancel = cancel_requested();
      lock.lock();
      if (cancel) return std::nullopt;
      if (!turn_taken_) break;
    }
    turn_free_.wait_for(lock, poll);
  }
  if (closed_) throw InvalidArgument("the engine is closed");  // closed while this call waited
  turn_taken_ = true;
  turn_holder_ = std::this_thread::get_id();
  return Turn(this);
}

void Engine::release_turn() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    turn_taken_ = false;
    turn_holder_ = std::thread::id();
  }
  turn_free_.notify_all();
}

Engine::Turn::~Turn() {
  if (engine_) engine_->release_turn();
}

GenerationResult Engine::cancelled_before_start(int prompt_tokens, double waited_seconds) {
  GenerationResult r;
  r.stats.prompt_tokens = prompt_tokens;
  r.stats.finish_reason = "cancelled";
  r.stats.wall_time = waited_seconds;
  return r;
}

bool Engine::close(const std::function<bool()>& cancel_requested) {
  if (closed_) return true;
  std::shared_ptr<Model> target, draft;  // released after mu_ (a model's destructor joins its workers)
  if (forked()) {  // nothing of the parent's runs here, and a parent's thread may have held mu_ at the fork
    closed_ = true;
    target = std::move(target_);
    draft = std::move(draft_);
    return true;
  }
  auto wait = [&]() -> std::optional<Turn> {
    try {
      return wait_for_turn(cancel_requested, "close()");
    } catch (const InvalidArgument&) {
      if (closed_) return std::nullopt;  // closed by another thread meanwhile
      throw;
    }
  };
  std::optional<Turn> turn = wait();
  if (!turn) return closed_.load();  // closed meanwhile, or cancelled while waiting
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;  // first: a reader that finds the engine open has models not yet released
  target = std::move(target_);
  draft = std::move(draft_);
  return true;
}

// ---------------------------------------------------------------------------------- requests
GenerationResult Engine::generate(const std::vector<int32_t>& prompt, const GenerationConfig& config,
                                  const TokenCallback& on_tokens, const AsyncOptions* async_options,
                                  AsyncReport* async_report) {
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<Turn> turn = wait_for_turn(config.cancel_requested);
  if (!turn) return cancelled_before_start(static_cast<int>(prompt.size()), seconds_since(t0));
  return generate(*turn, prompt, config, on_tokens, async_options, async_report);
}

GenerationResult Engine::generate(const Turn& turn, const std::vector<int32_t>& prompt, const GenerationConfig& config,
                                  const TokenCallback& on_tokens, const AsyncOptions* async_options,
                                  AsyncReport* async_report) {
  if (turn.engine_ != this) throw InvalidArgument("Engine::generate: the turn is another engine's");
  const auto t0 = std::chrono::steady_clock::now();
  GenerationResult result = run(prompt, config, on_tokens, async_options, async_report);
  result.stats.wall_time = seconds_since(t0);
  return result;
}

GenerationResult Engine::run(const std::vector<int32_t>& prompt, const GenerationConfig& config,
                             const TokenCallback& on_tokens, const AsyncOptions* async_options,
                             AsyncReport* async_report) {
  config.validate();
  if (config.mode != DecodeMode::TargetOnly && config.mode != DecodeMode::Auto && !draft_)
    throw InvalidArgument(std::string("mode '") + decode_mode_name(config.mode) +
                          "' needs a draft model; this engine has none");
  if (async_options && config.mode != DecodeMode::Async)
    throw InvalidArgument(std::string("async_options apply to mode='async' only (mode is '") +
                          decode_mode_name(config.mode) + "')");
  if (config.tree_budget > target_->options().max_tree)  // (speculation checks what each model needs)
    throw InvalidArgument(
        "tree_budget " + std::to_string(config.tree_budget) +
        " exceeds the engine's tree KV capacity max_tree=" + std::to_string(target_->options().max_tree));
  if (prompt.empty()) throw InvalidArgument("the prompt is empty: give at least one token");
  const int vocab = target_->config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw InvalidArgument("prompt token id " + std::to_string(prompt[i]) + " at index " + std::to_string(i) +
                            " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  check_request_fits_context(static_cast<int64_t>(prompt.size()), config.max_new_tokens, context_length(config.mode));
  for (int32_t s : config.stop_token_ids)
    if (s < 0 || s >= vocab) throw InvalidArgument("stop token id " + std::to_string(s) + " is outside the vocabulary");

  switch (config.mode) {
    case DecodeMode::TargetOnly:
      return generate_target_only(prompt, config, on_tokens);
    case DecodeMode::Auto:
      if (!draft_) return generate_target_only(prompt, config, on_tokens);
#ifdef SWIFTSPEC_HAS_SPECULATIVE
      {
#ifdef SWIFTSPEC_HAS_ASYNC
        SpeculationReport* report = async_report ? &async_report->speculation : nullptr;
#else
        SpeculationReport* report = nullptr;
#endif
        return generate_speculative_auto(*target_, *draft_, prompt, config, on_tokens, SpeculativeOptions{}, report,
                                         &auto_memory_);
      }
#else
      throw InvalidArgument("decode mode 'auto' with a draft model is not available in this build");
#endif
    case DecodeMode::Serial:
    case DecodeMode::Async:
#ifdef SWIFTSPEC_HAS_SPECULATIVE
      if (config.mode == DecodeMode::Serial)
        return generate_speculative_serial(*target_, *draft_, prompt, config, on_tokens);
#endif
#ifdef SWIFTSPEC_HAS_ASYNC
      if (config.mode == DecodeMode::Async) {
        const AsyncOptions defaults;
        return generate_speculative_async(*target_, *draft_, prompt, config, on_tokens,
                                          async_options ? *async_options : defaults, async_report);
      }
#endif
      throw InvalidArgument(std::string("decode mode '") + decode_mode_name(config.mode) +
                            "' is not available in this build");
  }
  throw InvalidArgument("unknown decode mode");
}

GenerationResult Engine::generate_target_only(const std::vector<int32_t>& prompt, const GenerationConfig& config,
                                              const TokenCallback& on_tokens) {
  Model& model = *target_;
  const int vocab = model.config().vocab_size;
  GenerationResult result;
  GenerationStats& st = result.stats;
  st.prompt_tokens = static_cast<int>(prompt.size());
  Rng rng(config.sampling.seed);
  std::vector<float> logits, scratch;
  TopKLogits top;

  model.truncate_committed(0);
  const auto t0 = std::chrono::steady_clock::now();
  if (!prefill(model, prompt, LogitsMode::Last, logits, {config.prefill_chunk, config.cancel_requested})) {
    st.prefill_time = seconds_since(t0);
    st.finish_reason = "cancelled";
    return result;
  }
  int32_t token = sample_token(logits.data(), vocab, config.sampling, rng, scratch);
  st.prefill_time = seconds_since(t0);
  const auto t_decode = std::chrono::steady_clock::now();

  auto is_stop = [&](int32_t t) {
    return std::find(config.stop_token_ids.begin(), config.stop_token_ids.end(), t) != config.stop_token_ids.end();
  };
  for (;;) {
    result.tokens.push_back(token);
    if (on_tokens && !on_tokens({token})) {
      st.finish_reason = "cancelled";
      break;
    }
    if (is_stop(token)) {
      st.finish_reason = "stop";
      break;
    }
    if (static_cast<int>(result.tokens.size()) >= config.max_new_tokens) {
      st.finish_reason = "length";
      break;
    }
    if (config.cancelled()) {
      st.finish_reason = "cancelled";
      break;
    }
    const auto ts = std::chrono::steady_clock::now();
    const ForwardBatch step = ForwardBatch::append({token}, model.committed_len(), LogitsMode::Last);
    if (config.sampling.greedy()) {
      // Greedy decoding reads one arg-max: selected where the logits are (Model::forward_top_k).
      model.forward_top_k(step, 1, false, top);
      token = top.ids[0];
      st.target_time += seconds_since(ts);
    } else if (config.sampling.top_k >= 1 && config.sampling.top_k < vocab) {
      // Top-k sampling reads the k best logits only (sample_from_top_k: the same distribution).
      // (top_k >= vocab keeps every token: ranking them all is only extra work, as in sampling_distribution.)
      model.forward_top_k(step, config.sampling.top_k, false, top);
      st.target_time += seconds_since(ts);
      token = sample_from_top_k(top.ids.data(), top.logits.data(), top.k, config.sampling, rng);
    } else {
      // Temperature / top-p alone: the step's kSampleHeadK best logits and its normaliser at T decide
      // the draw at most steps (sample_from_head: the same distribution); the whole row is read
      // (Model::read_logits_row) only when they do not.
      model.forward_top_k(step, std::min(kSampleHeadK, vocab), true, top, 1.0 / config.sampling.temperature);
      st.target_time += seconds_since(ts);
      token = sample_from_head(top, 0, vocab, config.sampling, rng,
                               [&](std::vector<float>& row) { model.read_logits_row(0, row); });
    }
    st.verification_steps += 1;
  }
  st.decode_time = seconds_since(t_decode);
  st.new_tokens = static_cast<int>(result.tokens.size());
  return result;
}

}  // namespace swiftspec
