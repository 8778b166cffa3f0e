// Bindings of the asynchronous engine (parallel tree generation, timeline,
// placement, tensor-parallel loading) on the module `swiftspec_core`.
#pragma once
#include <nanobind/nanobind.h>

namespace swiftspec::python {
void bind_async(nanobind::module_& m);
}
