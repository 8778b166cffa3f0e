// make_cuda_model(): adapts a swiftspec Checkpoint (cpp/include/swiftspec/
// checkpoint.h) to the CUDA backend's weight lookup. Kept in its own file so
// that tools linking only the CUDA library (kernel checks, benchmarks) do not
// need the runtime's checkpoint code.
#include "swiftspec/checkpoint.h"
#include "swiftspec_cuda/cuda_model.h"

namespace swiftspec {

int gemm_engine_code(const std::string& name) {
  if (name.empty()) return -1;
  if (name == "mma") return 0;
  if (name == "wgmma") return 1;
  throw InvalidArgument("gemm_engine '" + name + "' is not an engine (wgmma, mma)");
}

std::unique_ptr<CudaModel> make_cuda_model_ex(std::shared_ptr<const Checkpoint> checkpoint,
                                              const ModelOptions& options,
                                              const CudaModelOptions& cuda_options) {
  if (!checkpoint) throw InvalidArgument("make_cuda_model: checkpoint is null");
  // The CUDA kernels read float projections (`.weight`); an int4 folder has `.qweight`,
  // `.scales`, `.zeros` instead: refuse it by name rather than fail on a missing tensor.
  if (checkpoint->quantization().int4())
    throw CheckpointError(checkpoint->dir() + ": int4 weights are not supported by the CUDA backend yet; convert with "
                          "--dtype bfloat16 (tools/convert_weights.py), or use the cpu backend");
  const Checkpoint* ck = checkpoint.get();
  WeightLookup lookup = [ck](const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView& t = ck->tensor(name, shape);
    HostWeight w;
    w.dtype = t.dtype;
    w.shape = t.shape;
    w.data = t.data;
    return w;
  };
  WeightExists exists = [ck](const std::string& name) { return ck->has(name); };
  return make_cuda_model_from_host(ck->config(), lookup, exists, options, cuda_options);
}

std::unique_ptr<Model> make_cuda_model(std::shared_ptr<const Checkpoint> checkpoint,
                                       const ModelOptions& options) {
  CudaModelOptions cuda_options;
  cuda_options.device = options.device;
  cuda_options.sm_first = options.sm_first;
  cuda_options.sm_count = options.sm_count;
  cuda_options.stream_priority = options.stream_priority;
  cuda_options.gemm_engine = gemm_engine_code(options.gemm_engine);
  cuda_options.megakernel = options.megakernel;
  return make_cuda_model_ex(std::move(checkpoint), options, cuda_options);
}

}  // namespace swiftspec
