// swiftspec-cuda-bench: latency of the CUDA backend with random weights
// generated on the GPU (no files), against the physical limit measured in the
// same run.
//
//  * copy bandwidth: a 2 GiB device-to-device cudaMemcpy, bytes read + written;
//  * skinny GEMMs of the Llama-3-8B shapes at M = 1, 16, 64: ours (default
//    wgmma engine, and the mma.sync engine) vs cuBLAS
//    (cublasGemmEx, bf16 in, fp32 compute), weights rotated over > 400 MB so
//    that L2 does not serve them;
//  * single-step decode at batch 1 (context 512, greedy: arg-max on the GPU),
//    CUDA graph replays timed with events (median), with and without
//    programmatic dependent launch; plus the host-synchronous forward_argmax()
//    wall time; for the Llama-3-8B, Qwen2.5-1.5B and Qwen2.5-0.5B shapes;
//  * tree verification of 32 and 64 nodes at the 8B shape (all rows' arg-max);
//  * the same decode step as the decode megakernel (CudaModelOptions::megakernel).
// Physical limit of a step = weight bytes read per step / copy bandwidth.
//  * --sweep: every wgmma-engine choice (warpgroups, depth, resident
//    activations) per GEMM shape; --mma-models: each model step also with the
//    mma.sync engine (SWIFTSPEC_GEMM_ENGINE=mma); --pdl-early: also with GEMMs
//    releasing their dependents at entry (SWIFTSPEC_GEMM_PDL_EARLY=1); --untuned: also
//    with the untuned launch settings (SWIFTSPEC_STEP_TUNE=0: every PDL edge on, the
//    planner's GEMM plans; the PDL rows are tuned per bucket, CudaModelOptions::autotune,
//    and the choices are printed).
//  * --profile SHAPE [--profile-tree N [--attn-trace CSV]] [--profile-megakernel]: one greedy decode
//    step of SHAPE (as the decode megakernel with --profile-megakernel; then
//    a tree of N nodes, graph replayed 4 times) and nothing else, for ncu.
//  * --megakernel-only: no GEMMs; per shape the layered decode step (PDL) and
//    the megakernel step only. --megakernel-trace: also one traced megakernel
//    step per shape, its critical path per op kind. --mk-head-keys N: the
//    megakernel models' MegaPlan::head_keys (0: always split units + merge);
//    --mk-head-parts N: their CTAs per head in that mode (0: the plan's).
//    --mk-inflight N: weight chunks in flight per SM (-1: the plan's, 0: the whole ring).
//    --mk-slot-bytes N: bytes of one ring slot (0: the plan's).
//    --mk-hold N: ring slots of each op's last N chunks refilled only after the op's release (-1: the plan's).
//    --mk-hold-input 0|1: those refills wait for the next op's input instead (-1: the plan's).
//    --mk-attn-short 0|1: short attention parts in one round trip (-1: the plan's).
//    --mk-attn-prewait 0|1: a head part's committed K/V loads before its wait for QKV (-1: the plan's).
//    --mk-merge-in-o 0|1: a head's parts merged by the O projection's input load (-1: the plan's).
//    --mk-l2-prefetch N: bytes of its gate/up rows each CTA prefetches into L2 after its attention (-1: the plan's).
//    --mk-sm-count N: the megakernel models in a green context of the first N SMs (0: the whole GPU).
//    --mk-sweep I:S[:H[:U]],...: the megakernel step again per (inflight, slot bytes[, hold[, hold-input]]).
//    --megakernel-trace-csv DIR: the trace, and all its stamps as CSV files in DIR.
// Usage: swiftspec-cuda-bench [--json PATH] [--quick] [--no-gemm] [--sweep] [--mma-models] [--pdl-early] [--untuned]
//        [--megakernel-only] [--megakernel-trace] [--mk-head-keys N] [--mk-head-parts N] [--mk-inflight N] [--mk-slot-bytes N] [--mk-hold N] [--mk-hold-input U] [--mk-attn-short 0|1] [--mk-attn-prewait 0|1] [--mk-merge-in-o 0|1] [--mk-l2-prefetch N] [--mk-sm-count N] [--mk-sweep I:S[:H[:U]],...] [--context N] [--shapes qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b]
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(SWIFTSPEC_HAVE_CUBLAS)
#include <cublas_v2.h>
#endif

#include "common.h"
#include "device_memory.h"
#include "kernels/decode_megakernel.h"
#include "kernels/epilogues.h"
#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"
#include "swiftspec_cuda/cuda_model.h"
#include "tma_map.h"
#include "json_number.h"
#include "model_shapes.h"

using namespace swiftspec;
using namespace swiftspec::cuda;

namespace {

std::string g_json = "{\n";
bool g_first = true;
void json_kv(const std::string& key, const std::string& raw) {
  g_json += std::string(g_first ? "" : ",\n") + "  \"" + key + "\": " + raw;
  g_first = false;
}
double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median milliseconds of `f` (enqueues work on `st`) over `iters` runs.
template <class F>
double time_ms(cudaStream_t st, int iters, F f) {
  for (int i = 0; i < 3; ++i) f(i);
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) SS_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    SS_CUDA_CHECK(cudaEventRecord(ev[2 * i], st));
    f(i);
    SS_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], st));
  }
  SS_CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) SS_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  return median(ms);
}

double copy_bandwidth_tbs(cudaStream_t st) {
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer a(bytes), b(bytes);
  SS_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, bytes, st));
  const double ms = time_ms(st, 10, [&](int) {
    SS_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, st));
  });
  return 2.0 * bytes / (ms * 1e-3) / 1e12;
}

struct GemmRow {
  std::string name;
  int N, K, M;
  double ours_us, cublas_us, bytes, mma_us, best_us;
  std::string config, best_config;
};

/// `only`: run just the shape of that name (empty: all); `only_m`: just that M in 1..64 (0: 1, 16, 64).
std::vector<GemmRow> bench_gemms(cudaStream_t st, int num_sms, bool sweep, const std::string& only = "",
                                 int only_m = 0) {
  struct Shape {
    const char* name;
    int N, K;
  };
  const Shape shapes[] = {{"8B qkv", 6144, 4096}, {"8B o", 4096, 4096}, {"8B gate_up", 28672, 4096},
                          {"8B down", 4096, 14336}, {"8B lm_head", 128256, 4096},
                          {"0.5B qkv", 1152, 896}, {"0.5B gate_up", 9728, 896}, {"0.5B down", 896, 4864}};
  std::vector<GemmRow> rows;
#if defined(SWIFTSPEC_HAVE_CUBLAS)
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw CudaError("cublasCreate failed");
  cublasSetStream(h, st);
  DeviceBuffer cublas_ws(size_t(64) << 20);
  cublasSetWorkspace(h, cublas_ws.get(), cublas_ws.bytes());
#endif
  for (const Shape& s : shapes) {
    if (!only.empty() && only != s.name) continue;
    const size_t wbytes = size_t(s.N) * s.K * 2;
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t(400) << 20) / wbytes + 1));
    DeviceBuffer w(wbytes * copies), x(size_t(kMaxStepTokens) * s.K * 2), out(sizeof(float) * kMaxStepTokens * s.N);
    launch_fill_random_bf16(w.as<__nv_bfloat16>(), wbytes / 2 * copies, 0.02f, 7, st);
    launch_fill_random_bf16(x.as<__nv_bfloat16>(), size_t(kMaxStepTokens) * s.K, 1.0f, 8, st);
    // Any M in 1..64 with --gemm-m (e.g. the 32-token tree bucket); else 1, 16, 64.
    const std::vector<int> ms = only_m > 0 ? std::vector<int>{only_m} : std::vector<int>{1, 16, 64};
    for (int M : ms) {
      const int nt = M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8;
      const CUtensorMap xm = make_tma_map_bf16(x.get(), kMaxStepTokens, s.K, s.K, 8 * nt);
      GemmArgs a;
      a.N = s.N;
      a.K = s.K;
      a.m_active_max = M;
      EpiPlain::Params e;
      e.out = out.as<float>();
      e.ldo = s.N;
      // Median µs of one plan (weights rotated over `copies` buffers).
      auto time_plan = [&](const GemmConfig& c) {
        std::vector<CUtensorMap> wm;
        for (int i = 0; i < copies; ++i)
          wm.push_back(make_tma_map_bf16(w.as<unsigned char>() + wbytes * i, s.N, s.K, s.K, c.BR));
        return 1e3 * time_ms(st, 40, [&](int i) { launch_gemm<EpiPlain>(c, wm[i % copies], xm, a, e, false, st); });
      };
      auto desc = [](const GemmConfig& c) {
        char b[96];
        std::snprintf(b, sizeof b, "%s S=%d BR=%d st=%d xres=%d pa=%d grid=%d",
                      c.engine == GemmEngine::Wgmma ? "wgmma" : "mma", c.S, c.BR, c.stages, c.xres, c.palias, c.grid_x);
        return std::string(b);
      };
      const GemmConfig c = plan_gemm<EpiPlain>(s.N, s.K, nt, num_sms);
      const double ours_us = time_plan(c);
      GemmPlanHint hm;
      hm.engine = 0;
      const GemmConfig cm = plan_gemm<EpiPlain>(s.N, s.K, nt, num_sms, hm);
      const double mma_us = time_plan(cm);
      // Sweep of the wgmma engine's choices (calibrates the planner).
      double best_us = 1e30;
      std::string best;
      if (sweep && nt > 1) {
        GemmPlanHint hs;
        hs.engine = 1;
        hs.split_n = 1;
        const double us = time_plan(plan_gemm<EpiPlain>(s.N, s.K, nt, num_sms, hs));
        std::printf("  sweep %-13s M=%2d %-44s %8.1f us (%5.2f TB/s)\n", s.name, M, "default plan, n8 instructions only",
                    us, wbytes / (us * 1e-6) / 1e12);
      }
      if (sweep) {
        // Other K splits (not usable by the model unless gemm_slices changes:
        // the split is part of the matrix's arithmetic).
        for (int sl : {1, 2, 4, 8}) {
          if (sl == c.S || sl > s.K / 128) continue;
          GemmPlanHint h;
          h.slices = sl;
          const GemmConfig cv = plan_gemm<EpiPlain>(s.N, s.K, nt, num_sms, h);
          const double us = time_plan(cv);
          std::printf("  sweep %-13s M=%2d %-44s %8.1f us (%5.2f TB/s)\n", s.name, M, desc(cv).c_str(), us,
                      wbytes / (us * 1e-6) / 1e12);
        }
        for (int wg : {1, 2})
          for (int stg : {3, 4, 6, 8})
            for (int xr : {0, 1}) {
              GemmPlanHint h;
              h.engine = 1;
              h.wg = wg;
              h.stages = stg;
              h.xres = xr;
              GemmConfig cv;
              try {
                cv = plan_gemm<EpiPlain>(s.N, s.K, nt, num_sms, h);
              } catch (const std::exception&) {
                continue;
              }
              if (cv.xres != xr || cv.stages != stg) continue;  // did not fit
              const double us = time_plan(cv);
              std::printf("  sweep %-13s M=%2d %-44s %8.1f us (%5.2f TB/s)\n", s.name, M, desc(cv).c_str(), us,
                          wbytes / (us * 1e-6) / 1e12);
              if (us < best_us) {
                best_us = us;
                best = desc(cv);
              }
            }
      }
      const double ours = ours_us * 1e-3;
      double cub = -1;
#if defined(SWIFTSPEC_HAVE_CUBLAS)
      const float alpha = 1.f, beta = 0.f;
      cub = time_ms(st, 40, [&](int i) {
        const cublasStatus_t r = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, M, s.K, &alpha,
                                              w.as<unsigned char>() + wbytes * (i % copies), CUDA_R_16BF, s.K,
                                              x.get(), CUDA_R_16BF, s.K, &beta, out.get(), CUDA_R_32F, s.N,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (r != CUBLAS_STATUS_SUCCESS) throw CudaError("cublasGemmEx failed: status " + std::to_string(r));
      });
#endif
      rows.push_back({s.name, s.N, s.K, M, ours * 1e3, cub * 1e3, static_cast<double>(wbytes), mma_us, best_us, desc(c), best});
      std::printf("gemm %-13s N=%6d K=%6d M=%2d  ours %8.1f us (%5.2f TB/s)  mma %8.1f us (%5.2f TB/s)  cublas %8.1f us (%5.2f TB/s)  [%s]",
                  s.name, s.N, s.K, M, ours * 1e3, wbytes / (ours * 1e-3) / 1e12, mma_us, wbytes / (mma_us * 1e-6) / 1e12,
                  cub * 1e3, cub > 0 ? wbytes / (cub * 1e-3) / 1e12 : 0.0, desc(c).c_str());
      if (sweep) std::printf("  best %.1f us [%s]", best_us, best.c_str());
      std::printf("\n");
      std::fflush(stdout);
    }
  }
#if defined(SWIFTSPEC_HAVE_CUBLAS)
  cublasDestroy(h);
#endif
  return rows;
}

ForwardBatch decode_batch(int pos) {
  ForwardBatch b;
  b.tokens = {1234};
  b.positions = {pos};
  b.logits = LogitsMode::Last;
  return b;
}

/// A tree of n nodes under a context of `ctx`: a main chain with side branches
/// (depth about n/3), every node's logits (greedy verification reads all).
ForwardBatch tree_batch(int n, int ctx, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> parents(n), tokens(n);
  for (int i = 0; i < n; ++i) parents[i] = i == 0 ? -1 : (i % 3 == 0 ? static_cast<int>(g() % i) : i - 1);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(g() % 100000);
  return ForwardBatch::tree(tokens, parents, ctx);
}

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

struct ModelRow {
  std::string shape;
  double weight_gb, limit_ms, decode_ms, decode_nopdl_ms, host_ms, tree32_ms, tree64_ms;
  double tree32_nopdl_ms, tree64_nopdl_ms;  ///< the steps without programmatic dependent launch
  double mma_decode_ms, mma_tree32_ms, mma_tree64_ms;  ///< GEMM engine Mma (with PDL), if asked
  double early_decode_ms, early_tree32_ms, early_tree64_ms;  ///< GEMMs release dependents at entry
  double untuned_decode_ms, untuned_tree32_ms, untuned_tree64_ms;  ///< SWIFTSPEC_STEP_TUNE=0 (--untuned)
  std::string step_tuning;  ///< CudaModel::debug_step_tuning() of the PDL model, lines joined by "; "
  double mk_decode_ms, mk_host_ms;  ///< the decode megakernel (CudaModelOptions::megakernel)
  std::string mk_trace_json;        ///< per-op critical path (--megakernel-trace)
};

/// --mk-head-keys N: CudaModelOptions::megakernel_head_keys of every
/// megakernel model of the run (-1: the default; 0: split units and a merge).
int g_mk_head_keys = -1;
/// --mk-head-parts N: CudaModelOptions::megakernel_head_parts (0: the plan's).
int g_mk_head_parts = 0;
/// --mk-inflight N: CudaModelOptions::megakernel_max_inflight (-1: the plan's).
int g_mk_inflight = -1;
/// --mk-slot-bytes N: CudaModelOptions::megakernel_slot_bytes (0: the plan's).
int g_mk_slot_bytes = 0;
/// --mk-hold N: CudaModelOptions::megakernel_release_hold (-1: the plan's).
int g_mk_hold = -1;
/// --mk-hold-input U: CudaModelOptions::megakernel_hold_until_input (-1: the plan's).
int g_mk_hold_input = -1;
/// --mk-attn-short 0|1: CudaModelOptions::megakernel_attn_short (-1: the plan's).
int g_mk_attn_short = -1;
/// --mk-attn-prewait 0|1: CudaModelOptions::megakernel_attn_prewait (-1: the plan's).
int g_mk_attn_prewait = -1;
/// --mk-merge-in-o 0|1: CudaModelOptions::megakernel_merge_in_o (-1: the plan's).
int g_mk_merge_in_o = -1;
/// --mk-l2-prefetch N: CudaModelOptions::megakernel_l2_prefetch_bytes (-1: the plan's).
int g_mk_l2_prefetch = -1;
/// --mk-sm-count N: the megakernel models run in a green context of the first
/// N SMs (CudaModelOptions::sm_count; 0: the whole GPU) — a draft's partition
/// in one-GPU disaggregation; the grid has one CTA per SM of it.
int g_mk_sm_count = 0;

/// --mk-sweep I:S[:H[:U]],...: after each shape's megakernel step, the same
/// step again per (max_inflight, slot_bytes, release_hold, hold_until_input)
/// (H, U: -1 when left out;
/// A/B of the ring's settings in one process; with --megakernel-trace, each
/// one's trace summary too).
struct MkSweepItem {
  int inflight, slot_bytes, hold, hold_input;
};
std::vector<MkSweepItem> g_mk_sweep;

/// The megakernel flags of the command line into `co` (every megakernel model
/// of the run; set co.megakernel first).
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

/// --megakernel-trace-csv DIR: every stamp of each traced step as
/// DIR/mk_trace_<shape>[_<tag>].csv (layer, op, cta, arrive, start, end; ns
/// after the step's first start; -1 where a CTA has no such stamp; then the
/// ring's blocked waits for the op, ns: bytes, inflight, unconsumed, idle,
/// held as in ring_wait_summary).
std::string g_mk_trace_csv_dir;

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
  std::printf("megakernel ring  %-13s waits (us per layer, median|max over the CTAs with rows; bytes: consumers "
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
  auto stamp = [&](int slot, int cta, int which) { return static_cast<double>(t[(static_cast<size_t>(slot) * G + cta) * S + which]); };
  auto end_max = [&](int slot) { double v = 0; for (int c = 0; c < G; ++c) v = std::max(v, stamp(slot, c, 1)); return v; };
  auto start_max = [&](int slot) { double v = 0; for (int c = 0; c < G; ++c) v = std::max(v, stamp(slot, c, 0)); return v; };
  static const char* names[] = {"qkv", "attn_units", "split_merge", "o_proj", "gate_up", "down"};
  auto arrive_max = [&](int slot) { double v = 0; for (int c = 0; c < G; ++c) v = std::max(v, stamp(slot, c, 2)); return v; };
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
                       slot == L * ops ? "lm_head" : names[slot % ops], c, rel(stamp(slot, c, 2)), rel(stamp(slot, c, 0)),
                       rel(stamp(slot, c, 1)), ns(0), ns(1), ns(2), ns(3), ns(4));
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
  std::printf("megakernel trace %-13s total %.1f us, LM head %.1f us; per layer (us, segment / wake / arrive):", which.c_str(),
              total / 1e3, lm / 1e3);
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

ModelRow bench_model(const std::string& which, double bw_tbs, int ctx, bool quick, bool with_mma,
                     bool with_pdl_early, bool with_untuned, bool megakernel_only, bool mk_trace) {
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
  auto variant = [&](const char* env, const char* value, const char* label, double& dec, double& t32,
                     double& t64) {
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
  if (with_mma) variant("SWIFTSPEC_GEMM_ENGINE", "mma", "engine=mma", r.mma_decode_ms, r.mma_tree32_ms, r.mma_tree64_ms);
  if (with_pdl_early)
    variant("SWIFTSPEC_GEMM_PDL_EARLY", "1", "gemm-pdl-early", r.early_decode_ms, r.early_tree32_ms, r.early_tree64_ms);
  if (with_untuned)
    variant("SWIFTSPEC_STEP_TUNE", "0", "untuned", r.untuned_decode_ms, r.untuned_tree32_ms, r.untuned_tree64_ms);
  return r;
}

}  // namespace

/// The attention CTAs' phase stamps of the last step (CudaModelOptions::
/// attention_trace) as CSV at `path` (layers 8, 16, 24; CTAs that reached a
/// chunk; ns from the layer's first CTA past its grid dependency), and per
/// layer a summary on stdout: the kernel's span, the mean time of each phase
/// over the CTAs, and the phases of the CTA that ended last.
void write_attention_trace(CudaModel& m, int layers, const std::string& path) {
  std::vector<unsigned long long> t;
  const int kvh = m.debug_attention_trace(t);
  const size_t per_layer = static_cast<size_t>(kvh) * kMaxStepTokens * kAttnSplits * kAttnTraceStamps;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw std::runtime_error("--attn-trace: cannot write " + path);
  std::fprintf(f, "layer,kvh,blk,split,entry,dep,chunk,keys,scores,partial,arrival,end\n");
  static const char* phase[] = {"dep", "chunk", "keys", "scores", "partial", "arrival", "combine"};
  for (int l : {8, 16, 24}) {
    if (l >= layers) continue;
    const unsigned long long* L = t.data() + per_layer * l;
    unsigned long long t0 = ~0ull, tend = 0;
    size_t last = 0;
    double sum[7] = {0};
    int cnt[7] = {0}, active = 0;
    for (size_t c = 0; c < per_layer / kAttnTraceStamps; ++c) {
      const unsigned long long* r = L + c * kAttnTraceStamps;
      if (r[1]) t0 = std::min(t0, r[1]);
    }
    for (size_t c = 0; c < per_layer / kAttnTraceStamps; ++c) {
      const unsigned long long* r = L + c * kAttnTraceStamps;
      if (!r[2]) continue;  // no chunk: an idle CTA (or none at all)
      ++active;
      const unsigned long long e = r[7] > r[6] ? r[7] : r[6];  // r[7] of a CTA that did not combine may be stale
      if (e > tend) tend = e, last = c;
      for (int i = 0; i < 7; ++i)
        if (r[i] && r[i + 1] > r[i]) sum[i] += static_cast<double>(r[i + 1] - r[i]), ++cnt[i];
      const int h = static_cast<int>(c / (kMaxStepTokens * kAttnSplits));
      const int b = static_cast<int>(c / kAttnSplits % kMaxStepTokens), sp = static_cast<int>(c % kAttnSplits);
      std::fprintf(f, "%d,%d,%d,%d", l, h, b, sp);
      for (int i = 0; i < kAttnTraceStamps; ++i)
        std::fprintf(f, ",%lld", r[i] ? static_cast<long long>(r[i]) - static_cast<long long>(t0) : -1LL);
      std::fprintf(f, "\n");
    }
    std::printf("attention trace layer %d: %d active CTAs, span %.1f us; mean phase us:", l, active, (tend - t0) / 1e3);
    for (int i = 0; i < 7; ++i) std::printf(" %s %.2f", phase[i], cnt[i] ? sum[i] / cnt[i] / 1e3 : 0.0);
    const unsigned long long* r = L + last * kAttnTraceStamps;
    std::printf(" | last CTA (kvh %d, blk %d, split %d) from %.1f us:", static_cast<int>(last / (kMaxStepTokens * kAttnSplits)),
                static_cast<int>(last / kAttnSplits % kMaxStepTokens), static_cast<int>(last % kAttnSplits), (r[1] - t0) / 1e3);
    for (int i = 1; i < 7; ++i)
      if (r[i] && r[i + 1] > r[i]) std::printf(" %s %.2f", phase[i], (r[i + 1] - r[i]) / 1e3);
    std::printf("\n");
  }
  std::fclose(f);
}

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false, gemms = true, sweep = false, models_mma = false, models_pdl_early = false, models_untuned = false, mk_only = false;
  bool mk_trace = false;
  std::string profile;
  int profile_tree = 0;
  bool profile_megakernel = false;
  std::string attn_trace_path;
  std::string shapes;     // --shapes a,b: only these model shapes (default all three)
  std::string gemm_only;  // one GEMM shape by name (e.g. "8B o"), for a kernel profiler
  int gemm_m = 0;
  int bench_context = 512;  // --context N: committed keys of the model rows' steps
  std::string bad_int;      // the first integer flag whose value is not a whole integer
  // A flag's integer value, all of it: "12x" or "abc" is refused (std::atoi
  // would read them as 12 and 0, and a benchmark would run with a setting no
  // one asked for).
  const auto int_flag = [&](const std::string& flag, const char* text) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
      if (bad_int.empty()) bad_int = flag + " needs a whole integer, got '" + text + "'";
      return 0;
    }
    return static_cast<int>(v);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--quick") quick = true;
    if (a == "--no-gemm") gemms = false;
    if (a == "--sweep") sweep = true;
    if (a == "--mma-models") models_mma = true;
    if (a == "--pdl-early") models_pdl_early = true;
    if (a == "--untuned") models_untuned = true;
    if (a == "--shapes" && i + 1 < argc) shapes = argv[++i];
    if (a == "--megakernel-trace") mk_trace = true;
    if (a == "--megakernel-trace-csv" && i + 1 < argc) {
      g_mk_trace_csv_dir = argv[++i];
      mk_trace = true;
    }
    if (a == "--mk-head-keys" && i + 1 < argc) g_mk_head_keys = int_flag(a, argv[++i]);
    if (a == "--mk-head-parts" && i + 1 < argc) g_mk_head_parts = int_flag(a, argv[++i]);
    if (a == "--mk-inflight" && i + 1 < argc) g_mk_inflight = int_flag(a, argv[++i]);
    if (a == "--mk-slot-bytes" && i + 1 < argc) g_mk_slot_bytes = int_flag(a, argv[++i]);
    if (a == "--mk-hold" && i + 1 < argc) g_mk_hold = int_flag(a, argv[++i]);
    if (a == "--mk-hold-input" && i + 1 < argc) g_mk_hold_input = int_flag(a, argv[++i]);
    if (a == "--mk-attn-short" && i + 1 < argc) g_mk_attn_short = int_flag(a, argv[++i]);
    if (a == "--mk-attn-prewait" && i + 1 < argc) g_mk_attn_prewait = int_flag(a, argv[++i]);
    if (a == "--mk-merge-in-o" && i + 1 < argc) g_mk_merge_in_o = int_flag(a, argv[++i]);
    if (a == "--mk-l2-prefetch" && i + 1 < argc) g_mk_l2_prefetch = int_flag(a, argv[++i]);
    if (a == "--mk-sm-count" && i + 1 < argc) g_mk_sm_count = int_flag(a, argv[++i]);
    if (a == "--mk-sweep" && i + 1 < argc) {
      const std::string spec = argv[++i];
      size_t at = 0;
      while (at <= spec.size()) {
        const size_t comma = std::min(spec.find(',', at), spec.size());
        const std::string item = spec.substr(at, comma - at);
        std::vector<std::string> fields;  // INFLIGHT:SLOT_BYTES[:HOLD[:HOLD_INPUT]]
        for (size_t f = 0; f <= item.size();) {
          const size_t colon = std::min(item.find(':', f), item.size());
          fields.push_back(item.substr(f, colon - f));
          f = colon + 1;
        }
        if (fields.size() < 2 || fields.size() > 4) {
          bad_int = "--mk-sweep: item '" + item + "' is not INFLIGHT:SLOT_BYTES[:HOLD[:HOLD_INPUT]]";
          break;
        }
        while (fields.size() < 4) fields.push_back("-1");
        g_mk_sweep.push_back({int_flag(a, fields[0].c_str()), int_flag(a, fields[1].c_str()),
                              int_flag(a, fields[2].c_str()), int_flag(a, fields[3].c_str())});
        at = comma + 1;
      }
    }
    if (a == "--context" && i + 1 < argc) bench_context = int_flag(a, argv[++i]);
    if (a == "--megakernel-only") {
      mk_only = true;
      gemms = false;
    }
    if (a == "--profile" && i + 1 < argc) profile = argv[++i];
    if (a == "--profile-tree" && i + 1 < argc) profile_tree = int_flag(a, argv[++i]);
    if (a == "--profile-megakernel") profile_megakernel = true;
    if (a == "--attn-trace" && i + 1 < argc) attn_trace_path = argv[++i];
    if (a == "--gemm-only" && i + 1 < argc) gemm_only = argv[++i];
    if (a == "--gemm-m" && i + 1 < argc) gemm_m = int_flag(a, argv[++i]);
  }
  if (!bad_int.empty()) {
    std::fprintf(stderr, "%s\n", bad_int.c_str());
    return 2;
  }
  if (!g_mk_trace_csv_dir.empty() && !std::filesystem::is_directory(g_mk_trace_csv_dir)) {
    // Checked before the run: the CSVs are written minutes in, after the models.
    std::fprintf(stderr, "--megakernel-trace-csv: '%s' is not a directory\n", g_mk_trace_csv_dir.c_str());
    return 2;
  }
  if (bench_context < 1 || bench_context > 900) {
    std::fprintf(stderr, "--context must be 1..900 (the models are made with 1024 positions and 128 tree slots)\n");
    return 2;
  }
  if (g_mk_sm_count < 0 || g_mk_sm_count % 8 != 0) {
    // Green contexts split SMs in groups of 8 on Hopper (sm_partition.h).
    std::fprintf(stderr, "--mk-sm-count must be 0 (the whole GPU) or a positive multiple of 8, got %d\n", g_mk_sm_count);
    return 2;
  }
  if (gemm_m < 0 || gemm_m > kMaxStepTokens) {
    std::fprintf(stderr, "--gemm-m must be in 1..%d (got %d)\n", kMaxStepTokens, gemm_m);
    return 2;
  }
  if (!profile.empty()) {
    // One greedy decode step of SHAPE (for a kernel profiler such as ncu).
    try {
      ModelOptions opt;
      opt.max_context = 1024;
      opt.max_tree = 128;
      CudaModelOptions pco;
      pco.megakernel = profile_megakernel;
      apply_mk_flags(pco);
      pco.attention_trace = !attn_trace_path.empty();
      auto m = make_cuda_model_random(shape_config(profile), opt, pco, 42);
      m->debug_fill_committed_random(512, 43);
      std::vector<int32_t> am;
      m->forward_argmax(decode_batch(512), am);
      std::printf("profile %s: one decode step%s, argmax %d\n", profile.c_str(),
                  profile_megakernel ? " (decode megakernel)" : "", am.empty() ? -1 : am[0]);
      if (profile_tree > 0) {
        // Then 4 replays (3 warm-up + 1) of the graph of a tree of N nodes.
        m->truncate_committed(512);
        const int id = m->debug_prepare(tree_batch(profile_tree, 512, 6), false);
        if (!attn_trace_path.empty()) {
          std::vector<unsigned long long> stale;  // the tuning's and the decode step's stamps, cleared
          m->debug_attention_trace(stale);
        }
        std::printf("profile %s: tree of %d nodes %.4f ms\n", profile.c_str(), profile_tree, m->debug_replay_ms(id, 1));
        if (!attn_trace_path.empty()) write_attention_trace(*m, shape_config(profile).num_layers, attn_trace_path);
      }
    } catch (const std::exception& e) {
      std::printf("profile aborted: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  try {
    cudaDeviceProp prop;
    SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    SS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    json_kv("device", "\"" + std::string(prop.name) + "\"");
    const double bw = copy_bandwidth_tbs(st);
    std::printf("copy bandwidth (2 GiB D2D, read+write): %.3f TB/s\n", bw);
    json_kv("copy_bandwidth_tbs", num(bw));
    // The megakernel rows' SMs: a partition (--mk-sm-count) is not the whole
    // GPU that the limit and the layered rows use.
    json_kv("megakernel_sm_count", std::to_string(g_mk_sm_count > 0 ? g_mk_sm_count : prop.multiProcessorCount));
    if (g_mk_sm_count > 0)
      std::printf("megakernel models: a green context of SMs [0, %d) (--mk-sm-count); the rest of the GPU idle\n",
                  g_mk_sm_count);
    if (gemms) {
      const auto rows = bench_gemms(st, prop.multiProcessorCount, sweep, gemm_only, gemm_m);
      if (!gemm_only.empty()) return 0;  // a profiler run: the GEMM of one shape only
      std::string arr = "[";
      for (size_t i = 0; i < rows.size(); ++i) {
        const auto& g = rows[i];
        arr += std::string(i ? ",\n    " : "\n    ") + "{\"name\": \"" + g.name + "\", \"N\": " + num(g.N) +
               ", \"K\": " + num(g.K) + ", \"M\": " + num(g.M) + ", \"ours_us\": " + num(g.ours_us) +
               ", \"cublas_us\": " + num(g.cublas_us) + ", \"mma_engine_us\": " + num(g.mma_us) +
               ", \"sweep_best_us\": " + num(g.best_us < 1e29 ? g.best_us : -1) + ", \"config\": \"" + g.config +
               "\", \"sweep_best_config\": \"" + g.best_config + "\", \"weight_bytes\": " + num(g.bytes) + "}";
      }
      json_kv("gemm", arr + "\n  ]");
    }
    const int ctx = bench_context;
    std::vector<ModelRow> models;
    for (const char* w : {"qwen2.5-0.5b", "qwen2.5-1.5b", "llama3-8b"})
      if (shapes.empty() || ("," + shapes + ",").find("," + std::string(w) + ",") != std::string::npos) models.push_back(bench_model(w, bw, ctx, quick, models_mma, models_pdl_early, models_untuned, mk_only, mk_trace));
    std::string arr = "[";
    for (size_t i = 0; i < models.size(); ++i) {
      const auto& m = models[i];
      arr += std::string(i ? ",\n    " : "\n    ") + "{\"shape\": \"" + m.shape + "\", \"context\": " + num(ctx) +
             ", \"weight_gb\": " + num(m.weight_gb) + ", \"limit_ms\": " + num(m.limit_ms) +
             ", \"decode_ms\": " + num(m.decode_ms) + ", \"decode_no_pdl_ms\": " + num(m.decode_nopdl_ms) +
             ", \"host_sync_decode_ms\": " + num(m.host_ms) + ", \"frac_of_limit\": " + num(m.limit_ms / m.decode_ms) +
             (m.tree32_ms > 0 ? ", \"tree32_ms\": " + num(m.tree32_ms) + ", \"tree64_ms\": " + num(m.tree64_ms) : "") +
             (m.tree32_nopdl_ms > 0 ? ", \"tree32_no_pdl_ms\": " + num(m.tree32_nopdl_ms) +
                                          ", \"tree64_no_pdl_ms\": " + num(m.tree64_nopdl_ms)
                                    : "") +
             (m.mma_decode_ms > 0 ? ", \"mma_engine_decode_ms\": " + num(m.mma_decode_ms) : "") +
             (m.mma_tree32_ms > 0 ? ", \"mma_engine_tree32_ms\": " + num(m.mma_tree32_ms) +
                                        ", \"mma_engine_tree64_ms\": " + num(m.mma_tree64_ms) : "") +
             ", \"megakernel_decode_ms\": " + num(m.mk_decode_ms) + ", \"megakernel_host_sync_ms\": " + num(m.mk_host_ms) +
             ", \"megakernel_frac_of_limit\": " + num(m.limit_ms / m.mk_decode_ms) +
             (m.mk_trace_json.empty() ? "" : ", \"megakernel_trace\": " + m.mk_trace_json) +
             (m.early_decode_ms > 0 ? ", \"gemm_pdl_early_decode_ms\": " + num(m.early_decode_ms) : "") +
             (m.early_tree32_ms > 0 ? ", \"gemm_pdl_early_tree32_ms\": " + num(m.early_tree32_ms) +
                                          ", \"gemm_pdl_early_tree64_ms\": " + num(m.early_tree64_ms) : "") +
             (m.untuned_decode_ms > 0 ? ", \"untuned_decode_ms\": " + num(m.untuned_decode_ms) : "") +
             (m.untuned_tree32_ms > 0 ? ", \"untuned_tree32_ms\": " + num(m.untuned_tree32_ms) +
                                            ", \"untuned_tree64_ms\": " + num(m.untuned_tree64_ms) : "") +
             (m.step_tuning.empty() ? "" : ", \"step_tuning\": \"" + m.step_tuning + "\"") + "}";
    }
    json_kv("models", arr + "\n  ]");
    std::printf("\n%-14s %9s %9s %10s %10s %10s %8s %9s %9s %9s %8s\n", "shape", "weightsGB", "limit_ms", "decode_ms",
                "nopdl_ms", "host_ms", "%limit", "tree32x", "tree64x", "mk_ms", "mk%lim");
    for (const auto& m : models)
      std::printf("%-14s %9.3f %9.4f %10.4f %10.4f %10.4f %7.1f%% %9.3f %9.3f %9.4f %7.1f%%\n", m.shape.c_str(),
                  m.weight_gb, m.limit_ms, m.decode_ms, m.decode_nopdl_ms, m.host_ms, 100.0 * m.limit_ms / m.decode_ms,
                  m.tree32_ms / m.decode_ms, m.tree64_ms / m.decode_ms, m.mk_decode_ms,
                  100.0 * m.limit_ms / m.mk_decode_ms);
    cudaStreamDestroy(st);
  } catch (const std::exception& e) {
    std::printf("bench aborted: %s\n", e.what());
    json_kv("error", "\"" + std::string(e.what()) + "\"");
    g_json += "\n}\n";
    if (!json_path.empty()) {
      if (FILE* f = std::fopen(json_path.c_str(), "w")) { std::fputs(g_json.c_str(), f); std::fclose(f); }
    }
    return 1;
  }
  g_json += "\n}\n";
  if (!json_path.empty()) {
    if (FILE* f = std::fopen(json_path.c_str(), "w")) { std::fputs(g_json.c_str(), f); std::fclose(f); }
  }
  return 0;
}
