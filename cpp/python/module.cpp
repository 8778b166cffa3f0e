// The extension module `swiftspec_core`: the C++ runtime seen from Python.
// Python configures, tokenizes and drives; everything numeric runs here with
// the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

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
  m.doc() = "swiftspec C++ runtime: checkpoints, models (CPU/CUDA backends), engine";
  swiftspec::python::bind_runtime(m);
#ifdef SWIFTSPEC_BIND_SPECULATIVE
  swiftspec::python::bind_speculative(m);
#endif
#ifdef SWIFTSPEC_BIND_ASYNC
  swiftspec::python::bind_async(m);
#endif
}
