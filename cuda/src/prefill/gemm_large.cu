// Large-M GEMMs of the prefill path (gemm_large.h): one CUTLASS 3 kernel type, a
// 128 x 128 x 64 tile on a cluster of two CTAs along N, the cooperative warp-specialized
// schedule (two consumer warpgroups per tile), fp32 C / D through the TMA epilogue.
#include "prefill/gemm_large.h"

#include <string>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "common.h"

namespace swiftspec::cuda {

namespace {

using namespace cute;

using ElementAB = cutlass::bfloat16_t;
using ElementCD = float;
using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _2, _1>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementCD, cutlass::layout::RowMajor, 4, ElementCD,
    cutlass::layout::RowMajor, 4, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor, 8, ElementAB,
    cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                    cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

constexpr size_t kWorkspaceBytes = size_t(1) << 20;

typename Gemm::Arguments make_args(const __nv_bfloat16* X, const __nv_bfloat16* W, const float* C, float* D, int M,
                                   int N, int K, float beta, int sm_count, int device) {
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sm_count;
  typename Gemm::Arguments a{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {reinterpret_cast<const ElementAB*>(X), cutlass::make_cute_packed_stride(StrideA{}, make_shape(M, K, 1)),
       reinterpret_cast<const ElementAB*>(W), cutlass::make_cute_packed_stride(StrideB{}, make_shape(N, K, 1))},
      {{},
       beta != 0.f ? C : nullptr,
       cutlass::make_cute_packed_stride(StrideC{}, make_shape(M, N, 1)),
       D,
       cutlass::make_cute_packed_stride(StrideD{}, make_shape(M, N, 1))},
      hw};
  a.epilogue.thread.alpha = 1.f;
  a.epilogue.thread.beta = beta;
  return a;
}

}  // namespace

size_t gemm_large_workspace_bytes() { return kWorkspaceBytes; }

void gemm_large_bf16(const __nv_bfloat16* X, const __nv_bfloat16* W, const float* C, float* D, int M, int N, int K,
                     float beta, void* workspace, int sm_count, int device, cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0 || K % 8 != 0 || N % 4 != 0)
    throw InvalidArgument("gemm_large: M, N, K must be positive, K a multiple of 8 and N of 4 (got M=" +
                          std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + ")");
  const typename Gemm::Arguments args = make_args(X, W, C, D, M, N, K, beta, sm_count, device);
  if (Gemm::get_workspace_size(args) > kWorkspaceBytes)
    throw CudaError("gemm_large: CUTLASS asks for " + std::to_string(Gemm::get_workspace_size(args)) +
                    " workspace bytes, more than the " + std::to_string(kWorkspaceBytes) + " reserved");
  Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess)
    throw CudaError(std::string("gemm_large: CUTLASS cannot run this GEMM: ") + cutlassGetStatusString(st));
  st = gemm.initialize(args, workspace, stream);
  if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
  if (st != cutlass::Status::kSuccess)
    throw CudaError(std::string("gemm_large: CUTLASS launch failed: ") + cutlassGetStatusString(st) + " (" +
                    cudaGetErrorString(cudaGetLastError()) + ")");
}

}  // namespace swiftspec::cuda
