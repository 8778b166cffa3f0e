// One call at a time per model, across threads and engines. A model's KV
// cache and scratch buffers are state that one forward or one generation
// owns for its whole duration; two Python threads using the same model (two
// engines made over it, or model.forward beside a generation) would corrupt
// it and crash. The binding holds a ModelBusy for every call that runs a
// model, and a second caller gets InvalidArgument (InvalidRequestError in
// Python) naming the conflict instead. Also catches a callback that re-enters
// a model its own request is running.
#pragma once
#include <initializer_list>
#include <vector>

namespace swiftspec {
class Model;
}

namespace swiftspec::python {

class ModelBusy {
 public:
  /// Marks the given models (null entries ignored) busy for this object's
  /// lifetime. Throws InvalidArgument, marking none, if one is busy already.
  explicit ModelBusy(std::initializer_list<const Model*> models);
  ~ModelBusy();
  ModelBusy(const ModelBusy&) = delete;
  ModelBusy& operator=(const ModelBusy&) = delete;

 private:
  std::vector<const Model*> held_;
};

}  // namespace swiftspec::python
