// make_cuda_model(): adapts a swiftspec Checkpoint (cpp/include/swiftspec/
// checkpoint.h) to the CUDA backend's weight lookup. Kept in its own file so
// that tools linking only the CUDA library (kernel checks, benchmarks) do not
// need the runtime's checkpoint code.
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/int4_weights.h"
#include "swiftspec/checkpoint.h"
#include "swiftspec/model.h"
#include "swiftspec_cuda/cuda_model.h"

namespace swiftspec {

namespace {

/// Every int4 projection of `ck` under its float name ("<prefix>.weight", the name the CUDA
/// loader looks up), validated by the CPU backend's rules (cpu::load_int4_matrix, the one copy
/// of them): all of them before the first upload, so a bad tensor is refused, naming it and its
/// file, before anything is allocated on the GPU.
std::map<std::string, cpu::WeightMatrix> int4_projections(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t nq = int64_t(c.num_heads) * c.head_dim, nkv = int64_t(c.num_kv_heads) * c.head_dim;
  struct Projection {
    const char* name;
    int64_t n, k;
  };
  const Projection projections[] = {{"self_attn.q_proj", nq, H},  {"self_attn.k_proj", nkv, H},
                                    {"self_attn.v_proj", nkv, H}, {"self_attn.o_proj", H, nq},
                                    {"mlp.gate_proj", I, H},      {"mlp.up_proj", I, H},
                                    {"mlp.down_proj", H, I}};
  std::map<std::string, cpu::WeightMatrix> out;
  for (int l = 0; l < c.num_layers; ++l)
    for (const Projection& p : projections) {
      const std::string prefix = "model.layers." + std::to_string(l) + "." + p.name;
      out[prefix + ".weight"] = cpu::load_int4_matrix(ck, prefix, p.n, p.k);
    }
  return out;
}

HostWeight int4_host_weight(const cpu::WeightMatrix& w) {
  HostWeight h;
  h.dtype = DType::U8;
  h.shape = {w.n, w.k};
  h.data = w.data;
  h.scales = w.scales;
  h.zeros = w.zeros;
  h.group_size = w.group_size;
  return h;
}

}  // namespace

int gemm_engine_code(const std::string& name) {
  if (name.empty()) return -1;
  if (name == "mma") return 0;
  if (name == "wgmma") return 1;
  throw InvalidArgument("gemm_engine '" + name + "' is not an engine (wgmma, mma)");
}

std::unique_ptr<CudaModel> make_cuda_model_ex(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options,
                                              const CudaModelOptions& cuda_options_in) {
  if (!checkpoint) throw InvalidArgument("make_cuda_model: checkpoint is null");
  const Checkpoint* ck = checkpoint.get();
  CudaModelOptions cuda_options = cuda_options_in;
  std::map<std::string, cpu::WeightMatrix> int4;
  if (ck->quantization().int4()) {
    const std::string problem = int4_backend_problem("cuda", cuda_options.megakernel, 1);
    if (!problem.empty()) throw InvalidArgument("ModelOptions." + problem);
    cuda_options.int4_group_size = ck->quantization().group_size;
    // The prefill path's CUTLASS GEMMs read bf16 weights: prompts take the layered step.
    cuda_options.large_prefill = false;
    int4 = int4_projections(*ck);
  }
  WeightLookup lookup = [ck, &int4](const std::string& name, const std::vector<int64_t>& shape) {
    const auto it = int4.find(name);
    if (it != int4.end()) {
      const HostWeight w = int4_host_weight(it->second);
      if (w.shape != shape) {
        auto dims = [](const std::vector<int64_t>& s) {
          std::string o;
          for (int64_t d : s) o += (o.empty() ? "" : ", ") + std::to_string(d);
          return "[" + o + "]";
        };
        throw CheckpointError(ck->dir() + ": int4 projection '" + name + "' is " + dims(w.shape) + ", expected " +
                              dims(shape));
      }
      return w;
    }
    const TensorView& t = ck->tensor(name, shape);
    HostWeight w;
    w.dtype = t.dtype;
    w.shape = t.shape;
    w.data = t.data;
    return w;
  };
  WeightExists exists = [ck, &int4](const std::string& name) { return int4.count(name) > 0 || ck->has(name); };
  return make_cuda_model_from_host(ck->config(), lookup, exists, options, cuda_options);
}

std::unique_ptr<Model> make_cuda_model(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options) {
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
