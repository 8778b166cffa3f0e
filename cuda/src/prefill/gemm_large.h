// Large-M GEMMs of the prefill path: CUTLASS 3 (sm90 TMA + wgmma, warp-specialized
// persistent kernels) from the nvidia-cutlass wheel's headers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace swiftspec::cuda {

/// D = X W^T + beta C, fp32 accumulation:
///   X [M][K] bf16 row-major (the activations), W [N][K] bf16 row-major (a weight matrix in
///   the device layout), C and D [M][N] fp32 row-major (C may alias D: the residual add);
///   beta 0 reads no C (C may be null).
/// `sm_count`: the SMs the persistent grid is sized for (a green-context partition's).
/// `workspace` of gemm_large_workspace_bytes() bytes. K must be a multiple of 8 and N of 4
/// (16-byte rows for TMA); throws InvalidArgument otherwise, CudaError when CUTLASS
/// refuses or fails to launch.
void gemm_large_bf16(const __nv_bfloat16* X, const __nv_bfloat16* W, const float* C, float* D, int M, int N, int K,
                     float beta, void* workspace, int sm_count, int device, cudaStream_t stream);

/// Workspace bytes gemm_large_bf16 needs (the persistent tile scheduler's), for any shape.
size_t gemm_large_workspace_bytes();

}  // namespace swiftspec::cuda
