// swiftspec-cuda-green-bench: one-GPU disaggregation of a draft and a target
// model through CUDA green contexts (SwiftSpec ASPLOS'26 §4; issue #5), with
// random weights generated on the GPU (no files). Shapes: Qwen2.5-0.5B draft,
// Qwen2.5-1.5B target, context 512.
//
// For each split "draft on logical SMs [0, N), target on [N, end)":
//   1. isolation: the physical SM ids (%smid) each model's stream reaches,
//      and whether the two sets are disjoint;
//   2. exactness: logits of a 16-node tree on the partitioned models equal,
//      bit for bit, those of whole-GPU models with the same weights (the GEMM
//      arithmetic does not depend on the grid; model.h exactness contract);
//   3. latency alone: target decode step and 16-node tree verification, draft
//      decode step (CUDA graph replays, median of device times);
//   4. interference: the same target timings while a second thread keeps the
//      draft decoding on its own stream, with plain streams (both models on
//      all SMs; also with the target's stream at the highest priority) and
//      with each green-context split.
// Prints a table last; --json PATH writes every number.
// Usage: swiftspec-cuda-green-bench [--json PATH] [--splits 8,16,32] [--quick]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "green_context.h"
#include "swiftspec_cuda/cuda_model.h"
#include "json_number.h"

using namespace swiftspec;
using namespace swiftspec::cuda;

namespace {

constexpr int kContext = 512;

ModelConfig qwen_shape(bool target) {
  ModelConfig c;
  c.architecture = "qwen2";
  c.vocab_size = 151936;
  c.rope_theta = 1000000.0;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  c.num_kv_heads = 2;
  if (target) {  // Qwen2.5-1.5B
    c.hidden_size = 1536;
    c.intermediate_size = 8960;
    c.num_layers = 28;
    c.num_heads = 12;
    c.head_dim = 128;
  } else {  // Qwen2.5-0.5B
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_layers = 24;
    c.num_heads = 14;
    c.head_dim = 64;
  }
  return c;
}

ForwardBatch decode_batch() {
  ForwardBatch b;
  b.tokens = {1234};
  b.positions = {kContext};
  b.logits = LogitsMode::Last;
  return b;
}

/// A 16-node binary-ish tree under the context (node i's parent: (i-1)/2).
ForwardBatch tree16() {
  std::vector<int32_t> tokens, parents;
  for (int i = 0; i < 16; ++i) {
    tokens.push_back(1000 + 37 * i);
    parents.push_back(i == 0 ? -1 : (i - 1) / 2);
  }
  return ForwardBatch::tree(tokens, parents, kContext);
}

std::unique_ptr<CudaModel> make(bool target, int sm_first, int sm_count, int priority = 0) {
  ModelOptions opt;
  opt.max_context = 1024;
  opt.max_tree = 64;
  CudaModelOptions co;
  co.sm_first = sm_first;
  co.sm_count = sm_count;
  co.stream_priority = priority;
  auto m = make_cuda_model_random(qwen_shape(target), opt, co, target ? 1501 : 501);
  m->debug_fill_committed_random(kContext, target ? 77 : 55);
  return m;
}

std::string ints(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

struct Pair {
  std::unique_ptr<CudaModel> draft, target;
  int d_decode = -1, t_decode = -1, t_tree = -1;
  void prepare() {
    d_decode = draft->debug_prepare(decode_batch(), false);
    t_decode = target->debug_prepare(decode_batch(), false);
    t_tree = target->debug_prepare(tree16(), false);
  }
};

struct Timing {
  double t_decode = 0, t_tree = 0, d_decode = 0;          // alone
  double t_decode_busy = 0, t_tree_busy = 0, d_busy = 0;  // with the draft decoding concurrently
};

/// Target timings while a second thread keeps the draft busy; the draft's
/// median step time while the target was being timed.
void time_pair(Pair& p, int iters, Timing& t) {
  t.d_decode = p.draft->debug_replay_ms(p.d_decode, iters);
  t.t_decode = p.target->debug_replay_ms(p.t_decode, iters);
  t.t_tree = p.target->debug_replay_ms(p.t_tree, iters);
  std::atomic<bool> stop{false}, started{false};
  std::vector<double> draft_ms;
  std::string err;
  std::thread th([&] {
    try {
      while (!stop.load()) {
        draft_ms.push_back(p.draft->debug_replay_ms(p.d_decode, 20));
        started.store(true);
      }
    } catch (const std::exception& e) {
      err = e.what();
      started.store(true);
    }
  });
  while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  t.t_decode_busy = p.target->debug_replay_ms(p.t_decode, iters);
  t.t_tree_busy = p.target->debug_replay_ms(p.t_tree, iters);
  stop.store(true);
  th.join();
  if (!err.empty()) throw CudaError("draft thread: " + err);
  std::sort(draft_ms.begin(), draft_ms.end());
  t.d_busy = draft_ms.empty() ? 0 : draft_ms[draft_ms.size() / 2];
}

bool same_logits(CudaModel& a, CudaModel& b) {
  std::vector<float> la, lb;
  const int ca = a.committed_len(), cb = b.committed_len();
  a.forward(tree16(), la);
  b.forward(tree16(), lb);
  a.truncate_committed(ca);
  b.truncate_committed(cb);
  return la.size() == lb.size() && std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::vector<int> splits = {8, 16, 24, 32, 48, 64};
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--quick")
      quick = true;
    else if (a == "--splits" && i + 1 < argc) {
      splits.clear();
      std::stringstream ss(argv[++i]);
      std::string tok;
      while (std::getline(ss, tok, ',')) splits.push_back(std::stoi(tok));
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--splits 8,16,32] [--quick]\n", argv[0]);
      return 2;
    }
  }
  const int iters = quick ? 50 : 200;
  std::string json = "{\n";
  int status = 0;
  try {
    cudaDeviceProp prop;
    SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const SmSplitInfo& info = sm_split_info(0);
    std::printf("device: %s, %d SMs; green-context split: minSmPartitionSize %d, smCoscheduledAlignment %d\n",
                prop.name, prop.multiProcessorCount, info.min_partition, info.coscheduled_alignment);
    std::printf("groups (SMs each, split order%s): %s\nboundaries: %s\n", info.has_remainder ? ", remainder last" : "",
                ints(info.group_sms).c_str(), ints(info.boundaries).c_str());
    std::fflush(stdout);
    json += "  \"device\": \"" + std::string(prop.name) + "\",\n  \"device_sms\": " + num(info.device_sms) +
            ",\n  \"min_partition\": " + num(info.min_partition) +
            ",\n  \"coscheduled_alignment\": " + num(info.coscheduled_alignment) +
            ",\n  \"group_sms\": " + ints(info.group_sms) + ",\n  \"boundaries\": " + ints(info.boundaries) +
            ",\n  \"iters\": " + num(iters) + ",\n  \"runs\": [";

    // Whole-GPU pair: references for exactness, and the plain-streams interference run.
    Pair full;
    full.draft = make(false, 0, 0);
    full.target = make(true, 0, 0);
    full.prepare();
    Timing tf;
    time_pair(full, iters, tf);
    const int probe_ctas = 8 * prop.multiProcessorCount;
    const auto full_ids = full.target->debug_probe_sm_ids(probe_ctas);
    std::printf(
        "plain streams: target reaches %zu SMs; target decode %.4f ms (%.4f with draft busy), tree16 %.4f "
        "(%.4f), draft decode %.4f (%.4f busy)\n",
        full_ids.size(), tf.t_decode, tf.t_decode_busy, tf.t_tree, tf.t_tree_busy, tf.d_decode, tf.d_busy);
    std::printf("target GEMM plans, whole GPU:\n%s", full.target->debug_gemm_plans().c_str());
    std::fflush(stdout);
    auto run_json = [](const std::string& name, int dsm, int tsm, const Timing& t, size_t d_ids, size_t t_ids,
                       bool disjoint, int exact) {
      return "\n    {\"name\": \"" + name + "\", \"draft_sms\": " + num(dsm) + ", \"target_sms\": " + num(tsm) +
             ", \"draft_sm_ids\": " + num(static_cast<double>(d_ids)) +
             ", \"target_sm_ids\": " + num(static_cast<double>(t_ids)) +
             ", \"disjoint\": " + (disjoint ? "true" : "false") + ", \"bitwise_equal_logits\": " +
             (exact < 0 ? "null"
              : exact   ? "true"
                        : "false") +
             ", \"target_decode_ms\": " + num(t.t_decode) + ", \"target_tree16_ms\": " + num(t.t_tree) +
             ", \"draft_decode_ms\": " + num(t.d_decode) + ", \"target_decode_busy_ms\": " + num(t.t_decode_busy) +
             ", \"target_tree16_busy_ms\": " + num(t.t_tree_busy) + ", \"draft_decode_busy_ms\": " + num(t.d_busy) +
             "}";
    };
    json += run_json("plain", prop.multiProcessorCount, prop.multiProcessorCount, tf, full_ids.size(), full_ids.size(),
                     false, -1);
    // Plain streams, the target's at the highest priority: the block scheduler starts its
    // pending CTAs first (no SM partition, no preemption).
    Timing tp;
    {
      int least = 0, greatest = 0;
      SS_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      Pair prio;
      prio.draft = make(false, 0, 0);
      prio.target = make(true, 0, 0, greatest);
      prio.prepare();
      time_pair(prio, iters, tp);
      std::printf(
          "plain streams, target stream priority %d: target decode %.4f ms (%.4f with draft busy), tree16 "
          "%.4f (%.4f), draft decode %.4f (%.4f busy)\n",
          greatest, tp.t_decode, tp.t_decode_busy, tp.t_tree, tp.t_tree_busy, tp.d_decode, tp.d_busy);
      std::fflush(stdout);
      json += "," + run_json("plain_target_priority", prop.multiProcessorCount, prop.multiProcessorCount, tp,
                             full_ids.size(), full_ids.size(), false, -1);
    }
    struct Row {
      int n;
      int dsm, tsm;
      size_t d_ids, t_ids;
      bool disjoint;
      bool exact;
      Timing t;
    };
    std::vector<Row> rows;
    for (int n : splits) {
      Row r{};
      r.n = n;
      try {
        Pair p;
        p.draft = make(false, 0, n);
        p.target = make(true, n, 0);
        p.prepare();
        r.dsm = p.draft->num_sms();
        r.tsm = p.target->num_sms();
        const auto d_ids = p.draft->debug_probe_sm_ids(probe_ctas);
        const auto t_ids = p.target->debug_probe_sm_ids(probe_ctas);
        std::vector<int> both;
        std::set_intersection(d_ids.begin(), d_ids.end(), t_ids.begin(), t_ids.end(), std::back_inserter(both));
        r.d_ids = d_ids.size();
        r.t_ids = t_ids.size();
        r.disjoint = both.empty();
        r.exact = same_logits(*p.draft, *full.draft) && same_logits(*p.target, *full.target);
        time_pair(p, iters, r.t);
        std::printf(
            "split draft [0, %d) (%d SMs, reaches %zu) / target [%d, end) (%d SMs, reaches %zu): "
            "disjoint %s, logits bitwise equal %s; target decode %.4f ms (%.4f busy), tree16 %.4f (%.4f), "
            "draft decode %.4f (%.4f busy)\n",
            n, r.dsm, r.d_ids, n, r.tsm, r.t_ids, r.disjoint ? "yes" : "NO", r.exact ? "yes" : "NO", r.t.t_decode,
            r.t.t_decode_busy, r.t.t_tree, r.t.t_tree_busy, r.t.d_decode, r.t.d_busy);
        if (n == splits.front())
          std::printf("target GEMM plans on %d SMs:\n%s", r.tsm, p.target->debug_gemm_plans().c_str());
        if (n == splits.front())
          std::printf("draft GEMM plans on %d SMs:\n%s", r.dsm, p.draft->debug_gemm_plans().c_str());
        std::fflush(stdout);
        if (!r.disjoint || !r.exact) status = 1;
        json += "," + run_json("green_" + std::to_string(n), r.dsm, r.tsm, r.t, r.d_ids, r.t_ids, r.disjoint, r.exact);
        rows.push_back(r);
      } catch (const std::exception& e) {
        std::printf("split %d: %s\n", n, e.what());
        std::fflush(stdout);
        json += ",\n    {\"name\": \"green_" + std::to_string(n) + "\", \"error\": \"" + e.what() + "\"}";
        status = 1;
      }
    }
    // Out-of-range and off-granularity partitions are refused with a message.
    for (auto [f, c] : std::vector<std::pair<int, int>>{{0, 4}, {0, info.device_sms + 8}}) {
      try {
        make(false, f, c);
        std::printf("partition [%d, %d]: accepted (unexpected)\n", f, c);
        status = 1;
      } catch (const InvalidArgument& e) {
        std::printf("partition [%d, %d] refused: %s\n", f, c, e.what());
      }
    }
    json += "\n  ]\n}\n";
    std::printf("\n%-8s %5s %5s %8s %10s %10s %10s %10s %10s %10s %6s %6s\n", "run", "dSMs", "tSMs", "disjoint",
                "t_dec", "t_dec+d", "t_tree16", "t_tree+d", "d_dec", "d_dec+t", "exact", "slow%");
    std::printf("%-8s %5d %5d %8s %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %6s %5.1f%%\n", "plain",
                prop.multiProcessorCount, prop.multiProcessorCount, "-", tf.t_decode, tf.t_decode_busy, tf.t_tree,
                tf.t_tree_busy, tf.d_decode, tf.d_busy, "-", 100.0 * (tf.t_tree_busy / tf.t_tree - 1));
    std::printf("%-8s %5d %5d %8s %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %6s %5.1f%%\n", "prio",
                prop.multiProcessorCount, prop.multiProcessorCount, "-", tp.t_decode, tp.t_decode_busy, tp.t_tree,
                tp.t_tree_busy, tp.d_decode, tp.d_busy, "-", 100.0 * (tp.t_tree_busy / tp.t_tree - 1));
    for (const Row& r : rows)
      std::printf("green%-3d %5d %5d %8s %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %6s %5.1f%%\n", r.n, r.dsm, r.tsm,
                  r.disjoint ? "yes" : "NO", r.t.t_decode, r.t.t_decode_busy, r.t.t_tree, r.t.t_tree_busy, r.t.d_decode,
                  r.t.d_busy, r.exact ? "yes" : "NO", 100.0 * (r.t.t_tree_busy / r.t.t_tree - 1));
    std::printf("(ms per step; +d: while the draft decodes concurrently; slow%%: tree16 with draft vs alone)\n");
  } catch (const std::exception& e) {
    std::printf("green bench aborted: %s\n", e.what());
    json += "\n  ],\n  \"error\": \"" + std::string(e.what()) + "\"\n}\n";
    status = 2;
  }
  if (!json_path.empty())
    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  return status;
}
