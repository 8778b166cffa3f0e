// SM partitions of one GPU through CUDA green contexts (SwiftSpec ASPLOS'26
// §4: on one GPU the draft group and the target group are disaggregated by
// giving each its own SMs, so the draft's kernels cannot take SMs from the
// target's; docs/green_contexts.md).
//
// The driver API (CUDA >= 12.4; cuda.h "Green Contexts") partitions SMs in
// four steps: cuDeviceGetDevResource (the device's SMs) ->
// cuDevSmResourceSplitByCount (disjoint groups of at least minCount SMs, plus
// a remainder) -> cuDevResourceGenerateDesc (a set of groups of ONE split) ->
// cuGreenCtxCreate; work goes to a stream made by cuGreenCtxStreamCreate.
// Groups of different split calls may overlap, so this file splits each
// device once per process, into the smallest groups the driver allows
// (minSmPartitionSize: 8 SMs on compute capability 9.0), numbers the SMs in
// split order ("logical SMs"), and builds a partition [first, count] from the
// groups it covers (the remainder counts as the last group). Every model on
// that device therefore draws from the same split and disjoint ranges are
// disjoint sets of physical SMs.
//
// Driver entry points are fetched through cudaGetDriverEntryPointByVersion
// (no link-time dependency on libcuda), as tma_map.cpp does.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <new>
#include <string>
#include <vector>

#include "swiftspec/sm_partition.h"

namespace swiftspec::cuda {

/// How the driver splits one device's SMs (computed once per device).
struct SmSplitInfo {
  int device = 0;
  int device_sms = 0;             ///< SMs of the device (cuDeviceGetDevResource)
  int min_partition = 0;          ///< minSmPartitionSize reported by the driver
  int coscheduled_alignment = 0;  ///< smCoscheduledAlignment reported by the driver
  std::vector<int> group_sms;     ///< SMs of each split group, in split order (remainder last, if any)
  bool has_remainder = false;     ///< the last entry of group_sms is the split's remainder
  std::vector<int> boundaries;    ///< logical SM indices where partitions may start or end (0 .. device_sms)
};

/// The split of `device` (cached; thread-safe). Throws CudaError when the
/// driver has no green contexts (driver older than CUDA 12.4) or a call fails.
const SmSplitInfo& sm_split_info(int device);

/// A green context over logical SMs [range.first, range.end()) of a device.
/// Not copyable. Streams it creates must be destroyed before it.
class GreenContext {
 public:
  /// Resolves [first, count] (placement form, sm_partition.h) on `device` and
  /// creates the green context. Throws InvalidArgument (message starting with
  /// "sm_partition") for a range outside the device or off its boundaries, or
  /// too small to hold a cluster of 8 CTAs on 8 SMs (the GEMM kernels split K
  /// over clusters of up to 8 CTAs); CudaError for driver failures.
  GreenContext(int device, int first, int count);
  ~GreenContext();
  GreenContext(const GreenContext&) = delete;
  GreenContext& operator=(const GreenContext&) = delete;

  /// A new non-blocking stream whose kernels run on this partition's SMs
  /// (priority as for cudaStreamCreateWithPriority).
  cudaStream_t create_stream(int priority = 0);
  /// Makes the green context current on this thread (throws CudaError) /
  /// restores the previous one. The noexcept forms report success instead
  /// (destructors, where the driver may already be shut down at exit).
  void push() const;
  bool try_push() const noexcept;
  void pop() const;
  bool try_pop() const noexcept;

  SmRange range() const { return range_; }
  /// SMs provisioned by the driver (cuGreenCtxGetDevResource), = range().count.
  int sm_count() const { return sm_count_; }
  /// Clusters of 8 one-CTA-per-SM blocks that fit at once (occupancy API, in this context).
  int max_clusters_of_8() const { return clusters8_; }

 private:
  int device_ = 0;
  SmRange range_;
  int sm_count_ = 0;
  int clusters8_ = 0;
  CUgreenCtx green_ = nullptr;
  CUcontext ctx_ = nullptr;  ///< cuCtxFromGreenCtx(green_)
};

/// Makes `g` current on this thread for the scope (no-op for nullptr). The
/// constructor throws CudaError if the push fails; the std::nothrow_t form
/// ignores a failed push (for destructors). Leaving the scope never throws.
class GreenScope {
 public:
  explicit GreenScope(const GreenContext* g) : g_(g) {
    if (g_) g_->push();
  }
  GreenScope(const GreenContext* g, std::nothrow_t) : g_(g && g->try_push() ? g : nullptr) {}
  ~GreenScope() {
    if (g_) g_->try_pop();
  }
  GreenScope(const GreenScope&) = delete;
  GreenScope& operator=(const GreenScope&) = delete;

 private:
  const GreenContext* g_;
};

/// Diagnostics: runs `ctas` CTAs on `stream` (each spins ~`spin_us` µs) and
/// returns the sorted distinct SM ids (%smid) they ran on. Shows which
/// physical SMs a stream's kernels can reach. Synchronizes the stream.
std::vector<int> probe_sm_ids(cudaStream_t stream, int ctas, int spin_us = 20);

}  // namespace swiftspec::cuda
