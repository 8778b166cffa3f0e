// Parallel tree generation (async_engine.h) against target-only decoding with
// the real models: exact greedy output, limits, cancellation, errors, reuse.
#include <algorithm>
#include <atomic>
#include <map>
#include <tuple>
#include <stdexcept>

#include "backend/cpu/tp_model.h"
#include "swiftspec/async_engine.h"
#include "swiftspec/engine.h"
#include "swiftspec/error.h"
#include "test_framework.h"
#include "test_models.h"

namespace swiftspec::test {
namespace {

struct Pair {
  std::shared_ptr<Model> target, draft;
  std::unique_ptr<Engine> engine;
};

// Draft on core 0, target on core 1 (the CI machine has two cores).
Pair& pair() {
  static Pair p = [] {
    Pair q;
    q.target = load_cpu(target_dir(), 1, {1});
    q.draft = load_cpu(draft_dir(), 1, {0});
    q.engine = std::make_unique<Engine>(q.target, q.draft);
    return q;
  }();
  return p;
}

GenerationConfig greedy(int new_tokens, DecodeMode mode, int budget = 16, int depth = 6, int branching = 2) {
  GenerationConfig c;
  c.max_new_tokens = new_tokens;
  c.mode = mode;
  c.tree_budget = budget;
  c.max_depth = depth;
  c.branching = branching;
  return c;
}

const std::vector<int32_t>& reference(int prompt, int new_tokens) {
  static std::map<std::pair<int, int>, std::vector<int32_t>> cache;
  auto key = std::make_pair(prompt, new_tokens);
  if (!cache.count(key))
    cache[key] = pair().engine->generate(prompts()[prompt], greedy(new_tokens, DecodeMode::TargetOnly)).tokens;
  return cache[key];
}

}  // namespace

SWIFTSPEC_TEST(async_greedy_equals_target_only) {
  const int n = 40;
  for (int p = 0; p < 2; ++p) {
    const auto& ref = reference(p, n);
    for (auto [budget, depth, branching] : {std::tuple{6, 6, 1}, std::tuple{16, 6, 2}, std::tuple{32, 8, 3}}) {
      AsyncReport rep;
      GenerationConfig cfg = greedy(n, DecodeMode::Async, budget, depth, branching);
      GenerationResult r =
          generate_speculative_async(*pair().target, *pair().draft, prompts()[p], cfg, nullptr, AsyncOptions{}, &rep);
      CHECK(r.tokens == ref);
      CHECK_EQ(r.stats.finish_reason, std::string("length"));
      CHECK_EQ(r.stats.new_tokens, n);
      CHECK(r.stats.verification_steps >= 1);
      CHECK(r.stats.verification_steps < n);  // speculation accepted something
      CHECK_EQ(static_cast<int>(rep.speculation.accepted_per_step.size()), r.stats.verification_steps);
      const TimelineSummary s = rep.timeline.summary();
      CHECK_EQ(s.rounds, r.stats.verification_steps);
      CHECK(s.target_verify > 0);
    }
  }
}

SWIFTSPEC_TEST(async_engine_dispatch_and_stop_token) {
  const auto& ref = reference(0, 32);
  // Through Engine::generate (DecodeMode::Async).
  GenerationResult r = pair().engine->generate(prompts()[0], greedy(32, DecodeMode::Async));
  CHECK(r.tokens == ref);
  // A stop token cuts right after its first occurrence.
  for (int k : {0, 3, 11}) {
    GenerationConfig cfg = greedy(32, DecodeMode::Async);
    cfg.stop_token_ids = {ref[k]};
    const size_t first = std::find(ref.begin(), ref.end(), ref[k]) - ref.begin();
    GenerationResult s = pair().engine->generate(prompts()[0], cfg);
    CHECK(s.tokens == std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
    CHECK_EQ(s.stats.finish_reason, std::string("stop"));
  }
}

SWIFTSPEC_TEST(async_max_tokens) {
  const auto& ref = reference(1, 32);
  for (int n : {1, 2, 3, 7, 13}) {
    GenerationResult r = pair().engine->generate(prompts()[1], greedy(n, DecodeMode::Async));
    CHECK(r.tokens == std::vector<int32_t>(ref.begin(), ref.begin() + n));
    CHECK_EQ(r.stats.finish_reason, std::string("length"));
  }
}

SWIFTSPEC_TEST(async_cancel_at_every_token) {
  const auto& ref = reference(0, 24);
  for (int stop_at = 1; stop_at <= 24; stop_at += 5) {
    int seen = 0, calls_after_cancel = 0;
    bool cancelled = false;
    GenerationResult r =
        pair().engine->generate(prompts()[0], greedy(24, DecodeMode::Async), [&](const std::vector<int32_t>& toks) {
          if (cancelled) ++calls_after_cancel;
          seen += static_cast<int>(toks.size());
          cancelled = seen >= stop_at;
          return !cancelled;
        });
    CHECK_EQ(calls_after_cancel, 0);
    CHECK_EQ(static_cast<int>(r.tokens.size()), seen);
    CHECK(r.tokens == std::vector<int32_t>(ref.begin(), ref.begin() + seen));
    if (seen < 24) CHECK_EQ(r.stats.finish_reason, std::string("cancelled"));
  }
  // The engine is ready for the next request.
  CHECK(pair().engine->generate(prompts()[0], greedy(24, DecodeMode::Async)).tokens == ref);
}

SWIFTSPEC_TEST(async_callback_exception_propagates) {
  int calls = 0;
  bool threw = false;
  try {
    pair().engine->generate(prompts()[1], greedy(16, DecodeMode::Async), [&](const std::vector<int32_t>&) -> bool {
      if (++calls == 2) throw std::runtime_error("callback failed");
      return true;
    });
  } catch (const std::runtime_error& e) {
    threw = std::string(e.what()) == "callback failed";
  }
  CHECK(threw);
  CHECK(pair().engine->generate(prompts()[1], greedy(16, DecodeMode::Async)).tokens ==
        std::vector<int32_t>(reference(1, 32).begin(), reference(1, 32).begin() + 16));
}

SWIFTSPEC_TEST(async_rejects_bad_options) {
  GenerationConfig cfg = greedy(8, DecodeMode::Async);
  AsyncOptions o;
  o.min_send_nodes = 0;
  CHECK_THROWS(generate_speculative_async(*pair().target, *pair().draft, prompts()[0], cfg, nullptr, o, nullptr),
               InvalidArgument);
  o = AsyncOptions{};
  o.speculative.growth = SpeculativeOptions::Growth::Sampled;
  CHECK_THROWS(generate_speculative_async(*pair().target, *pair().draft, prompts()[0], cfg, nullptr, o, nullptr),
               InvalidArgument);
  cfg.tree_budget = 1000;  // more than the models' tree KV
  CHECK_THROWS(pair().engine->generate(prompts()[0], cfg), InvalidArgument);
}

SWIFTSPEC_TEST(async_sampling_equals_target_only_sampling) {
  // Top-k growth + target-sampling verification: one categorical draw per
  // emitted token, as target-only sampling — the same tokens for a seed.
  for (uint64_t seed : {1u, 7u}) {
    GenerationConfig cfg = greedy(24, DecodeMode::TargetOnly);
    cfg.sampling.temperature = 0.8f;
    cfg.sampling.top_p = 0.95f;
    cfg.sampling.seed = seed;
    const auto ref = pair().engine->generate(prompts()[1], cfg).tokens;
    cfg.mode = DecodeMode::Async;
    CHECK(pair().engine->generate(prompts()[1], cfg).tokens == ref);
  }
}

}  // namespace swiftspec::test

namespace swiftspec::test {

// Many short requests through every way a request ends, with a
// tensor-parallel target (2 ranks: worker-group threads, communicator) and a
// plain draft: the ThreadSanitizer stress target of tools/run_tsan.sh.
// SWIFTSPEC_TEST_STRESS_REQUESTS sets the count (default 40).
SWIFTSPEC_TEST(async_engine_stress) {
  TpCpuOptions tp;
  tp.tp = 2;
  ModelOptions o;
  o.max_context = 256;
  o.max_tree = 32;
  o.num_threads = 1;
  auto target = std::shared_ptr<Model>(make_tp_cpu_model(Checkpoint::open(small_dir()), o, tp));
  auto draft = load_cpu(small_dir(), 1, {}, 256, 32);
  Engine engine(target, draft);
  const auto& prompt = small_prompt();
  GenerationConfig cfg = greedy(8, DecodeMode::TargetOnly, 6, 3, 2);
  const auto ref = engine.generate(prompt, cfg).tokens;
  cfg.mode = DecodeMode::Async;
  const int n = env_int("SWIFTSPEC_TEST_STRESS_REQUESTS", 40);
  for (int i = 0; i < n; ++i) {
    GenerationConfig c = cfg;
    c.max_new_tokens = 1 + i % 8;
    switch (i % 4) {
      case 0: {  // limits
        GenerationResult r = engine.generate(prompt, c);
        CHECK(r.tokens == std::vector<int32_t>(ref.begin(), ref.begin() + c.max_new_tokens));
        break;
      }
      case 1: {  // a stop token
        c.max_new_tokens = 8;
        c.stop_token_ids = {ref[i % 5]};
        GenerationResult r = engine.generate(prompt, c);
        const size_t cut = std::find(ref.begin(), ref.end(), ref[i % 5]) - ref.begin() + 1;
        CHECK(r.tokens == std::vector<int32_t>(ref.begin(), ref.begin() + cut));
        break;
      }
      case 2: {  // cancellation after k tokens
        const int k = 1 + i % 6;
        int seen = 0;
        GenerationResult r = engine.generate(prompt, c, [&](const std::vector<int32_t>& t) {
          seen += static_cast<int>(t.size());
          return seen < k;
        });
        CHECK(r.tokens == std::vector<int32_t>(ref.begin(), ref.begin() + r.tokens.size()));
        break;
      }
      default: {  // the callback throws
        bool threw = false;
        try {
          engine.generate(prompt, c, [](const std::vector<int32_t>&) -> bool { throw std::runtime_error("x"); });
        } catch (const std::runtime_error&) {
          threw = true;
        }
        CHECK(threw);
      }
    }
  }
}

}  // namespace swiftspec::test
