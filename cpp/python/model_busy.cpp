#include "python/model_busy.h"

#include <mutex>
#include <unordered_set>

#include "swiftspec/error.h"

namespace swiftspec::python {
namespace {
std::mutex g_mu;
std::unordered_set<const Model*>& busy_models() {
  static std::unordered_set<const Model*> s;
  return s;
}
}  // namespace

ModelBusy::ModelBusy(std::initializer_list<const Model*> models) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& busy = busy_models();
  for (const Model* m : models)
    if (m != nullptr && busy.count(m))
      throw InvalidArgument(
          "the model is in use by another request (a model runs one request at a time: use one engine per "
          "thread, and do not call into a model from a callback of its own request)");
  for (const Model* m : models)
    if (m != nullptr && busy.insert(m).second) held_.push_back(m);
}

ModelBusy::~ModelBusy() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Model* m : held_) busy_models().erase(m);
}

}  // namespace swiftspec::python
