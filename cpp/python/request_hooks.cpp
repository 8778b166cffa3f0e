#include "python/request_hooks.h"

#include <nanobind/stl/vector.h>

#include <string>
#include <utility>

#include "swiftspec/error.h"

namespace nb = nanobind;

namespace swiftspec::python {
namespace {

// Refused when the request starts, naming the parameter (was: "'int' object is not callable"
// from the first poll, or for on_tokens only once the prompt was prefilled).
void check_callable(const nb::object& hook, const char* name) {
  if (hook.is_none() || PyCallable_Check(hook.ptr())) return;
  throw InvalidArgument(std::string(name) + " must be callable or None, got " + Py_TYPE(hook.ptr())->tp_name);
}

}  // namespace

RequestHooks::RequestHooks(nb::object on_tokens, nb::object cancel_check)
    : on_tokens_(std::move(on_tokens)), cancel_check_(std::move(cancel_check)) {
  check_callable(on_tokens_, "on_tokens");
  check_callable(cancel_check_, "cancel_check");
}

TokenCallback RequestHooks::token_callback() {
  if (on_tokens_.is_none()) return {};
  return [this](const std::vector<int32_t>& toks) -> bool {
    nb::gil_scoped_acquire acquire;
    if (error_) return false;
    try {
      nb::object r = on_tokens_(toks);
      return r.is_none() || nb::cast<bool>(r);
    } catch (...) {
      error_ = std::current_exception();
      return false;
    }
  };
}

std::function<bool()> RequestHooks::cancel_requested() {
  return [this]() -> bool {
    nb::gil_scoped_acquire acquire;
    if (error_) return true;
    try {
      // The main thread's pending signals: SIGINT's default handler raises KeyboardInterrupt
      // (a no-op on other threads, where Python runs no signal handlers).
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
      if (!cancel_check_.is_none()) {
        nb::object r = cancel_check_();
        const int truth = PyObject_IsTrue(r.ptr());
        if (truth < 0) throw nb::python_error();
        return truth != 0;
      }
    } catch (...) {
      error_ = std::current_exception();
      return true;
    }
    return false;
  };
}

void RequestHooks::rethrow() {
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace swiftspec::python
