// Bindings of the runtime's input limits (issue 28): the JSON and GGUF checks the Python package
// applies to the files it reads itself, so that one set of rules guards both.
#pragma once
#include <nanobind/nanobind.h>

namespace swiftspec::python {
void bind_inputs(nanobind::module_& m);
}
