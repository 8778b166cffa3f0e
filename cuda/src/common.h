// Shared helpers of the CUDA backend: error checking, bf16 conversions, and
// thin wrappers over the PTX instructions the kernels use (mbarrier, TMA bulk
// tensor copies, ldmatrix, mma.sync, wgmma, programmatic dependent launch).
// Hopper (sm_90a) only.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <new>
#include <string>

#include "swiftspec_cuda/cuda_model.h"

namespace swiftspec::cuda {

/// Throws CudaError naming the call, the place and the CUDA error.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

}  // namespace swiftspec::cuda

#define SS_CUDA_CHECK(call)                                                                              \
  do {                                                                                                   \
    cudaError_t ss_err_ = (call);                                                                        \
    if (ss_err_ != cudaSuccess) ::swiftspec::cuda::throw_cuda_error(ss_err_, #call, __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: checks the launch error (not the kernel's completion).
#define SS_CUDA_CHECK_LAUNCH(what) SS_CUDA_CHECK(cudaGetLastError())

namespace swiftspec::cuda {

/// Bit of the current device in "done once per device" masks (kernel
/// attributes): cudaFuncSetAttribute applies to the current device only, so a
/// process that launches a kernel on several GPUs (tensor parallelism, one
/// thread per GPU) must set it once per device. Ordinals >= 64 get no bit (0):
/// callers then set the attribute on every call (the call is idempotent).
inline uint64_t current_device_bit() {
  int dev = 0;
  SS_CUDA_CHECK(cudaGetDevice(&dev));
  return dev < 64 ? uint64_t(1) << dev : 0;
}

/// Makes `device` this thread's current device for the scope and restores the
/// previous one after it. The current device is per host thread, and a model
/// is called from whichever thread runs its worker group (the async engine's
/// draft and target threads, Python's), so every entry point of a model sets
/// it (a thread that last used GPU 1 may call a model on GPU 0). The
/// constructor throws CudaError;
/// the std::nothrow_t form (for destructors) ignores failures.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    SS_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
      SS_CUDA_CHECK(cudaSetDevice(device));
      restore_ = true;
    }
  }
  DeviceScope(int device, std::nothrow_t) {
    restore_ = cudaGetDevice(&previous_) == cudaSuccess && previous_ != device && cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceScope() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace swiftspec::cuda

namespace swiftspec::cuda {

// ---------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------
#if defined(__CUDACC__)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Programmatic dependent launch: let the next kernel of the stream start its
/// prologue now (it still waits for this grid's completion in griddep_wait()).
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
/// Waits until the grids this one depends on have completed and their memory
/// is visible. A no-op when the kernel was launched without PDL.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/// Orders this thread's earlier async-proxy accesses of shared memory (TMA
/// writes, wgmma reads) before its later generic-proxy accesses (PTX ISA,
/// "proxy fence"), for buffers reused by plain loads and stores.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
/// One test of mbar_wait's condition: has the phase of parity `parity`
/// completed? (try_wait: the thread may be suspended for a system-dependent
/// time before it answers no; mbar_test_wait never suspends.)
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done)
               : "r"(smem_u32(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
/// Whether the phase of `parity` of mbarrier `bar` has completed, without
/// waiting (test_wait; try_wait may suspend the thread for a while).
__device__ __forceinline__ bool mbar_test_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done)
               : "r"(smem_u32(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
/// One try_wait that suspends the thread at most ~`hint_ns` (or until the
/// phase completes): for a waiting loop that must also watch something else
/// without busy-polling the warp scheduler it shares with other warps.
__device__ __forceinline__ bool mbar_try_wait_for(uint64_t* bar, uint32_t parity, uint32_t hint_ns) {
  uint32_t done;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3; selp.u32 %0, 1, 0, p; }"
               : "=r"(done)
               : "r"(smem_u32(bar)), "r"(parity), "r"(hint_ns)
               : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

/// 2-D TMA tile load global -> shared, completing on `bar` (bytes counted).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
/// Same with an L2 cache policy (createpolicy result).
__device__ __forceinline__ void tma_load_2d_hint(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

/// Four 8x8 b16 matrices, transposed (B operands of mma.sync from a row-major
/// [k][n] tile): lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// D += A(16x16, row) * B(16x8, col), bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- Hopper warpgroup MMA (wgmma, sm_90a) ----------------------------------
/// Shared-memory matrix descriptor of a K-major operand tile whose rows are
/// 128 bytes (64 bf16) written by TMA with CU_TENSOR_MAP_SWIZZLE_128B: 8-row
/// core-matrix groups 1024 bytes apart (stride byte offset), leading byte
/// offset unused for swizzled K-major tiles (1 by convention), layout type 1 =
/// 128-byte swizzle. The tile base must be 1024-byte aligned; the k-th group of
/// 16 columns starts `32 * k` bytes further (the swizzle is a function of the
/// address bits, so an offset inside the 128-byte row stays valid).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
/// Waits until at most one committed wgmma group is pending.
__device__ __forceinline__ void wgmma_wait_1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
/// Makes the compiler treat the accumulators as rewritten here, so that no
/// read of them is scheduled before the wgmma_wait_all() that precedes it.
template <int NT>
__device__ __forceinline__ void wgmma_fence_acc(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) asm volatile("" : "+f"(d[i][c])::"memory");
}
/// D[64 x 8*NT] += A[64 x 16] * B[8*NT x 16]^T, A (weight rows) and B (token
/// rows) K-major in shared memory, fp32 accumulators in the mma.sync m16n8
/// fragment layout per 8-column block: warp w of the warpgroup holds rows
/// 16w + lane/4 (+8), columns 8j + 2*(lane%4) (+1) in d[j][0..3].
template <int NT>
__device__ __forceinline__ void wgmma_bf16(float (&d)[NT][4], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void wgmma_bf16<1>(float (&d)[1][4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "l"(da), "l"(db), "r"(1)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_bf16<2>(float (&d)[2][4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3])
      : "l"(da), "l"(db), "r"(1)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_bf16<4>(float (&d)[4][4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, "
      "%17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(da), "l"(db), "r"(1)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_bf16<8>(float (&d)[8][4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, "
      "p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(1)
      : "memory");
}

/// Byte offset of the 16-byte chunk `chunk` (0..7) of row `row` in a tile of
/// 128-byte rows written by TMA with CU_TENSOR_MAP_SWIZZLE_128B (tile base
/// 1024-byte aligned): the chunk index is XORed with row % 8.
__device__ __forceinline__ uint32_t swz128(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

/// Orderable 64-bit key of (value, index): a larger value wins, then a
/// smaller index (the host's swiftspec::argmax / top_k_indices order). Used
/// with atomicMax for a deterministic arg-max. -0 is keyed as +0 (equal values
/// tie to the smaller index, as on the host); every NaN gets the largest value
/// key (kNanValueKey), so a NaN anywhere in a row wins its arg-max and the host
/// can refuse the row (argmax_key_is_nan) instead of returning a wrong token.
__device__ __forceinline__ unsigned long long argmax_key(float v, int idx) {
  uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  if (v != v) u = 0xFFFFFFFFu;
  return (static_cast<unsigned long long>(u) << 32) |
         static_cast<unsigned long long>(0xFFFFFFFFu - static_cast<uint32_t>(idx));
}

#endif  // __CUDACC__

/// True when an arg-max key came from a NaN (argmax_key).
inline __host__ __device__ bool argmax_key_is_nan(unsigned long long key) {
  return static_cast<uint32_t>(key >> 32) == 0xFFFFFFFFu;
}

/// Index of the token in an arg-max key (host and device).
inline __host__ __device__ int argmax_key_index(unsigned long long key) {
  return static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFull));
}

}  // namespace swiftspec::cuda
