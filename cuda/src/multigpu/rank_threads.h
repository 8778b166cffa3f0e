// One host thread per rank of a multi-GPU group (tools and tests): the
// all-reduce kernels of one rank wait on the GPU for the other ranks, so the
// ranks' launches must be issued concurrently, each from its own thread with
// its own current device.
#pragma once
#include <cuda_runtime.h>

#include <exception>
#include <thread>
#include <vector>

#include "common.h"

namespace swiftspec::cuda {

/// Runs f(rank) for rank = 0..devices.size()-1, each on its own thread whose
/// current device is devices[rank]; returns when all have returned. Rethrows
/// the exception of the lowest failing rank. A rank that fails while the
/// others wait on the GPU for it leaves them waiting: callers run under a
/// wall-clock limit (tools/gpu_multi.sh).
template <class F>
void run_ranks(const std::vector<int>& devices, F&& f) {
  const int n = static_cast<int>(devices.size());
  std::vector<std::exception_ptr> err(n);
  std::vector<std::thread> th;
  th.reserve(n);
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        SS_CUDA_CHECK(cudaSetDevice(devices[r]));
        f(r);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

}  // namespace swiftspec::cuda
