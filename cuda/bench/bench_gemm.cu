// swiftspec-cuda-bench's copy bandwidth (the physical limit's denominator) and its skinny
// GEMM rows: ours (wgmma and mma.sync engines) vs cuBLAS, and --sweep's plan sweep.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#if defined(SWIFTSPEC_HAVE_CUBLAS)
#include <cublas_v2.h>
#endif

#include "common.h"
#include "cuda_bench.h"
#include "device_memory.h"
#include "kernels/epilogues.h"
#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"
#include "tma_map.h"

using namespace swiftspec;
using namespace swiftspec::cuda;

namespace cuda_bench {

namespace {

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

}  // namespace

double copy_bandwidth_tbs(cudaStream_t st) {
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer a(bytes), b(bytes);
  SS_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, bytes, st));
  const double ms = time_ms(
      st, 10, [&](int) { SS_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, st)); });
  return 2.0 * bytes / (ms * 1e-3) / 1e12;
}

std::vector<GemmRow> bench_gemms(cudaStream_t st, int num_sms, bool sweep, const std::string& only, int only_m) {
  struct Shape {
    const char* name;
    int N, K;
  };
  const Shape shapes[] = {{"8B qkv", 6144, 4096},      {"8B o", 4096, 4096},         {"8B gate_up", 28672, 4096},
                          {"8B down", 4096, 14336},    {"8B lm_head", 128256, 4096}, {"0.5B qkv", 1152, 896},
                          {"0.5B gate_up", 9728, 896}, {"0.5B down", 896, 4864}};
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
        std::printf("  sweep %-13s M=%2d %-44s %8.1f us (%5.2f TB/s)\n", s.name, M,
                    "default plan, n8 instructions only", us, wbytes / (us * 1e-6) / 1e12);
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
        const cublasStatus_t r =
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, M, s.K, &alpha,
                         w.as<unsigned char>() + wbytes * (i % copies), CUDA_R_16BF, s.K, x.get(), CUDA_R_16BF, s.K,
                         &beta, out.get(), CUDA_R_32F, s.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (r != CUBLAS_STATUS_SUCCESS) throw CudaError("cublasGemmEx failed: status " + std::to_string(r));
      });
#endif
      rows.push_back(
          {s.name, s.N, s.K, M, ours * 1e3, cub * 1e3, static_cast<double>(wbytes), mma_us, best_us, desc(c), best});
      std::printf(
          "gemm %-13s N=%6d K=%6d M=%2d  ours %8.1f us (%5.2f TB/s)  mma %8.1f us (%5.2f TB/s)  cublas %8.1f us (%5.2f "
          "TB/s)  [%s]",
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

}  // namespace cuda_bench
