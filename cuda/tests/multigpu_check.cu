// swiftspec-cuda-multigpu-check: correctness of the multi-GPU parts (issue 7)
// on every GPU count available, against host references.
//
//  1. NCCL group (make_nccl_group): fp32 and bf16 all-reduce, gather, barrier,
//     abort() -> CommAborted on every rank, reset() -> usable again.
//  2. Peer all-reduce (PeerGroup, one-shot over NVLink peer access), 13 to
//     512 Ki bf16 elements (8 KB - 1 MB and odd tails): captured as a CUDA
//     graph per rank and replayed 3 times with fresh inputs (epoch reuse),
//     plus eager launches in between; outputs poisoned before every run;
//     checked BIT-EXACT against the host's emulation (fp32 sum of the bf16
//     inputs in rank order, rounded once to bf16), bit-identical across
//     ranks, relative error vs a double sum < 1e-2. The same with several
//     ranks on GPU 0 (the protocol on a one-GPU machine).
//  3. Row-parallel GEMM (Y = sum_r X_r W_r^T, bf16, fp32 accumulation) at the
//     Llama-3-8B O / down projection shapes split over the TP degree, M = 1, 7,
//     64: fused all-reduce epilogue (fp32 output; residual output with h16 and
//     RMSNorm statistics), the two-kernel path (GEMM partials into the
//     symmetric buffer, then the all-reduce + residual kernel: bit-identical
//     to the fused residual output), GEMM + ncclAllReduce, GEMM + peer
//     all-reduce; all
//     against a double-precision host product: relative error < 1e-2, no
//     unwritten (poisoned) element, rows >= M untouched, fused results
//     bit-identical across ranks, row 0 bit-identical for M = 1 and M = 64.
// Relative error = ||out - ref||_F / ||ref||_F.
// Usage: swiftspec-cuda-multigpu-check [--gpus N] [--json PATH]. Exit status 1
// if any check fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "device_memory.h"
#include "graph_cache.h"
#include "kernels/gemm_skinny.h"
#include "multigpu/epi_allreduce.h"
#include "multigpu/peer_allreduce.h"
#include "multigpu/rank_threads.h"
#include "step_desc.h"
#include "tma_map.h"

#if defined(SWIFTSPEC_HAVE_NCCL)
#include <nccl.h>

#include "swiftspec_cuda/nccl_group.h"
#endif

using namespace swiftspec;
using namespace swiftspec::cuda;

namespace {

// ---------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------
struct Result {
  std::string name;
  double err;
  double limit;
  bool pass;
  std::string detail;
};
std::vector<Result> g_results;

void record(const std::string& name, double err, double limit, bool pass, const std::string& detail = "") {
  g_results.push_back({name, err, limit, pass, detail});
  std::printf("CHECK %-62s err=%.3e limit=%.1e %s %s\n", name.c_str(), err, limit, pass ? "PASS" : "FAIL",
              detail.c_str());
  std::fflush(stdout);
}

void write_json(const std::string& path, int gpus) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  std::fprintf(f, "{\n  \"gpus\": %d,\n  \"checks\": [\n", gpus);
  for (size_t i = 0; i < g_results.size(); ++i) {
    const Result& r = g_results[i];
    std::string d;
    for (char c : r.detail) d += (c == '"' || c == '\\') ? '\'' : c;
    std::fprintf(f, "    {\"name\": \"%s\", \"err\": %.6e, \"limit\": %.1e, \"pass\": %s, \"detail\": \"%s\"}%s\n",
                 r.name.c_str(), std::isfinite(r.err) ? r.err : -1.0, r.limit, r.pass ? "true" : "false", d.c_str(),
                 i + 1 < g_results.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

// ---------------------------------------------------------------------------
// Host numerics
// ---------------------------------------------------------------------------
uint16_t f2bf(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf2f(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  /// Uniform in +-[0.05, 1] * scale: never zero.
  float sym(float scale) {
    std::uniform_real_distribution<float> u(0.05f, 1.0f);
    const float m = u(g) * scale;
    return (g() & 1) ? m : -m;
  }
};

std::vector<uint16_t> random_bf16(size_t n, float scale, Rng& rng) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f2bf(rng.sym(scale));
  return v;
}

template <class F>
void parallel_for(int n, F f) {
  const int nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      for (int i = t; i < n; i += nt) f(i);
    });
  for (auto& x : th) x.join();
}

/// ||out - ref|| / ||ref||; non-finite outputs counted in *bad and skipped.
double rel_err(const std::vector<float>& out, const std::vector<double>& ref, size_t* bad) {
  double num = 0, den = 0;
  size_t nb = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      ++nb;
      continue;
    }
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  *bad = nb;
  return std::sqrt(num / std::max(den, 1e-300));
}

std::string fmt_bad(size_t bad, size_t mism = 0) {
  std::string s;
  if (bad) s += "non-finite=" + std::to_string(bad) + " ";
  if (mism) s += "rank-mismatch=" + std::to_string(mism) + " ";
  return s;
}

std::vector<float> to_float(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf2f(v[i]);
  return f;
}

template <class T>
void upload(void* dst, const std::vector<T>& v, cudaStream_t st) {
  SS_CUDA_CHECK(cudaMemcpyAsync(dst, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice, st));
  SS_CUDA_CHECK(cudaStreamSynchronize(st));
}
template <class T>
std::vector<T> download(const void* src, size_t n, cudaStream_t st) {
  std::vector<T> v(n);
  SS_CUDA_CHECK(cudaMemcpyAsync(v.data(), src, sizeof(T) * n, cudaMemcpyDeviceToHost, st));
  SS_CUDA_CHECK(cudaStreamSynchronize(st));
  return v;
}

/// Per-rank streams of a group (created on each rank's device).
struct Streams {
  std::vector<cudaStream_t> s;
  std::vector<int> dev;
  explicit Streams(const std::vector<int>& devices) : s(devices.size()), dev(devices) {
    for (size_t r = 0; r < devices.size(); ++r) {
      SS_CUDA_CHECK(cudaSetDevice(devices[r]));
      SS_CUDA_CHECK(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking));
    }
  }
  ~Streams() {
    for (size_t r = 0; r < s.size(); ++r) {
      cudaSetDevice(dev[r]);
      cudaStreamSynchronize(s[r]);
      cudaStreamDestroy(s[r]);
    }
  }
};

std::string devs_str(const std::vector<int>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------
// 1. NCCL group
// ---------------------------------------------------------------------------
#if defined(SWIFTSPEC_HAVE_NCCL)
void check_nccl(const std::vector<int>& devs, Rng& rng) {
  const int n = static_cast<int>(devs.size());
  const std::string tag = "nccl tp" + std::to_string(n) + " ";
  auto comms = make_nccl_group(devs);
  // fp32 all-reduce
  const size_t cnt = 1000;
  std::vector<std::vector<float>> in(n, std::vector<float>(cnt));
  std::vector<double> ref(cnt, 0.0);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < cnt; ++i) {
      in[r][i] = rng.sym(1.0f);
      ref[i] += in[r][i];
    }
  std::vector<std::vector<float>> out(n);
  run_ranks(devs, [&](int r) {
    DeviceBuffer b(sizeof(float) * cnt);
    cudaStream_t st = static_cast<cudaStream_t>(comms[r]->stream());
    upload(b.get(), in[r], st);
    comms[r]->all_reduce_sum(b.as<float>(), cnt);
    out[r] = download<float>(b.get(), cnt, st);
  });
  size_t bad = 0, mism = 0;
  const double e32 = rel_err(out[0], ref, &bad);
  for (int r = 1; r < n; ++r) mism += std::memcmp(out[r].data(), out[0].data(), 4 * cnt) != 0;
  record(tag + "all_reduce_sum fp32 x1000", e32, 1e-6, e32 < 1e-6 && !bad && !mism, fmt_bad(bad, mism));

  // bf16 all-reduce
  const size_t cb = 4096;
  std::vector<std::vector<uint16_t>> inb(n);
  std::vector<double> refb(cb, 0.0);
  for (int r = 0; r < n; ++r) {
    inb[r] = random_bf16(cb, 1.0f, rng);
    for (size_t i = 0; i < cb; ++i) refb[i] += bf2f(inb[r][i]);
  }
  std::vector<std::vector<uint16_t>> outb(n);
  run_ranks(devs, [&](int r) {
    DeviceBuffer b(2 * cb);
    cudaStream_t st = static_cast<cudaStream_t>(comms[r]->stream());
    upload(b.get(), inb[r], st);
    comms[r]->all_reduce_sum_bf16(b.get(), cb);
    outb[r] = download<uint16_t>(b.get(), cb, st);
  });
  mism = 0;
  const double eb = rel_err(to_float(outb[0]), refb, &bad);
  for (int r = 1; r < n; ++r) mism += outb[r] != outb[0];
  record(tag + "all_reduce_sum_bf16 x4096", eb, 1e-2, eb < 1e-2 && !bad && !mism, fmt_bad(bad, mism));

  // gather to the last rank
  const int root = n - 1;
  const size_t cg = 100;
  std::vector<float> gathered;
  run_ranks(devs, [&](int r) {
    DeviceBuffer s(sizeof(float) * cg), d(sizeof(float) * cg * n);
    cudaStream_t st = static_cast<cudaStream_t>(comms[r]->stream());
    upload(s.get(), std::vector<float>(in[r].begin(), in[r].begin() + cg), st);
    comms[r]->gather(s.as<float>(), d.as<float>(), cg, root);
    if (r == root)
      gathered = download<float>(d.get(), cg * n, st);
    else
      SS_CUDA_CHECK(cudaStreamSynchronize(st));
  });
  size_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < cg; ++i) wrong += gathered[r * cg + i] != in[r][i];
  record(tag + "gather x100 to the last rank", static_cast<double>(wrong), 0, wrong == 0,
         wrong ? std::to_string(wrong) + " wrong" : "");

  // barrier, abort, reset
  run_ranks(devs, [&](int r) { comms[r]->barrier(); });
  comms[0]->abort();
  std::vector<int> threw(n, 0);
  run_ranks(devs, [&](int r) {
    try {
      comms[r]->barrier();
    } catch (const CommAborted&) {
      threw[r] = 1;
    }
  });
  int nthrew = 0;
  for (int t : threw) nthrew += t;
  comms[n - 1]->reset();
  std::vector<std::vector<float>> again(n);
  run_ranks(devs, [&](int r) {
    DeviceBuffer b(sizeof(float) * cnt);
    cudaStream_t st = static_cast<cudaStream_t>(comms[r]->stream());
    upload(b.get(), in[r], st);
    comms[r]->all_reduce_sum(b.as<float>(), cnt);
    comms[r]->barrier();
    again[r] = download<float>(b.get(), cnt, st);
  });
  const double ea = rel_err(again[0], ref, &bad);
  record(tag + "abort -> CommAborted on every rank; reset -> all-reduce", ea, 1e-6, nthrew == n && ea < 1e-6 && !bad,
         std::to_string(nthrew) + "/" + std::to_string(n) + " threw");
}
#endif

// ---------------------------------------------------------------------------
// 2. Peer all-reduce
// ---------------------------------------------------------------------------
void check_peer_allreduce(const std::vector<int>& devs, const std::vector<size_t>& counts, Rng& rng) {
  const int n = static_cast<int>(devs.size());
  const size_t cap = *std::max_element(counts.begin(), counts.end());
  PeerGroup group(devs, (cap + 7) / 8 * 8, 1);
  Streams streams(devs);
  const std::string tag = "peer all-reduce " + std::to_string(n) + " ranks on " + devs_str(devs) + " ";
  for (size_t cnt : counts) {
    // Per rank: a graph of one all-reduce; 3 replays with fresh inputs, an
    // eager launch after each replay (the epoch runs on across both).
    std::vector<DeviceBuffer> inb(n), outb(n);
    std::vector<cudaGraphExec_t> g(n, nullptr);
    for (int r = 0; r < n; ++r) {
      SS_CUDA_CHECK(cudaSetDevice(devs[r]));
      inb[r].allocate(2 * cnt);
      outb[r].allocate(2 * cnt);
    }
    run_ranks(devs, [&](int r) {
      g[r] = capture_graph(streams.s[r], [&](cudaStream_t) {
        group.all_reduce_bf16(r, inb[r].as<__nv_bfloat16>(), outb[r].as<__nv_bfloat16>(), cnt, streams.s[r]);
      });
    });
    double worst = 0;
    size_t bad_total = 0, mism_total = 0, inexact_total = 0;
    for (int round = 0; round < 6; ++round) {
      const bool eager = round % 2 == 1;
      std::vector<std::vector<uint16_t>> in(n);
      for (int r = 0; r < n; ++r) in[r] = random_bf16(cnt, 1.0f, rng);
      std::vector<std::vector<uint16_t>> out(n);
      run_ranks(devs, [&](int r) {
        upload(inb[r].get(), in[r], streams.s[r]);
        SS_CUDA_CHECK(cudaMemsetAsync(outb[r].get(), 0xFF, 2 * cnt, streams.s[r]));
        if (eager)
          group.all_reduce_bf16(r, inb[r].as<__nv_bfloat16>(), outb[r].as<__nv_bfloat16>(), cnt, streams.s[r]);
        else
          SS_CUDA_CHECK(cudaGraphLaunch(g[r], streams.s[r]));
        out[r] = download<uint16_t>(outb[r].get(), cnt, streams.s[r]);
      });
      std::vector<double> ref(cnt, 0.0);
      size_t inexact = 0;
      for (size_t i = 0; i < cnt; ++i) {
        float s = 0.f;  // the device's arithmetic: fp32, rank order, one rounding
        for (int r = 0; r < n; ++r) {
          s += bf2f(in[r][i]);
          ref[i] += bf2f(in[r][i]);
        }
        inexact += f2bf(s) != out[0][i];
      }
      size_t bad = 0;
      worst = std::max(worst, rel_err(to_float(out[0]), ref, &bad));
      bad_total += bad;
      inexact_total += inexact;
      for (int r = 1; r < n; ++r) mism_total += out[r] != out[0];
    }
    for (int r = 0; r < n; ++r) {
      SS_CUDA_CHECK(cudaSetDevice(devs[r]));
      cudaGraphExecDestroy(g[r]);
    }
    std::string detail = fmt_bad(bad_total, mism_total);
    if (inexact_total) detail += "not-bit-exact=" + std::to_string(inexact_total);
    record(tag + "x" + std::to_string(cnt) + " (3 graph + 3 eager)", worst, 1e-2,
           worst < 1e-2 && !bad_total && !mism_total && !inexact_total, detail);
  }
}

// ---------------------------------------------------------------------------
// 3. Row-parallel GEMM + all-reduce
// ---------------------------------------------------------------------------
int bucket_nt(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

struct RankGemm {
  DeviceBuffer w, x, out32, out16, h32, h16, ssq;
};

/// `peers` null: the fused and peer variants are skipped (no peer access);
/// `comms` null or empty: the NCCL variant is skipped.
void check_row_parallel(const std::vector<int>& devs, const char* name, int N, int Ktot, const std::vector<int>& Ms,
                        Rng& rng, PeerGroup* peers
#if defined(SWIFTSPEC_HAVE_NCCL)
                        ,
                        std::vector<std::unique_ptr<CudaCommunicator>>* comms
#endif
) {
  constexpr int R = kMaxStepTokens;
  const int n = static_cast<int>(devs.size());
  if (Ktot % (16 * n) != 0) {
    record(std::string("row-parallel ") + name + " tp" + std::to_string(n), 0, 0, true,
           "skipped: K not divisible by 16 * tp");
    return;
  }
  const int K = Ktot / n;
  const float ws = 1.0f / std::sqrt(static_cast<float>(Ktot));
  std::vector<std::vector<uint16_t>> w(n), x(n);
  for (int r = 0; r < n; ++r) {
    w[r] = random_bf16(static_cast<size_t>(N) * K, ws, rng);
    x[r] = random_bf16(static_cast<size_t>(R) * K, 1.0f, rng);
  }
  std::vector<float> h0 = to_float(random_bf16(static_cast<size_t>(R) * N, 1.0f, rng));
  // Reference: Y[m][j] = sum_r sum_k x_r[m][k] w_r[j][k] (double), rows < max M.
  const int maxM = *std::max_element(Ms.begin(), Ms.end());
  std::vector<double> Y(static_cast<size_t>(maxM) * N, 0.0);
  {
    std::vector<std::vector<float>> wf(n), xf(n);
    for (int r = 0; r < n; ++r) {
      wf[r] = to_float(w[r]);
      xf[r] = to_float(x[r]);
    }
    parallel_for(N, [&](int j) {
      for (int m = 0; m < maxM; ++m) {
        double s = 0;
        for (int r = 0; r < n; ++r) {
          const float* a = &xf[r][static_cast<size_t>(m) * K];
          const float* b = &wf[r][static_cast<size_t>(j) * K];
          for (int k = 0; k < K; ++k) s += static_cast<double>(a[k]) * b[k];
        }
        Y[static_cast<size_t>(m) * N + j] = s;
      }
    });
  }
  std::vector<RankGemm> rk(n);
  Streams streams(devs);
  int num_sms = 0;
  SS_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, devs[0]));
  for (int r = 0; r < n; ++r) {
    SS_CUDA_CHECK(cudaSetDevice(devs[r]));
    rk[r].w.allocate(2 * w[r].size());
    rk[r].x.allocate(2 * x[r].size());
    rk[r].out32.allocate(sizeof(float) * R * N);
    rk[r].out16.allocate(2 * static_cast<size_t>(R) * N);
    rk[r].h32.allocate(sizeof(float) * R * N);
    rk[r].h16.allocate(2 * static_cast<size_t>(R) * N);
    rk[r].ssq.allocate(sizeof(float) * R * (N / 16));
    upload(rk[r].w.get(), w[r], streams.s[r]);
    upload(rk[r].x.get(), x[r], streams.s[r]);
  }
  const std::string base = std::string("row-parallel ") + name + " N=" + std::to_string(N) +
                           " K=" + std::to_string(Ktot) + "/" + std::to_string(n) + " ";
  std::vector<float> row0_m1(N);
  bool have_row0 = false;
  for (int M : Ms) {
    const int nt = bucket_nt(M);
    // The plan must be the same on every rank (CTA slots pair up across ranks).
    std::vector<GemmConfig> plans(n), plans_b(n);
    run_ranks(devs, [&](int r) {
      plans[r] = plan_gemm<EpiAllReduce>(N, K, nt, num_sms);
      plans_b[r] = plan_gemm<EpiStoreBf16>(N, K, nt, num_sms);
    });
    for (int r = 1; r < n; ++r)
      if (plans[r].grid_x != plans[0].grid_x || plans[r].S != plans[0].S || plans[r].BR != plans[0].BR)
        throw CudaError("row-parallel check: GEMM plans differ across ranks (unlike GPUs?)");
    GemmArgs a;
    a.N = N;
    a.K = K;
    a.m_active_max = M;
    std::vector<double> ref(Y.begin(), Y.begin() + static_cast<size_t>(M) * N);
    size_t bad = 0, mism = 0;
    if (peers) {
      // (a) fused, fp32 output: graph replay after an eager launch.
      std::vector<std::vector<float>> o32(n);
      std::vector<std::vector<uint32_t>> raw(n);
      run_ranks(devs, [&](int r) {
        cudaStream_t st = streams.s[r];
        const CUtensorMap wm = make_tma_map_bf16(rk[r].w.get(), N, K, K, plans[r].BR);
        const CUtensorMap xm = make_tma_map_bf16(rk[r].x.get(), R, K, K, 8 * nt);
        EpiAllReduce::Params e;
        e.ch = peers->channel(r, 0);
        e.N = N;
        e.out = AllReduceOut::F32;
        e.out32 = rk[r].out32.as<float>();
        e.ldo = N;
        SS_CUDA_CHECK(cudaMemsetAsync(rk[r].out32.get(), 0xFF, sizeof(float) * R * N, st));
        launch_gemm_allreduce(plans[r], wm, xm, a, e, false, st);
        cudaGraphExec_t g =
            capture_graph(st, [&](cudaStream_t) { launch_gemm_allreduce(plans[r], wm, xm, a, e, false, st); });
        SS_CUDA_CHECK(cudaMemsetAsync(rk[r].out32.get(), 0xFF, sizeof(float) * R * N, st));
        SS_CUDA_CHECK(cudaGraphLaunch(g, st));
        raw[r] = download<uint32_t>(rk[r].out32.get(), static_cast<size_t>(R) * N, st);
        cudaGraphExecDestroy(g);
      });
      size_t untouched_bad = 0;
      for (int r = 0; r < n; ++r) {
        o32[r].resize(static_cast<size_t>(M) * N);
        std::memcpy(o32[r].data(), raw[r].data(), 4 * o32[r].size());
        for (size_t i = static_cast<size_t>(M) * N; i < raw[r].size(); ++i) untouched_bad += raw[r][i] != 0xFFFFFFFFu;
        if (r > 0) mism += o32[r] != o32[0];
      }
      const double ef = rel_err(o32[0], ref, &bad);
      std::string det = fmt_bad(bad, mism);
      if (untouched_bad) det += "rows>=M written=" + std::to_string(untouched_bad) + " ";
      size_t inv = 0;
      if (M == 1) {
        std::copy(o32[0].begin(), o32[0].begin() + N, row0_m1.begin());
        have_row0 = true;
      } else if (have_row0) {
        inv = std::memcmp(row0_m1.data(), o32[0].data(), 4 * static_cast<size_t>(N)) != 0;
        if (inv) det += "row0 differs from M=1 ";
      }
      record(base + "M=" + std::to_string(M) + " fused all-reduce fp32", ef, 1e-2,
             ef < 1e-2 && !bad && !mism && !untouched_bad && !inv, det);

      // (b) fused, residual output: h32 += Y, h16, ssq.
      std::vector<std::vector<float>> hh(n), ss(n);
      std::vector<std::vector<uint16_t>> h16(n);
      run_ranks(devs, [&](int r) {
        cudaStream_t st = streams.s[r];
        const CUtensorMap wm = make_tma_map_bf16(rk[r].w.get(), N, K, K, plans[r].BR);
        const CUtensorMap xm = make_tma_map_bf16(rk[r].x.get(), R, K, K, 8 * nt);
        upload(rk[r].h32.get(), h0, st);
        SS_CUDA_CHECK(cudaMemsetAsync(rk[r].h16.get(), 0xFF, 2 * static_cast<size_t>(R) * N, st));
        SS_CUDA_CHECK(cudaMemsetAsync(rk[r].ssq.get(), 0xFF, sizeof(float) * R * (N / 16), st));
        EpiAllReduce::Params e;
        e.ch = peers->channel(r, 0);
        e.N = N;
        e.out = AllReduceOut::Residual;
        e.h32 = rk[r].h32.as<float>();
        e.h16 = rk[r].h16.as<__nv_bfloat16>();
        e.ssq = rk[r].ssq.as<float>();
        launch_gemm_allreduce(plans[r], wm, xm, a, e, false, st);
        hh[r] = download<float>(rk[r].h32.get(), static_cast<size_t>(M) * N, st);
        h16[r] = download<uint16_t>(rk[r].h16.get(), static_cast<size_t>(M) * N, st);
        ss[r] = download<float>(rk[r].ssq.get(), static_cast<size_t>(M) * (N / 16), st);
      });
      std::vector<double> href(static_cast<size_t>(M) * N), sref(static_cast<size_t>(M) * (N / 16), 0.0);
      for (size_t i = 0; i < href.size(); ++i) href[i] = h0[i] + Y[i];
      for (int m = 0; m < M; ++m)
        for (int j = 0; j < N; ++j)
          sref[static_cast<size_t>(m) * (N / 16) + j / 16] +=
              href[static_cast<size_t>(m) * N + j] * href[static_cast<size_t>(m) * N + j];
      size_t bh = 0, b16 = 0, bs = 0;
      mism = 0;
      const double eh = rel_err(hh[0], href, &bh);
      const double e16 = rel_err(to_float(h16[0]), href, &b16);
      const double es = rel_err(ss[0], sref, &bs);
      for (int r = 1; r < n; ++r) mism += (hh[r] != hh[0]) + (h16[r] != h16[0]) + (ss[r] != ss[0]);
      const double eres = std::max({eh, e16, es});
      record(base + "M=" + std::to_string(M) + " fused all-reduce + residual (h32, h16, ssq)", eres, 1e-2,
             eres < 1e-2 && !bh && !b16 && !bs && !mism, fmt_bad(bh + b16 + bs, mism));

      // (d) two kernels: GEMM partials into the symmetric buffer, then the
      // peer all-reduce + residual kernel; same arithmetic as (b), so the
      // results must equal (b)'s bit for bit.
      std::vector<std::vector<float>> hh2(n), ss2(n);
      std::vector<std::vector<uint16_t>> h162(n);
      std::vector<GemmConfig> plans_s(n);
      run_ranks(devs, [&](int r) { plans_s[r] = plan_gemm<EpiPeerStore>(N, K, nt, num_sms); });
      run_ranks(devs, [&](int r) {
        cudaStream_t st = streams.s[r];
        const CUtensorMap wm = make_tma_map_bf16(rk[r].w.get(), N, K, K, plans_s[r].BR);
        const CUtensorMap xm = make_tma_map_bf16(rk[r].x.get(), R, K, K, 8 * nt);
        upload(rk[r].h32.get(), h0, st);
        SS_CUDA_CHECK(cudaMemsetAsync(rk[r].h16.get(), 0xFF, 2 * static_cast<size_t>(R) * N, st));
        SS_CUDA_CHECK(cudaMemsetAsync(rk[r].ssq.get(), 0xFF, sizeof(float) * R * (N / 16), st));
        EpiPeerStore::Params e;
        e.ch = peers->channel(r, 0);
        e.N = N;
        launch_gemm<EpiPeerStore>(plans_s[r], wm, xm, a, e, false, st);
        launch_peer_allreduce_residual(peers->channel(r, 0), nullptr, M, N, rk[r].h32.as<float>(),
                                       rk[r].h16.as<__nv_bfloat16>(), rk[r].ssq.as<float>(), false, st);
        hh2[r] = download<float>(rk[r].h32.get(), static_cast<size_t>(M) * N, st);
        h162[r] = download<uint16_t>(rk[r].h16.get(), static_cast<size_t>(M) * N, st);
        ss2[r] = download<float>(rk[r].ssq.get(), static_cast<size_t>(M) * (N / 16), st);
      });
      size_t bh2 = 0, b162 = 0, bs2 = 0, mism2 = 0;
      const double eh2 = rel_err(hh2[0], href, &bh2);
      const double e162 = rel_err(to_float(h162[0]), href, &b162);
      const double es2 = rel_err(ss2[0], sref, &bs2);
      for (int r = 1; r < n; ++r) mism2 += (hh2[r] != hh2[0]) + (h162[r] != h162[0]) + (ss2[r] != ss2[0]);
      const bool same = hh2[0] == hh[0] && h162[0] == h16[0] && ss2[0] == ss[0];
      const double eres2 = std::max({eh2, e162, es2});
      std::string det2 = fmt_bad(bh2 + b162 + bs2, mism2);
      if (!same) det2 += "differs from the fused residual result";
      record(base + "M=" + std::to_string(M) + " GEMM -> symmetric buffer + peer all-reduce/residual kernel", eres2,
             1e-2, eres2 < 1e-2 && !bh2 && !b162 && !bs2 && !mism2 && same, det2);
    }  // peers

    // (c) GEMM -> bf16, then ncclAllReduce / the peer all-reduce.
    for (int via = 0; via < 2; ++via) {
#if defined(SWIFTSPEC_HAVE_NCCL)
      if (via == 0 && (!comms || comms->empty())) continue;
#else
      if (via == 0) continue;
#endif
      if (via == 1 && !peers) continue;
      std::vector<std::vector<uint16_t>> ob(n);
      run_ranks(devs, [&](int r) {
        cudaStream_t st = streams.s[r];
        const CUtensorMap wm = make_tma_map_bf16(rk[r].w.get(), N, K, K, plans_b[r].BR);
        const CUtensorMap xm = make_tma_map_bf16(rk[r].x.get(), R, K, K, 8 * nt);
        SS_CUDA_CHECK(cudaMemsetAsync(rk[r].out16.get(), 0xFF, 2 * static_cast<size_t>(R) * N, st));
        EpiStoreBf16::Params e;
        e.out = rk[r].out16.as<__nv_bfloat16>();
        e.ldo = N;
        launch_gemm<EpiStoreBf16>(plans_b[r], wm, xm, a, e, false, st);
        const size_t cnt = static_cast<size_t>(M) * N;
        if (via == 0) {
#if defined(SWIFTSPEC_HAVE_NCCL)
          (*comms)[r]->set_stream(st);
          (*comms)[r]->all_reduce_sum_bf16(rk[r].out16.get(), cnt);
#endif
        } else {
          peers->all_reduce_bf16(r, rk[r].out16.as<__nv_bfloat16>(), rk[r].out16.as<__nv_bfloat16>(), cnt, st, 1);
        }
        ob[r] = download<uint16_t>(rk[r].out16.get(), cnt, st);
      });
      mism = 0;
      for (int r = 1; r < n; ++r) mism += ob[r] != ob[0];
      const double eb = rel_err(to_float(ob[0]), ref, &bad);
      record(base + "M=" + std::to_string(M) + (via == 0 ? " GEMM + ncclAllReduce bf16" : " GEMM + peer all-reduce"),
             eb, 1e-2, eb < 1e-2 && !bad && !mism, fmt_bad(bad, mism));
    }
  }
}

/// Runs one section; an exception fails it (recorded) and the next section
/// still runs (e.g. no peer access between the GPUs: the NCCL checks go on).
template <class F>
void guarded(const std::string& name, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    record(name + " (aborted)", NAN, 0, false, std::string("exception: ") + e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  int want = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc)
      json = argv[++i];
    else if (a == "--gpus" && i + 1 < argc)
      want = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: swiftspec-cuda-multigpu-check [--gpus N] [--json PATH] (unknown argument '%s')\n",
                   a.c_str());
      return 2;
    }
  }
  int gpus = 0;
  try {
#if defined(SWIFTSPEC_HAVE_NCCL)
    disable_nvlink_multicast();
#endif
    SS_CUDA_CHECK(cudaGetDeviceCount(&gpus));
    if (want > 0) {
      if (want > gpus)
        throw InvalidArgument("--gpus " + std::to_string(want) + ": only " + std::to_string(gpus) + " GPUs");
      gpus = want;
    }
    cudaDeviceProp prop;
    SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("devices: %d x %s, %d SMs, cc %d.%d\n", gpus, prop.name, prop.multiProcessorCount, prop.major,
                prop.minor);
    Rng rng(20261129);
    const std::vector<size_t> counts = {13, 1000, 4096, 8192, 16384, 65536, 262144, 524288};
    // The protocol with several ranks on GPU 0 (runs on any machine).
    guarded("peer all-reduce 2 ranks on GPU 0", [&] { check_peer_allreduce({0, 0}, {13, 4096, 65536}, rng); });
    guarded("peer all-reduce 4 ranks on GPU 0", [&] { check_peer_allreduce({0, 0, 0, 0}, {1000, 524288}, rng); });
    std::vector<int> tps;
    for (int t : {1, 2, 4, 8})
      if (t <= gpus) tps.push_back(t);
    if (std::find(tps.begin(), tps.end(), gpus) == tps.end()) tps.push_back(gpus);
    for (int tp : tps) {
      std::vector<int> devs(tp);
      for (int r = 0; r < tp; ++r) devs[r] = r;
      const std::string t = " tp" + std::to_string(tp);
#if defined(SWIFTSPEC_HAVE_NCCL)
      guarded("nccl" + t, [&] { check_nccl(devs, rng); });
#endif
      guarded("peer all-reduce" + t, [&] { check_peer_allreduce(devs, counts, rng); });
      guarded("row-parallel" + t, [&] {
        std::unique_ptr<PeerGroup> peers;
        guarded("row-parallel peer group" + t,
                [&] { peers = std::make_unique<PeerGroup>(devs, static_cast<size_t>(kMaxStepTokens) * 4096, 2); });
#if defined(SWIFTSPEC_HAVE_NCCL)
        std::vector<std::unique_ptr<CudaCommunicator>> comms;
        guarded("row-parallel nccl group" + t, [&] { comms = make_nccl_group(devs); });
        check_row_parallel(devs, "8B o_proj", 4096, 4096, {1, 7, 64}, rng, peers.get(), &comms);
        check_row_parallel(devs, "8B down_proj", 4096, 14336, {1, 64}, rng, peers.get(), &comms);
#else
        check_row_parallel(devs, "8B o_proj", 4096, 4096, {1, 7, 64}, rng, peers.get());
        check_row_parallel(devs, "8B down_proj", 4096, 14336, {1, 64}, rng, peers.get());
#endif
      });
    }
  } catch (const std::exception& e) {
    std::printf("CHECK %-62s err=nan limit=0 FAIL exception: %s\n", "(aborted)", e.what());
    g_results.push_back({"(aborted)", NAN, 0, false, e.what()});
  }
  int fails = 0;
  for (const auto& r : g_results) fails += r.pass ? 0 : 1;
  std::printf("checks: %zu, failed: %d\n", g_results.size(), fails);
  if (!json.empty()) write_json(json, gpus);
  return fails ? 1 : 0;
}
