// swiftspec-decode: the C++ embedding example. Loads a converted checkpoint
// and decodes from token ids without Python.
//
//   swiftspec-decode --checkpoint DIR --tokens 151644,872,198 [--max-new-tokens 32]
//                    [--draft DIR --mode target|serial|async] [--temperature T --top-k K --top-p P --seed S]
//                    [--threads N] [--backend cpu|cuda]
// Prints the new token ids, space-separated, on one line; statistics on stderr.
// Exit code 2 on bad arguments or bad input, with a message naming it.
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "swiftspec/checkpoint.h"
#include "swiftspec/engine.h"
#include "swiftspec/error.h"
#include "swiftspec/model.h"

namespace {

const char* const kUsage =
    "usage: swiftspec-decode --checkpoint DIR --tokens ID,ID,... [--max-new-tokens N]\n"
    "       [--draft DIR] [--mode target|serial|async] [--temperature T] [--top-k K] [--top-p P]\n"
    "       [--seed S] [--threads N] [--backend cpu|cuda]\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "swiftspec-decode: " << msg << "\n" << kUsage;
  std::exit(2);
}

// The integer `v` given to option `opt`, in [lo, hi]: anything else (a fraction, an exponent, trailing
// text, a value past the range) is a usage error naming it. Integers were read as doubles and cast,
// so "--max-new-tokens 2.7" decoded 2 tokens, "--seed -1" or "--seed 1.5" decoded with another seed,
// and "--max-new-tokens 1e20" was refused as "got -2147483648".
long long parse_integer(const std::string& opt, const std::string& v, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || std::isspace(static_cast<unsigned char>(v[0])) || end == v.c_str() || *end)
    usage_error(opt + ": '" + v + "' is not an integer");
  if (errno == ERANGE || x < lo || x > hi)
    usage_error(opt + ": " + v + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

uint64_t parse_seed(const std::string& v) {
  errno = 0;
  char* end = nullptr;
  if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0])))  // strtoull takes "-1" as 2^64 - 1
    usage_error("--seed: '" + v + "' is not an integer >= 0");
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (*end) usage_error("--seed: '" + v + "' is not an integer >= 0");
  if (errno == ERANGE) usage_error("--seed: " + v + " is out of range [0, 18446744073709551615]");
  return x;
}

// Token ids as int32 (an id past the range was wrapped: 4294967297 decoded as token 1); the engine
// checks them against the vocabulary.
std::vector<int32_t> parse_ids(const std::string& s) {
  if (s.empty()) usage_error("--tokens: the prompt is empty; give at least one token id");
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (true) {
    const size_t comma = s.find(',', begin);
    const std::string item = s.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || std::isspace(static_cast<unsigned char>(item[0])) || end == item.c_str() || *end)
      usage_error("--tokens: '" + item + "' is not an integer token id");
    if (errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
      usage_error("--tokens: " + item + " is out of the range of token ids");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint, draft, backend = "cpu", mode = "target";
  std::vector<int32_t> prompt;
  swiftspec::GenerationConfig cfg;
  cfg.max_new_tokens = 32;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << "Decodes from token ids with a swiftspec checkpoint (the C++ embedding example).\n" << kUsage;
      return 0;
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto number = [&](const std::string& v) -> double {
      char* end = nullptr;
      double d = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end) usage_error(a + ": '" + v + "' is not a number");
      return d;
    };
    if (a == "--checkpoint")
      checkpoint = value();
    else if (a == "--draft")
      draft = value();
    else if (a == "--tokens")
      prompt = parse_ids(value());
    else if (a == "--max-new-tokens")
      cfg.max_new_tokens = static_cast<int>(parse_integer(a, value(), INT_MIN, INT_MAX));
    else if (a == "--temperature")
      cfg.sampling.temperature = static_cast<float>(number(value()));
    else if (a == "--top-k")
      cfg.sampling.top_k = static_cast<int>(parse_integer(a, value(), INT_MIN, INT_MAX));
    else if (a == "--top-p")
      cfg.sampling.top_p = static_cast<float>(number(value()));
    else if (a == "--seed")
      cfg.sampling.seed = parse_seed(value());
    else if (a == "--threads")
      threads = static_cast<int>(parse_integer(a, value(), INT_MIN, INT_MAX));
    else if (a == "--backend")
      backend = value();
    else if (a == "--mode")
      mode = value();
    else
      usage_error("unknown argument '" + a + "'");
  }
  if (checkpoint.empty()) usage_error("--checkpoint is required");
  if (prompt.empty()) usage_error("--tokens is required");
  if (mode == "target")
    cfg.mode = swiftspec::DecodeMode::TargetOnly;
  else if (mode == "serial")
    cfg.mode = swiftspec::DecodeMode::Serial;
  else if (mode == "async")
    cfg.mode = swiftspec::DecodeMode::Async;
  else
    usage_error("--mode must be target, serial or async");

  try {
    swiftspec::ModelOptions opts;
    opts.num_threads = threads;
    auto ckpt = swiftspec::Checkpoint::open(checkpoint);
    cfg.stop_token_ids = ckpt->config().eos_token_ids;
    std::shared_ptr<swiftspec::Model> target = swiftspec::load_model(ckpt, backend, opts);
    std::shared_ptr<swiftspec::Model> draft_model;
    if (!draft.empty()) draft_model = swiftspec::load_model(swiftspec::Checkpoint::open(draft), backend, opts);
    swiftspec::Engine engine(target, draft_model);
    auto result = engine.generate(prompt, cfg);
    for (size_t i = 0; i < result.tokens.size(); ++i) std::cout << (i ? " " : "") << result.tokens[i];
    std::cout << "\n";
    const auto& s = result.stats;
    std::fprintf(stderr,
                 "prompt_tokens=%d new_tokens=%d finish=%s ttft=%.3fs decode=%.3fs tok/s=%.2f "
                 "acceptance_length=%.2f\n",
                 s.prompt_tokens, s.new_tokens, s.finish_reason.c_str(), s.prefill_time, s.decode_time,
                 s.decode_time > 0 ? (s.new_tokens - 1) / s.decode_time : 0.0, s.acceptance_length());
  } catch (const swiftspec::Error& e) {
    std::cerr << "swiftspec-decode: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
