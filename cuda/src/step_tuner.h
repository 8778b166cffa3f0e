// Per-bucket choice of a layered step's launch settings by timing its graph.
//
// Why: several launch settings change no arithmetic (the kernels, their order
// and each output's reduction order stay the same) but change the speed, and
// which is fastest depends on the shape and on the kernels around it in the
// graph, where an isolated benchmark does not see it:
//  * programmatic dependent launch (PDL) edges: on the H200 the Llama-3-8B
//    single-token step was slower with PDL on every edge than with none,
//    while its tree steps and the small models' steps were faster with it;
//  * a GEMM's row-block size (warpgroups) and pipeline depth: the planner's
//    cost model picks them per matrix in isolation; in the 8B 32-node tree
//    step a deeper gate/up pipeline than the planner's was faster
//    (benchmarks/README.md, "a step tuner per token bucket").
// So the engine picks, per token bucket, the setting that replays fastest on
// the machine at hand, as a GEMM library picks a tactic: once per bucket and
// context band (context_bands.h: the attention's share of the step grows with
// the context), when the model is made (CudaModelOptions::autotune).
#include <cstdint>
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace swiftspec::cuda {

/// One tunable setting of a step; option 0 is the default.
struct TunerKnob {
  std::string name;                  ///< e.g. "pdl.attn", "plan.gate_up"
  std::vector<std::string> options;  ///< option names, [0] the default (>= 1 entry)
};

/// One option index per knob (same order as the knobs).
using StepSetting = std::vector<int>;

/// Outcome of tune_step().
struct StepTuning {
  StepSetting chosen;
  std::string chosen_name;                               ///< step_setting_name() of `chosen`
  std::vector<std::pair<std::string, double>> measured;  ///< (setting name, median ms) per candidate
  /// "default 4.9120, pdl.attn=off 4.7810, ... -> pdl.attn=off".
  std::string summary() const;
};

/// "default", or the knobs away from their default as "name=option" joined by "+".
std::string step_setting_name(const std::vector<TunerKnob>& knobs, const StepSetting& s);

/// Times graphs of one step captured with different settings and returns the
/// fastest. Candidates: the default setting, each `extra` setting, and every
/// non-default option of every knob alone; then, if options of two or more
/// knobs each beat the default, their combination (each knob's best option)
/// against the first round's winner. Each round replays every candidate once,
/// interleaved (drift hits all alike): one warm-up round, then `rounds`
/// timed rounds; the median decides. A setting must beat the default by
/// `min_gain` (fraction) to be chosen, so noise does not flip the choice.
///
/// `capture(setting)` must return an executable graph of the step under that
/// setting; replaying it must be idempotent (the step rewrites the same KV
/// slots and outputs with the same values). The chosen graph is returned in
/// `*chosen` (the caller owns it); the other graphs are destroyed. Runs on
/// `stream` and synchronizes it. Throws CudaError (graphs captured so far are
/// destroyed first) and InvalidArgument for knobs without options or extra
/// settings of the wrong size.
///
/// `outputs` (checks; may be empty): after the timing, every candidate is
/// replayed once more and `outputs()` (the step's results copied to the host,
/// after a stream synchronization) must equal the default setting's byte for
/// byte; otherwise Error naming the setting is thrown (a setting that changed
/// the arithmetic is a bug).
StepTuning tune_step(cudaStream_t stream, const std::vector<TunerKnob>& knobs, const std::vector<StepSetting>& extra,
                     const std::function<cudaGraphExec_t(const StepSetting&)>& capture, cudaGraphExec_t* chosen,
                     int rounds = 5, double min_gain = 0.01, const std::function<std::vector<uint8_t>()>& outputs = {});

/// Replays `graphs` interleaved on `stream`, as tune_step times its candidates: one
/// warm-up round, then `rounds` timed rounds (CUDA events); returns each graph's median
/// device time in ms, in order. Synchronizes the stream; throws CudaError.
std::vector<double> time_graphs(cudaStream_t stream, const std::vector<cudaGraphExec_t>& graphs, int rounds = 5);

}  // namespace swiftspec::cuda
