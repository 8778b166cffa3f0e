#include "python/result_dicts.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace swiftspec::python {

nb::dict stats_dict(const GenerationStats& s) {
  nb::dict d;
  d["prompt_tokens"] = s.prompt_tokens;
  d["new_tokens"] = s.new_tokens;
  d["verification_steps"] = s.verification_steps;
  d["draft_steps"] = s.draft_steps;
  d["prefill_time"] = s.prefill_time;
  d["decode_time"] = s.decode_time;
  d["target_time"] = s.target_time;
  d["draft_time"] = s.draft_time;
  d["wall_time"] = s.wall_time;
  d["finish_reason"] = s.finish_reason;
  d["acceptance_length"] = s.acceptance_length();
  return d;
}

nb::dict report_dict(const SpeculationReport& r) {
  nb::dict d;
  d["growth"] = r.growth;
  d["verification"] = r.verification;
  d["expand_width"] = r.expand_width;
  d["min_expand_prob"] = r.min_expand_prob;
  d["rejection_sampling_nodes"] = r.rejection_sampling_nodes;
  d["target_sampling_nodes"] = r.target_sampling_nodes;
  d["verified_nodes"] = r.verified_nodes;
  d["drafted_nodes"] = r.drafted_nodes;
  d["reused_nodes"] = r.reused_nodes;
  d["accepted_per_step"] = r.accepted_per_step;
  d["verified_per_step"] = r.verified_per_step;
  d["draft_batch_rows"] = r.draft_batch_rows;
  if (!r.budget_per_round.empty()) {  // the auto mode
    d["budget_per_round"] = r.budget_per_round;
    d["round_reasons"] = r.round_reasons;
    d["caught_up_tokens"] = r.caught_up_tokens;
  }
  return d;
}

}  // namespace swiftspec::python
