// swiftspec-cuda-memory-check: cuda_memory_need (swiftspec_cuda/memory_plan.h) against the GPU
// memory a CudaModel really takes, for the benchmark shapes at several contexts. Run it on the
// GPU machine after changing the model's buffers: the estimate must stay at or above what is
// measured (the context plan refuses or caps on it), and not far above.
//
// Measured: cudaMemGetInfo's free bytes before the model is made minus after (weights, KV
// cache, workspaces and graphs that stay), and the lowest free value seen while it is made
// (a thread polls it: the load-time staging buffer is freed before the constructor returns).
// Prints one line per case and a JSON array on the last line; exit status 1 when an estimate is
// below what was measured at its peak.
//
// Usage: swiftspec-cuda-memory-check [--shapes qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b]
//                                    [--contexts 4096,32768] [--megakernel] [--int4 G]
// --int4 G: int4 projections of group size G (CudaModelOptions::int4_group_size; random
// contents, so no load-time staging is measured).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model_shapes.h"
#include "swiftspec_cuda/cuda_model.h"
#include "swiftspec_cuda/memory_plan.h"

using namespace swiftspec;

namespace {
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}
size_t free_now() {
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  return f;
}
}  // namespace

int main(int argc, char** argv) {
  std::string shapes = "qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b", contexts = "4096,32768";
  bool megakernel = false;
  int int4_group = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--shapes" && i + 1 < argc)
      shapes = argv[++i];
    else if (a == "--contexts" && i + 1 < argc)
      contexts = argv[++i];
    else if (a == "--megakernel")
      megakernel = true;
    else if (a == "--int4" && i + 1 < argc)
      int4_group = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--shapes a,b] [--contexts n,m] [--megakernel] [--int4 G]\n", argv[0]);
      return 2;
    }
  }
  cudaSetDevice(0);
  cudaFree(nullptr);  // the context first: its own memory is not the model's
  bool ok = true;
  std::string json = "[";
  for (const std::string& shape : split(shapes)) {
    for (const std::string& ctx : split(contexts)) {
      const ModelConfig cfg = cuda::shape_config(shape);
      ModelOptions opt;
      opt.max_context = std::stoi(ctx);
      opt.max_tree = 256;
      opt.megakernel = megakernel;
      CudaModelOptions co;
      co.megakernel = megakernel;
      co.int4_group_size = int4_group;
      if (int4_group > 0) co.large_prefill = false;
      const MemoryNeed need = cuda_memory_need(cfg, opt, 2, int4_group);
      const size_t before = free_now();
      std::atomic<bool> done{false};
      std::atomic<size_t> lowest{before};
      std::thread poll([&] {
        while (!done) {
          const size_t f = free_now();
          size_t l = lowest.load();
          while (f < l && !lowest.compare_exchange_weak(l, f)) {
          }
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      });
      size_t after = before;
      std::string error;
      try {
        auto m = make_cuda_model_random(cfg, opt, co, 1);
        cudaDeviceSynchronize();
        after = free_now();
        done = true;
        poll.join();
      } catch (const std::exception& e) {
        done = true;
        poll.join();
        error = e.what();
      }
      const double gib = double(1ull << 30);
      const size_t estimate = need.bytes(opt.max_context);
      const size_t steady = before - after, peak = before - lowest.load();
      const bool below = error.empty() && estimate < peak;
      ok = ok && !below && error.empty();
      std::printf(
          "%-13s ctx %6d  estimate %7.3f GiB (weights %.3f, kv %.3f, workspaces %.3f)  measured steady %7.3f "
          "peak %7.3f GiB  estimate/peak %.3f%s%s\n",
          shape.c_str(), opt.max_context, estimate / gib, need.weight_bytes / gib, need.kv_bytes(opt.max_context) / gib,
          need.workspace(opt.max_context) / gib, steady / gib, peak / gib, peak ? double(estimate) / double(peak) : 0.0,
          below ? "  BELOW" : "", error.empty() ? "" : ("  error: " + error).c_str());
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "%s{\"shape\": \"%s\", \"context\": %d, \"megakernel\": %s, \"int4_group\": %d, \"estimate\": %zu, "
                    "\"weights\": %llu, "
                    "\"kv\": %llu, \"workspaces\": %llu, \"steady\": %zu, \"peak\": %zu}",
                    json.size() > 1 ? ", " : "", shape.c_str(), opt.max_context, megakernel ? "true" : "false",
                    int4_group, estimate, (unsigned long long)need.weight_bytes,
                    (unsigned long long)need.kv_bytes(opt.max_context),
                    (unsigned long long)need.workspace(opt.max_context), steady, peak);
      json += buf;
    }
  }
  std::printf("%s]\n", json.c_str());
  return ok ? 0 : 1;
}
