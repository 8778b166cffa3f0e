// Per-bucket choice of the programmatic dependent launch (PDL) edges of a
// layered step graph.
//
// Why: PDL lets kernel i+1 launch while kernel i finishes, hiding launch
// latency and letting a GEMM request its first weight stages early. Whether an
// edge pays depends on the shape: on the H200 the Llama-3-8B single-token step
// was slower with PDL on every edge than with none (runs 16-17: 4.77-4.83 vs
// 4.91-5.18 ms), while its tree steps and the small models' steps were faster
// with it. A launch attribute changes no arithmetic (the kernels and their
// order are the same), so the engine may pick, per token bucket, whichever set
// of edges replays fastest on the machine at hand, as a GEMM library picks a
// tactic. The choice is made once, at a bucket's first step.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace swiftspec::cuda {

/// Launch kinds of a layered step whose incoming PDL edge can be switched off
/// (bit `1 << kind` of an "off" mask). The embedding is the graph's first node
/// and has no incoming edge.
enum PdlKind : unsigned {
  kPdlQkv = 0,
  kPdlAttention,
  kPdlOProj,
  kPdlGateUp,
  kPdlDown,
  kPdlLmHead,
  kPdlKinds
};
constexpr unsigned kPdlAllOff = (1u << kPdlKinds) - 1;

/// "qkv+down", "none" (every edge on) or "all" (every edge off).
std::string pdl_mask_name(unsigned off_mask);

/// Outcome of tune_pdl_edges().
struct PdlTuning {
  unsigned off_mask = 0;                              ///< chosen: kinds launched without PDL
  std::vector<std::pair<unsigned, double>> measured;  ///< (off mask, median ms) per candidate, in timing order
  /// "none 4.912, all 4.781, attn 4.903, ... -> all".
  std::string summary() const;
};

/// Times graphs of one step captured with different PDL "off" masks and keeps
/// the fastest. `capture(mask)` must return an executable graph of the step
/// with the kinds in `mask` launched without PDL; replaying it must be
/// idempotent (a step rewrites the same KV slots and outputs with the same
/// values). Candidates: every edge on, every edge off, each kind off alone;
/// then, if two or more single kinds beat every-edge-on, their union. Each
/// round replays every candidate once, interleaved (drift hits all alike);
/// `rounds` rounds after one warm-up replay each; the median decides. A
/// candidate must beat the default (every edge on) by `min_gain` (fraction) to
/// be chosen, so noise does not flip the choice. The chosen graph is returned
/// in `*chosen` (the caller owns it); the others are destroyed. Runs on
/// `stream` and synchronizes it. Throws CudaError (captures that fail are
/// destroyed first).
PdlTuning tune_pdl_edges(cudaStream_t stream, const std::function<cudaGraphExec_t(unsigned)>& capture,
                         cudaGraphExec_t* chosen, int rounds = 5, double min_gain = 0.01);

}  // namespace swiftspec::cuda
