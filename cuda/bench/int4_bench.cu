// swiftspec-cuda-int4-bench: the int4-weight skinny GEMM (kernels/gemm_int4.h, issue 31)
// against its memory limit and against the bf16 skinny GEMM, random weights generated on
// the GPU, in one run on one machine.
//
// Per model shape (--shapes, default qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b), per projection
// (qkv, o, gate_up, down) and per M (--ms, default 1,16,64):
//   * int4: median of --iters launches (events around each), the weights rotated over
//     copies of > 400 MB so that L2 does not serve them;
//   * step bytes = int4 words (N*K/2) + group metadata (4*N*K/G) + activations (2*M*K);
//     limit = step bytes / the copy bandwidth of the same run (a 2 GiB device-to-device
//     cudaMemcpy, read + write); frac_of_limit = limit / time. The fp32 outputs (4*M*N,
//     an epilogue's choice) are reported, not counted;
//   * bf16 (unless --no-bf16): the bf16 skinny GEMM's default plan at the same shape and M,
//     weights rotated likewise; ratio = int4 / bf16;
//   * per model shape and M, the layer's four projections summed (int4, bf16, limit).
// --sweep: also every warps-per-CTA choice (2, 4, 8) of the int4 planner, per row.
// --model-steps: per model shape, the whole single-token decode step (the layered step, tuned as
//   at load, 512 committed keys, median of 200 graph replays) of a random bf16 model and of the
//   same shape with int4 projections of group --group (CudaModelOptions::int4_group_size), each
//   against its weight bytes per step (CudaModel::weight_bytes_per_step) over the copy bandwidth.
// Usage: swiftspec-cuda-int4-bench [--shapes a,b] [--ms 1,16,64] [--group G] [--iters N]
//        [--no-bf16] [--sweep] [--model-steps] [--json PATH]
// Exit status 2 on a bad flag, 1 on a CUDA error.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "copy_bandwidth.h"
#include "device_memory.h"
#include "json_number.h"
#include "kernels/epilogues.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"
#include "list_flag.h"
#include "model_shapes.h"
#include "step_desc.h"
#include "swiftspec_cuda/cuda_model.h"
#include "tma_map.h"

using namespace swiftspec;
using namespace swiftspec::cuda;

namespace {

bool parse_int(const std::string& text, int& v) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE || x < INT_MIN || x > INT_MAX) return false;
  v = static_cast<int>(x);
  return true;
}

/// Median microseconds of `f(i)` (enqueues one launch on `st`) over `iters` runs, after 3 warm-ups.
template <class F>
double time_us(cudaStream_t st, int iters, F f) {
  for (int i = 0; i < 3; ++i) f(i);
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) SS_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    SS_CUDA_CHECK(cudaEventRecord(ev[2 * i], st));
    f(i + 3);
    SS_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], st));
  }
  SS_CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) SS_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

int bucket_nt(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

struct Row {
  std::string model, name, config;
  int N, K, M;
  double int4_us, bf16_us, bytes, out_bytes, limit_us;
};

/// --model-steps (see the header): prints a table, returns the JSON array's items.
std::string bench_model_steps(const std::vector<std::string>& names, const std::vector<ModelConfig>& models, int group,
                              double bw_tbs) {
  std::string arr;
  std::printf("\n%-14s %9s %9s %7s %9s %9s %7s %9s\n", "decode step", "bf16_ms", "limit_ms", "%limit", "int4_ms",
              "limit_ms", "%limit", "int4/bf16");
  for (size_t i = 0; i < models.size(); ++i) {
    ModelOptions opt;
    opt.max_context = 1024;
    opt.max_tree = 64;
    double ms[2], gb[2];
    for (int q = 0; q < 2; ++q) {
      CudaModelOptions co;
      if (q == 1) {
        co.int4_group_size = group;
        co.large_prefill = false;
      }
      auto m = make_cuda_model_random(models[i], opt, co, 42);
      m->debug_fill_committed_random(512, 43);
      ForwardBatch b;
      b.tokens = {1};
      b.positions = {512};
      b.logits = LogitsMode::Last;
      ms[q] = m->debug_replay_ms(m->debug_prepare(b, false), 200);
      gb[q] = static_cast<double>(m->weight_bytes_per_step()) / 1e9;
    }
    const double lim0 = gb[0] / bw_tbs, lim1 = gb[1] / bw_tbs;  // GB / (TB/s) = ms
    std::printf("%-14s %9.4f %9.4f %6.1f%% %9.4f %9.4f %6.1f%% %9.3f\n", names[i].c_str(), ms[0], lim0,
                100.0 * lim0 / ms[0], ms[1], lim1, 100.0 * lim1 / ms[1], ms[1] / ms[0]);
    std::fflush(stdout);
    arr += std::string(arr.empty() ? "\n    " : ",\n    ") + "{\"shape\": \"" + names[i] +
           "\", \"bf16_ms\": " + num(ms[0]) + ", \"bf16_weight_gb\": " + num(gb[0]) +
           ", \"bf16_limit_ms\": " + num(lim0) + ", \"int4_ms\": " + num(ms[1]) +
           ", \"int4_weight_gb\": " + num(gb[1]) + ", \"int4_limit_ms\": " + num(lim1) +
           ", \"int4_over_bf16\": " + num(ms[1] / ms[0]) + "}";
  }
  return arr;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, shapes = "qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b", ms_list = "1,16,64";
  int group = 128, iters = 40;
  bool with_bf16 = true, sweep = false, model_steps = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--json" && has)
      json_path = argv[++i];
    else if (a == "--shapes" && has)
      shapes = argv[++i];
    else if (a == "--ms" && has)
      ms_list = argv[++i];
    else if (a == "--group" && has) {
      if (!parse_int(argv[++i], group)) {
        std::fprintf(stderr, "--group needs an integer\n");
        return 2;
      }
    } else if (a == "--iters" && has) {
      if (!parse_int(argv[++i], iters) || iters < 1) {
        std::fprintf(stderr, "--iters needs a positive integer\n");
        return 2;
      }
    } else if (a == "--no-bf16")
      with_bf16 = false;
    else if (a == "--sweep")
      sweep = true;
    else if (a == "--model-steps")
      model_steps = true;
    else {
      std::fprintf(stderr,
                   "unknown flag '%s'\nusage: swiftspec-cuda-int4-bench [--shapes a,b] [--ms 1,16,64] "
                   "[--group G] [--iters N] [--no-bf16] [--sweep] [--model-steps] [--json PATH]\n",
                   a.c_str());
      return 2;
    }
  }
  std::vector<int> Ms;
  for (const auto& m : split_list(ms_list)) {
    int v = 0;
    if (!parse_int(m, v) || v < 1 || v > kMaxStepTokens) {
      std::fprintf(stderr, "--ms: '%s' is not in 1..%d\n", m.c_str(), kMaxStepTokens);
      return 2;
    }
    Ms.push_back(v);
  }
  std::vector<ModelConfig> models;
  try {
    for (const auto& s : split_list(shapes)) models.push_back(shape_config(s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "--shapes: %s\n", e.what());
    return 2;
  }

  std::string json = "{\n";
  std::vector<Row> rows;
  double bw = 0;
  try {
    cudaDeviceProp prop;
    SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    bw = copy_bandwidth_tbs(0);
    std::printf("device: %s, %d SMs, L2 %d MB\ncopy bandwidth (2 GiB D2D, read+write): %.3f TB/s\n", prop.name, sms,
                prop.l2CacheSize >> 20, bw);
    json += "  \"device\": \"" + std::string(prop.name) + "\",\n  \"copy_bandwidth_tbs\": " + num(bw) +
            ",\n  \"group_size\": " + num(group) + ",\n";
    cudaStream_t st;
    SS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    constexpr int R = kMaxStepTokens;
    const std::vector<std::string> shape_names = split_list(shapes);
    for (size_t mi = 0; mi < models.size(); ++mi) {
      const ModelConfig& c = models[mi];
      const int H = c.hidden_size, I = c.intermediate_size;
      const int nq = c.num_heads * c.head_dim, nkv = c.num_kv_heads * c.head_dim;
      struct Mat {
        const char* name;
        int N, K;
      };
      const Mat mats[] = {{"qkv", nq + 2 * nkv, H}, {"o", H, nq}, {"gate_up", 2 * I, H}, {"down", H, I}};
      for (const Mat& m : mats) {
        const int N = m.N, K = m.K;
        check_int4_shape(N, K, group);
        const size_t qbytes = size_t(N) * K / 2, mbytes = size_t(N) * (K / group) * 4;
        const int copies = static_cast<int>(std::max<size_t>(2, (size_t(400) << 20) / (qbytes + mbytes) + 1));
        DeviceBuffer qw(qbytes * copies), meta(mbytes * copies), x(size_t(R) * K * 2), out(sizeof(float) * R * N);
        std::vector<Int4View> views(copies);
        for (int i = 0; i < copies; ++i) {
          views[i] = {reinterpret_cast<const uint32_t*>(qw.as<uint8_t>() + qbytes * i),
                      reinterpret_cast<const uint32_t*>(meta.as<uint8_t>() + mbytes * i), N, K, group};
          launch_fill_random_int4(views[i], 1000 + i, st);
        }
        launch_fill_random_bf16(x.as<__nv_bfloat16>(), size_t(R) * K, 1.0f, 9, st);
        // bf16 weights for the comparison, rotated likewise.
        const size_t wbytes = size_t(N) * K * 2;
        const int bcopies = with_bf16 ? static_cast<int>(std::max<size_t>(2, (size_t(400) << 20) / wbytes + 1)) : 0;
        DeviceBuffer wb(wbytes * bcopies);
        if (with_bf16) launch_fill_random_bf16(wb.as<__nv_bfloat16>(), wbytes / 2 * bcopies, 0.02f, 7, st);
        for (int M : Ms) {
          const int nt = bucket_nt(M);
          const CUtensorMap xm = make_tma_map_bf16(x.get(), R, K, K, 8 * nt);
          GemmArgs a;
          a.N = N;
          a.K = K;
          a.m_active_max = M;
          EpiPlain::Params e;
          e.out = out.as<float>();
          e.ldo = N;
          auto time_int4 = [&](const Int4GemmConfig& cfg) {
            return time_us(st, iters,
                           [&](int i) { launch_gemm_int4<EpiPlain>(cfg, views[i % copies], xm, a, e, false, st); });
          };
          const Int4GemmConfig cfg = plan_gemm_int4<EpiPlain>(N, K, group, nt, sms);
          const double us = time_int4(cfg);
          double bus = -1;
          if (with_bf16) {
            const GemmConfig bc = plan_gemm<EpiPlain>(N, K, nt, sms);
            std::vector<CUtensorMap> wm;
            for (int i = 0; i < bcopies; ++i)
              wm.push_back(make_tma_map_bf16(wb.as<uint8_t>() + wbytes * i, N, K, K, bc.BR));
            bus = time_us(st, iters, [&](int i) { launch_gemm<EpiPlain>(bc, wm[i % bcopies], xm, a, e, false, st); });
          }
          const double bytes = double(qbytes) + double(mbytes) + 2.0 * M * K;
          const double limit_us = bytes / (bw * 1e12) * 1e6;
          char desc[96];
          std::snprintf(desc, sizeof desc, "S=%d BR=%d warps=%d stages=%d grid=%dx%d", cfg.S, cfg.BR, cfg.WR,
                        cfg.stages, cfg.grid_x, cfg.S);
          rows.push_back({shape_names[mi], m.name, desc, N, K, M, us, bus, bytes, 4.0 * M * N, limit_us});
          std::printf(
              "int4 %-13s %-8s N=%6d K=%6d M=%2d  %8.2f us  limit %7.2f us (%5.1f%%, %5.2f TB/s)  bf16 %8.2f us  "
              "int4/bf16 %.3f  [%s]\n",
              shape_names[mi].c_str(), m.name, N, K, M, us, limit_us, 100.0 * limit_us / us, bytes / (us * 1e-6) / 1e12,
              bus, bus > 0 ? us / bus : -1.0, desc);
          if (sweep) {
            for (int wr : {2, 4, 8}) {
              Int4PlanHint h;
              h.warps = wr;
              const Int4GemmConfig cv = plan_gemm_int4<EpiPlain>(N, K, group, nt, sms, h);
              const double v = time_int4(cv);
              std::printf("  sweep warps=%d BR=%d grid=%dx%d stages=%d: %8.2f us (%5.1f%% of limit)\n", wr, cv.BR,
                          cv.grid_x, cv.S, cv.stages, v, 100.0 * limit_us / v);
            }
          }
          std::fflush(stdout);
        }
      }
    }
    cudaStreamDestroy(st);
  } catch (const std::exception& e) {
    std::printf("int4 bench aborted: %s\n", e.what());
    json += "  \"error\": \"" + std::string(e.what()) + "\",\n";
  }
  // Per model shape and M: the layer's four projections.
  std::string arr, layers;
  std::printf("\n%-14s %3s %11s %11s %11s %8s %10s\n", "shape", "M", "int4_us", "limit_us", "bf16_us", "%limit",
              "int4/bf16");
  for (const auto& r : rows) {
    arr += std::string(arr.empty() ? "\n    " : ",\n    ") + "{\"shape\": \"" + r.model + "\", \"name\": \"" + r.name +
           "\", \"N\": " + num(r.N) + ", \"K\": " + num(r.K) + ", \"M\": " + num(r.M) +
           ", \"int4_us\": " + num(r.int4_us) + ", \"bytes\": " + num(r.bytes) +
           ", \"out_bytes\": " + num(r.out_bytes) + ", \"limit_us\": " + num(r.limit_us) +
           ", \"frac_of_limit\": " + num(r.limit_us / r.int4_us) + ", \"bf16_us\": " + num(r.bf16_us) +
           ", \"int4_over_bf16\": " + num(r.bf16_us > 0 ? r.int4_us / r.bf16_us : -1) + ", \"config\": \"" + r.config +
           "\"}";
  }
  std::vector<std::string> seen;
  for (const auto& r : rows) {
    const std::string key = r.model + "/" + std::to_string(r.M);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    double i4 = 0, bf = 0, lim = 0;
    for (const auto& q : rows)
      if (q.model == r.model && q.M == r.M) {
        i4 += q.int4_us;
        bf += q.bf16_us;
        lim += q.limit_us;
      }
    std::printf("%-14s %3d %11.2f %11.2f %11.2f %7.1f%% %10.3f\n", r.model.c_str(), r.M, i4, lim, bf > 0 ? bf : -1.0,
                100.0 * lim / i4, bf > 0 ? i4 / bf : -1.0);
    layers += std::string(layers.empty() ? "\n    " : ",\n    ") + "{\"shape\": \"" + r.model +
              "\", \"M\": " + num(r.M) + ", \"int4_us\": " + num(i4) + ", \"limit_us\": " + num(lim) +
              ", \"frac_of_limit\": " + num(lim / i4) + ", \"bf16_us\": " + num(bf > 0 ? bf : -1) +
              ", \"int4_over_bf16\": " + num(bf > 0 ? i4 / bf : -1) + "}";
  }
  std::string steps;
  if (model_steps && bw > 0) {
    try {
      steps = ",\n  \"model_steps\": [" + bench_model_steps(split_list(shapes), models, group, bw) + "\n  ]";
    } catch (const std::exception& e) {
      std::printf("int4 model steps aborted: %s\n", e.what());
      json += "  \"error\": \"model steps: " + std::string(e.what()) + "\",\n";
    }
  }
  json += "  \"gemm\": [" + arr + "\n  ],\n  \"layer_projections\": [" + layers + "\n  ]" + steps + "\n}\n";
  if (!json_path.empty()) {
    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  return json.find("\"error\"") == std::string::npos ? 0 : 1;
}
