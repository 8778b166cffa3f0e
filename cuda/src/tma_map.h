// Creation of TMA tensor maps (CUtensorMap) for the skinny GEMM: 2-D bf16,
// 128-byte swizzle, box {64 columns, box_rows rows}. The driver entry point is
// fetched through the runtime (no link against libcuda).
#pragma once
#include <cuda.h>

#include <cstdint>

namespace swiftspec::cuda {

/// Tensor map over a row-major bf16 matrix [rows][cols] with leading
/// dimension `ld` elements (ld*2 % 16 == 0, base 16-byte aligned), box
/// {64, box_rows} (box_rows <= 256). Out-of-range box parts read as zero.
/// Throws CudaError / InvalidArgument.
CUtensorMap make_tma_map_bf16(const void* base, uint64_t rows, uint64_t cols, uint64_t ld, uint32_t box_rows);

}  // namespace swiftspec::cuda
