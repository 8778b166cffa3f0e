// swiftspec-decode: the C++ embedding example. Loads a converted checkpoint
// and decodes from token ids without Python.
//
//   swiftspec-decode --checkpoint DIR --tokens 151644,872,198 [--max-new-tokens 32]
//                    [--draft DIR --mode target|serial|async] [--temperature T --top-k K --top-p P --seed S]
//                    [--threads N] [--backend cpu|cuda]
// Prints the new token ids, space-separated, on one line; statistics on stderr.
// Exit code 2 on bad arguments or bad input, with a message naming it.
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

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      usage_error("--tokens: '" + item + "' is not an integer token id");
    }
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
    if (a == "--checkpoint") checkpoint = value();
    else if (a == "--draft") draft = value();
    else if (a == "--tokens") prompt = parse_ids(value());
    else if (a == "--max-new-tokens") cfg.max_new_tokens = static_cast<int>(number(value()));
    else if (a == "--temperature") cfg.sampling.temperature = static_cast<float>(number(value()));
    else if (a == "--top-k") cfg.sampling.top_k = static_cast<int>(number(value()));
    else if (a == "--top-p") cfg.sampling.top_p = static_cast<float>(number(value()));
    else if (a == "--seed") cfg.sampling.seed = static_cast<uint64_t>(number(value()));
    else if (a == "--threads") threads = static_cast<int>(number(value()));
    else if (a == "--backend") backend = value();
    else if (a == "--mode") mode = value();
    else usage_error("unknown argument '" + a + "'");
  }
  if (checkpoint.empty()) usage_error("--checkpoint is required");
  if (prompt.empty()) usage_error("--tokens is required");
  if (mode == "target") cfg.mode = swiftspec::DecodeMode::TargetOnly;
  else if (mode == "serial") cfg.mode = swiftspec::DecodeMode::Serial;
  else if (mode == "async") cfg.mode = swiftspec::DecodeMode::Async;
  else usage_error("--mode must be target, serial or async");

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
