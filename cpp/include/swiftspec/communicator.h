// Collective communication inside one worker group: tensor parallelism in
// the disaggregated design of SwiftSpec (ASPLOS'26 §4; docs/async_engine.md,
// "right-sized parallelism": the draft group and the target group each pick
// their own TP degree). A group runs its model Megatron-style (Shoeybi et al.
// 2019) over `size` ranks: one all-reduce after the row-parallel attention
// output projection and one after the row-parallel MLP down projection.
//
// The interface is shaped after NCCL so a CUDA implementation maps each call
// to one NCCL call on the communicator's stream:
//   all_reduce_sum(data, count)     -> ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, stream)
//   gather(send, recv, count, root) -> ncclGroupStart; ncclSend/ncclRecv; ncclGroupEnd
//   barrier()                       -> an all-reduce of one element, then stream sync
// Buffers are fp32; `count` counts elements, not bytes. Every rank of the
// group must make the same sequence of calls with the same counts (SPMD).
//
// Implementations:
//  - in-process (this file, CPU backend): the ranks are threads of one process;
//    buffers are plain host memory. Sums are formed in rank order
//    (((r0 + r1) + r2) + ...) for every element, so results are bit-identical
//    on every rank, every run, and whatever the number of rows in the batch
//    (each element is reduced on its own): the batch invariance the lossless
//    greedy claim needs (model.h, "Exactness").
//  - NCCL (CUDA builds): provided by the CUDA backend as
//    `make_nccl_group(devices)` in cuda/include/swiftspec_cuda/nccl_group.h
//    (device pointers; calls are enqueued on the stream given to
//    set_stream() and return before the GPU has done them; NCCL's sum order).
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "swiftspec/error.h"

namespace swiftspec {

/// Thrown by every blocked or later collective call of a group after one of
/// its ranks called abort() (a rank failed mid-step; see WorkerGroup).
class CommAborted : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This rank's index in [0, size()).
  virtual int rank() const = 0;
  /// Number of ranks in the group (the TP degree).
  virtual int size() const = 0;

  /// In place: data[i] <- sum over ranks of data[i], i < count (fp32).
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  /// Rank `root` receives every rank's `send[count]` into `recv`, rank-major:
  /// recv[r * count + i] = send_of_rank_r[i] (`recv` holds size()*count
  /// floats on the root; ignored elsewhere).
  virtual void gather(const float* send, float* recv, size_t count, int root) = 0;
  /// Returns once every rank has called barrier().
  virtual void barrier() = 0;

  /// Makes every blocked and later call of every rank of the group throw
  /// CommAborted, until reset(). Safe to call from any rank, any time.
  virtual void abort() = 0;
  /// Clears an abort. Call only while no rank is inside a collective.
  virtual void reset() = 0;

  /// CUDA implementations: the stream later calls are enqueued on. The
  /// in-process implementation ignores it.
  virtual void set_stream(void* /*stream*/) {}
};

/// `size` communicators of one in-process group, index r being rank r. Each
/// must be used by one thread at a time (its rank's thread). Throws
/// InvalidArgument for size < 1.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size);

}  // namespace swiftspec
