// Bindings of the core runtime: errors, checkpoints, models, engine.
#pragma once
#include <nanobind/nanobind.h>

namespace swiftspec::python {
void bind_runtime(nanobind::module_& m);
}
