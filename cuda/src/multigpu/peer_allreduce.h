// PeerGroup: the GPUs of one tensor-parallel group with NVLink peer access
// and the symmetric buffers of the one-shot all-reduce (peer_channel.h says
// how it works and why it is safe to reuse). No NCCL: plain CUDA.
//
// Owns, for every rank and channel, one device allocation on the rank's GPU
// (flags, counters, data [2][capacity] bf16), and the PeerChannel views that
// kernels take by value. A channel is one sequence of all-reduce launches
// that every rank issues in the same order (e.g. one per call site of a
// model); launches of different channels never wait for each other.
//
// The standalone all-reduce (all_reduce_bf16) copies the input into the
// rank's half of the symmetric buffer, exchanges flags, then every rank sums
// the n contributions in rank order in fp32 and rounds once to bf16: the
// results are bit-identical on every rank and for every split of the work
// over CTAs (each element is reduced on its own).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "multigpu/peer_channel.h"

namespace swiftspec::cuda {

class PeerGroup {
 public:
  /// `devices`: CUDA ordinals, rank r on devices[r], 1..kMaxPeerRanks of
  /// them. Distinct GPUs get peer access to each other
  /// (cudaDeviceEnablePeerAccess); an ordinal may repeat (several ranks on
  /// one GPU, for protocol tests on a one-GPU machine: only launches with few
  /// CTAs, which are co-resident, may then be used). `capacity`: bf16
  /// elements of the largest all-reduce (per launch); `channels` >= 1.
  /// Throws InvalidArgument for a bad list / size, CudaError naming the pair
  /// of GPUs without peer access, or on allocation failures.
  PeerGroup(const std::vector<int>& devices, size_t capacity, int channels = 1);
  ~PeerGroup();
  PeerGroup(const PeerGroup&) = delete;
  PeerGroup& operator=(const PeerGroup&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_.at(rank); }
  size_t capacity() const { return capacity_; }
  int channels() const { return channels_; }
  /// Rank `rank`'s view of channel `ch`.
  const PeerChannel& channel(int rank, int ch = 0) const;

  /// All-reduce of `count` bf16 (count <= capacity): out[i] = bf16(sum over
  /// ranks r = 0..n-1 of in_r[i]) with fp32 sums in rank order. `in` and
  /// `out` are on rank `rank`'s GPU, 16-byte aligned, may be equal. Enqueued
  /// on `stream` (capturable; with `pdl` launched as a programmatic
  /// dependent). Every rank must make the same calls on the channel, each
  /// from its own thread (it waits on the GPU for the others). `max_ctas`:
  /// CTAs of the launch (0: default, up to 128). Throws InvalidArgument.
  void all_reduce_bf16(int rank, const __nv_bfloat16* in, __nv_bfloat16* out, size_t count, cudaStream_t stream,
                       int ch = 0, bool pdl = false, int max_ctas = 0) const;

  /// Zeroes every rank's flags and counters of every channel (synchronous).
  /// Only while no launch of the group is in flight; restores the start state
  /// after a launch was killed mid-way (not needed otherwise).
  void reset_state();

 private:
  std::vector<int> devices_;
  size_t capacity_ = 0;
  int channels_ = 0;
  size_t bytes_per_alloc_ = 0;
  std::vector<void*> allocs_;       // [rank * channels + ch]
  std::vector<PeerChannel> views_;  // [rank * channels + ch]
};

/// The second kernel of the two-kernel row-parallel path (after a GEMM with
/// EpiPeerStore on the same channel and stream): for token rows m <
/// min(*m_active_ptr, m_max) (null pointer: m_max), Y[m] = sum over ranks
/// in rank order (fp32) of the bf16 partials in the channel's data for this
/// launch, then h32[m] += Y[m], h16[m] = bf16(h32[m]), ssq[m][t] = (sum of
/// squares of columns 16t..16t+7) + (of 16t+8..16t+15) — the same
/// arithmetic as EpiAllReduce's residual output, so both paths give
/// bit-identical results. h32 / h16 [m_max][N], ssq [m_max][N / 16], N % 16
/// == 0, m_max * N <= capacity. One thread per 16-column tile; the CTAs
/// (m_max * N / 4096 of them, at least one) exchange flags with the same CTA
/// of every rank, then advance the channel's epoch. With `pdl`, launched as
/// a programmatic dependent of the GEMM. Throws InvalidArgument.
void launch_peer_allreduce_residual(const PeerChannel& ch, const int* m_active_ptr, int m_max, int N, float* h32,
                                    __nv_bfloat16* h16, float* ssq, bool pdl, cudaStream_t stream);

/// Offsets inside one rank/channel allocation (bytes).
constexpr size_t kPeerFlagsBytes = sizeof(uint32_t) * kMaxPeerCtas * kMaxPeerRanks;
constexpr size_t kPeerCountersOffset = kPeerFlagsBytes;    // epoch, done
constexpr size_t kPeerDataOffset = kPeerFlagsBytes + 256;  // 256-byte aligned data

}  // namespace swiftspec::cuda
