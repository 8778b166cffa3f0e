// Request dispatch and target-only autoregressive decoding.
#include "swiftspec/engine.h"

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
    : target_(std::move(target)), draft_(std::move(draft)) {
  if (!target_) throw InvalidArgument("Engine: the target model is required");
  if (draft_ && draft_->config().vocab_size != target_->config().vocab_size)
    throw InvalidArgument("Engine: draft vocabulary (" + std::to_string(draft_->config().vocab_size) +
                          ") differs from the target's (" + std::to_string(target_->config().vocab_size) +
                          "); speculative decoding needs one tokenizer");
}

Engine::~Engine() = default;

GenerationResult Engine::generate(const std::vector<int32_t>& prompt, const GenerationConfig& config,
                                  const TokenCallback& on_tokens) {
  config.validate();
  if (config.mode != DecodeMode::TargetOnly && !draft_)
    throw InvalidArgument("speculative decoding needs a draft model: load the engine with one");
  if (prompt.empty()) throw InvalidArgument("the prompt is empty: give at least one token");
  const int vocab = target_->config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw InvalidArgument("prompt token id " + std::to_string(prompt[i]) + " at index " + std::to_string(i) +
                            " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  int context = target_->options().max_context;
  if (draft_ && config.mode != DecodeMode::TargetOnly) context = std::min(context, draft_->options().max_context);
  const long long needed = static_cast<long long>(prompt.size()) + config.max_new_tokens;
  if (needed > context)
    throw InvalidArgument("prompt of " + std::to_string(prompt.size()) + " tokens plus max_new_tokens " +
                          std::to_string(config.max_new_tokens) + " exceeds the context of " +
                          std::to_string(context) + " tokens");
  for (int32_t s : config.stop_token_ids)
    if (s < 0 || s >= vocab)
      throw InvalidArgument("stop token id " + std::to_string(s) + " is outside the vocabulary");

  switch (config.mode) {
    case DecodeMode::TargetOnly:
      return generate_target_only(prompt, config, on_tokens);
    case DecodeMode::Serial:
    case DecodeMode::Async:
      if (!draft_) throw InvalidArgument("speculative decoding needs a draft model: load the engine with one");
#ifdef SWIFTSPEC_HAS_SPECULATIVE
      if (config.mode == DecodeMode::Serial)
        return generate_speculative_serial(*target_, *draft_, prompt, config, on_tokens);
#endif
#ifdef SWIFTSPEC_HAS_ASYNC
      if (config.mode == DecodeMode::Async)
        return generate_speculative_async(*target_, *draft_, prompt, config, on_tokens);
#endif
      throw InvalidArgument(std::string("decode mode '") + (config.mode == DecodeMode::Serial ? "serial" : "async") +
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
