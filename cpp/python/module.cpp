// The extension module `swiftspec_core`: the C++ runtime seen from Python.
// Python configures, tokenizes and drives; everything numeric runs here with
// the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "python/bind_inputs.h"
#include "python/bind_runtime.h"
#if __has_include("python/bind_speculative.h")
#include "python/bind_speculative.h"
#define SWIFTSPEC_BIND_SPECULATIVE 1
#endif
#if __has_include("python/bind_async.h")
#include "python/bind_async.h"
#define SWIFTSPEC_BIND_ASYNC 1
#endif

namespace nb = nanobind;

NB_MODULE(swiftspec_core, m) {
  // The text `help(swiftspec_core)` and `swiftspec_core.__doc__` show: what this module is, how it
  // is reached, and where its user-level API is (most users want swiftspec.Engine, not this).
  m.doc() =
      "swiftspec_core: the C++ runtime of swiftspec, as a compiled (nanobind) extension module.\n"
      "\n"
      "It loads checkpoints (load_model, parse_model_config, resolve_max_context) into models on the\n"
      "CPU or CUDA backend (Model, ModelOptions, Checkpoint) and decodes with them (Engine: target-only,\n"
      "serial and asynchronous speculative decoding); the submodule `spec` holds the speculative core\n"
      "(token trees, tree KV bookkeeping, verification). Numeric work runs with the GIL released.\n"
      "\n"
      "`import swiftspec_core` and `from swiftspec import swiftspec_core` give this same module. The\n"
      "Python API over it (tokenization, chat templates, model fetching and conversion) is\n"
      "swiftspec.Engine; errors are raised as swiftspec.CheckpointError / InvalidRequestError.";
  swiftspec::python::bind_runtime(m);
  swiftspec::python::bind_inputs(m);
#ifdef SWIFTSPEC_BIND_SPECULATIVE
  swiftspec::python::bind_speculative(m);
#endif
#ifdef SWIFTSPEC_BIND_ASYNC
  swiftspec::python::bind_async(m);
#endif
}
