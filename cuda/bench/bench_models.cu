// swiftspec-cuda-bench's model rows: decode and tree steps of the layered path (PDL on and off,
// engine and tuning variants) and of the decode megakernel, with its knobs and trace summaries.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench.h"
#include "json_number.h"
#include "kernels/decode_megakernel.h"
#include "model_shapes.h"

using namespace swiftspec;
using namespace swiftspec::cuda;

namespace cuda_bench {

ForwardBatch decode_batch(int pos) {
  ForwardBatch b;
  b.tokens = {1234};
  b.positions = {pos};
  b.logits = LogitsMode::Last;
  return b;
}

ForwardBatch tree_batch(int n, int ctx, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> parents(n), tokens(n);
  for (int i = 0; i < n; ++i) parents[i] = i == 0 ? -1 : (i % 3 == 0 ? static_cast<int>(g() % i) : i - 1);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(g() % 100000);
  return ForwardBatch::tree(tokens, parents, ctx);
}

void apply_mk_flags(CudaModelOptions& co) {
  co.megakernel_head_keys = g_mk_head_keys;
  co.megakernel_head_parts = g_mk_head_parts;
  co.megakernel_max_inflight = g_mk_inflight;
  co.megakernel_slot_bytes = g_mk_slot_bytes;
  co.megakernel_release_hold = g_mk_hold;
  co.megakernel_hold_until_input = g_mk_hold_input;
  co.megakernel_attn_short = g_mk_attn_short;
  co.megakernel_attn_prewait = g_mk_attn_prewait;
  co.megakernel_merge_in_o = g_mk_merge_in_o;
  co.megakernel_l2_prefetch_bytes = g_mk_l2_prefetch;
  if (co.megakernel) {
    co.sm_first = 0;
    co.sm_count = g_mk_sm_count;
  }
}

namespace {

/// Median wall time (ms) of `n` host-synchronous greedy decode steps at position `ctx`
/// (descriptor upload + graph + arg-max copy), each from committed length ctx.
double host_sync_decode_ms(CudaModel& m, int ctx, int n) {
  std::vector<float> wall;
  std::vector<int32_t> am;
  for (int i = 0; i < n; ++i) {
    m.truncate_committed(ctx);
    const auto t0 = std::chrono::steady_clock::now();
    m.forward_argmax(decode_batch(ctx), am);
    const auto t1 = std::chrono::steady_clock::now();
    wall.push_back(std::chrono::duration<float, std::milli>(t1 - t0).count());
  }
  return median(wall);
}

/// The head units' phases (MegaParams::trace after the op stamps,
/// kMegaAttnStamps per layer and CTA): medians over layers 1.. and units, in
/// us, for part 0 and for the other parts apart (the plan's head_parts, read
/// from `plan`): the QKV wait, the scores (K rows landed), the softmax, P V
/// and the state stored, the handoff (part 0: the others' states merged and
/// its output stored; the others: their release); and from the layer's last
/// QKV end to the part's start and its end. Prints one line, returns JSON
/// members ("" when the step ran no head units).
template <class EndMax>
std::string attention_phase_summary(const std::string& which, const std::vector<unsigned long long>& t, int G, int L,
                                    const std::string& plan, EndMax&& end_max) {
  int P = 1;
  const size_t at = plan.find("head_parts=");
  if (at != std::string::npos) P = std::max(1, std::atoi(plan.c_str() + at + 11));
  const size_t off = mega_trace_attn_offset(L, G);
  if (t.size() < off + static_cast<size_t>(L) * G * kMegaAttnStamps) return "";
  // [part 0 or not][phase 0..4 deltas, 5: start after QKV, 6: end after QKV]
  std::vector<double> v[2][7];
  for (int l = 1; l < L; ++l) {
    const double qkv_end = end_max(l * 6);
    for (int c = 0; c < G; ++c) {
      const unsigned long long* a = &t[off + (static_cast<size_t>(l) * G + c) * kMegaAttnStamps];
      if (a[0] == 0 || a[5] == 0) continue;
      const int k = c % P == 0 ? 0 : 1;
      for (int ph = 0; ph < 5; ++ph) v[k][ph].push_back((static_cast<double>(a[ph + 1]) - a[ph]) / 1e3);
      v[k][5].push_back((static_cast<double>(a[1]) - qkv_end) / 1e3);
      v[k][6].push_back((static_cast<double>(a[5]) - qkv_end) / 1e3);
    }
  }
  if (v[0][0].empty()) return "";
  const auto median = [](std::vector<double> x) {
    if (x.empty()) return 0.0;
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  static const char* names[] = {"wait", "scores", "softmax", "pv_state", "handoff", "start_after_qkv", "end_after_qkv"};
  std::printf("megakernel attention %-13s phases (us, medians; part 0 | parts 1..%d):", which.c_str(), P - 1);
  std::string json;
  for (int ph = 0; ph < 7; ++ph) {
    std::printf(" %s %.2f|%.2f", names[ph], median(v[0][ph]), median(v[1][ph]));
    json += std::string(ph ? ", " : "") + "\"attn_" + names[ph] + "_part0_us\": " + num(median(v[0][ph])) +
            ", \"attn_" + names[ph] + "_others_us\": " + num(median(v[1][ph]));
  }
  std::printf("\n");
  return json;
}

/// The ring's blocked waits per GEMV op kind (MegaParams::trace's
/// kMegaRingWords, cycles turned into us with each CTA's clock words):
/// consumer warp 0 waiting for a chunk to land ("bytes"); the producer, with
/// the ring at full depth, waiting for the oldest chunk to land ("inflight":
/// HBM or latency bound) or, landed, to be consumed ("unconsumed": the
/// consumers behind or waiting for a dependency; newer chunks may still be
/// landing; "idle": the part of it after the newest chunk had landed too, the
/// SM's stream standing still), or for a held slot's release ("held"). Per op
/// kind, the mean over layers 1.. of the
/// median and of the maximum over the CTAs with rows in the op (its arrival
/// stamp set); the LM head alone. Prints one line, returns JSON members.
std::string ring_wait_summary(const std::string& which, const std::vector<unsigned long long>& t, int G, int L) {
  if (t.size() < mega_trace_words(L, G)) return "";
  const size_t ring = mega_trace_ring_offset(L, G), clk = mega_trace_clock_offset(L, G);
  std::vector<double> ns_per_cycle(G, 0.0);
  double ghz_sum = 0;
  int ghz_n = 0;
  for (int c = 0; c < G; ++c) {
    const unsigned long long* w = &t[clk + static_cast<size_t>(c) * kMegaClockWords];
    if (w[2] > w[0] && w[3] > w[1]) {
      ns_per_cycle[c] = static_cast<double>(w[3] - w[1]) / static_cast<double>(w[2] - w[0]);
      ghz_sum += 1.0 / ns_per_cycle[c];
      ++ghz_n;
    }
  }
  if (ghz_n == 0) return "";
  const auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  // [word][median, max] for one op slot, over the CTAs with rows; false if none.
  const auto per_slot = [&](int slot, double (&out)[kMegaRingWords][2]) {
    std::vector<double> v[kMegaRingWords];
    for (int c = 0; c < G; ++c) {
      if (t[(static_cast<size_t>(slot) * G + c) * kMegaTraceStamps + 2] == 0 || ns_per_cycle[c] == 0) continue;
      const unsigned long long* w = &t[ring + (static_cast<size_t>(slot) * G + c) * kMegaRingWords];
      for (int k = 0; k < kMegaRingWords; ++k) v[k].push_back(static_cast<double>(w[k]) * ns_per_cycle[c] / 1e3);
    }
    if (v[0].empty()) return false;
    for (int k = 0; k < kMegaRingWords; ++k) {
      out[k][0] = median(v[k]);
      out[k][1] = *std::max_element(v[k].begin(), v[k].end());
    }
    return true;
  };
  static const char* ops[] = {"qkv", "o_proj", "gate_up", "down", "lm_head"};
  static const int op_slot[] = {0, 3, 4, 5};
  static const char* words[kMegaRingWords] = {"bytes", "inflight", "unconsumed", "idle", "held"};
  std::printf(
      "megakernel ring  %-13s waits (us per layer, median|max over the CTAs with rows; bytes: consumers "
      "waiting for a chunk to land; the producer, ring at full depth: inflight, for its oldest chunk to "
      "land; unconsumed, for it to be consumed; idle, of that, with every chunk landed; held, for a held "
      "slot's release; SM clock %.2f GHz):",
      which.c_str(), ghz_sum / ghz_n);
  std::string json = "\"sm_clock_ghz\": " + num(ghz_sum / ghz_n);
  for (int o = 0; o < 5; ++o) {
    double mean[kMegaRingWords][2] = {};
    int n = 0;
    if (o < 4) {
      for (int l = 1; l < L; ++l) {
        double one[kMegaRingWords][2];
        if (!per_slot(l * 6 + op_slot[o], one)) continue;
        for (int k = 0; k < kMegaRingWords; ++k) mean[k][0] += one[k][0], mean[k][1] += one[k][1];
        ++n;
      }
    } else if (per_slot(6 * L, mean)) {
      n = 1;
    }
    if (n == 0) continue;
    std::printf(" %s", ops[o]);
    for (int k = 0; k < kMegaRingWords; ++k) {
      std::printf(" %s %.2f|%.2f", words[k], mean[k][0] / n, mean[k][1] / n);
      json += std::string(", \"") + ops[o] + "_" + words[k] + "_wait_us\": " + num(mean[k][0] / n) + ", \"" + ops[o] +
              "_" + words[k] + "_wait_max_us\": " + num(mean[k][1] / n);
    }
  }
  std::printf("\n");
  return json;
}

/// The megakernel's critical path per op kind, from one traced step
/// (CudaModelOptions::megakernel_trace): mean over layers >= 1 of the time
/// from the previous op's last end to this op's last end ("segment"), of
/// which the time until the last CTA woke up ("wake") and until the last CTA
/// arrived at the op's wait ("arrive": a CTA still busy with earlier work).
std::string megakernel_trace_summary(const std::string& which, const ModelConfig& cfg, const std::string& tag = "") {
  ModelOptions opt;
  opt.max_context = 1024;
  opt.max_tree = 128;
  CudaModelOptions co;
  co.megakernel = true;
  co.megakernel_trace = true;
  apply_mk_flags(co);
  auto m = make_cuda_model_random(cfg, opt, co, 42);
  m->debug_fill_committed_random(512, 43);
  std::vector<int32_t> am;
  for (int i = 0; i < 5; ++i) {
    m->truncate_committed(512);
    m->forward_argmax(decode_batch(512), am);
  }
  std::vector<unsigned long long> t;
  const int G = m->debug_megakernel_trace(t);
  const int L = cfg.num_layers, ops = 6;
  constexpr int S = kMegaTraceStamps;
  auto stamp = [&](int slot, int cta, int which) {
    return static_cast<double>(t[(static_cast<size_t>(slot) * G + cta) * S + which]);
  };
  auto end_max = [&](int slot) {
    double v = 0;
    for (int c = 0; c < G; ++c) v = std::max(v, stamp(slot, c, 1));
    return v;
  };
  auto start_max = [&](int slot) {
    double v = 0;
    for (int c = 0; c < G; ++c) v = std::max(v, stamp(slot, c, 0));
    return v;
  };
  static const char* names[] = {"qkv", "attn_units", "split_merge", "o_proj", "gate_up", "down"};
  auto arrive_max = [&](int slot) {
    double v = 0;
    for (int c = 0; c < G; ++c) v = std::max(v, stamp(slot, c, 2));
    return v;
  };
  double seg[6] = {0}, wake[6] = {0}, arrive[6] = {0};
  for (int l = 1; l < L; ++l)
    for (int o = 0; o < ops; ++o) {
      const int slot = l * ops + o;
      const double prev = end_max(slot - 1);
      seg[o] += (end_max(slot) - prev) / (L - 1);
      wake[o] += (start_max(slot) - prev) / (L - 1);
      const double a = arrive_max(slot);
      if (a > 0) arrive[o] += (a - prev) / (L - 1);
    }
  double t0 = 1e300;
  for (int c = 0; c < G; ++c) t0 = std::min(t0, stamp(0, c, 0));
  if (!g_mk_trace_csv_dir.empty()) {
    const std::string path = g_mk_trace_csv_dir + "/mk_trace_" + which + (tag.empty() ? "" : "_" + tag) + ".csv";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fprintf(f,
                   "layer,op,cta,arrive_ns,start_ns,end_ns,bytes_wait_ns,inflight_wait_ns,unconsumed_wait_ns,"
                   "idle_ns,held_wait_ns\n");
      auto rel = [&](double v) { return v > 0 ? static_cast<long long>(v - t0) : -1LL; };
      const size_t ring = mega_trace_ring_offset(L, G), clk = mega_trace_clock_offset(L, G);
      for (int slot = 0; slot <= L * ops; ++slot)
        for (int c = 0; c < G; ++c) {
          const unsigned long long* cw = &t[clk + static_cast<size_t>(c) * kMegaClockWords];
          const double npc = cw[2] > cw[0] && cw[3] > cw[1]
                                 ? static_cast<double>(cw[3] - cw[1]) / static_cast<double>(cw[2] - cw[0])
                                 : -1.0;
          const unsigned long long* rw = &t[ring + (static_cast<size_t>(slot) * G + c) * kMegaRingWords];
          // A CTA with rows in a GEMV op (QKV, O, gate/up, down, the LM head) stamps its arrival; the
          // attention's arrival stamp is no ring op's.
          const int op = slot % ops;
          const bool gemv = slot == L * ops || op == 0 || op == 3 || op == 4 || op == 5;
          const bool rows = gemv && stamp(slot, c, 2) > 0;
          auto ns = [&](int k) { return npc > 0 && rows ? static_cast<long long>(rw[k] * npc) : -1LL; };
          std::fprintf(f, "%d,%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld\n", slot / ops,
                       slot == L * ops ? "lm_head" : names[slot % ops], c, rel(stamp(slot, c, 2)),
                       rel(stamp(slot, c, 0)), rel(stamp(slot, c, 1)), ns(0), ns(1), ns(2), ns(3), ns(4));
        }
      std::fclose(f);
    } else {
      std::fprintf(stderr, "--megakernel-trace-csv: cannot write %s\n", path.c_str());
    }
  }
  const double lm = end_max(L * ops) - end_max(L * ops - 1);
  const double total = end_max(L * ops) - t0;
  const std::string attn_json = attention_phase_summary(which, t, G, L, m->debug_gemm_plans(), end_max);
  const std::string ring_json = ring_wait_summary(which, t, G, L);
  std::string json = "{" + attn_json + (attn_json.empty() ? "" : ", ") + ring_json + (ring_json.empty() ? "" : ", ");
  // The traced model tunes its own plan (it times the traced kernel), so its slot size may differ from
  // the untraced model's: its plan line with the trace.
  const std::string plans = m->debug_gemm_plans();
  const size_t mk_at = plans.find("megakernel ");
  if (mk_at != std::string::npos)
    std::printf("megakernel traced plan %-13s %s\n", which.c_str(),
                plans.substr(mk_at, plans.find('\n', mk_at) - mk_at).c_str());
  std::printf("megakernel trace %-13s total %.1f us, LM head %.1f us; per layer (us, segment / wake / arrive):",
              which.c_str(), total / 1e3, lm / 1e3);
  double layer = 0;
  for (int o = 0; o < ops; ++o) {
    std::printf(" %s %.2f/%.2f/%.2f", names[o], seg[o] / 1e3, wake[o] / 1e3, arrive[o] / 1e3);
    json += std::string(o ? ", " : "") + "\"" + names[o] + "_us\": " + num(seg[o] / 1e3) + ", \"" + names[o] +
            "_wake_us\": " + num(wake[o] / 1e3) + ", \"" + names[o] + "_arrive_us\": " + num(arrive[o] / 1e3);
    layer += seg[o];
  }
  std::printf(" | layer %.2f\n", layer / 1e3);
  std::fflush(stdout);
  return json + ", \"layer_us\": " + num(layer / 1e3) + ", \"lm_head_us\": " + num(lm / 1e3) +
         ", \"total_us\": " + num(total / 1e3) + "}";
}

}  // namespace

ModelRow bench_model(const std::string& which, double bw_tbs, int ctx, bool quick, bool with_mma, bool with_pdl_early,
                     bool with_untuned, bool megakernel_only, bool mk_trace) {
  ModelRow r{};
  r.shape = which;
  const ModelConfig cfg = shape_config(which);
  ModelOptions opt;
  opt.max_context = 1024;
  opt.max_tree = 128;
  const int iters = quick ? 50 : 200;
  for (int pdl = 1; pdl >= (megakernel_only ? 1 : 0); --pdl) {
    CudaModelOptions co;
    co.use_pdl = pdl != 0;
    auto m = make_cuda_model_random(cfg, opt, co, 42);
    m->debug_fill_committed_random(ctx, 43);
    const int id = m->debug_prepare(decode_batch(ctx), false);
    const double ms = m->debug_replay_ms(id, iters);
    if (pdl) {
      r.decode_ms = ms;
      r.weight_gb = m->weight_bytes_per_step() / 1e9;
      r.limit_ms = m->weight_bytes_per_step() / (bw_tbs * 1e12) * 1e3;
    }
    if (pdl && !megakernel_only) {
      r.host_ms = host_sync_decode_ms(*m, ctx, quick ? 20 : 60);
      m->truncate_committed(ctx);
      if (which == "llama3-8b") {
        const int t32 = m->debug_prepare(tree_batch(32, ctx, 5), false);
        const int t64 = m->debug_prepare(tree_batch(64, ctx, 6), false);
        r.tree32_ms = m->debug_replay_ms(t32, iters);
        r.tree64_ms = m->debug_replay_ms(t64, iters);
      }
      for (char c : m->debug_step_tuning()) r.step_tuning += c == '\n' ? std::string("; ") : std::string(1, c);
      std::printf("model %-13s step tuning: %s\n", which.c_str(), r.step_tuning.c_str());
      std::printf("model %-13s layered GEMM plans: %s\n", which.c_str(), m->debug_gemm_plans().c_str());
    } else if (!pdl) {
      r.decode_nopdl_ms = ms;
      if (which == "llama3-8b") {
        m->truncate_committed(ctx);
        r.tree32_nopdl_ms = m->debug_replay_ms(m->debug_prepare(tree_batch(32, ctx, 5), false), iters);
        r.tree64_nopdl_ms = m->debug_replay_ms(m->debug_prepare(tree_batch(64, ctx, 6), false), iters);
        std::printf("model %-13s pdl=0 tree32 %.4f ms tree64 %.4f ms\n", which.c_str(), r.tree32_nopdl_ms,
                    r.tree64_nopdl_ms);
      }
    }
    std::printf("model %-13s pdl=%d decode %.4f ms\n", which.c_str(), pdl, ms);
    std::fflush(stdout);
  }
  // Variants of the PDL step selected by environment variables (A/B).
  auto variant = [&](const char* env, const char* value, const char* label, double& dec, double& t32, double& t64) {
    setenv(env, value, 1);
    CudaModelOptions co;
    auto m = make_cuda_model_random(cfg, opt, co, 42);
    m->debug_fill_committed_random(ctx, 43);
    dec = m->debug_replay_ms(m->debug_prepare(decode_batch(ctx), false), iters);
    if (which == "llama3-8b") {
      t32 = m->debug_replay_ms(m->debug_prepare(tree_batch(32, ctx, 5), false), iters);
      t64 = m->debug_replay_ms(m->debug_prepare(tree_batch(64, ctx, 6), false), iters);
    }
    unsetenv(env);
    std::printf("model %-13s %s pdl=1 decode %.4f ms tree32 %.4f tree64 %.4f\n", which.c_str(), label, dec, t32, t64);
    std::fflush(stdout);
  };
  {
    // The decode megakernel: graph replay (device time) and the host-synchronous step.
    CudaModelOptions co;
    co.megakernel = true;
    apply_mk_flags(co);
    auto m = make_cuda_model_random(cfg, opt, co, 42);
    m->debug_fill_committed_random(ctx, 43);
    r.mk_decode_ms = m->debug_replay_ms(m->debug_prepare(decode_batch(ctx), false), iters);
    r.mk_host_ms = host_sync_decode_ms(*m, ctx, quick ? 20 : 60);
    std::printf("model %-13s megakernel decode %.4f ms (host-synchronous %.4f ms) [%s]\n", which.c_str(),
                r.mk_decode_ms, r.mk_host_ms, m->debug_gemm_plans().c_str());
    std::printf("model %-13s megakernel tuning: %s", which.c_str(), m->debug_step_tuning().c_str());
    std::fflush(stdout);
  }
  if (mk_trace) r.mk_trace_json = megakernel_trace_summary(which, cfg);
  for (const auto& [inflight, slot_bytes, hold, hold_input] : g_mk_sweep) {
    const int keep_inflight = g_mk_inflight, keep_slot = g_mk_slot_bytes, keep_hold = g_mk_hold,
              keep_hold_input = g_mk_hold_input;
    g_mk_hold_input = hold_input;
    g_mk_inflight = inflight;
    g_mk_slot_bytes = slot_bytes;
    g_mk_hold = hold;
    CudaModelOptions co;
    co.megakernel = true;
    apply_mk_flags(co);
    auto m = make_cuda_model_random(cfg, opt, co, 42);
    m->debug_fill_committed_random(ctx, 43);
    const double ms = m->debug_replay_ms(m->debug_prepare(decode_batch(ctx), false), iters);
    std::printf("model %-13s megakernel sweep inflight=%d slot_bytes=%d hold=%d hold_input=%d decode %.4f ms [%s]\n",
                which.c_str(), inflight, slot_bytes, hold, hold_input, ms, m->debug_gemm_plans().c_str());
    std::fflush(stdout);
    m.reset();
    if (mk_trace)
      megakernel_trace_summary(which, cfg,
                               "inflight" + std::to_string(inflight) + "_slot" + std::to_string(slot_bytes) +
                                   (hold >= 0 ? "_hold" + std::to_string(hold) : std::string()) +
                                   (hold_input >= 0 ? "_in" + std::to_string(hold_input) : std::string()));
    g_mk_inflight = keep_inflight;
    g_mk_slot_bytes = keep_slot;
    g_mk_hold = keep_hold;
    g_mk_hold_input = keep_hold_input;
  }
  if (with_mma)
    variant("SWIFTSPEC_GEMM_ENGINE", "mma", "engine=mma", r.mma_decode_ms, r.mma_tree32_ms, r.mma_tree64_ms);
  if (with_pdl_early)
    variant("SWIFTSPEC_GEMM_PDL_EARLY", "1", "gemm-pdl-early", r.early_decode_ms, r.early_tree32_ms, r.early_tree64_ms);
  if (with_untuned)
    variant("SWIFTSPEC_STEP_TUNE", "0", "untuned", r.untuned_decode_ms, r.untuned_tree32_ms, r.untuned_tree64_ms);
  return r;
}

}  // namespace cuda_bench
