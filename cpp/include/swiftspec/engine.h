// The engine: owns a target model and optionally a draft model, and decodes
// requests one at a time (the product is single-request, latency-first).
//
// Embedding from C++ (no Python needed):
//   auto ckpt   = swiftspec::Checkpoint::open("/path/to/checkpoint");
//   auto target = swiftspec::load_model(ckpt, "cpu", {});
//   swiftspec::Engine engine(std::move(target));
//   swiftspec::GenerationConfig cfg;  cfg.max_new_tokens = 64;
//   auto result = engine.generate(prompt_ids, cfg);
#pragma once
#include <memory>
#include <vector>

#include "swiftspec/generation.h"
#include "swiftspec/model.h"

namespace swiftspec {

class Engine {
 public:
  /// `draft` may be null (then only DecodeMode::TargetOnly is available).
  /// Throws InvalidArgument if the models' vocabularies differ. The engine
  /// shares the models; do not run them elsewhere while a request runs.
  explicit Engine(std::shared_ptr<Model> target, std::shared_ptr<Model> draft = nullptr);
  ~Engine();

  Model& target() { return *target_; }
  Model* draft() { return draft_.get(); }

  /// Decodes `prompt` (token ids, non-empty, each < vocab) under `config`.
  /// Each call starts from an empty KV cache. `on_tokens`, when given, is
  /// called with newly final tokens and may cancel; config.cancel_requested,
  /// when set, is polled between prefill chunks (config.prefill_chunk) and
  /// decode steps and may cancel too, also before the first token (the result
  /// then has no tokens, finish_reason "cancelled"). Throws InvalidArgument for
  /// an empty prompt, out-of-range ids, a prompt plus max_new_tokens longer
  /// than the context, invalid sampling/tree parameters, or a speculative
  /// mode without a draft model. The engine is ready for the next request
  /// after any return or throw.
  GenerationResult generate(const std::vector<int32_t>& prompt, const GenerationConfig& config,
                            const TokenCallback& on_tokens = nullptr);

 private:
  GenerationResult generate_target_only(const std::vector<int32_t>& prompt,
                                        const GenerationConfig& config,
                                        const TokenCallback& on_tokens);
  std::shared_ptr<Model> target_;
  std::shared_ptr<Model> draft_;
};

}  // namespace swiftspec
