// Skinny GEMM of the decode / verification step: Y[m][n] = sum_k X[m][k] W[n][k]
// for M = 1..64 rows (tokens), weights W [N, K] bf16 row-major (memory-bound:
// every weight byte is read once per step, for all M rows at once).
//
// Kernel (SwiftSpec ASPLOS'26 §5.1, fused latency-optimized GEMMs):
//  * K is split into S contiguous slices (S fixed per matrix shape, never by M);
//    the S CTAs of a slice group form a thread-block cluster and sum their fp32
//    partials through distributed shared memory in slice order 0..S-1. So a
//    row of a batch of 64 gets bit-identical results to a batch of one.
//  * Each CTA streams its [BR rows x 64 k] weight tiles and the matching
//    [Mpad x 64 k] activation tiles with TMA (128-byte swizzle) through a
//    STAGES-deep mbarrier pipeline; warps read fragments with ldmatrix and
//    accumulate with mma.sync m16n8k16 (bf16 in, fp32 accumulate). The weight
//    tiles of the first stages are requested before griddepcontrol.wait, so
//    they overlap the previous kernel (programmatic dependent launch); the
//    next kernel is released after the main loop (gemm_pdl_early()).
//  * Persistent: a CTA loops over row blocks; the pipeline runs across them.
//  * Epilogues (template parameter) see, for one 16-row tile, the pair of rows
//    (r, r+8) of one token in the same thread: RoPE pairs and gate/up pairs are
//    placed there by permuting weight rows at load time (see weights.h).
//  * Two inner engines, chosen per matrix (never per M, so the row arithmetic
//    stays batch invariant): `Mma` (ldmatrix + mma.sync, any row block of 16
//    rows) and `Wgmma` (Hopper warpgroup MMA, the weight tile is the 64-row
//    A operand and the token tile the N = 8*NT operand, both read by the
//    tensor cores straight from the TMA-swizzled shared memory; one wgmma
//    group stays in flight). Options of the wgmma engine, checked and
//    benchmarked but off by default (measured slower on the H200;
//    benchmarks/README.md, "wgmma GEMM engine"):
//    keeping the CTA's activation slice resident in shared memory (loaded
//    once instead of once per row block; costs resident CTAs), and n8
//    instructions only (split_n).
//  * In a cluster launch where every CTA has one row block (one round), the
//    wgmma engine writes the row block's fp32 partials over its stage buffers
//    (palias): the bytes saved keep more CTAs resident (the 8B down matrix at
//    M = 32 / 64 in one round instead of two; benchmarks/README.md, "GEMM K
//    slices and aliased partials").
// Shapes: N % 16 == 0, K % 16 == 0, M <= 64. Errors: InvalidArgument.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace swiftspec::cuda {

/// Inner engine of the skinny GEMM (see above).
enum class GemmEngine { Mma = 0, Wgmma = 1 };

/// Geometry of one launch, chosen by plan_gemm() (host).
struct GemmConfig {
  GemmEngine engine = GemmEngine::Mma;
  int xres = 0;     ///< wgmma: activation slice resident in shared memory
  int split_n = 0;  ///< wgmma: one m64n8k16 per 8-token block instead of one m64n(8*NT)k16
  int palias = 0;   ///< wgmma: the reduction partials reuse the stage buffers (one round only)
  int NT = 1;       ///< n-tiles of 8 tokens: Mpad = 8 * NT (1, 2, 4, 8)
  int TM = 1;       ///< 16-row m-tiles per warp
  int WR = 1;       ///< warps per CTA (each owns TM m-tiles of the row block)
  int stages = 4;   ///< pipeline depth
  int S = 1;        ///< K slices = cluster size
  int BR = 16;      ///< rows per row block = 16 * TM * WR
  int grid_x = 1;   ///< row-block loop CTAs per slice
  size_t smem = 0;  ///< dynamic shared memory bytes
};

/// Arguments common to all epilogues.
struct GemmArgs {
  int N = 0, K = 0;
  const int* m_active_ptr = nullptr;  ///< tokens with outputs: min(*ptr, m_active_max); null: m_active_max
  int m_active_max = 0;
  const int* x_row0_ptr = nullptr;  ///< first X row (token 0); null: row 0
  // RMSNorm statistics of X (norm-fused GEMMs): per X row, hidden/16 partial
  // sums of squares of the fp32 residual (written by the previous residual
  // epilogue or the embedding).
  const float* ssq = nullptr;
  int ssq_stride = 0;  ///< partials per row (hidden / 16)
  int hidden = 0;
  float eps = 1e-6f;
  // Set by launch_gemm from the GemmConfig (callers leave them alone).
  int stages = 0;     ///< wgmma engine: pipeline depth (runtime)
  int xres = 0;       ///< wgmma engine: activation slice resident
  int split_n = 0;    ///< wgmma engine: n8 instructions only
  int palias = 0;     ///< wgmma engine: partials alias the stage buffers (every CTA one row block)
  int pdl_early = 0;  ///< release the dependent kernel at entry (else after the main loop)
};

/// Optional overrides of plan_gemm's choices (benchmarks, tests). The engine
/// must not depend on M for a given matrix (batch invariance): callers that
/// override it must do so for every bucket of that matrix.
struct GemmPlanHint {
  int engine = -1;   ///< -1: default (gemm_default_engine), 0: Mma, 1: Wgmma
  int wg = 0;        ///< wgmma: warpgroups per CTA (1 or 2 → 64 / 128 rows); 0: planner
  int stages = 0;    ///< wgmma: pipeline depth 2..8; 0: planner
  int xres = -1;     ///< wgmma: -1 planner, 0 stream activations, 1 resident (if it fits)
  int split_n = -1;  ///< wgmma: -1 default (gemm_default_split_n), 0 / 1
  int palias = -1;   ///< wgmma: -1 planner (alias when the launch is one round), 0 never
  int slices = 0;    ///< K slices (benchmarks only: the model must use gemm_slices); 0: default
};

/// Whether the wgmma engine issues n8 instructions only (SWIFTSPEC_WGMMA_SPLIT_N=1).
/// Both forms are checked for batch invariance; the wide form is the default.
int gemm_default_split_n();

/// Whether GEMMs release their programmatic dependents at entry
/// (SWIFTSPEC_GEMM_PDL_EARLY=1, A/B measurements) instead of after their
/// main loop (default).
int gemm_pdl_early();

/// Whether the planner may alias the partials onto the stages (palias) in one-round
/// launches: yes unless SWIFTSPEC_GEMM_PALIAS=0 (A/B measurements).
int gemm_default_palias();

/// Default engine of an N x K matrix: Wgmma, unless the environment variable
/// SWIFTSPEC_GEMM_ENGINE=mma asks for the mma.sync engine (A/B measurements).
GemmEngine gemm_default_engine(int N, int K);

/// K slices of an N x K matrix (a function of the shape only: the
/// batch-invariance contract).
int gemm_slices(int N, int K);

/// Picks tiles and grid for N x K with 8*NT token rows on this device.
/// `hint` overrides choices (see GemmPlanHint).
template <class Epi>
GemmConfig plan_gemm(int N, int K, int NT, int num_sms, const GemmPlanHint& hint = {});

/// Launches on `stream` (captured into graphs), optionally with programmatic
/// dependent launch. `wmap`: tensor map of W with box {64, cfg.BR}; `xmap`:
/// tensor map of X (rows = token rows, leading dim K) with box {64, 8*cfg.NT}.
template <class Epi>
void launch_gemm(const GemmConfig& cfg, const CUtensorMap& wmap, const CUtensorMap& xmap, const GemmArgs& args,
                 const typename Epi::Params& ep, bool pdl, cudaStream_t stream);

}  // namespace swiftspec::cuda
