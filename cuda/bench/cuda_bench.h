// What the parts of swiftspec-cuda-bench share: bench_main.cu (flags, report), bench_gemm.cu
// (copy bandwidth, GEMM rows) and bench_models.cu (model step rows, the megakernel's knobs).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "swiftspec/config.h"
#include "swiftspec/model.h"
#include "swiftspec_cuda/cuda_model.h"

namespace cuda_bench {

inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// bench_gemm.cu
double copy_bandwidth_tbs(cudaStream_t st);

struct GemmRow {
  std::string name;
  int N, K, M;
  double ours_us, cublas_us, bytes, mma_us, best_us;
  std::string config, best_config;
};

/// `only`: run just the shape of that name (empty: all); `only_m`: just that M in 1..64 (0: 1, 16, 64).
std::vector<GemmRow> bench_gemms(cudaStream_t st, int num_sms, bool sweep, const std::string& only = "",
                                 int only_m = 0);

// bench_models.cu
swiftspec::ForwardBatch decode_batch(int pos);

/// A tree of n nodes under a context of `ctx`: a main chain with side branches
/// (depth about n/3), every node's logits (greedy verification reads all).
swiftspec::ForwardBatch tree_batch(int n, int ctx, uint64_t seed);

struct ModelRow {
  std::string shape;
  double weight_gb, limit_ms, decode_ms, decode_nopdl_ms, host_ms, tree32_ms, tree64_ms;
  double tree32_nopdl_ms, tree64_nopdl_ms;                         ///< the steps without programmatic dependent launch
  double mma_decode_ms, mma_tree32_ms, mma_tree64_ms;              ///< GEMM engine Mma (with PDL), if asked
  double early_decode_ms, early_tree32_ms, early_tree64_ms;        ///< GEMMs release dependents at entry
  double untuned_decode_ms, untuned_tree32_ms, untuned_tree64_ms;  ///< SWIFTSPEC_STEP_TUNE=0 (--untuned)
  std::string step_tuning;          ///< CudaModel::debug_step_tuning() of the PDL model, lines joined by "; "
  double mk_decode_ms, mk_host_ms;  ///< the decode megakernel (CudaModelOptions::megakernel)
  std::string mk_trace_json;        ///< per-op critical path (--megakernel-trace)
};

/// --mk-head-keys N: CudaModelOptions::megakernel_head_keys of every
/// megakernel model of the run (-1: the default; 0: split units and a merge).
inline int g_mk_head_keys = -1;
/// --mk-head-parts N: CudaModelOptions::megakernel_head_parts (0: the plan's).
inline int g_mk_head_parts = 0;
/// --mk-inflight N: CudaModelOptions::megakernel_max_inflight (-1: the plan's).
inline int g_mk_inflight = -1;
/// --mk-slot-bytes N: CudaModelOptions::megakernel_slot_bytes (0: the plan's).
inline int g_mk_slot_bytes = 0;
/// --mk-hold N: CudaModelOptions::megakernel_release_hold (-1: the plan's).
inline int g_mk_hold = -1;
/// --mk-hold-input U: CudaModelOptions::megakernel_hold_until_input (-1: the plan's).
inline int g_mk_hold_input = -1;
/// --mk-attn-short 0|1: CudaModelOptions::megakernel_attn_short (-1: the plan's).
inline int g_mk_attn_short = -1;
/// --mk-attn-prewait 0|1: CudaModelOptions::megakernel_attn_prewait (-1: the plan's).
inline int g_mk_attn_prewait = -1;
/// --mk-merge-in-o 0|1: CudaModelOptions::megakernel_merge_in_o (-1: the plan's).
inline int g_mk_merge_in_o = -1;
/// --mk-l2-prefetch N: CudaModelOptions::megakernel_l2_prefetch_bytes (-1: the plan's).
inline int g_mk_l2_prefetch = -1;
/// --mk-sm-count N: the megakernel models run in a green context of the first
/// N SMs (CudaModelOptions::sm_count; 0: the whole GPU) — a draft's partition
/// in one-GPU disaggregation; the grid has one CTA per SM of it.
inline int g_mk_sm_count = 0;

/// --mk-sweep I:S[:H[:U]],...: after each shape's megakernel step, the same
/// step again per (max_inflight, slot_bytes, release_hold, hold_until_input)
/// (H, U: -1 when left out;
/// A/B of the ring's settings in one process; with --megakernel-trace, each
/// one's trace summary too).
struct MkSweepItem {
  int inflight, slot_bytes, hold, hold_input;
};
inline std::vector<MkSweepItem> g_mk_sweep;

/// The megakernel flags of the command line into `co` (every megakernel model
/// of the run; set co.megakernel first).
void apply_mk_flags(swiftspec::CudaModelOptions& co);

/// --megakernel-trace-csv DIR: every stamp of each traced step as
/// DIR/mk_trace_<shape>[_<tag>].csv (layer, op, cta, arrive, start, end; ns
/// after the step's first start; -1 where a CTA has no such stamp; then the
/// ring's blocked waits for the op, ns: bytes, inflight, unconsumed, idle,
/// held as in ring_wait_summary).
inline std::string g_mk_trace_csv_dir;

ModelRow bench_model(const std::string& which, double bw_tbs, int ctx, bool quick, bool with_mma, bool with_pdl_early,
                     bool with_untuned, bool megakernel_only, bool mk_trace);

}  // namespace cuda_bench
