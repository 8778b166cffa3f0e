#include "python/model_busy.h"

#include <mutex>
#include <string>
#include <unordered_set>

#include "swiftspec/error.h"

namespace swiftspec::python {
namespace {
std::mutex g_mu;
std::unordered_set<const void*>& busy_objects() {
  static std::unordered_set<const void*> s;
  return s;
}
}  // namespace

BusyGuard::BusyGuard(const std::vector<BusyItem>& items) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& busy = busy_objects();
  for (const BusyItem& it : items) {
    if (it.object == nullptr || !busy.count(it.object)) continue;
    if (it.name == nullptr)
      throw InvalidArgument(
          "the model is in use by another request (a model runs one request at a time: use one engine per "
          "thread, and do not call into a model from a callback of its own request)");
    const std::string name = it.name;
    throw InvalidArgument("the " + name + " is in use by another call (a " + name +
                          " runs one call at a time: give each thread its own)");
  }
  for (const BusyItem& it : items)
    if (it.object != nullptr && busy.insert(it.object).second) held_.push_back(it.object);
}

BusyGuard::~BusyGuard() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const void* p : held_) busy_objects().erase(p);
}

std::vector<BusyItem> ModelBusy::items(std::initializer_list<const Model*> models) {
  std::vector<BusyItem> out;
  for (const Model* m : models) out.push_back({m, nullptr});
  return out;
}

ModelBusy::ModelBusy(std::initializer_list<const Model*> models) : guard_(items(models)) {}

}  // namespace swiftspec::python
