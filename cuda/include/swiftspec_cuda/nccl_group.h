// NCCL communicators of one worker group over the GPUs of one node (issue 7;
// communicator.h names this factory). One process drives every GPU of the
// group, one thread per GPU (rank); SwiftSpec ASPLOS'26 §4: the draft group
// and the target group each get their own communicator over their own GPUs.
//
// Semantics on top of communicator.h:
//  - buffers are DEVICE pointers on the rank's GPU; `count` counts elements;
//  - every collective is enqueued on the rank's stream (set_stream(), else a
//    non-blocking stream the group created on that GPU) and returns at once:
//    it is ordered with the kernels of that stream, not with the host. The
//    calls are CUDA-graph capturable (NCCL >= 2.9);
//  - barrier() is the exception: it returns when every rank's barrier
//    all-reduce has completed on the GPU (the host waits);
//  - abort() marks the group aborted (every later call of every rank, and a
//    barrier() waiting for a dead rank, throws CommAborted) and aborts the
//    NCCL communicators, so a kernel waiting for a rank that will never come
//    is torn down. reset() re-creates the communicators (ncclCommInitAll over
//    the same devices); call it only while no rank is inside a call.
// Sums: all_reduce_sum (fp32) and all_reduce_sum_bf16 use NCCL's sum, whose
// order depends on NCCL's algorithm choice (ring / tree, channels): results
// are identical on every rank of one call, but not guaranteed bit-identical
// to the rank-order sum of the in-process communicator. The exact rank-order
// all-reduce of the CUDA backend is the peer all-reduce (cuda/src/multigpu/).
//
// NVLink multicast (NVLS) stays off: make_nccl_group() sets
// NCCL_NVLS_ENABLE=0 in the environment before NCCL reads it (a program using
// multicast can take a shared host's GPUs out of service). A value other
// than 0 is overridden, with a warning on stderr.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "swiftspec/communicator.h"
#include "swiftspec_cuda/cuda_model.h"

namespace swiftspec {

/// An NCCL call failed. The message names the call and NCCL's error string.
class NcclError : public CudaError {
 public:
  using CudaError::CudaError;
};

/// A Communicator on one GPU of an NCCL group (device buffers, see above).
class CudaCommunicator : public Communicator {
 public:
  /// CUDA ordinal of this rank's GPU.
  virtual int device() const = 0;
  /// The cudaStream_t later calls are enqueued on.
  virtual void* stream() const = 0;
  /// In place: data[i] <- sum over ranks of data[i], i < count; `data` is
  /// __nv_bfloat16 on this rank's GPU (NCCL's bf16 sum). The all-reduce of
  /// the tensor-parallel CUDA model.
  virtual void all_reduce_sum_bf16(void* data, size_t count) = 0;
  /// The ncclComm_t of this rank (for benchmarks and tests; do not destroy).
  virtual void* nccl_comm() const = 0;
};

/// One communicator per entry of `devices` (CUDA ordinals, distinct), index
/// r being rank r on devices[r]; created together with ncclCommInitAll from
/// the calling thread. Each communicator must then be used by one thread at a
/// time (its rank's thread). Throws InvalidArgument for an empty list, a
/// repeated or out-of-range ordinal, NcclError / CudaError when NCCL or CUDA
/// fails.
std::vector<std::unique_ptr<CudaCommunicator>> make_nccl_group(const std::vector<int>& devices);

/// Sets NCCL_NVLS_ENABLE=0 in this process's environment (see above).
/// Called by make_nccl_group(); call it yourself before any other NCCL use.
void disable_nvlink_multicast();

}  // namespace swiftspec
