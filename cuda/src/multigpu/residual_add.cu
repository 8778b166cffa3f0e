// Residual add after a separate all-reduce (the GEMM + ncclAllReduce path of
// row_parallel_impl.h): EpiResidual's work, done as its own kernel.
#include "common.h"
#include "multigpu/row_parallel_impl.h"

namespace swiftspec::cuda {

namespace {

/// Block m: token row m; thread t: 16-column tiles t, t + blockDim.x, ...
/// (the sum of squares of a tile in column order).
__global__ void __launch_bounds__(256)
    residual_add_kernel(const __nv_bfloat16* y, const int* m_active_ptr, int m_active_max, float* h32,
                        __nv_bfloat16* h16, float* ssq, int hidden) {
  griddep_wait();
  int m_active = m_active_max;
  if (m_active_ptr) m_active = min(m_active, *m_active_ptr);
  const int m = static_cast<int>(blockIdx.x);
  if (m >= m_active) return;
  const int tiles = hidden >> 4;
  for (int t = threadIdx.x; t < tiles; t += blockDim.x) {
    const size_t base = static_cast<size_t>(m) * hidden + 16 * t;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float a = h32[base + i] + __bfloat162float(y[base + i]);
      h32[base + i] = a;
      h16[base + i] = __float2bfloat16_rn(a);
      s += a * a;
    }
    ssq[static_cast<size_t>(m) * tiles + t] = s;
  }
}

}  // namespace

void launch_residual_add(const __nv_bfloat16* y, const int* m_active_ptr, int m_active_max, float* h32,
                         __nv_bfloat16* h16, float* ssq, int hidden, bool pdl, cudaStream_t stream) {
  if (hidden <= 0 || hidden % 16 != 0)
    throw InvalidArgument("residual add: hidden " + std::to_string(hidden) + " must be a positive multiple of 16");
  if (m_active_max <= 0) return;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(m_active_max), 1, 1);
  lc.blockDim = dim3(256, 1, 1);
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, &residual_add_kernel, y, m_active_ptr, m_active_max, h32, h16, ssq, hidden));
}

}  // namespace swiftspec::cuda
