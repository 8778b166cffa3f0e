// Peer channel: the device-side state of the one-shot all-reduce over NVLink
// peer access (no NCCL), shared by the standalone all-reduce kernel
// (peer_allreduce.h) and the row-parallel GEMM whose epilogue does the
// all-reduce (epi_allreduce.h).
//
// Every rank r owns, on its GPU, a "symmetric" allocation of the same layout:
//   data  [2][capacity] bf16   what rank r contributes, double-buffered by the
//                              parity of the launch epoch
//   flags [kMaxPeerCtas][kMaxPeerRanks] u32
//                              flags[c][q]: the last epoch in which CTA c of
//                              rank q said "my contribution is written"
//   epoch, done  u32           this rank's launch counter (local use only)
// and every rank holds the device pointers of all ranks' data and flags
// (cudaDeviceEnablePeerAccess makes them dereferenceable; one process, so
// no IPC handles are needed).
//
// One launch (an all-reduce op) on rank r, CTA c, epoch e = epoch + 1:
//   1. write the contribution into data_r[e & 1] (the CTA's share of it);
//   2. __syncthreads; thread q: fence.acq_rel.sys, then st.release.sys
//      flags_q[c][r] = e (a store into rank q's memory: the peer polls locally);
//   3. thread q spins on ld.acquire.sys flags_r[c][q] until >= e; __syncthreads;
//   4. read every rank's data[e & 1] for the CTA's share and sum them in rank
//      order 0, 1, ..., n-1 (fp32): every rank gets bit-identical results;
//   5. the last CTA to finish (done counter) resets `done` and increments
//      `epoch`, so the next launch, or the next replay of a CUDA graph, uses
//      e + 1 without the host.
// Why this is safe to reuse (rank r writes data_r[p] in epoch e while a peer
// may still read it?): rank r's launch e starts after its launch e - 1 has
// completed on its stream, and launch e - 1 completed only after every CTA of
// rank r saw every peer's flag e - 1, which each peer set after its launch
// e - 2 had completed. So every peer has finished reading data_r[e & 1] from
// epoch e - 2 before rank r overwrites it; epoch e - 1 used the other half.
// A flag may already be past e (a peer that raced into launch e + 1 on that
// CTA slot), hence ">= e" (wrap-safe signed difference). Different launches
// on one channel may use different grids: only the CTA slots of the launch
// take part, and all ranks issue the same sequence of launches (SPMD).
// Requirements: every rank issues the same sequence of launches on a channel
// with the same grid per launch; the CTAs of one launch are co-resident
// (persistent grids, or few CTAs), since they wait for each other's peers;
// kernels that may be launched with programmatic dependent launch read the
// epoch only after griddepcontrol.wait.
// Source: the one-shot all-reduce over peer memory with flags pushed to the
// reader is the idea of the "custom all-reduce" kernels of TensorRT-LLM and
// vLLM; the epoch/parity handshake, the per-CTA slots and the fused-epilogue
// use are this project's own. Memory-model patterns (release/acquire at .sys
// scope, fence.acq_rel.sys) follow the PTX ISA, "Memory Consistency Model".
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace swiftspec::cuda {

constexpr int kMaxPeerRanks = 8;    ///< ranks of one peer group (GPUs of one NVLink node)
constexpr int kMaxPeerCtas = 1024;  ///< CTAs of one launch on a channel

/// Rank `rank`'s view of one channel (kernel parameter, by value).
struct PeerChannel {
  int rank = 0;
  int size = 1;
  size_t capacity = 0;                      ///< bf16 elements per parity half
  __nv_bfloat16* data[kMaxPeerRanks] = {};  ///< every rank's data [2][capacity]
  uint32_t* flags[kMaxPeerRanks] = {};      ///< every rank's flags [kMaxPeerCtas][kMaxPeerRanks]
  uint32_t* epoch = nullptr;                ///< this rank's launch epoch (local)
  uint32_t* done = nullptr;                 ///< this rank's finished-CTA counter (local)
};

#if defined(__CUDACC__)

__device__ __forceinline__ uint32_t peer_ld_volatile_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t peer_ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void peer_st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/// 16-byte load that never hits a stale L1 line (peer data rewritten every
/// other epoch at the same address).
__device__ __forceinline__ uint4 peer_ld_volatile_v4(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ __nv_bfloat16 peer_ld_volatile_bf16(const __nv_bfloat16* p) {
  unsigned short v;
  asm volatile("ld.volatile.global.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return __ushort_as_bfloat16(v);
}

/// The epoch of the current launch (step 5 of the protocol: constant during a
/// launch). Call after griddepcontrol.wait.
__device__ __forceinline__ uint32_t peer_epoch(const PeerChannel& ch) { return peer_ld_volatile_u32(ch.epoch) + 1u; }

__device__ __forceinline__ uint64_t peer_globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// A wait for a peer longer than this is a bug (a rank that never launches
/// its part, mismatched launch sequences): the kernel reports it and traps,
/// so the process fails instead of hanging. Legitimate waits are
/// microseconds (ranks' host threads drift by at most milliseconds).
constexpr uint64_t kPeerWaitLimitNs = 10ull * 1000 * 1000 * 1000;

/// Steps 2-3 for CTA slot `slot`: announce this CTA's contribution to every
/// rank and wait for every rank's. All threads of the CTA must call it after
/// writing their part of the contribution. Needs blockDim.x >= ch.size.
__device__ __forceinline__ void peer_exchange(const PeerChannel& ch, int slot, uint32_t e) {
  __syncthreads();
  const int q = threadIdx.x;
  if (q < ch.size) {
    __threadfence_system();  // fence.acq_rel.sys: the CTA's writes (ordered by the barrier) first
    peer_st_release_sys(ch.flags[q] + static_cast<size_t>(slot) * kMaxPeerRanks + ch.rank, e);
    const uint32_t* mine = ch.flags[ch.rank] + static_cast<size_t>(slot) * kMaxPeerRanks + q;
    uint32_t v = peer_ld_acquire_sys(mine);
    if (static_cast<int>(v - e) < 0) {
      const uint64_t t0 = peer_globaltimer_ns();
      for (uint32_t spins = 1;; ++spins) {
        v = peer_ld_acquire_sys(mine);
        if (static_cast<int>(v - e) >= 0) break;
        if ((spins & 1023u) == 0 && peer_globaltimer_ns() - t0 > kPeerWaitLimitNs) {
          printf("swiftspec peer all-reduce: rank %d CTA slot %d waited 10 s for rank %d (epoch %u, flag %u): trap\n",
                 ch.rank, slot, q, e, v);
          __trap();
        }
      }
    }
  }
  __syncthreads();
}

/// Step 5: the last CTA of the launch advances the epoch. All threads of
/// every CTA of the launch call it once, at the very end.
__device__ __forceinline__ void peer_finish_launch(const PeerChannel& ch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned total = gridDim.x * gridDim.y * gridDim.z;
    __threadfence();
    if (atomicAdd(ch.done, 1u) == total - 1) {
      atomicExch(ch.done, 0u);
      __threadfence();
      atomicAdd(ch.epoch, 1u);
    }
  }
}

/// Linear CTA index (flag slot) of the current CTA.
__device__ __forceinline__ int peer_cta_slot() {
  return static_cast<int>((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
}

/// Adds 8 bf16 (a 16-byte vector) into 8 fp32 accumulators.
__device__ __forceinline__ void peer_add8(float (&acc)[8], const uint4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

/// Sum over ranks 0..n-1 (in that order) of the 8 bf16 at element offset
/// `off` of data[r] + half: all loads issued before the adds.
template <int NR>
__device__ __forceinline__ void peer_sum8(const PeerChannel& ch, size_t half, size_t off, float (&acc)[8]) {
  uint4 v[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) v[r] = peer_ld_volatile_v4(ch.data[r] + half + off);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  // Rank 0 first, then 1, ...: (((0 + x0) + x1) + ...), the same on every rank.
#pragma unroll
  for (int r = 0; r < NR; ++r) peer_add8(acc, v[r]);
}

/// Same with the group size known at run time only (n <= kMaxPeerRanks;
/// fused epilogues, which are not templated on it).
__device__ __forceinline__ void peer_sum8_n(const PeerChannel& ch, size_t half, size_t off, float (&acc)[8]) {
  uint4 v[kMaxPeerRanks];
#pragma unroll
  for (int r = 0; r < kMaxPeerRanks; ++r)
    if (r < ch.size) v[r] = peer_ld_volatile_v4(ch.data[r] + half + off);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxPeerRanks; ++r)
    if (r < ch.size) peer_add8(acc, v[r]);
}

#endif  // __CUDACC__

}  // namespace swiftspec::cuda
