// swiftspec-cuda-tp-bench: decode-step latency of the tensor-parallel CUDA
// model (issue 7) with random weights generated on the GPUs, for the
// Llama-3-8B and Llama-3-70B shapes at TP 1, 2, 4, 8 (up to the GPU count,
// and where the shard fits in GPU memory), against the physical limit.
//
// Each rank runs the CUDA model (cuda_model.h) with the rank's shard shape:
// query heads / tp, KV heads / tp, FFN rows / tp, vocabulary / tp (the LM
// head is column-parallel; each rank takes the arg-max of its own slice: the
// cross-rank arg-max of 64-bit keys, one tiny all-reduce, is not timed), the
// hidden size and the replicated fp32 residual stream whole. The attention
// output and MLP down projections all-reduce through the row-parallel hook
// (row_parallel.h), in two variants:
//   peer-fused    the peer all-reduce in the GEMM epilogue (one kernel),
//   peer-2kernel  GEMM into the symmetric buffer, then the peer all-reduce
//                 kernel with the residual add (two kernels),
//   nccl          GEMM, ncclAllReduce (bf16), residual-add kernel.
// Every rank replays its step graph (batch 1, context 512, greedy, PDL on)
// concurrently; the number is the slowest rank's median (CUDA events).
// Physical limit of a step = weight bytes one rank reads / copy bandwidth of
// GPU 0 (measured here, bytes read + written).
// Usage: swiftspec-cuda-tp-bench [--gpus N] [--json PATH] [--iters N] [--ctx N]
//          [--shapes llama3-8b,llama3-70b] [--quick]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "copy_bandwidth.h"
#include "device_memory.h"
#include "multigpu/peer_allreduce.h"
#include "multigpu/rank_threads.h"
#include "multigpu/row_parallel_impl.h"
#include "step_desc.h"
#include "swiftspec_cuda/cuda_model.h"
#include "json_number.h"
#include "model_shapes.h"

using namespace swiftspec;
using namespace swiftspec::cuda;

namespace {

/// The rank's shard shape (TpPlan's split without padding: every count here
/// divides by tp = 1, 2, 4, 8).
ModelConfig shard(const ModelConfig& c, int tp) {
  if (c.num_heads % tp || c.num_kv_heads % tp || c.intermediate_size % (8 * tp) || c.vocab_size % (16 * tp))
    throw InvalidArgument("shape does not split evenly over tp=" + std::to_string(tp));
  ModelConfig s = c;
  s.num_heads /= tp;
  s.num_kv_heads /= tp;
  s.intermediate_size /= tp;
  s.vocab_size /= tp;
  return s;
}

/// Device bytes of a model of shard shape `c` (weights, KV cache, a margin for activations).
size_t model_bytes(const ModelConfig& c, const ModelOptions& o) {
  const size_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const size_t nq = c.num_heads * hd, nkv = c.num_kv_heads * hd;
  const size_t layer = 2 * (H * (nq + 2 * nkv) + H * nq + 2 * I * H + H * I);
  const size_t kv = 2 * 2 * size_t(c.num_layers) * nkv * (o.max_context + o.max_tree);
  return size_t(c.num_layers) * layer + 2 * 2 * size_t(c.vocab_size) * H + kv + (size_t(1) << 30);
}

struct Row {
  std::string shape, mode, note;
  int tp = 1;
  double ms = -1, rank_min_ms = -1, weight_gb = 0, limit_ms = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, shapes_arg = "llama3-8b,llama3-70b";
  int want = 0, iters = 100, ctx = 512;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--gpus" && i + 1 < argc)
      want = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (a == "--ctx" && i + 1 < argc)
      ctx = std::atoi(argv[++i]);
    else if (a == "--shapes" && i + 1 < argc)
      shapes_arg = argv[++i];
    else if (a == "--quick")
      iters = 30;
    else {
      std::fprintf(stderr,
                   "usage: swiftspec-cuda-tp-bench [--gpus N] [--json PATH] [--iters N] [--ctx N] [--shapes A,B] "
                   "[--quick] (unknown argument '%s')\n",
                   a.c_str());
      return 2;
    }
  }
  if (iters < 1 || ctx < 1 || ctx > 1000) {
    std::fprintf(stderr, "--iters must be >= 1 and --ctx in 1..1000\n");
    return 2;
  }
  std::vector<std::string> shapes;
  {
    std::stringstream ss(shapes_arg);
    std::string s;
    while (std::getline(ss, s, ',')) shapes.push_back(s);
  }
  std::vector<Row> rows;
  int gpus = 0;
  double bw = 0;
  std::string error, device_name;
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
    device_name = prop.name;
    bw = copy_bandwidth_tbs(0);
    std::printf("devices: %d x %s; copy bandwidth GPU 0: %.3f TB/s; ctx %d; iters %d\n", gpus, prop.name, bw, ctx,
                iters);
    std::vector<int> tps;
    for (int t : {1, 2, 4, 8})
      if (t <= gpus) tps.push_back(t);
    ModelOptions opt;
    opt.max_context = 1024;
    opt.max_tree = 64;
    ForwardBatch step;
    step.tokens = {1234};
    step.positions = {ctx};
    step.logits = LogitsMode::Last;
    for (const std::string& shape : shapes) {
      const ModelConfig full = shape_config(shape);
      for (int tp : tps) {
        std::vector<std::string> modes =
            tp == 1 ? std::vector<std::string>{"single"} : std::vector<std::string>{"peer-fused", "peer-2kernel"};
#if defined(SWIFTSPEC_HAVE_NCCL)
        if (tp > 1) modes.push_back("nccl");
#endif
        const ModelConfig cfg = shard(full, tp);
        std::vector<int> devs(tp);
        for (int r = 0; r < tp; ++r) devs[r] = r;
        size_t free_min = SIZE_MAX;
        for (int r = 0; r < tp; ++r) {
          size_t fr = 0, tot = 0;
          SS_CUDA_CHECK(cudaSetDevice(r));
          SS_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
          free_min = std::min(free_min, fr);
        }
        const size_t need = model_bytes(cfg, opt);
        for (const std::string& mode : modes) {
          Row row;
          row.shape = shape;
          row.mode = mode;
          row.tp = tp;
          if (need > free_min) {
            row.note = "skipped: needs " + num(need / 1e9) + " GB per GPU, " + num(free_min / 1e9) + " GB free";
            std::printf("%-11s tp%d %-10s %s\n", shape.c_str(), tp, mode.c_str(), row.note.c_str());
            rows.push_back(row);
            continue;
          }
          try {
            std::unique_ptr<PeerGroup> peers;
            if (mode.rfind("peer", 0) == 0)
              peers = std::make_unique<PeerGroup>(devs, size_t(kMaxStepTokens) * cfg.hidden_size, 2);
#if defined(SWIFTSPEC_HAVE_NCCL)
            std::vector<std::unique_ptr<CudaCommunicator>> comms;
            if (mode == "nccl") comms = make_nccl_group(devs);
#endif
            std::vector<std::unique_ptr<CudaModel>> models(tp);
            std::vector<double> ms(tp, 0.0);
            run_ranks(devs, [&](int r) {
              CudaModelOptions co;
              co.device = r;
              if (mode == "peer-fused") co.row_parallel = make_peer_row_parallel(*peers, r, prop.multiProcessorCount);
              if (mode == "peer-2kernel")
                co.row_parallel = make_peer_row_parallel(*peers, r, prop.multiProcessorCount, PeerRowMode::TwoKernel);
#if defined(SWIFTSPEC_HAVE_NCCL)
              if (mode == "nccl")
                co.row_parallel = make_nccl_row_parallel(*comms[r], cfg.hidden_size, prop.multiProcessorCount);
#endif
              models[r] = make_cuda_model_random(cfg, opt, co, 42 + r);
              models[r]->debug_fill_committed_random(ctx, 43 + r);
            });
            run_ranks(devs, [&](int r) {
              const int id = models[r]->debug_prepare(step, false);
              ms[r] = models[r]->debug_replay_ms(id, iters);
            });
            row.ms = *std::max_element(ms.begin(), ms.end());
            row.rank_min_ms = *std::min_element(ms.begin(), ms.end());
            row.weight_gb = models[0]->weight_bytes_per_step() / 1e9;
            row.limit_ms = models[0]->weight_bytes_per_step() / (bw * 1e12) * 1e3;
            std::printf(
                "%-11s tp%d %-10s step %8.4f ms (ranks %.4f..%.4f)  weights/rank %6.2f GB  limit %7.4f ms  %.0f%%\n",
                shape.c_str(), tp, mode.c_str(), row.ms, row.rank_min_ms, row.ms, row.weight_gb, row.limit_ms,
                100.0 * row.limit_ms / row.ms);
            std::fflush(stdout);
            rows.push_back(row);
            run_ranks(devs, [&](int r) { models[r].reset(); });
          } catch (const std::exception& e) {  // this row only (e.g. no peer access): the next mode still runs
            row.note = std::string("error: ") + e.what();
            std::replace(row.note.begin(), row.note.end(), '"', '\'');
            std::printf("%-11s tp%d %-10s %s\n", shape.c_str(), tp, mode.c_str(), row.note.c_str());
            rows.push_back(row);
          }
        }
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
    std::replace(error.begin(), error.end(), '"', '\'');
    std::printf("ERROR: %s\n", e.what());
  }
  std::printf("\n%-11s %-3s %-10s %10s %10s %8s\n", "shape", "tp", "mode", "step_ms", "limit_ms", "of_limit");
  for (const Row& r : rows)
    std::printf("%-11s %-3d %-10s %10.4f %10.4f %7.0f%% %s\n", r.shape.c_str(), r.tp, r.mode.c_str(), r.ms, r.limit_ms,
                r.ms > 0 ? 100.0 * r.limit_ms / r.ms : 0.0, r.note.c_str());
  if (!json_path.empty()) {
    std::string j =
        "{\n  \"device\": \"" + device_name + "\",\n  \"gpus\": " + std::to_string(gpus) +
        ",\n  \"copy_bandwidth_tbs\": " + num(bw) + ",\n  \"context\": " + std::to_string(ctx) +
        ",\n  \"iters\": " + std::to_string(iters) +
        ",\n  \"units\": \"ms per decode step, batch 1 (median of graph replays, slowest rank)\",\n  \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      j += std::string(i ? "," : "") + "\n    {\"shape\": \"" + r.shape + "\", \"tp\": " + std::to_string(r.tp) +
           ", \"mode\": \"" + r.mode + "\", \"step_ms\": " + num(r.ms) +
           ", \"fastest_rank_ms\": " + num(r.rank_min_ms) + ", \"weight_gb_per_rank\": " + num(r.weight_gb) +
           ", \"limit_ms\": " + num(r.limit_ms) + ", \"note\": \"" + r.note + "\"}";
    }
    j += "\n  ],\n  \"error\": \"" + error + "\"\n}\n";
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) {
      std::fputs(j.c_str(), f);
      std::fclose(f);
    }
  }
  return error.empty() ? 0 : 1;
}
