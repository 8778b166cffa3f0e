// The runtime pieces of the asynchronous engine, without models: channels,
// the in-process communicator, worker groups, the tensor-parallel plan, the
// timeline. Also the ThreadSanitizer stress targets (tools/run_tsan.sh).
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <algorithm>
#include <thread>

#include "swiftspec/channel.h"
#include "swiftspec/config.h"
#include "swiftspec/communicator.h"
#include "swiftspec/error.h"
#include "swiftspec/placement.h"
#include "swiftspec/tensor_parallel.h"
#include "swiftspec/timeline.h"
#include "swiftspec/worker_group.h"
#include "src/async/send_policy.h"
#include "test_framework.h"

namespace swiftspec::test {
namespace {

ModelConfig qwen_config(int heads, int kv_heads, int hidden, int inter) {
  ModelConfig c;
  c.architecture = "qwen2";
  c.vocab_size = 151936;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_layers = 2;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  return c;
}

}  // namespace

SWIFTSPEC_TEST(async_channel_order_close_and_threads) {
  Channel<int> ch;
  CHECK(ch.send(1));
  CHECK(ch.send(2));
  CHECK_EQ(*ch.try_receive(), 1);
  ch.close();
  CHECK(!ch.send(3));
  CHECK_EQ(*ch.receive(), 2);  // queued before close: still delivered
  CHECK(!ch.receive().has_value());
  CHECK(!ch.try_receive().has_value());

  // Two producers, one consumer: every message arrives once, per-producer order kept.
  Channel<std::pair<int, int>> c2;
  const int n = 20000;
  std::thread a([&] {
    for (int i = 0; i < n; ++i) c2.send({0, i});
  });
  std::thread b([&] {
    for (int i = 0; i < n; ++i) c2.send({1, i});
  });
  int next[2] = {0, 0};
  for (int k = 0; k < 2 * n; ++k) {
    auto m = c2.receive();
    CHECK(m.has_value());
    CHECK_EQ(m->second, next[m->first]);
    ++next[m->first];
  }
  a.join();
  b.join();
  // A blocked receiver wakes on close.
  Channel<int> c3;
  std::thread w([&] { CHECK(!c3.receive().has_value()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  c3.close();
  w.join();
}

SWIFTSPEC_TEST(async_allreduce_rank_order_and_determinism) {
  for (int n : {1, 2, 3, 4, 5}) {
    WorkerGroup g(n, {}, {}, "ar");
    const size_t count = 1237;  // not a multiple of the rank count
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.0f, 1000.0f);
    for (auto& d : data)
      for (float& x : d) x = dist(rng);
    // Expected: the sum in rank order, per element.
    std::vector<float> expect(count);
    for (size_t i = 0; i < count; ++i) {
      float acc = data[0][i];
      for (int r = 1; r < n; ++r) acc += data[r][i];
      expect[i] = acc;
    }
    for (int rep = 0; rep < 50; ++rep) {
      auto work = data;
      g.run([&](int r) { g.comm(r).all_reduce_sum(work[r].data(), count); });
      for (int r = 0; r < n; ++r) CHECK(std::memcmp(work[r].data(), expect.data(), count * sizeof(float)) == 0);
    }
    // Gather to rank 1 (or 0).
    const int root = n > 1 ? 1 : 0;
    std::vector<float> recv(n * 7, -1.0f);
    g.run([&](int r) {
      std::vector<float> send(7, static_cast<float>(r));
      g.comm(r).gather(send.data(), r == root ? recv.data() : nullptr, 7, root);
    });
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < 7; ++i) CHECK_EQ(recv[r * 7 + i], static_cast<float>(r));
  }
}

SWIFTSPEC_TEST(async_worker_group_errors_abort_and_recover) {
  WorkerGroup g(3, {}, {}, "err");
  // Rank 2 fails before its collective: the others, blocked in it, see
  // CommAborted; run() reports rank 2's own error.
  bool got = false;
  try {
    g.run([&](int r) {
      if (r == 2) throw InvalidArgument("rank 2 failed");
      float x = 1.0f;
      g.comm(r).all_reduce_sum(&x, 1);
    });
  } catch (const InvalidArgument& e) {
    got = std::string(e.what()) == "rank 2 failed";
  }
  CHECK(got);
  // The group is usable again.
  std::vector<float> v(3, 0.0f);
  g.run([&](int r) {
    float x = static_cast<float>(r + 1);
    g.comm(r).all_reduce_sum(&x, 1);
    v[r] = x;
  });
  for (float x : v) CHECK_EQ(x, 6.0f);
  // Mismatched counts are reported, not a hang.
  CHECK_THROWS(g.run([&](int r) {
    std::vector<float> b(4 + r);
    g.comm(r).all_reduce_sum(b.data(), b.size());
  }),
               InvalidArgument);
  g.run([&](int r) { g.comm(r).barrier(); });
}

// Many short SPMD steps with collectives: the TSAN stress target.
SWIFTSPEC_TEST(async_worker_group_stress) {
  for (int n : {2, 4}) {
    WorkerGroup g(n, {}, {}, "stress");
    std::vector<float> buf(n * 64);
    for (int step = 0; step < 2000; ++step) {
      g.run([&](int r) {
        float* mine = buf.data() + r * 64;
        for (int i = 0; i < 64; ++i) mine[i] = static_cast<float>(r + step);
        g.comm(r).all_reduce_sum(mine, 64);
        if (step % 7 == 0) g.comm(r).barrier();
      });
      const float expect = static_cast<float>(n * step + n * (n - 1) / 2);
      for (float x : buf) CHECK_EQ(x, expect);
    }
  }
  // Groups created and destroyed in a loop: no thread is left behind.
  for (int i = 0; i < 200; ++i) {
    WorkerGroup g(3, {}, {}, "churn");
    std::atomic<int> ran{0};
    g.run([&](int) { ran.fetch_add(1); });
    CHECK_EQ(ran.load(), 3);
  }
}

SWIFTSPEC_TEST(async_tp_plan_pads_any_degree) {
  // Qwen2.5-Coder 1.5B (12 heads, 2 KV heads, FFN 8960) and 0.5B (14, 2, 4864).
  for (auto c : {qwen_config(12, 2, 1536, 8960), qwen_config(14, 2, 896, 4864)}) {
    for (int tp = 1; tp <= 8; ++tp) {
      const TpPlan p = TpPlan::make(c, tp);
      p.validate(c, "test");
      CHECK_EQ(p.tp, tp);
      CHECK_EQ(p.q_heads_per_rank, (c.num_heads + tp - 1) / tp);
      CHECK(p.ffn_per_rank % 8 == 0);
      CHECK(p.ffn_per_rank * tp >= c.intermediate_size);
      const int group = c.num_heads / c.num_kv_heads;
      int real = 0;
      for (int r = 0; r < tp; ++r)
        for (int j = 0; j < p.q_heads_per_rank; ++j)
          if (p.q_heads[r][j] >= 0) {
            ++real;
            CHECK_EQ(p.kv_heads[r][p.q_to_kv[r][j]], p.q_heads[r][j] / group);
          }
      CHECK_EQ(real, c.num_heads);
      CHECK(TpPlan::from_json(p.to_json(), "test") == p);
    }
  }
  // 1.5B over 2 ranks: 6 heads and 1 KV head each, no padding.
  const TpPlan p2 = TpPlan::make(qwen_config(12, 2, 1536, 8960), 2);
  CHECK_EQ(p2.q_heads_per_rank, 6);
  CHECK_EQ(p2.kv_heads_per_rank, 1);
  CHECK_EQ(p2.ffn_per_rank, 4480);
  CHECK(p2.kv_heads[0] == std::vector<int>{0});
  CHECK(p2.kv_heads[1] == std::vector<int>{1});
  // 0.5B over 4 ranks: 14 heads -> 4 per rank with 2 padding heads in all.
  const TpPlan p4 = TpPlan::make(qwen_config(14, 2, 896, 4864), 4);
  CHECK_EQ(p4.q_heads_per_rank, 4);
  int pads = 0;
  for (const auto& row : p4.q_heads) pads += static_cast<int>(std::count(row.begin(), row.end(), -1));
  CHECK_EQ(pads, 2);
  // A corrupted plan is rejected naming the problem.
  TpPlan bad = p2;
  bad.q_heads[1][0] = 0;  // head 0 owned twice
  CHECK_THROWS(bad.validate(qwen_config(12, 2, 1536, 8960), "test"), CheckpointError);
  CHECK_THROWS(TpPlan::make(qwen_config(12, 2, 1536, 8960), 0), InvalidArgument);
}

SWIFTSPEC_TEST(async_timeline_summary_and_trace) {
  Timeline t;
  t.start();
  TimelineTrack& target = t.track("target");
  TimelineTrack& draft = t.track("draft");
  target.add(timeline_event::kPrefill, 0.0, 1.0, 0);
  target.add(timeline_event::kWaitSubtree, 1.0, 1.5, 1);
  target.add(timeline_event::kVerify, 1.5, 3.5, 1, {{"nodes", 16}, {"accepted", 3}});
  target.add(timeline_event::kWaitSubtree, 3.5, 3.6, 2);
  target.add(timeline_event::kVerify, 3.6, 5.6, 2);
  draft.add(timeline_event::kGrow, 1.0, 1.4, 1);
  draft.add(timeline_event::kWaitResult, 4.0, 5.6, 2);
  const TimelineSummary s = t.summary();
  CHECK_EQ(s.rounds, 2);
  CHECK(std::fabs(s.target_verify - 4.0) < 1e-12);
  CHECK(std::fabs(s.target_wait - 0.1) < 1e-12);  // the wait before round 1 is not after a verification
  CHECK(std::fabs(s.decode_span - 4.1) < 1e-12);
  CHECK(std::fabs(s.draft_wait - 1.6) < 1e-12);
  const std::string json = t.to_chrome_trace();
  CHECK(json.find("\"traceEvents\"") != std::string::npos);
  CHECK(json.find("\"ph\":\"X\"") != std::string::npos);
  CHECK(json.find("\"accepted\":3") != std::string::npos);
  CHECK(json.find("\"thread_name\"") != std::string::npos);
}

SWIFTSPEC_TEST(async_send_policy_waits_only_when_it_pays) {
  using async_detail::SendPolicy;
  GenerationConfig cfg;
  cfg.tree_budget = 16;
  cfg.max_depth = 8;
  cfg.branching = 2;
  AsyncOptions opt;
  opt.speculative.expand_width = 1;
  // A root with one confident child (p = 0.9), unexpanded.
  TokenTree tree(100);
  tree.set_expanded(0);
  tree.add_child(0, 7, std::log(0.9f));
  const std::vector<int32_t> selected{0, 1};
  auto policy = [&](double draft_step, bool cost_aware) {
    AsyncOptions o = opt;
    o.cost_aware_send = cost_aware;
    SendPolicy p(o, cfg);
    p.record_verification(4, 1.0);  // Tv(n) = 0.6 + 0.1 n
    p.record_verification(8, 1.4);
    p.record_draft_step(draft_step, 0.9, 1, true);
    return p;
  };
  CHECK(std::fabs(policy(0.05, true).predicted_verify(1) - 0.7) < 1e-9);
  // E_now = 1.9 tokens in 0.7 s (2.71/s); one more step adds ~0.81 tokens and 2 nodes:
  // a 0.05 s step: 2.71 tokens in 0.95 s (2.85/s) -> wait; a 0.5 s step: in 1.4 s -> send.
  CHECK(!policy(0.05, true).send_now(tree, selected, 8, true, 0));
  CHECK(policy(0.5, true).send_now(tree, selected, 8, true, 0));
  // Never waits when nothing can grow, when eager, or after max_depth waits.
  CHECK(policy(0.05, true).send_now(tree, selected, 8, false, 0));
  CHECK(policy(0.05, false).send_now(tree, selected, 8, true, 0));
  CHECK(policy(0.05, true).send_now(tree, selected, 8, true, 8));
  // Without two distinct verified sizes there is no cost model: eager.
  SendPolicy fresh(opt, cfg);
  fresh.record_verification(4, 1.0);
  fresh.record_draft_step(0.01, 0.9, 1, false);
  CHECK(fresh.predicted_verify(4) < 0);
  CHECK(fresh.send_now(tree, selected, 8, true, 0));
  // min_send_nodes holds an idle target back until the tree has that many nodes.
  AsyncOptions m = opt;
  m.min_send_nodes = 2;
  m.cost_aware_send = false;
  CHECK(!SendPolicy(m, cfg).send_now(tree, selected, 8, true, 0));
}

namespace {
// Whether parsing the placement `text` throws InvalidArgument whose message contains `needle`.
bool placement_fails_with(const std::string& text, const std::string& needle) {
  try {
    Placement::from_json(text);
  } catch (const InvalidArgument& e) {
    return std::string(e.what()).find(needle) != std::string::npos;
  }
  return false;
}
}  // namespace

namespace {
// The message of the error `f` throws (as type E), or "" if it throws none.
template <typename E, typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// JSON errors name the position and the reason, without nlohmann's "[json.exception.parse_error.101] ".
SWIFTSPEC_TEST(json_errors_without_the_library_prefix) {
  CHECK_EQ(error_of<InvalidArgument>([] { Placement::from_json(R"({"target": {"tp": 1,}})"); }),
           std::string("placement is not valid JSON: parse error at line 1, column 21: syntax error while parsing "
                       "object key - unexpected '}'; expected string literal"));
  CHECK_EQ(error_of<InvalidArgument>([] { Placement::from_json(R"({"draft": {"sm_partition": "x"}})"); }),
           std::string("placement.draft.sm_partition has the wrong type: type must be array, but is string"));
  CHECK_EQ(error_of<CheckpointError>([] { ModelConfig::from_json_text("{\"model_type\": ", "cfg.json"); }),
           std::string("cfg.json: malformed JSON: parse error at line 1, column 16: syntax error while parsing "
                       "value - unexpected end of input; expected '[', '{', or a literal"));
}

SWIFTSPEC_TEST(async_placement_json_and_automatic) {
  Placement p = Placement::from_json(R"({"draft": {"tp": 1, "cores": [0]}, "target": {"tp": 2, "cores": [1]}})");
  CHECK_EQ(p.draft.tp, 1);
  CHECK(p.draft.cores == std::vector<std::vector<int>>{{0}});
  CHECK(p.target.cores == (std::vector<std::vector<int>>{{1}, {1}}));  // short flat list: ranks share
  CHECK_EQ(p.target.resolved_threads(0), 1);
  CHECK(Placement::from_json(p.to_json()).to_json() == p.to_json());
  // Flat lists split evenly; nested lists are per rank.
  const int n = static_cast<int>(std::thread::hardware_concurrency());
  if (n >= 2) {
    Placement q = Placement::from_json(R"({"target": {"tp": 1, "cores": [0, 1]}})");
    CHECK((q.target.cores == std::vector<std::vector<int>>{{0, 1}}));
    CHECK_EQ(q.target.resolved_threads(0), 2);
  }
  // Errors name the group and field.
  CHECK(placement_fails_with(R"({"target": {"tp": 0}})", "placement.target.tp"));
  CHECK(placement_fails_with(R"({"draft": {"core": [0]}})", "unknown field 'core'"));
  CHECK(placement_fails_with(R"({"target": {"cores": [100000]}})", "core 100000 does not exist"));
  CHECK(placement_fails_with(R"({"target": {"tp": 2, "cores": [[0]]}})", "placement.target.cores lists 1 ranks"));
  CHECK(placement_fails_with(R"({"gpu": {}})", "unknown group 'gpu'"));
  CHECK(placement_fails_with("[1", "not valid JSON"));
  // Automatic: two cores -> draft on core 0, target on core 1.
  Placement a = Placement::automatic(2);
  CHECK(a.draft.cores == std::vector<std::vector<int>>{{0}});
  CHECK(a.target.cores == std::vector<std::vector<int>>{{1}});
  Placement b = Placement::automatic(2, 2);
  CHECK(b.target.cores == (std::vector<std::vector<int>>{{1}, {1}}));
}

SWIFTSPEC_TEST(async_placement_sm_partition) {
  // One GPU, two green-context partitions: draft [0, 16), target [16, last].
  Placement p = Placement::from_json(R"({"draft": {"sm_partition": [0, 16]}, "target": {"sm_partition": [16, 0]}})");
  CHECK_EQ(p.draft.sm_first, 0);
  CHECK_EQ(p.draft.sm_count, 16);
  CHECK_EQ(p.target.sm_first, 16);
  CHECK_EQ(p.target.sm_count, 0);
  CHECK(Placement::from_json(p.to_json()).to_json() == p.to_json());
  CHECK(p.to_json().find("\"sm_partition\":[16,0]") != std::string::npos);
  CHECK(placement_fails_with(R"({"draft": {"sm_partition": [0, 24]}, "target": {"sm_partition": [16, 0]}})",
                             "overlap on GPU 0"));
  CHECK(placement_fails_with(R"({"draft": {"sm_partition": [-8, 16]}})", "placement.draft.sm_partition must be"));
  CHECK(
      placement_fails_with(R"({"target": {"sm_partition": [8]}})", "placement.target.sm_partition must be [first SM"));
  CHECK(placement_fails_with(R"({"target": {"sm_partition": "all"}})",
                             "placement.target.sm_partition has the wrong type"));
  // Different GPUs, or a group on the whole GPU: no overlap.
  Placement::from_json(R"({"draft": {"devices": [0], "sm_partition": [0, 16]},
                           "target": {"devices": [1], "sm_partition": [8, 0]}})");
  Placement::from_json(R"({"draft": {"sm_partition": [0, 16]}, "target": {}})");
  CHECK(!sm_partitions_overlap(0, 16, 16, 0));
  CHECK(sm_partitions_overlap(0, 17, 16, 8));
  CHECK(!sm_partitions_overlap(0, 0, 0, 16));  // [0, 0] is no partition
  // Stream priority (CUDA): parsed, round-tripped.
  Placement pr = Placement::from_json(R"({"target": {"stream_priority": -5}})");
  CHECK_EQ(pr.target.stream_priority, -5);
  CHECK_EQ(pr.draft.stream_priority, 0);
  CHECK(Placement::from_json(pr.to_json()).target.stream_priority == -5);
  // Decode megakernel (CUDA): a JSON boolean, round-tripped; anything else names the field.
  Placement mk = Placement::from_json(R"({"draft": {"megakernel": true}})");
  CHECK(mk.draft.megakernel);
  CHECK(!mk.target.megakernel);
  CHECK(Placement::from_json(mk.to_json()).draft.megakernel);
  CHECK(mk.to_json().find("\"megakernel\":true") != std::string::npos);
  CHECK(
      placement_fails_with(R"({"draft": {"megakernel": "yes"}})", "placement.draft.megakernel must be true or false"));
  CHECK(placement_fails_with(R"({"target": {"megakernel": 1}})", "placement.target.megakernel must be true or false"));

  // Resolution against a device (what the CUDA backend does with the driver's split).
  std::vector<int> bounds;
  for (int b = 0; b <= 128; b += 8) bounds.push_back(b);
  bounds.push_back(132);  // an H200: 16 groups of 8 SMs and a remainder of 4
  const SmRange a = resolve_sm_partition(0, 16, 132, bounds, "sm_partition");
  CHECK_EQ(a.first, 0);
  CHECK_EQ(a.count, 16);
  const SmRange b = resolve_sm_partition(16, 0, 132, bounds, "sm_partition");
  CHECK_EQ(b.first, 16);
  CHECK_EQ(b.count, 116);
  auto resolve_fails = [&](int f, int c, const std::string& needle) {
    try {
      resolve_sm_partition(f, c, 132, bounds, "placement.draft.sm_partition");
    } catch (const InvalidArgument& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  CHECK(resolve_fails(0, 20,
                      "placement.draft.sm_partition [0, 20] (SMs 0..19): green-context partitions of this "
                      "GPU start and end at SM 0, 8, 16"));
  CHECK(resolve_fails(128, 8, "is outside the 132 SMs of this GPU"));
  CHECK(resolve_fails(132, 0, "is outside the 132 SMs"));
  CHECK(resolve_fails(0, 0, "is the whole GPU"));
  CHECK(resolve_fails(-1, 8, "non-negative"));
  CHECK_EQ(resolve_sm_partition(3, 5, 132, {}, "x").count, 5);  // no boundaries: any SM
}

}  // namespace swiftspec::test
