// The Python side of one generation request's hooks, shared by every binding
// that runs a request (Engine.generate, generate_async, spec.generate_serial):
//   - the token callback: a Python callable run under the GIL on the caller's
//     thread; returning False cancels;
//   - the cancellation check (GenerationConfig::cancel_requested): pending
//     signals of the main thread (Ctrl-C: PyErr_CheckSignals runs the Python
//     handler, which raises KeyboardInterrupt), then an optional Python
//     predicate (cancel_check() -> truthy cancels). The runtime polls it
//     between prefill chunks and decode steps, so Ctrl-C is seen during a long
//     prefill too.
// An exception raised by either cancels the request; rethrow() raises it once
// the runtime has returned (the models are then reusable).
#pragma once
#include <nanobind/nanobind.h>

#include <exception>
#include <functional>

#include "swiftspec/generation.h"

namespace swiftspec::python {

class RequestHooks {
 public:
  /// `on_tokens` and `cancel_check` may be None; anything else that is not callable throws
  /// InvalidArgument naming the parameter. Construct with the GIL held.
  RequestHooks(nanobind::object on_tokens, nanobind::object cancel_check);

  /// The TokenCallback to pass to the runtime (empty when on_tokens is None).
  TokenCallback token_callback();
  /// The cancellation check for GenerationConfig::cancel_requested (always set: signals).
  std::function<bool()> cancel_requested();
  /// Raises the first exception a hook raised, if any. Call with the GIL held,
  /// after the runtime returned.
  void rethrow();

 private:
  nanobind::object on_tokens_, cancel_check_;
  std::exception_ptr error_;
};

}  // namespace swiftspec::python
