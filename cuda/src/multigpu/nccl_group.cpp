// make_nccl_group(): NCCL communicators of one in-process worker group
// (nccl_group.h). One GroupState is shared by the group's communicators: the
// NCCL handles, the abort flag, and a lock that keeps abort() from tearing
// the handles down while a rank is enqueueing on them.
#include "swiftspec_cuda/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>

#include "common.h"

namespace swiftspec {
namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw NcclError(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(r) + " (" +
                    ncclGetLastError(nullptr) + ")");
}
#define SS_NCCL_CHECK(call) nccl_check((call), #call)

struct GroupState {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;  // empty after abort() until reset()
  std::atomic<bool> aborted{false};
  // Shared: a rank enqueueing on its communicator. Exclusive: abort()
  // tearing the communicators down, reset() re-creating them.
  std::shared_mutex mu;

  void init_comms() {
    comms.assign(devices.size(), nullptr);
    SS_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
  }
  ~GroupState() {
    int prev = 0;
    cudaGetDevice(&prev);
    for (size_t r = 0; r < comms.size(); ++r) {
      if (!comms[r]) continue;
      cudaSetDevice(devices[r]);
      ncclCommDestroy(comms[r]);
    }
    cudaSetDevice(prev);
  }
};

class NcclCommunicator final : public CudaCommunicator {
 public:
  NcclCommunicator(std::shared_ptr<GroupState> g, int rank) : g_(std::move(g)), rank_(rank) {
    SS_CUDA_CHECK(cudaSetDevice(device()));
    SS_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
    stream_ = own_stream_;
    SS_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    SS_CUDA_CHECK(cudaMemset(scratch_, 0, sizeof(float)));
  }
  ~NcclCommunicator() override {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device());
    if (own_stream_) {
      cudaStreamSynchronize(own_stream_);
      cudaStreamDestroy(own_stream_);
    }
    if (scratch_) cudaFree(scratch_);
    cudaSetDevice(prev);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(g_->devices.size()); }
  int device() const override { return g_->devices[rank_]; }
  void* stream() const override { return stream_; }
  void set_stream(void* s) override { stream_ = s ? static_cast<cudaStream_t>(s) : own_stream_; }
  void* nccl_comm() const override {
    std::shared_lock lock(g_->mu);
    return g_->comms.empty() ? nullptr : g_->comms[rank_];
  }

  void all_reduce_sum(float* data, size_t count) override {
    enqueue("all_reduce_sum",
            [&](ncclComm_t c) { SS_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, c, stream_)); });
  }
  void all_reduce_sum_bf16(void* data, size_t count) override {
    enqueue("all_reduce_sum_bf16",
            [&](ncclComm_t c) { SS_NCCL_CHECK(ncclAllReduce(data, data, count, ncclBfloat16, ncclSum, c, stream_)); });
  }

  void gather(const float* send, float* recv, size_t count, int root) override {
    if (root < 0 || root >= size())
      throw InvalidArgument("gather: root " + std::to_string(root) + " is outside [0, size=" + std::to_string(size()) +
                            ")");
    enqueue("gather", [&](ncclComm_t c) {
      if (rank_ == root) {
        if (!recv) throw InvalidArgument("gather: recv is null on the root rank");
        SS_CUDA_CHECK(cudaMemcpyAsync(recv + static_cast<size_t>(root) * count, send, sizeof(float) * count,
                                      cudaMemcpyDeviceToDevice, stream_));
      }
      SS_NCCL_CHECK(ncclGroupStart());
      if (rank_ == root) {
        for (int r = 0; r < size(); ++r)
          if (r != root)
            SS_NCCL_CHECK(ncclRecv(recv + static_cast<size_t>(r) * count, count, ncclFloat32, r, c, stream_));
      } else {
        SS_NCCL_CHECK(ncclSend(send, count, ncclFloat32, root, c, stream_));
      }
      SS_NCCL_CHECK(ncclGroupEnd());
    });
  }

  void barrier() override {
    enqueue("barrier", [&](ncclComm_t c) {
      SS_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, c, stream_));
    });
    // Poll instead of cudaStreamSynchronize, so that abort() by another rank
    // frees a thread whose peers never arrive.
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) SS_CUDA_CHECK(e);
      if (g_->aborted.load()) throw CommAborted("barrier: the NCCL group was aborted");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void abort() override {
    g_->aborted.store(true);
    std::unique_lock lock(g_->mu);
    for (size_t r = 0; r < g_->comms.size(); ++r) {
      cudaSetDevice(g_->devices[r]);
      ncclCommAbort(g_->comms[r]);  // errors ignored: the group is being torn down
    }
    g_->comms.clear();
    cudaSetDevice(device());
  }

  void reset() override {
    std::unique_lock lock(g_->mu);
    if (g_->comms.empty()) g_->init_comms();
    g_->aborted.store(false);
    SS_CUDA_CHECK(cudaSetDevice(device()));
  }

 private:
  template <class F>
  void enqueue(const char* what, F&& f) {
    if (g_->aborted.load()) throw CommAborted(std::string(what) + ": the NCCL group was aborted");
    std::shared_lock lock(g_->mu);
    if (g_->aborted.load() || g_->comms.empty()) throw CommAborted(std::string(what) + ": the NCCL group was aborted");
    SS_CUDA_CHECK(cudaSetDevice(device()));
    f(g_->comms[rank_]);
  }

  std::shared_ptr<GroupState> g_;
  int rank_ = 0;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
};

}  // namespace

void disable_nvlink_multicast() {
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  if (v && std::strcmp(v, "0") != 0)
    std::fprintf(stderr, "swiftspec: NCCL_NVLS_ENABLE=%s overridden to 0 (NVLink multicast stays off)\n", v);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
}

std::vector<std::unique_ptr<CudaCommunicator>> make_nccl_group(const std::vector<int>& devices) {
  if (devices.empty()) throw InvalidArgument("make_nccl_group: devices is empty");
  int count = 0;
  SS_CUDA_CHECK(cudaGetDeviceCount(&count));
  std::set<int> seen;
  for (size_t i = 0; i < devices.size(); ++i) {
    const int d = devices[i];
    if (d < 0 || d >= count)
      throw InvalidArgument("make_nccl_group: devices[" + std::to_string(i) + "] = " + std::to_string(d) +
                            " is outside [0, " + std::to_string(count) + ") (CUDA devices of this process)");
    if (!seen.insert(d).second)
      throw InvalidArgument("make_nccl_group: device " + std::to_string(d) +
                            " is listed twice (NCCL needs one GPU per rank)");
  }
  disable_nvlink_multicast();
  int prev = 0;
  SS_CUDA_CHECK(cudaGetDevice(&prev));
  auto g = std::make_shared<GroupState>();
  g->devices = devices;
  g->init_comms();
  std::vector<std::unique_ptr<CudaCommunicator>> out;
  for (int r = 0; r < static_cast<int>(devices.size()); ++r) out.push_back(std::make_unique<NcclCommunicator>(g, r));
  SS_CUDA_CHECK(cudaSetDevice(prev));
  return out;
}

}  // namespace swiftspec
