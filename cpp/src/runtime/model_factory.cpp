// Chooses a backend by name.
#include <string>

#include "backend/cpu/cpu_model.h"
#include "swiftspec/error.h"
#include "swiftspec/model.h"
#include "swiftspec/sm_partition.h"
#ifdef SWIFTSPEC_WITH_CUDA
#include "swiftspec_cuda/cuda_model.h"
#endif

namespace swiftspec {

std::string int4_backend_problem(const std::string& backend, bool megakernel, int tp) {
  if (backend != "cuda") return "";
  if (megakernel)
    return "megakernel: int4 weights run on the cuda backend's layered step; the decode megakernel streams bf16 "
           "weights (issue 31): drop megakernel, or use bfloat16 weights";
  if (tp > 1)
    return "tp " + std::to_string(tp) +
           ": int4 weights run on one GPU on the cuda backend; the tensor-parallel GEMMs read bf16 weights "
           "(issue 31): use tp 1, bfloat16 weights, or the cpu backend";
  return "";
}

std::string kv_window_backend_problem(const std::string& backend, int recent) {
  if (recent <= 0 || backend != "cuda") return "";
  return "kv_window: the cuda backend does not implement the draft's attention window yet (issue 27): drop "
         "kv_window, or use the cpu backend";
}

void check_kv_window(const ModelOptions& o, const std::string& backend) {
  const auto bounded = [](int v, const char* field) {
    if (v < 0 || v > kMaxKvWindow)
      throw InvalidArgument(std::string("ModelOptions.") + field + " must be in [0, " + std::to_string(kMaxKvWindow) +
                            "], got " + std::to_string(v));
  };
  bounded(o.kv_window_sinks, "kv_window_sinks");
  bounded(o.kv_window_recent, "kv_window_recent");
  if (o.kv_window_recent == 0 && o.kv_window_sinks > 0)
    throw InvalidArgument("ModelOptions.kv_window_sinks " + std::to_string(o.kv_window_sinks) +
                          " needs a window: kv_window_recent > 0 (0: full attention)");
  const std::string problem = kv_window_backend_problem(backend, o.kv_window_recent);
  if (!problem.empty()) throw InvalidArgument("ModelOptions." + problem);
}

std::unique_ptr<Model> load_model(std::shared_ptr<const Checkpoint> checkpoint, const std::string& backend,
                                  const ModelOptions& requested) {
  if (!checkpoint) throw InvalidArgument("load_model: checkpoint is null");
  if (requested.max_tree < 1) throw InvalidArgument("max_tree must be >= 1, got " + std::to_string(requested.max_tree));
  if (requested.num_threads < 0)
    throw InvalidArgument("num_threads must be >= 0, got " + std::to_string(requested.num_threads));
  check_kv_window(requested, backend);
#ifndef SWIFTSPEC_WITH_CUDA
  if (backend == "cuda")
    throw InvalidArgument("backend 'cuda' is not built in: reinstall with SWIFTSPEC_CUDA=ON (see README)");
#endif
  if (backend != "cpu" && backend != "cuda")
    throw InvalidArgument("unknown backend '" + backend + "' (available: cpu, cuda)");
  if (checkpoint->quantization().int4()) {
    const std::string problem = int4_backend_problem(backend, requested.megakernel, 1);
    if (!problem.empty()) throw InvalidArgument("ModelOptions." + problem);
  }
  // The context, bounded by the memory free on the model's device: before any allocation.
  const ModelOptions options = resolve_max_context(requested, model_memory(*checkpoint, backend, requested));
  if (backend == "cpu") {
    if (has_sm_partition(options.sm_first, options.sm_count))
      throw InvalidArgument("sm_partition [" + std::to_string(options.sm_first) + ", " +
                            std::to_string(options.sm_count) +
                            "] (ModelOptions.sm_first / sm_count) applies to the cuda backend only");
    if (options.device != 0)
      throw InvalidArgument("device " + std::to_string(options.device) +
                            " (ModelOptions.device) applies to the cuda backend only");
    if (options.stream_priority != 0)
      throw InvalidArgument("stream_priority " + std::to_string(options.stream_priority) +
                            " (ModelOptions.stream_priority) applies to the cuda backend only");
    if (!options.gemm_engine.empty())
      throw InvalidArgument("gemm_engine '" + options.gemm_engine +
                            "' (ModelOptions.gemm_engine) applies to the cuda backend only");
    if (options.megakernel)
      throw InvalidArgument("megakernel (ModelOptions.megakernel) applies to the cuda backend only");
    return make_cpu_model(std::move(checkpoint), options);
  }
#ifdef SWIFTSPEC_WITH_CUDA
  return make_cuda_model(std::move(checkpoint), options);
#else
  throw InvalidArgument("unknown backend '" + backend + "' (available: cpu, cuda)");  // (refused above)
#endif
}

}  // namespace swiftspec
