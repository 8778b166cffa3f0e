// swiftspec-cuda-allreduce-bench: latency of the tensor-parallel all-reduce
// on the GPUs of one node (issue 7), for every TP degree 1, 2, 4, 8 up to the
// GPU count (and the count itself).
//
//  * all-reduce of 8 KB, 16 KB, ..., 1 MB of bf16, in place:
//    (a) ncclAllReduce (NVLink multicast off: NCCL_NVLS_ENABLE=0),
//    (b) the peer all-reduce (one-shot over NVLink peer access, rank-order
//        sums: cuda/src/multigpu/peer_channel.h), with its default CTA count
//        and at 4 / 16 / 64 CTAs (tuning data);
//  * the row-parallel GEMM of the Llama-3-8B O projection (N 4096, K 4096/tp)
//    and down projection (N 4096, K 14336/tp) at M = 1, 16, 64 token rows:
//    GEMM alone (bf16 out), GEMM + ncclAllReduce, GEMM + peer all-reduce,
//    the GEMM with the all-reduce fused into its epilogue, and the two-kernel
//    path (GEMM partials into the symmetric buffer, then the all-reduce
//    kernel, which also adds the residual: a little more work than the others);
//  * at TP 2: one-way latency of a 256 B / 4 KB / 64 KB message between the
//    two GPUs (what the draft and target groups exchange: subtrees,
//    verification results), ncclSend/ncclRecv ping-pong vs a peer-memory
//    ping-pong kernel (stores into the peer's inbox + a release flag).
// Timing: every rank captures a CUDA graph of R back-to-back operations
// (GEMMs rotate over weight copies of >= 400 MB per rank, so L2 does not
// serve the weights), every rank's thread replays it `iters` times with CUDA
// events around each replay; time per operation = replay / R; the number
// reported is the median over replays of the slowest rank's time. Also the
// device-to-device copy bandwidth of GPU 0 (bytes read + written), for the
// physical limit of a GEMM (weight bytes / bandwidth).
// With one GPU everything runs at TP 1 (NCCL and the peer all-reduce then
// reduce over one rank): a smoke test of the code path.
// Usage: swiftspec-cuda-allreduce-bench [--gpus N] [--json PATH] [--iters N] [--quick]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "copy_bandwidth.h"
#include "device_memory.h"
#include "graph_cache.h"
#include "json_number.h"
#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"
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

/// Every rank replays its graph `iters` times (after 3 warm-up replays);
/// returns the median over replays of max over ranks of the replay time
/// divided by `ops` (microseconds per operation).
double time_graphs(const std::vector<int>& devs, const std::vector<cudaStream_t>& st,
                   const std::vector<cudaGraphExec_t>& g, int ops, int iters) {
  const int n = static_cast<int>(devs.size());
  std::vector<std::vector<float>> ms(n, std::vector<float>(iters));
  run_ranks(devs, [&](int r) {
    for (int i = 0; i < 3; ++i) SS_CUDA_CHECK(cudaGraphLaunch(g[r], st[r]));
    std::vector<cudaEvent_t> ev(2 * iters);
    for (auto& e : ev) SS_CUDA_CHECK(cudaEventCreate(&e));
    for (int i = 0; i < iters; ++i) {
      SS_CUDA_CHECK(cudaEventRecord(ev[2 * i], st[r]));
      SS_CUDA_CHECK(cudaGraphLaunch(g[r], st[r]));
      SS_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], st[r]));
    }
    SS_CUDA_CHECK(cudaStreamSynchronize(st[r]));
    for (int i = 0; i < iters; ++i) SS_CUDA_CHECK(cudaEventElapsedTime(&ms[r][i], ev[2 * i], ev[2 * i + 1]));
    for (auto& e : ev) cudaEventDestroy(e);
  });
  std::vector<float> worst(iters, 0.f);
  for (int i = 0; i < iters; ++i)
    for (int r = 0; r < n; ++r) worst[i] = std::max(worst[i], ms[r][i]);
  std::sort(worst.begin(), worst.end());
  return 1e3 * worst[iters / 2] / ops;
}

void destroy_graphs(const std::vector<int>& devs, std::vector<cudaGraphExec_t>& g) {
  for (size_t r = 0; r < g.size(); ++r)
    if (g[r]) {
      SS_CUDA_CHECK(cudaSetDevice(devs[r]));
      cudaGraphExecDestroy(g[r]);
      g[r] = nullptr;
    }
}

/// CTA counts of the peer all-reduce tried besides the default (tuning data).
constexpr int kSweepCtas[] = {4, 16, 64};

struct ArRow {
  int tp;
  size_t bytes;
  double nccl_us, peer_us;
  double peer_sweep_us[3];  ///< at kSweepCtas CTAs (capped by the message size)
};
struct GemmRow {
  int tp;
  std::string shape;
  int N, K, M;
  double gemm_us, gemm_nccl_us, gemm_peer_us, fused_us, limit_us;
  std::string plan;
  double two_kernel_us = -1;  ///< GEMM into the symmetric buffer + all-reduce/residual kernel
};

int bucket_nt(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// ---- messages between two GPUs (draft group <-> target group) -------------------
struct P2pRow {
  size_t bytes;
  double nccl_us, peer_us;  ///< one-way latency (half a round trip)
};

/// Waits until *flag >= seq (wrap-safe); traps after kPeerWaitLimitNs.
__device__ void pingpong_wait(const uint32_t* flag, uint32_t seq) {
  const uint64_t t0 = peer_globaltimer_ns();
  for (uint32_t spins = 1; static_cast<int>(peer_ld_acquire_sys(flag) - seq) < 0; ++spins)
    if ((spins & 1023u) == 0 && peer_globaltimer_ns() - t0 > kPeerWaitLimitNs) {
      printf("pingpong: waited 10 s for message %u: trap\n", seq);
      __trap();
    }
}

/// `iters` round trips of a `vecs` x 16-byte message between two GPUs over
/// peer memory, one CTA per side: the sender stores the message into the
/// receiver's inbox, then (fence.acq_rel.sys) st.release.sys the receiver's
/// flag = sequence number; side 1 answers each message. Sequence numbers
/// continue across launches / graph replays through a counter on each side.
__global__ void __launch_bounds__(256)
    pingpong_kernel(const uint4* src, uint4* peer_inbox, uint32_t* peer_flag, const uint32_t* my_flag,
                    uint32_t* counter, size_t vecs, int side, int iters) {
  const uint32_t base = peer_ld_volatile_u32(counter);
  for (int i = 1; i <= iters; ++i) {
    const uint32_t seq = base + static_cast<uint32_t>(i);
    if (side == 1) {
      if (threadIdx.x == 0) pingpong_wait(my_flag, seq);
      __syncthreads();
    }
    for (size_t v = threadIdx.x; v < vecs; v += blockDim.x) peer_inbox[v] = src[v];
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      peer_st_release_sys(peer_flag, seq);
      if (side == 0) pingpong_wait(my_flag, seq);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *counter = base + static_cast<uint32_t>(iters);
}

/// One-way message latency GPU devs[0] <-> devs[1]: NCCL send/recv and the
/// peer-memory ping-pong, for a few message sizes (subtrees and verification
/// results are bytes to tens of KB).
std::vector<P2pRow> bench_p2p(const std::vector<int>& devs, const std::vector<cudaStream_t>& st,
                              void* const* nccl_comms, bool peer_ok, int iters) {
  constexpr int kTrips = 50;
  const std::vector<int> pair = {devs[0], devs[1]};
  const std::vector<cudaStream_t> pst = {st[0], st[1]};
  const size_t maxb = size_t(64) << 10;
  std::vector<DeviceBuffer> msg(2), inbox(2), flags(2);
  for (int r = 0; r < 2; ++r) {
    SS_CUDA_CHECK(cudaSetDevice(pair[r]));
    msg[r].allocate(maxb);
    inbox[r].allocate(maxb);
    flags[r].allocate(256);  // [0]: flag written by the other side, [1]: counter
    SS_CUDA_CHECK(cudaMemset(msg[r].get(), 1 + r, maxb));
    SS_CUDA_CHECK(cudaMemset(flags[r].get(), 0, 256));
    SS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<P2pRow> rows;
  for (size_t bytes : {size_t(256), size_t(4) << 10, size_t(64) << 10}) {
    P2pRow row{bytes, -1, -1};
    std::vector<cudaGraphExec_t> g(2, nullptr);
#if defined(SWIFTSPEC_HAVE_NCCL)
    if (nccl_comms) {
      run_ranks(pair, [&](int r) {
        ncclComm_t c = static_cast<ncclComm_t>(nccl_comms[r]);
        g[r] = capture_graph(pst[r], [&](cudaStream_t) {
          for (int i = 0; i < kTrips; ++i) {
            const auto ok = [](ncclResult_t e, const char* what) {
              if (e != ncclSuccess) throw NcclError(std::string(what) + ": " + ncclGetErrorString(e));
            };
            if (r == 0) {
              ok(ncclSend(msg[0].get(), bytes, ncclInt8, 1, c, pst[0]), "ncclSend");
              ok(ncclRecv(inbox[0].get(), bytes, ncclInt8, 1, c, pst[0]), "ncclRecv");
            } else {
              ok(ncclRecv(inbox[1].get(), bytes, ncclInt8, 0, c, pst[1]), "ncclRecv");
              ok(ncclSend(msg[1].get(), bytes, ncclInt8, 0, c, pst[1]), "ncclSend");
            }
          }
        });
      });
      row.nccl_us = time_graphs(pair, pst, g, 2 * kTrips, iters);
      destroy_graphs(pair, g);
    }
#endif
    if (peer_ok) {
      run_ranks(pair, [&](int r) {
        const int o = 1 - r;
        uint32_t* myf = flags[r].as<uint32_t>();
        g[r] = capture_graph(pst[r], [&](cudaStream_t) {
          pingpong_kernel<<<1, 256, 0, pst[r]>>>(msg[r].as<uint4>(), inbox[o].as<uint4>(), flags[o].as<uint32_t>(), myf,
                                                 myf + 1, bytes / 16, r, kTrips);
          SS_CUDA_CHECK(cudaGetLastError());
        });
      });
      row.peer_us = time_graphs(pair, pst, g, 2 * kTrips, iters);
      destroy_graphs(pair, g);
    }
    std::printf("  p2p %6zu B one-way: nccl send/recv %7.2f us  peer memory %7.2f us\n", bytes, row.nccl_us,
                row.peer_us);
    std::fflush(stdout);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int want = 0, iters = 200;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--gpus" && i + 1 < argc)
      want = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (a == "--quick")
      quick = true;
    else {
      std::fprintf(stderr,
                   "usage: swiftspec-cuda-allreduce-bench [--gpus N] [--json PATH] [--iters N] [--quick] "
                   "(unknown argument '%s')\n",
                   a.c_str());
      return 2;
    }
  }
  if (quick) iters = std::min(iters, 30);
  if (iters < 1) {
    std::fprintf(stderr, "--iters must be >= 1\n");
    return 2;
  }
  std::vector<ArRow> ar_rows;
  std::vector<GemmRow> gemm_rows;
  std::vector<P2pRow> p2p_rows;
  int gpus = 0;
  double bw = 0;
  std::string device_name, error;
  std::vector<std::string> notes;
  int nccl_version = 0;
  try {
#if defined(SWIFTSPEC_HAVE_NCCL)
    disable_nvlink_multicast();
    ncclGetVersion(&nccl_version);
#endif
    SS_CUDA_CHECK(cudaGetDeviceCount(&gpus));
    if (want > 0) {
      if (want > gpus)
        throw InvalidArgument("--gpus " + std::to_string(want) + ": only " + std::to_string(gpus) + " GPUs");
      gpus = want;
    }
    cudaDeviceProp prop;
    SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    device_name = prop.name;
    std::printf("devices: %d x %s, %d SMs; NCCL %d; iters %d\n", gpus, prop.name, prop.multiProcessorCount,
                nccl_version, iters);
    bw = copy_bandwidth_tbs(0);
    std::printf("copy bandwidth GPU 0: %.3f TB/s\n", bw);
    const int num_sms = prop.multiProcessorCount;

    std::vector<int> tps;
    for (int t : {1, 2, 4, 8})
      if (t <= gpus) tps.push_back(t);
    if (std::find(tps.begin(), tps.end(), gpus) == tps.end()) tps.push_back(gpus);
    for (int tp : tps) {
      std::vector<int> devs(tp);
      for (int r = 0; r < tp; ++r) devs[r] = r;
      std::vector<cudaStream_t> st(tp);
      for (int r = 0; r < tp; ++r) {
        SS_CUDA_CHECK(cudaSetDevice(r));
        SS_CUDA_CHECK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
      }
      const size_t cap = size_t(1) << 19;  // 1 MB of bf16; >= 64 x 4096 outputs
      // Either side may be unavailable (no peer access between the GPUs, an
      // NCCL failure): the other still runs, the missing columns stay -1.
      std::unique_ptr<PeerGroup> peers;
      try {
        peers = std::make_unique<PeerGroup>(devs, cap, 2);
      } catch (const std::exception& e) {
        std::printf("  tp%d: peer group unavailable: %s\n", tp, e.what());
        notes.push_back("tp" + std::to_string(tp) + " peer: " + e.what());
      }
#if defined(SWIFTSPEC_HAVE_NCCL)
      std::vector<std::unique_ptr<CudaCommunicator>> comms;
      try {
        comms = make_nccl_group(devs);
        for (int r = 0; r < tp; ++r) comms[r]->set_stream(st[r]);
      } catch (const std::exception& e) {
        std::printf("  tp%d: NCCL group unavailable: %s\n", tp, e.what());
        notes.push_back("tp" + std::to_string(tp) + " nccl: " + e.what());
      }
      const bool have_nccl = !comms.empty();
#else
      const bool have_nccl = false;
#endif
      // ---- all-reduce latency ------------------------------------------------
      {
        constexpr int kOps = 20;
        std::vector<DeviceBuffer> buf(tp);
        for (int r = 0; r < tp; ++r) {
          SS_CUDA_CHECK(cudaSetDevice(r));
          buf[r].allocate(2 * cap);
          launch_fill_random_bf16(buf[r].as<__nv_bfloat16>(), cap, 1e-3f, 100 + r, st[r]);
          SS_CUDA_CHECK(cudaStreamSynchronize(st[r]));
        }
        for (size_t bytes = 8192; bytes <= (size_t(1) << 20); bytes *= 2) {
          const size_t cnt = bytes / 2;
          ArRow row{tp, bytes, -1, -1, {-1, -1, -1}};
          std::vector<cudaGraphExec_t> g(tp, nullptr);
#if defined(SWIFTSPEC_HAVE_NCCL)
          if (have_nccl) {
            run_ranks(devs, [&](int r) {
              g[r] = capture_graph(st[r], [&](cudaStream_t) {
                for (int i = 0; i < kOps; ++i) comms[r]->all_reduce_sum_bf16(buf[r].get(), cnt);
              });
            });
            row.nccl_us = time_graphs(devs, st, g, kOps, iters);
            destroy_graphs(devs, g);
          }
#endif
          if (peers) {
            run_ranks(devs, [&](int r) {
              g[r] = capture_graph(st[r], [&](cudaStream_t) {
                for (int i = 0; i < kOps; ++i)
                  peers->all_reduce_bf16(r, buf[r].as<__nv_bfloat16>(), buf[r].as<__nv_bfloat16>(), cnt, st[r], 0);
              });
            });
            row.peer_us = time_graphs(devs, st, g, kOps, iters);
            destroy_graphs(devs, g);
            for (int k = 0; k < 3; ++k) {
              run_ranks(devs, [&](int r) {
                g[r] = capture_graph(st[r], [&](cudaStream_t) {
                  for (int i = 0; i < kOps; ++i)
                    peers->all_reduce_bf16(r, buf[r].as<__nv_bfloat16>(), buf[r].as<__nv_bfloat16>(), cnt, st[r], 0,
                                           false, kSweepCtas[k]);
                });
              });
              row.peer_sweep_us[k] = time_graphs(devs, st, g, kOps, std::max(5, iters / 2));
              destroy_graphs(devs, g);
            }
          }
          std::printf(
              "  tp%d all-reduce %7zu B: nccl %8.2f us  peer %8.2f us  (peer at %d/%d/%d CTAs: %.2f %.2f %.2f)\n", tp,
              bytes, row.nccl_us, row.peer_us, kSweepCtas[0], kSweepCtas[1], kSweepCtas[2], row.peer_sweep_us[0],
              row.peer_sweep_us[1], row.peer_sweep_us[2]);
          std::fflush(stdout);
          ar_rows.push_back(row);
        }
      }
      // ---- messages between two GPUs (once, at TP 2) ---------------------------------
      if (tp == 2) {
        try {
#if defined(SWIFTSPEC_HAVE_NCCL)
          std::vector<void*> raw;
          for (auto& c : comms) raw.push_back(c->nccl_comm());
          p2p_rows = bench_p2p(devs, st, have_nccl ? raw.data() : nullptr, peers != nullptr, std::max(5, iters / 2));
#else
          p2p_rows = bench_p2p(devs, st, nullptr, peers != nullptr, std::max(5, iters / 2));
#endif
        } catch (const std::exception& e) {
          std::printf("  p2p failed: %s\n", e.what());
          notes.push_back(std::string("p2p: ") + e.what());
        }
      }
      // ---- row-parallel GEMM + all-reduce -----------------------------------------
      struct Shape {
        const char* name;
        int N, Ktot;
      };
      for (const Shape& s : {Shape{"8B o_proj", 4096, 4096}, Shape{"8B down_proj", 4096, 14336}}) {
        if (s.Ktot % (16 * tp) != 0) continue;
        const int N = s.N, K = s.Ktot / tp;
        const size_t wbytes = size_t(N) * K * 2;
        const int copies = static_cast<int>(std::clamp<size_t>((size_t(400) << 20) / wbytes + 1, 2, 64));
        std::vector<DeviceBuffer> w(tp), x(tp), y(tp), h32(tp), h16(tp), ssq(tp);
        for (int r = 0; r < tp; ++r) {
          SS_CUDA_CHECK(cudaSetDevice(r));
          w[r].allocate(wbytes * copies);
          x[r].allocate(size_t(kMaxStepTokens) * K * 2);
          y[r].allocate(size_t(kMaxStepTokens) * N * 2);
          h32[r].allocate(size_t(kMaxStepTokens) * N * 4);
          h16[r].allocate(size_t(kMaxStepTokens) * N * 2);
          ssq[r].allocate(size_t(kMaxStepTokens) * (N / 16) * 4);
          SS_CUDA_CHECK(cudaMemset(h32[r].get(), 0, h32[r].bytes()));
          launch_fill_random_bf16(w[r].as<__nv_bfloat16>(), wbytes / 2 * copies, 1.0f / std::sqrt(float(s.Ktot)), 7 + r,
                                  st[r]);
          launch_fill_random_bf16(x[r].as<__nv_bfloat16>(), size_t(kMaxStepTokens) * K, 1.0f, 8 + r, st[r]);
          SS_CUDA_CHECK(cudaStreamSynchronize(st[r]));
        }
        for (int M : {1, 16, 64}) {
          const int nt = bucket_nt(M);
          GemmRow row{tp, s.name, N, s.Ktot, M, -1, -1, -1, -1, 0, ""};
          row.limit_us = wbytes / (bw * 1e12) * 1e6;
          std::vector<GemmConfig> pf(tp), pb(tp), ps(tp);
          run_ranks(devs, [&](int r) {
            pf[r] = plan_gemm<EpiAllReduce>(N, K, nt, num_sms);
            pb[r] = plan_gemm<EpiStoreBf16>(N, K, nt, num_sms);
            ps[r] = plan_gemm<EpiPeerStore>(N, K, nt, num_sms);
          });
          for (int r = 1; r < tp; ++r)
            if (pf[r].grid_x != pf[0].grid_x || pf[r].S != pf[0].S || pf[r].BR != pf[0].BR)
              throw CudaError("GEMM plans differ across ranks (unlike GPUs?)");
          {
            char b[128];
            std::snprintf(b, sizeof b, "%s S=%d BR=%d grid=%dx%d", pf[0].engine == GemmEngine::Wgmma ? "wgmma" : "mma",
                          pf[0].S, pf[0].BR, pf[0].grid_x, pf[0].S);
            row.plan = b;
          }
          GemmArgs a;
          a.N = N;
          a.K = K;
          a.m_active_max = M;
          const size_t cnt = size_t(M) * N;
          // variant: 0 gemm, 1 gemm + nccl, 2 gemm + peer, 3 fused, 4 two kernels
          // (GEMM into the symmetric buffer, all-reduce + residual add)
          for (int variant = 0; variant < 5; ++variant) {
            if ((variant == 1 && !have_nccl) || (variant >= 2 && !peers)) continue;
            std::vector<cudaGraphExec_t> g(tp, nullptr);
            run_ranks(devs, [&](int r) {
              const GemmConfig& c = variant == 3 ? pf[r] : variant == 4 ? ps[r] : pb[r];
              std::vector<CUtensorMap> wm;
              for (int i = 0; i < copies; ++i)
                wm.push_back(make_tma_map_bf16(w[r].as<unsigned char>() + wbytes * i, N, K, K, c.BR));
              const CUtensorMap xm = make_tma_map_bf16(x[r].get(), kMaxStepTokens, K, K, 8 * nt);
              EpiStoreBf16::Params eb;
              eb.out = y[r].as<__nv_bfloat16>();
              eb.ldo = N;
              EpiAllReduce::Params ef;
              if (variant == 3) ef.ch = peers->channel(r, 1);
              ef.N = N;
              ef.out = AllReduceOut::Bf16;
              ef.out16 = y[r].as<__nv_bfloat16>();
              ef.ldo = N;
              EpiPeerStore::Params es;
              if (variant == 4) es.ch = peers->channel(r, 1);
              es.N = N;
              g[r] = capture_graph(st[r], [&](cudaStream_t) {
                for (int i = 0; i < copies; ++i) {
                  if (variant == 4) {
                    launch_gemm<EpiPeerStore>(c, wm[i], xm, a, es, false, st[r]);
                    launch_peer_allreduce_residual(es.ch, nullptr, M, N, h32[r].as<float>(), h16[r].as<__nv_bfloat16>(),
                                                   ssq[r].as<float>(), false, st[r]);
                    continue;
                  }
                  if (variant == 3) {
                    launch_gemm_allreduce(c, wm[i], xm, a, ef, false, st[r]);
                    continue;
                  }
                  launch_gemm<EpiStoreBf16>(c, wm[i], xm, a, eb, false, st[r]);
#if defined(SWIFTSPEC_HAVE_NCCL)
                  if (variant == 1) comms[r]->all_reduce_sum_bf16(y[r].get(), cnt);
#endif
                  if (variant == 2)
                    peers->all_reduce_bf16(r, y[r].as<__nv_bfloat16>(), y[r].as<__nv_bfloat16>(), cnt, st[r], 0);
                }
              });
            });
            const double us = time_graphs(devs, st, g, copies, std::max(5, iters / 4));
            destroy_graphs(devs, g);
            (variant == 0   ? row.gemm_us
             : variant == 1 ? row.gemm_nccl_us
             : variant == 2 ? row.gemm_peer_us
             : variant == 3 ? row.fused_us
                            : row.two_kernel_us) = us;
          }
          std::printf(
              "  tp%d %-13s M=%2d: gemm %7.2f  +nccl %7.2f  +peer %7.2f  fused %7.2f  2-kernel %7.2f us  (limit %6.2f; "
              "%s)\n",
              tp, s.name, M, row.gemm_us, row.gemm_nccl_us, row.gemm_peer_us, row.fused_us, row.two_kernel_us,
              row.limit_us, row.plan.c_str());
          std::fflush(stdout);
          gemm_rows.push_back(row);
        }
      }
      for (int r = 0; r < tp; ++r) {
        SS_CUDA_CHECK(cudaSetDevice(r));
        SS_CUDA_CHECK(cudaStreamSynchronize(st[r]));
      }
#if defined(SWIFTSPEC_HAVE_NCCL)
      comms.clear();
#endif
      for (int r = 0; r < tp; ++r) {
        SS_CUDA_CHECK(cudaSetDevice(r));
        cudaStreamDestroy(st[r]);
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
    std::replace(error.begin(), error.end(), '"', '\'');
    std::printf("ERROR: %s\n", e.what());
  }

  // ---- summary table + JSON ------------------------------------------------------
  std::printf("\n%-4s %-9s %10s %10s %8s\n", "tp", "bytes", "nccl_us", "peer_us", "speedup");
  for (const ArRow& r : ar_rows)
    std::printf("%-4d %-9zu %10.2f %10.2f %8.2f\n", r.tp, r.bytes, r.nccl_us, r.peer_us,
                r.peer_us > 0 && r.nccl_us > 0 ? r.nccl_us / r.peer_us : 0.0);
  std::printf("\n%-4s %-13s %3s %9s %9s %9s %9s %9s\n", "tp", "shape", "M", "gemm", "+nccl", "+peer", "fused", "limit");
  for (const GemmRow& r : gemm_rows)
    std::printf("%-4d %-13s %3d %9.2f %9.2f %9.2f %9.2f %9.2f\n", r.tp, r.shape.c_str(), r.M, r.gemm_us, r.gemm_nccl_us,
                r.gemm_peer_us, r.fused_us, r.limit_us);
  if (!json_path.empty()) {
    std::string j = "{\n  \"device\": \"" + device_name + "\",\n  \"gpus\": " + std::to_string(gpus) +
                    ",\n  \"nccl_version\": " + std::to_string(nccl_version) + ",\n  \"nvls_enable\": \"" +
                    (std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "") +
                    "\",\n  \"iters\": " + std::to_string(iters) + ",\n  \"copy_bandwidth_tbs\": " + num(bw) +
                    ",\n  \"units\": \"microseconds per operation (median over graph replays of the slowest rank)\"" +
                    ",\n  \"allreduce\": [";
    for (size_t i = 0; i < ar_rows.size(); ++i) {
      const ArRow& r = ar_rows[i];
      j += std::string(i ? "," : "") + "\n    {\"tp\": " + std::to_string(r.tp) +
           ", \"bytes\": " + std::to_string(r.bytes) + ", \"nccl_us\": " + num(r.nccl_us) +
           ", \"peer_us\": " + num(r.peer_us) + ", \"peer_us_by_ctas\": {\"" + std::to_string(kSweepCtas[0]) +
           "\": " + num(r.peer_sweep_us[0]) + ", \"" + std::to_string(kSweepCtas[1]) +
           "\": " + num(r.peer_sweep_us[1]) + ", \"" + std::to_string(kSweepCtas[2]) +
           "\": " + num(r.peer_sweep_us[2]) + "}}";
    }
    j += "\n  ],\n  \"row_parallel_gemm\": [";
    for (size_t i = 0; i < gemm_rows.size(); ++i) {
      const GemmRow& r = gemm_rows[i];
      j += std::string(i ? "," : "") + "\n    {\"tp\": " + std::to_string(r.tp) + ", \"shape\": \"" + r.shape +
           "\", \"N\": " + std::to_string(r.N) + ", \"K_total\": " + std::to_string(r.K) +
           ", \"M\": " + std::to_string(r.M) + ", \"gemm_us\": " + num(r.gemm_us) +
           ", \"gemm_nccl_us\": " + num(r.gemm_nccl_us) + ", \"gemm_peer_us\": " + num(r.gemm_peer_us) +
           ", \"fused_us\": " + num(r.fused_us) + ", \"two_kernel_residual_us\": " + num(r.two_kernel_us) +
           ", \"weight_limit_us\": " + num(r.limit_us) + ", \"plan\": \"" + r.plan + "\"}";
    }
    j += "\n  ],\n  \"p2p_one_way\": [";
    for (size_t i = 0; i < p2p_rows.size(); ++i)
      j += std::string(i ? "," : "") + "\n    {\"bytes\": " + std::to_string(p2p_rows[i].bytes) +
           ", \"nccl_us\": " + num(p2p_rows[i].nccl_us) + ", \"peer_us\": " + num(p2p_rows[i].peer_us) + "}";
    j += "\n  ],\n  \"notes\": [";
    for (size_t i = 0; i < notes.size(); ++i) {
      std::string n = notes[i];
      std::replace(n.begin(), n.end(), '"', '\'');
      j += std::string(i ? ", " : "") + "\"" + n + "\"";
    }
    j += "],\n  \"error\": \"" + error + "\"\n}\n";
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) {
      std::fputs(j.c_str(), f);
      std::fclose(f);
    }
  }
  return error.empty() ? 0 : 1;
}
