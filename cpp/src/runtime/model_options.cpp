// ModelOptions resolved against a model's config and the memory free for it (the KV capacity).
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "swiftspec/error.h"
#include "swiftspec/memory_plan.h"
#include "swiftspec/model.h"
#ifdef SWIFTSPEC_WITH_CUDA
#include "swiftspec_cuda/memory_plan.h"
#endif

namespace swiftspec {

uint64_t checkpoint_weight_bytes(const std::string& dir) {
  namespace fs = std::filesystem;
  uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.extension() != ".safetensors") continue;
    std::error_code size_ec;
    const uintmax_t size = fs::file_size(p, size_ec);  // follows links (a linked variant of a folder)
    if (!size_ec) total += size;
  }
  return total;
}

ModelMemory model_memory(const Checkpoint& checkpoint, const std::string& backend, const ModelOptions& options) {
  ModelMemory m;
  m.name = model_name_of(checkpoint.dir());
  m.origin = checkpoint.dir() + "/config.json";
  m.trained = checkpoint.config().context_limit();
  if (backend == "cpu") {
    m.needs.push_back(
        {"cpu", cpu_memory_need(checkpoint.config(), options, checkpoint_weight_bytes(checkpoint.dir()))});
    return m;
  }
#ifdef SWIFTSPEC_WITH_CUDA
  if (backend == "cuda") {
    m.needs.push_back({"cuda:" + std::to_string(options.device),
                       cuda_memory_need(checkpoint.config(), options, static_cast<int>(dtype_size(checkpoint.dtype())),
                                        checkpoint.quantization().int4() ? checkpoint.quantization().group_size : 0)});
    return m;
  }
#endif
  throw InvalidArgument("unknown backend '" + backend + "' (available: cpu" +
#ifdef SWIFTSPEC_WITH_CUDA
                        std::string(", cuda)")
#else
                        std::string("; cuda needs a build with SWIFTSPEC_CUDA=ON)")
#endif
  );
}

namespace {
FreeMemory free_memory_of(const std::string& device) {
  if (device == "cpu") return cpu_free_memory();
#ifdef SWIFTSPEC_WITH_CUDA
  if (device.rfind("cuda:", 0) == 0) return cuda_free_memory(std::stoi(device.substr(5)));
#endif
  throw InvalidArgument("no memory to plan on device '" + device + "' in this build");
}
}  // namespace

ContextPlan plan_model_contexts(const std::vector<ModelMemory>& models, const std::vector<int>& requested) {
  if (requested.size() != models.size())
    throw InvalidArgument("plan_model_contexts: " + std::to_string(models.size()) + " models but " +
                          std::to_string(requested.size()) + " requested contexts");
  std::map<std::string, int> index;  // device -> its position in `devices`
  std::vector<FreeMemory> devices;
  std::vector<ContextRequest> requests;
  for (size_t i = 0; i < models.size(); ++i) {
    ContextRequest r;
    r.name = models[i].name;
    r.origin = models[i].origin;
    r.trained = models[i].trained;
    r.requested = requested[i];
    for (const auto& [device, need] : models[i].needs) {
      auto it = index.find(device);
      if (it == index.end()) {
        it = index.emplace(device, static_cast<int>(devices.size())).first;
        devices.push_back(free_memory_of(device));
      }
      r.needs.push_back({it->second, need});
    }
    requests.push_back(std::move(r));
  }
  return plan_contexts(requests, devices);
}

ModelOptions resolve_max_context(const ModelOptions& options, const ModelMemory& memory, std::string* note) {
  const ContextPlan plan = plan_model_contexts({memory}, {options.max_context});
  ModelOptions out = options;
  out.max_context = plan.contexts[0];
  if (note) *note = plan.note;
  return out;
}

}  // namespace swiftspec
