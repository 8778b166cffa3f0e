// swiftspec_core: the request counters the generate functions return to Python,
// as dicts, in one place so that every mode reports the same keys.
#pragma once

#include <nanobind/nanobind.h>

#include "swiftspec/generation.h"
#include "swiftspec/speculative.h"

namespace swiftspec::python {

/// GenerationStats as {'prompt_tokens', 'new_tokens', 'verification_steps', 'draft_steps',
/// 'prefill_time', 'decode_time', 'target_time', 'draft_time' (seconds), 'finish_reason',
/// 'acceptance_length'} (generation.h gives each field's meaning).
nanobind::dict stats_dict(const GenerationStats& s);

/// SpeculationReport as a dict with one key per field (speculative.h), the
/// per-step lists as Python lists: the same keys for serial and async speculation.
nanobind::dict report_dict(const SpeculationReport& r);

}  // namespace swiftspec::python
