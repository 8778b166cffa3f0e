// swiftspec-cuda-long-bench: the CUDA backend at long contexts (issue 27), random weights
// generated on the GPU, against the physical limit measured in the same run.
//
// Per model shape and committed context C (--contexts, default 512,4096,16384,32768):
//   * decode step (layered; and as the decode megakernel with no key limit) at C, CUDA graph
//     replays timed with events (median);
//   * tree verification steps of 16 / 32 / 64 nodes at C;
//   * prefill of a C-token prompt from an empty cache through Model::forward in passes of
//     prefill_chunk_tokens() (the prefill path, and with --no-prefill-path compare the decode
//     steps), wall time to the last token's logits (TTFT of the engine without tokenization);
//   * the decode limit: (weight bytes + K/V bytes of C keys) / copy bandwidth.
// Usage: swiftspec-cuda-long-bench [--shapes qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b] [--contexts 512,4096,...]
//        [--iters N] [--no-megakernel] [--no-prefill] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "copy_bandwidth.h"
#include "json_number.h"
#include "list_flag.h"
#include "model_shapes.h"
#include "swiftspec_cuda/cuda_model.h"

using namespace swiftspec;
using namespace swiftspec::cuda;

namespace {

ForwardBatch decode_at(int pos) {
  ForwardBatch b;
  b.tokens = {1234};
  b.positions = {pos};
  b.logits = LogitsMode::Last;
  return b;
}

/// A tree of n nodes: a main chain with side branches (depth about n / 3), every row's logits.
ForwardBatch tree_at(int n, int ctx, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> parents(n), tokens(n);
  for (int i = 0; i < n; ++i) parents[i] = i == 0 ? -1 : (i % 3 == 0 ? static_cast<int>(g() % i) : i - 1);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(g() % 100000);
  return ForwardBatch::tree(tokens, parents, ctx);
}

struct Row {
  std::string shape;
  int context = 0;
  double limit_ms = 0, decode_ms = 0, mk_ms = -1, tree16_ms = 0, tree32_ms = 0, tree64_ms = 0;
  double prefill_s = -1, prefill_decode_steps_s = -1;
};

/// Wall seconds of a `len`-token prompt from an empty cache to its last token's logits (the
/// passes a Model::prefill would make), median of `reps`.
double prefill_seconds(CudaModel& m, int len, int reps) {
  std::mt19937_64 g(7);
  std::vector<int32_t> toks(len);
  for (auto& t : toks) t = static_cast<int32_t>(g() % 100000);
  const int chunk = m.prefill_chunk_tokens();
  std::vector<double> wall;
  std::vector<float> logits;
  for (int r = 0; r < reps; ++r) {
    m.truncate_committed(0);
    const auto t0 = std::chrono::steady_clock::now();
    for (int at = 0; at < len; at += chunk) {
      const int end = std::min(len, at + chunk);
      std::vector<int32_t> piece(toks.begin() + at, toks.begin() + end);
      std::vector<int32_t> am;
      if (end == len)
        m.forward_argmax(ForwardBatch::append(piece, at, LogitsMode::Last), am);
      else
        m.forward(ForwardBatch::append(piece, at, LogitsMode::None), logits);
    }
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  return wall[wall.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes = "qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b", contexts = "512,4096,16384,32768", json_path;
  int iters = 20;
  bool with_mk = true, with_prefill = true, compare_decode_prefill = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--shapes" && i + 1 < argc)
      shapes = argv[++i];
    else if (a == "--contexts" && i + 1 < argc)
      contexts = argv[++i];
    else if (a == "--iters" && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (a == "--no-megakernel")
      with_mk = false;
    else if (a == "--no-prefill")
      with_prefill = false;
    else if (a == "--no-prefill-path")
      compare_decode_prefill = true;
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  std::vector<int> ctx;
  for (const auto& c : split_list(contexts)) ctx.push_back(std::atoi(c.c_str()));
  const int max_ctx = *std::max_element(ctx.begin(), ctx.end());
  if (iters < 3 || max_ctx < 1) {
    std::fprintf(stderr, "--iters must be >= 3 and contexts positive\n");
    return 2;
  }
  std::vector<Row> rows;
  std::string json = "{\n";
  try {
    cudaDeviceProp prop;
    SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const double bw = copy_bandwidth_tbs(0);
    std::printf("device: %s, %d SMs; copy bandwidth %.3f TB/s\n", prop.name, prop.multiProcessorCount, bw);
    json +=
        "  \"device\": \"" + std::string(prop.name) + "\",\n  \"copy_bandwidth_tbs\": " + num(bw) + ",\n  \"rows\": [";
    for (const auto& shape : split_list(shapes)) {
      const ModelConfig cfg = shape_config(shape);
      ModelOptions opt;
      opt.max_context = max_ctx + 256;
      opt.max_tree = 128;
      const double kv_per_token = 2.0 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2;
      std::vector<Row> shape_rows;
      {
        auto m = make_cuda_model_random(cfg, opt, CudaModelOptions{}, 42);
        const double wbytes = static_cast<double>(m->weight_bytes_per_step());
        for (int c : ctx) {
          Row r;
          r.shape = shape;
          r.context = c;
          r.limit_ms = (wbytes + kv_per_token * (c + 1)) / (bw * 1e12) * 1e3;
          m->debug_fill_committed_random(c, 43);
          r.decode_ms = m->debug_replay_ms(m->debug_prepare(decode_at(c), false), iters);
          r.tree16_ms = m->debug_replay_ms(m->debug_prepare(tree_at(16, c, 5), false), iters);
          r.tree32_ms = m->debug_replay_ms(m->debug_prepare(tree_at(32, c, 6), false), iters);
          r.tree64_ms = m->debug_replay_ms(m->debug_prepare(tree_at(64, c, 7), false), iters);
          if (with_prefill) r.prefill_s = prefill_seconds(*m, c, 3);
          shape_rows.push_back(r);
          std::printf(
              "%-13s C=%6d decode %.4f ms (limit %.4f, %.0f%%) tree16 %.3fx tree32 %.3fx tree64 %.3fx prefill %.1f "
              "tok/s\n",
              shape.c_str(), c, r.decode_ms, r.limit_ms, 100 * r.limit_ms / r.decode_ms, r.tree16_ms / r.decode_ms,
              r.tree32_ms / r.decode_ms, r.tree64_ms / r.decode_ms, r.prefill_s > 0 ? c / r.prefill_s : 0.0);
          std::fflush(stdout);
        }
      }
      if (compare_decode_prefill) {
        CudaModelOptions co;
        co.large_prefill = false;
        auto m = make_cuda_model_random(cfg, opt, co, 42);
        for (auto& r : shape_rows) r.prefill_decode_steps_s = prefill_seconds(*m, r.context, 1);
      }
      if (with_mk) {
        CudaModelOptions co;
        co.megakernel = true;
        co.megakernel_max_keys = 0;  // the megakernel at every context, to compare
        try {
          auto m = make_cuda_model_random(cfg, opt, co, 42);
          for (auto& r : shape_rows) {
            m->debug_fill_committed_random(r.context, 43);
            r.mk_ms = m->debug_replay_ms(m->debug_prepare(decode_at(r.context), false), iters);
          }
        } catch (const std::exception& e) {
          std::printf("%s megakernel: %s\n", shape.c_str(), e.what());
        }
      }
      rows.insert(rows.end(), shape_rows.begin(), shape_rows.end());
    }
  } catch (const std::exception& e) {
    std::printf("long bench aborted: %s\n", e.what());
    return 1;
  }
  std::printf("\n%-13s %6s %9s %9s %6s %8s %8s %8s %8s %8s %10s %10s\n", "shape", "C", "limit_ms", "decode_ms", "%lim",
              "dec/512", "mk_ms", "tree16x", "tree32x", "tree64x", "prefill/s", "pf-steps/s");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    double base = r.decode_ms;
    for (const Row& o : rows)
      if (o.shape == r.shape && o.context == 512) base = o.decode_ms;
    std::printf("%-13s %6d %9.4f %9.4f %5.0f%% %8.3f %8.4f %8.3f %8.3f %8.3f %10.0f %10.0f\n", r.shape.c_str(),
                r.context, r.limit_ms, r.decode_ms, 100 * r.limit_ms / r.decode_ms, base / r.decode_ms, r.mk_ms,
                r.tree16_ms / r.decode_ms, r.tree32_ms / r.decode_ms, r.tree64_ms / r.decode_ms,
                r.prefill_s > 0 ? r.context / r.prefill_s : 0.0,
                r.prefill_decode_steps_s > 0 ? r.context / r.prefill_decode_steps_s : 0.0);
    json += std::string(i ? "," : "") + "\n    {\"shape\": \"" + r.shape + "\", \"context\": " + num(r.context) +
            ", \"limit_ms\": " + num(r.limit_ms) + ", \"decode_ms\": " + num(r.decode_ms) +
            ", \"megakernel_ms\": " + num(r.mk_ms) + ", \"tree16_ms\": " + num(r.tree16_ms) +
            ", \"tree32_ms\": " + num(r.tree32_ms) + ", \"tree64_ms\": " + num(r.tree64_ms) +
            ", \"prefill_s\": " + num(r.prefill_s) + ", \"prefill_decode_steps_s\": " + num(r.prefill_decode_steps_s) +
            "}";
  }
  json += "\n  ]\n}\n";
  if (!json_path.empty()) {
    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
