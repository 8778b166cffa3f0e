// Device memory copy bandwidth, the denominator of every "physical limit" of the multi-GPU
// benches (bytes a step must read / this bandwidth): a 2 GiB device-to-device cudaMemcpy on
// `dev`, bytes read + written, median of 10 timed copies after 3 warm-ups, in TB/s.
// CUDA errors abort through SS_CUDA_CHECK.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "device_memory.h"

namespace swiftspec::cuda {

inline double copy_bandwidth_tbs(int dev) {
  SS_CUDA_CHECK(cudaSetDevice(dev));
  cudaStream_t st;
  SS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t bytes = size_t(2) << 30;
  double bw = 0;
  {
    DeviceBuffer a(bytes), b(bytes);
    SS_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, bytes, st));
    cudaEvent_t e0, e1;
    SS_CUDA_CHECK(cudaEventCreate(&e0));
    SS_CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 13; ++i) {
      SS_CUDA_CHECK(cudaEventRecord(e0, st));
      SS_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, st));
      SS_CUDA_CHECK(cudaEventRecord(e1, st));
      SS_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      SS_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (i >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    bw = 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e12;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cudaStreamDestroy(st);
  return bw;
}

}  // namespace swiftspec::cuda
