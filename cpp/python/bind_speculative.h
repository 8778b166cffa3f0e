// Bindings of the speculative core (token tree, tree KV bookkeeping,
// verification, draft/target sides, serial tree generation) as the submodule
// `swiftspec_core.spec`.
#pragma once
#include <nanobind/nanobind.h>

namespace swiftspec::python {
void bind_speculative(nanobind::module_& m);
}
