// Real models and prompts for the C++ tests.
//
// Checkpoint folders come from the environment (pytest sets them from its
// fixtures; tools/run_tsan.sh from the user cache):
//   SWIFTSPEC_TEST_TARGET  target checkpoint (default: the 1.5B Qwen2.5-Coder, bf16, in the cache)
//   SWIFTSPEC_TEST_DRAFT   draft checkpoint  (default: the 0.5B Qwen2.5-Coder, bf16, in the cache)
// A missing folder fails the test that needs it (CheckpointError names it).
#pragma once
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "swiftspec/checkpoint.h"
#include "swiftspec/model.h"

namespace swiftspec::test {

inline std::string cache_checkpoint(const std::string& name) {
  std::string root;
  if (const char* c = std::getenv("SWIFTSPEC_CACHE"))
    root = c;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"))
    root = std::string(x) + "/swiftspec";
  else
    root = std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/swiftspec";
  return root + "/checkpoints/" + name;
}

inline std::string target_dir() {
  const char* e = std::getenv("SWIFTSPEC_TEST_TARGET");
  return e ? e : cache_checkpoint("qwen2.5-coder-1.5b-instruct-bfloat16");
}
inline std::string draft_dir() {
  const char* e = std::getenv("SWIFTSPEC_TEST_DRAFT");
  return e ? e : cache_checkpoint("qwen2.5-coder-0.5b-instruct-bfloat16");
}
/// The smallest real model, for stress tests (SWIFTSPEC_TEST_SMALL; default SmolLM2-135M bf16).
inline std::string small_dir() {
  const char* e = std::getenv("SWIFTSPEC_TEST_SMALL");
  return e ? e : cache_checkpoint("smollm2-135m-instruct-bfloat16");
}
/// An integer from the environment, or `fallback`.
inline int env_int(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e ? std::atoi(e) : fallback;
}

/// A CPU model over `dir` with `threads` threads pinned to `cores` (may be empty).
inline std::shared_ptr<Model> load_cpu(const std::string& dir, int threads = 1, std::vector<int> cores = {},
                                       int max_context = 1024, int max_tree = 128) {
  ModelOptions o;
  o.max_context = max_context;
  o.max_tree = max_tree;
  o.num_threads = threads;
  o.cpu_affinity = std::move(cores);
  return std::shared_ptr<Model>(load_model(Checkpoint::open(dir), "cpu", o));
}

/// Real chat prompts, tokenized with the models' tokenizer and chat template
/// (Qwen2.5: default system prompt, user turn, assistant header):
///   0: "Write a Python function that checks whether a number is prime."
///   1: "Explain what a hash map is in two sentences."
inline const std::vector<std::vector<int32_t>>& prompts() {
  static const std::vector<std::vector<int32_t>> p = {
      {151644, 8948,  198,   2610,  525,  1207,   16948, 11,     3465,   553, 54364,  14817, 13,    1446,
       525,    264,   10950, 17847, 13,   151645, 198,   151644, 872,    198, 7985,   264,   13027, 729,
       429,    12341, 3425,  264,   1372, 374,    10250, 13,     151645, 198, 151644, 77091, 198},
      {151644, 8948, 198,   2610,  525,  1207,   16948, 11,     3465, 553,    54364, 14817, 13,   1446,
       525,    264,  10950, 17847, 13,   151645, 198,   151644, 872,  198,    840,   20772, 1128, 264,
       5175,   2415, 374,   304,   1378, 22870,  13,    151645, 198,  151644, 77091, 198},
  };
  return p;
}

/// A real chat prompt for SmolLM2 (its tokenizer and chat template):
/// "Write a Python function that checks whether a number is prime."
inline const std::vector<int32_t>& small_prompt() {
  static const std::vector<int32_t> p = {1,    9690,  198,   2683, 359,  253,  5356,  5646,  11173, 3365, 3511,
                                         308,  34519, 28,    7018, 411,  407,  19712, 8182,  2,     198,  1,
                                         4093, 198,   19161, 253,  5905, 1517, 338,   11139, 1991,  253,  1230,
                                         314,  9552,  30,    2,    198,  1,    520,   9531,  198};
  return p;
}

}  // namespace swiftspec::test
