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

std::unique_ptr<Model> load_model(std::shared_ptr<const Checkpoint> checkpoint,
                                  const std::string& backend, const ModelOptions& requested) {
  if (!checkpoint) throw InvalidArgument("load_model: checkpoint is null");
  const ModelOptions options =
      resolve_max_context(requested, checkpoint->config(), checkpoint->dir() + "/config.json");
  if (options.max_tree < 1)
    throw InvalidArgument("max_tree must be >= 1, got " + std::to_string(options.max_tree));
  if (options.num_threads < 0)
    throw InvalidArgument("num_threads must be >= 0, got " + std::to_string(options.num_threads));
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
  if (backend == "cuda") return make_cuda_model(std::move(checkpoint), options);
#else
  if (backend == "cuda")
    throw InvalidArgument("backend 'cuda' is not built in: reinstall with SWIFTSPEC_CUDA=ON (see README)");
#endif
  throw InvalidArgument("unknown backend '" + backend + "' (available: cpu, cuda)");
}

}  // namespace swiftspec
