// swiftspec-cuda-bench: latency of the CUDA backend with random weights
// generated on the GPU (no files), against the physical limit measured in the
// same run.
// This file parses the flags and writes the report; bench_gemm.cu and bench_models.cu
// measure the rows.
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
//  * --profile SHAPE [--profile-tree N] [--profile-megakernel]: one greedy decode
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
//        [--megakernel-only] [--megakernel-trace] [--mk-head-keys N] [--mk-head-parts N] [--mk-inflight N]
//        [--mk-slot-bytes N] [--mk-hold N] [--mk-hold-input U] [--mk-attn-short 0|1] [--mk-attn-prewait 0|1]
//        [--mk-merge-in-o 0|1] [--mk-l2-prefetch N] [--mk-sm-count N] [--mk-sweep I:S[:H[:U]],...] [--context N]
//        [--shapes qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b]
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "common.h"
#include "cuda_bench.h"
#include "json_number.h"
#include "model_shapes.h"
#include "step_desc.h"

using namespace swiftspec;
using namespace swiftspec::cuda;
using namespace cuda_bench;

namespace {

std::string g_json = "{\n";
bool g_first = true;
void json_kv(const std::string& key, const std::string& raw) {
  g_json += std::string(g_first ? "" : ",\n") + "  \"" + key + "\": " + raw;
  g_first = false;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false, gemms = true, sweep = false, models_mma = false, models_pdl_early = false, models_untuned = false,
       mk_only = false;
  bool mk_trace = false;
  std::string profile;
  int profile_tree = 0;
  bool profile_megakernel = false;
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
    std::fprintf(stderr, "--mk-sm-count must be 0 (the whole GPU) or a positive multiple of 8, got %d\n",
                 g_mk_sm_count);
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
        std::printf("profile %s: tree of %d nodes %.4f ms\n", profile.c_str(), profile_tree, m->debug_replay_ms(id, 1));
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
      if (shapes.empty() || ("," + shapes + ",").find("," + std::string(w) + ",") != std::string::npos)
        models.push_back(
            bench_model(w, bw, ctx, quick, models_mma, models_pdl_early, models_untuned, mk_only, mk_trace));
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
                                        ", \"mma_engine_tree64_ms\": " + num(m.mma_tree64_ms)
                                  : "") +
             ", \"megakernel_decode_ms\": " + num(m.mk_decode_ms) +
             ", \"megakernel_host_sync_ms\": " + num(m.mk_host_ms) +
             ", \"megakernel_frac_of_limit\": " + num(m.limit_ms / m.mk_decode_ms) +
             (m.mk_trace_json.empty() ? "" : ", \"megakernel_trace\": " + m.mk_trace_json) +
             (m.early_decode_ms > 0 ? ", \"gemm_pdl_early_decode_ms\": " + num(m.early_decode_ms) : "") +
             (m.early_tree32_ms > 0 ? ", \"gemm_pdl_early_tree32_ms\": " + num(m.early_tree32_ms) +
                                          ", \"gemm_pdl_early_tree64_ms\": " + num(m.early_tree64_ms)
                                    : "") +
             (m.untuned_decode_ms > 0 ? ", \"untuned_decode_ms\": " + num(m.untuned_decode_ms) : "") +
             (m.untuned_tree32_ms > 0 ? ", \"untuned_tree32_ms\": " + num(m.untuned_tree32_ms) +
                                            ", \"untuned_tree64_ms\": " + num(m.untuned_tree64_ms)
                                      : "") +
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
      if (FILE* f = std::fopen(json_path.c_str(), "w")) {
        std::fputs(g_json.c_str(), f);
        std::fclose(f);
      }
    }
    return 1;
  }
  g_json += "\n}\n";
  if (!json_path.empty()) {
    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fputs(g_json.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
