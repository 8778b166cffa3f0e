// Decode megakernel device primitives: acquire / release counters, the spin
// guard, mbarriers, the consumer warps' named barrier, the trace stamps, block
// reductions, bf16 unpacking.
// Part of decode_megakernel.cu, included once inside its anonymous
// namespace and its `#if defined(__CUDACC__)`, so that each file holds one
// piece of the kernel; uses its constants (kConsumers, kWarps, kMegaTraceStamps).
#pragma once

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/// The CTA's release mark (MegaPlan::release_hold): a plain shared-memory
/// word written by consumer thread 0, polled by the producer.
__device__ __forceinline__ int ld_volatile_shared(const int* p) {
  int v;
  asm volatile("ld.volatile.shared.s32 %0, [%1];" : "=r"(v) : "r"(smem_u32(p)) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile_shared(int* p, int v) {
  asm volatile("st.volatile.shared.s32 [%0], %1;" ::"r"(smem_u32(p)), "r"(v) : "memory");
}
/// 1-D TMA bulk copy global -> shared (bytes % 16 == 0, both 16-byte aligned).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}
/// Spins until ready(); traps after ~10 s: a producer that never arrives (or
/// a mismatch between the producer's and the consumers' chunk walks) is a
/// bug, and a trap reports it where a hang would not.
template <class F>
__device__ __forceinline__ void spin_until(F&& ready) {
  if (ready()) return;
  const long long t0 = clock64();
  while (!ready())
    if (clock64() - t0 > 20000000000LL) __trap();
}
/// mbar_wait with spin_until's guard.
__device__ __forceinline__ void ring_wait(uint64_t* bar, uint32_t parity) {
  spin_until([&] { return mbar_try_wait(bar, parity); });
}
/// Traced kernel: cycles this thread was blocked in ring_wait, 0 when the
/// phase was already complete (tested first: every chunk would otherwise add
/// its probe's cycles).
__device__ __forceinline__ unsigned long long timed_ring_wait(uint64_t* bar, uint32_t parity) {
  if (mbar_test_wait(bar, parity)) return 0ull;
  const long long t0 = clock64();
  ring_wait(bar, parity);
  return static_cast<unsigned long long>(clock64() - t0);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
/// Barrier of the consumer warps only (the producer warp never joins).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

/// Consumer thread 0 waits until *ctr >= target (acquire at GPU scope; with
/// spin_until's guard), then the consumers proceed. (Relaxed polls with one
/// fence after success measured slower; benchmarks/README.md, "the decode
/// megakernel reworked".)
__device__ __forceinline__ void wait_counter(const unsigned* ctr, unsigned target) {
  if (threadIdx.x == 0) spin_until([&] { return ld_acquire_gpu(ctr) >= target; });
  consumer_sync();
}

/// Trace (MegaParams::trace): consumer thread 0 stamps the global timer (ns)
/// at the start (which 0: after its wait), the end (1: before its release) or
/// the arrival at the wait (2) of op `slot`. kTraced is the kernel's
/// instantiation (decode_megakernel_kernel<kTraced>): the untraced one has no
/// trace code at all, so the stamps cannot cost the default step registers.
template <bool kTraced>
__device__ __forceinline__ void trace_mark(const MegaParams& p, int slot, int which) {
  if constexpr (!kTraced) return;
  if (p.trace != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    p.trace[(static_cast<size_t>(slot) * p.plan.ctas + blockIdx.x) * kMegaTraceStamps + which] = t;
  }
}

/// Traced kernel: consumer thread 0 stores clock64 and the global timer at
/// word `at` (0: the consumers' start, 2: their end) of this CTA's
/// kMegaClockWords, which turn the ring's wait cycles into ns.
__device__ __forceinline__ void clock_trace(const MegaParams& p, int at) {
  if (p.trace != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    unsigned long long* w = p.trace + mega_trace_clock_offset(p.s.num_layers, p.plan.ctas) +
                            static_cast<size_t>(blockIdx.x) * kMegaClockWords;
    w[at] = static_cast<unsigned long long>(clock64());
    w[at + 1] = t;
  }
}

/// The consumers' writes so far (ordered by the barrier) are released to the
/// waiters of `ctr` (the pattern of CUTLASS's generic barrier). The trace's
/// end of op `slot` is stamped after the barrier: all warps are done.
template <bool kTraced>
__device__ __forceinline__ void signal_counter(const MegaParams& p, unsigned* ctr, int slot) {
  consumer_sync();
  trace_mark<kTraced>(p, slot, 1);
  if (threadIdx.x == 0) red_release_gpu_add(ctr, 1u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/// Sum over the consumer threads, the same value in each (fixed order).
__device__ __forceinline__ float block_sum(float v, float* small) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) small[threadIdx.x >> 5] = v;
  consumer_sync();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t += small[w];
  consumer_sync();
  return t;
}

__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  acc = fmaf(bf_lo(w.x), bf_lo(x.x), acc);
  acc = fmaf(bf_hi(w.x), bf_hi(x.x), acc);
  acc = fmaf(bf_lo(w.y), bf_lo(x.y), acc);
  acc = fmaf(bf_hi(w.y), bf_hi(x.y), acc);
  acc = fmaf(bf_lo(w.z), bf_lo(x.z), acc);
  acc = fmaf(bf_hi(w.z), bf_hi(x.z), acc);
  acc = fmaf(bf_lo(w.w), bf_lo(x.w), acc);
  acc = fmaf(bf_hi(w.w), bf_hi(x.w), acc);
  return acc;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
