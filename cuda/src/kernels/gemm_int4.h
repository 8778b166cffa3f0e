// Skinny GEMM with int4 weights (W4A16, issue 31): Y[m][n] = sum_k X[m][k] W[n][k] for
// M = 1..64 tokens, X bf16, W int4 with one fp16 scale s and one 4-bit zero point z per
// group of G consecutive k of a row: W[n][k] = (q[n][k] - z[n][k/G]) * s[n][k/G] (the
// checkpoint format's int4, docs/checkpoint_format.md, "int4 weights"; the CPU backend's
// int4 is the numerical reference). fp32 accumulation.
//
// Numerics. The kernel never rounds a weight: the integer q - z (-15..15) is exact in bf16,
// so the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate) form exact products
// x * (q - z) and sum them over one group into a group accumulator; at the group's end
// (or the K slice's end) the group sum is scaled into the output accumulator,
// acc = fmaf(s, gsum, acc). Since (q - z) * s is exact in fp32 (an 11-bit significand
// times a 5-bit integer), this is the same real-valued product the CPU backend computes
// from its dequantized fp32 weights; only the order (and rounding) of the fp32 additions
// differs, not the weights.
//
// Batch invariance (model.h's exactness contract). K is split into S slices (a function of
// the matrix shape only: gemm_int4_slices); within a slice every row is reduced in the same
// k order, with the same group flushes, whatever M, the row-block size or the pipeline
// depth; the S partials of a row are added in slice order 0..S-1 through distributed
// shared memory (one thread-block cluster per row block, as the bf16 skinny GEMM:
// gemm_skinny.h, whose reduction epilogue and epilogue interface are reused). So a row of a
// batch of 64 gets the bits of a batch of one.
//
// Kernel. Memory-bound: every weight byte is read once per step for all M tokens. A CTA of
// WR warps owns row blocks of BR = 16 * TM * WR rows (persistent over row blocks) and one
// K slice; it streams stages of 128 k through an mbarrier pipeline: the row block's int4
// words and group metadata with 1-D TMA bulk copies (contiguous in the layout below) and
// the [8 * NT x 64] activation tiles with 2-D TMA (128-byte swizzle, ldmatrix B fragments,
// as the bf16 kernel). A lane reads 16 bytes of weights per 64 k per 16-row tile (one
// ld.shared.v4) and turns each 32-bit word into its four bf16x2 A-fragment registers
// with shifts, lop3 (0x4300 | nibble = bf16 128 + q) and one bf16x2 add of -(128 + z).
// Weight copies of the first stages are issued before griddepcontrol.wait (programmatic
// dependent launch), the dependents released after the main loop, as the bf16 kernel.
//
// Device layout (int4_relayout / upload_int4_matrix make it from the checkpoint tensors):
//  * qw: uint32 [K/64][N/16][32 lanes][4], 16 bytes per lane per (64-k tile kt, 16-row
//    tile rt): word j of lane l holds the 8 nibbles lane l needs for the mma.sync A
//    fragment of k16 step j (k = 64 kt + 16 j .. +15) of rows 16 rt .. +15. With
//    g = l / 4, t = l % 4, kb = 64 kt + 16 j, r0 = 16 rt + g, r1 = r0 + 8, the fragment's
//    elements are e0 = q[r0][kb+2t], e1 = q[r0][kb+2t+1], e2 = q[r1][kb+2t],
//    e3 = q[r1][kb+2t+1], e4..e7 the same at kb+2t+8, kb+2t+9; nibble slot i (bits 4i..4i+3)
//    holds e[{0, 2, 4, 6, 1, 3, 5, 7}[i]] (Marlin's interleave: slots i and i + 4 form
//    the bf16x2 pair i after `(word >> 4i) & 0x000F000F`). N * K / 2 bytes.
//  * meta: uint32 [K/G][N]: (0xC300 | z) << 16 | fp16 bits of s, i.e. the bf16 bits of
//    -(128 + z) over the scale's. 4 * N * K / G bytes (the checkpoint's 3, plus one
//    byte that saves the kernel a conversion).
//  Rows may be permuted at re-layout (perm: device row n is checkpoint row perm[n]), as the
//  bf16 weights are for the RoPE / gate-up pairs (weight_layout.h).
//
// Shapes: N % 16 == 0, K % 64 == 0, G % 32 == 0, K % G == 0, M <= 64; the activation
// tensor map has box {64, 8 * NT}. Errors: InvalidArgument (shapes, values), CudaError.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "device_memory.h"
#include "kernels/gemm_skinny.h"

namespace swiftspec::cuda {

/// Device view of an int4 matrix in the layout above.
struct Int4View {
  const uint32_t* qw = nullptr;    ///< [K/64][N/16][32][4]
  const uint32_t* meta = nullptr;  ///< [K/G][N]
  int N = 0, K = 0, G = 0;
};

/// An int4 matrix in device memory (owning).
struct Int4Matrix {
  DeviceBuffer qw, meta;
  int N = 0, K = 0, G = 0;
  Int4View view() const { return {qw.as<const uint32_t>(), meta.as<const uint32_t>(), N, K, G}; }
  size_t bytes() const { return qw.bytes() + meta.bytes(); }
};

/// Throws InvalidArgument unless N, K, G fit the kernel (see Shapes above).
void check_int4_shape(int N, int K, int G);

/// Re-layout on the GPU, from the checkpoint tensors already in device memory:
/// qweight uint8 [N][K/2] (element 2j of a row in the low nibble of byte j), scales
/// fp16 bits [N][K/G], zeros uint8 [N][K/G] (0..15), optional perm [N] (device) ->
/// qw and meta in the layout above (qw: N*K/2 bytes, meta: 4*N*K/G bytes, 16-byte
/// aligned). `invalid` (device int, optional): incremented per group whose zero point
/// exceeds 15 or whose scale is not finite (such groups are still written). Async on `stream`.
void launch_int4_relayout(const uint8_t* qweight, const uint16_t* scales, const uint8_t* zeros, const int* perm, int N,
                          int K, int G, uint32_t* qw, uint32_t* meta, int* invalid, cudaStream_t stream);

/// Host tensors of the checkpoint format (as launch_int4_relayout; perm on the host or
/// null) -> an Int4Matrix: validates the shape and every zero point (<= 15) and scale
/// (finite) on the host first (InvalidArgument naming the first bad group), then uploads,
/// re-lays out on `stream` and synchronizes it.
Int4Matrix upload_int4_matrix(const uint8_t* qweight, const uint16_t* scales, const uint8_t* zeros, const int* perm,
                              int N, int K, int G, cudaStream_t stream);

/// Random valid contents for benchmarks: nibbles, scales in +-[2^-10, 2^-9), zeros 0..15.
void launch_fill_random_int4(const Int4View& w, uint64_t seed, cudaStream_t stream);

/// K slices (1..8, each at least two 64-k tiles) of an N x K int4 matrix: a function of
/// the shape only (the batch-invariance contract).
int gemm_int4_slices(int N, int K);

/// Geometry of one launch (plan_gemm_int4).
struct Int4GemmConfig {
  int NT = 1;       ///< n-tiles of 8 tokens: Mpad = 8 * NT (1, 2, 4, 8)
  int TM = 1;       ///< 16-row tiles per warp
  int WR = 4;       ///< warps per CTA
  int BR = 64;      ///< rows per row block = 16 * TM * WR
  int S = 1;        ///< K slices = cluster size
  int stages = 3;   ///< pipeline depth (stages of 128 k)
  int grid_x = 1;   ///< row-block loop CTAs per slice
  size_t smem = 0;  ///< dynamic shared memory bytes
};

/// Overrides of plan_gemm_int4's choices (benchmarks, tests).
struct Int4PlanHint {
  int warps = 0;   ///< 2, 4 or 8 warps per CTA; 0: planner
  int slices = 0;  ///< K slices (benchmarks only: the arithmetic changes); 0: gemm_int4_slices
};

/// Picks the row-block size and grid for N x K (group G) with 8*NT token rows.
template <class Epi>
Int4GemmConfig plan_gemm_int4(int N, int K, int G, int NT, int num_sms, const Int4PlanHint& hint = {});

/// Launches on `stream` (graph-capturable), optionally with programmatic dependent launch.
/// plan_gemm_int4 / launch_gemm_int4 exist for Epi = EpiPlain (gemm_int4.cu) and the model's
/// EpiQKV, EpiResidualNormed, EpiSwiGLU (gemm_int4_{qkv,residual,swiglu}.cu; epilogues.h).
/// `xmap`: tensor map of X (rows = token rows, leading dimension K) with box {64, 8*cfg.NT}
/// (make_tma_map_bf16). `args`: as for launch_gemm (N, K, m_active, x_row0, RMS statistics);
/// args.N / args.K must equal w.N / w.K.
template <class Epi>
void launch_gemm_int4(const Int4GemmConfig& cfg, const Int4View& w, const CUtensorMap& xmap, const GemmArgs& args,
                      const typename Epi::Params& ep, bool pdl, cudaStream_t stream);

}  // namespace swiftspec::cuda
