#include "python/model_busy.h"

#include <pthread.h>

#include <mutex>
#include <new>
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

// A fork()ed child has only the forking thread: the calls the parent's other threads were running
// are not running in it, and g_mu may have been held by one of them at the fork. Without this, a
// model the parent was using stays "in use by another request" in the child for ever (and a held
// g_mu would hang the child's first call).
void forget_busy_in_child() {
  new (&g_mu) std::mutex();
  busy_objects().clear();
}
const bool g_fork_handler = pthread_atfork(nullptr, nullptr, &forget_busy_in_child) == 0;
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
