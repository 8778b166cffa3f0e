// One call at a time per model, and per low-level speculative object, across
// threads and engines. A model's KV cache and scratch buffers are state that
// one forward or one generation owns for its whole duration; two Python
// threads using the same model (two engines made over it, or model.forward
// beside a generation) would corrupt it and crash. The same holds for a
// DraftTree, a TreeKvCache and a TreeVerifier (their bookkeeping, and the
// model they drive). The binding holds a guard for every call on such an
// object (the GIL is released inside the long ones), and a second caller gets
// InvalidArgument (InvalidRequestError in Python) naming the object instead.
// Also catches a callback that re-enters a model its own request is running.
#pragma once
#include <initializer_list>
#include <vector>

namespace swiftspec {
class Model;
}

namespace swiftspec::python {

/// An object to mark busy and the name its error message gives it ("DraftTree", ...;
/// nullptr: a model, with the message of ModelBusy).
struct BusyItem {
  const void* object;
  const char* name;
};

class BusyGuard {
 public:
  /// Marks the given objects (null objects ignored) busy for this guard's
  /// lifetime. Throws InvalidArgument naming the first one that is busy
  /// already, marking none.
  explicit BusyGuard(const std::vector<BusyItem>& items);
  ~BusyGuard();
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;

 private:
  std::vector<const void*> held_;
};

/// BusyGuard over models.
class ModelBusy {
 public:
  explicit ModelBusy(std::initializer_list<const Model*> models);

 private:
  static std::vector<BusyItem> items(std::initializer_list<const Model*> models);
  BusyGuard guard_;
};

}  // namespace swiftspec::python
