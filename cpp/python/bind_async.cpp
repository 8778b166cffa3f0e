// swiftspec_core: the asynchronous engine seen from Python — parallel tree
// generation with its timeline, placement-driven model loading (including
// tensor-parallel CPU models), and the tensor-parallel plan. Every call that
// runs a model releases the GIL; the token callback re-acquires it on the
// host thread (the caller's), never on a worker group's thread.
#include "python/bind_async.h"
#include "python/engine_request.h"

#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <utility>

#include "swiftspec/async_engine.h"
#include "swiftspec/checkpoint.h"
#include "swiftspec/config.h"
#include "swiftspec/engine.h"
#include "swiftspec/error.h"
#include "swiftspec/model.h"
#include "swiftspec/placement.h"
#include "swiftspec/tensor_parallel.h"
#include "swiftspec/timeline.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace swiftspec::python {
namespace {

nb::dict summary_dict(const TimelineSummary& s) {
  nb::dict d;
  d["span"] = s.span;
  d["decode_span"] = s.decode_span;
  d["target_verify"] = s.target_verify;
  d["target_wait"] = s.target_wait;
  d["draft_grow"] = s.draft_grow;
  d["draft_other"] = s.draft_other;
  d["draft_wait"] = s.draft_wait;
  d["rounds"] = s.rounds;
  d["target_utilization"] = s.target_utilization();
  return d;
}

nb::list events_list(const Timeline& t) {
  nb::list out;
  for (const auto& track : t.tracks())
    for (const auto& e : track.events) {
      nb::dict d;
      d["track"] = track.name;
      d["name"] = e.name;
      d["begin"] = e.begin;
      d["end"] = e.end;
      d["round"] = e.round;
      nb::dict args;
      for (const auto& [k, v] : e.args) args[k.c_str()] = v;
      d["args"] = args;
      out.append(d);
    }
  return out;
}

/// "placement.<group>.<problem>" for each group of `p` (draft first or target first) whose
/// `problem_of(group)` is not empty: the placement_*_problems bindings.
template <class ProblemOf>
std::vector<std::string> group_problems(const Placement& p, bool draft_first, ProblemOf problem_of) {
  std::vector<std::string> out;
  const std::pair<const char*, const GroupPlacement*> draft{"draft", &p.draft}, target{"target", &p.target};
  for (const auto& [name, group] : draft_first ? std::array{draft, target} : std::array{target, draft}) {
    const std::string problem = problem_of(*group);
    if (!problem.empty()) out.push_back(std::string("placement.") + name + "." + problem);
  }
  return out;
}

}  // namespace

void bind_async(nb::module_& m) {
  nb::class_<Timeline>(m, "Timeline",
                       "Per-round timeline of an async request (timeline.h): tracks 'target', 'draft', 'host'.")
      .def("chrome_trace", &Timeline::to_chrome_trace, "Chrome trace JSON text (chrome://tracing, ui.perfetto.dev).")
      .def("save_chrome_trace", &Timeline::save_chrome_trace, "path"_a, "Writes the Chrome trace JSON to path.")
      .def(
          "summary", [](const Timeline& t) { return summary_dict(t.summary()); },
          "Critical-path summary (seconds): target_verify, target_wait, draft_grow, draft_wait, rounds,\n"
          "decode_span, target_utilization (= target_verify / decode_span).")
      .def("events", &events_list, "Every event as {'track', 'name', 'begin', 'end', 'round', 'args'}.");

  m.def(
      "generate_async",
      [](Engine& engine, const std::vector<int32_t>& prompt, int max_new_tokens, double temperature, int top_k,
         double top_p, uint64_t seed, const std::vector<int32_t>& stop_token_ids, int tree_budget, int max_depth,
         int branching, nb::object on_tokens, nb::object cancel_check, int prefill_chunk, nb::kwargs options) {
        GenerationConfig cfg = request_config(max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids,
                                              DecodeMode::Async, tree_budget, max_depth, branching, prefill_chunk);
        return run_request(engine, prompt, cfg, std::move(on_tokens), std::move(cancel_check),
                           async_options_from(options));
      },
      "engine"_a, "prompt"_a, "max_new_tokens"_a = 128, "temperature"_a = 0.0, "top_k"_a = 0, "top_p"_a = 1.0,
      "seed"_a = 0, "stop_token_ids"_a = std::vector<int32_t>{}, "tree_budget"_a = 16, "max_depth"_a = 8,
      "branching"_a = 2, "on_tokens"_a = nb::none(), "cancel_check"_a = nb::none(), "prefill_chunk"_a = 0, "options"_a,
      "Parallel tree generation (async_engine.h) on an Engine's target and draft: the draft group grows\n"
      "the token tree while the target group verifies. Returns {'tokens', 'stats', 'report', 'timeline'}.\n"
      "Its options, by keyword (an unknown one is refused by name): expand_width (draft nodes per step,\n"
      "0: automatic), growth_depth (depth limit of continuous growth below the root, 0: 3*max_depth),\n"
      "min_send_nodes (verifiable nodes the draft waits for before handing a subtree to an idle target,\n"
      "default 1), cost_aware_send (also wait while one more draft step raises the expected token rate:\n"
      "cpp/src/async/send_policy.h; default True), min_expand_prob (default 0: grow until the budget),\n"
      "record_timeline (default True). on_tokens, cancel_check, prefill_chunk: as Engine.generate (the\n"
      "host polls Ctrl-C and cancel_check while the groups prefill or verify; each group stops at its\n"
      "next prefill chunk), and like it the request waits for the engine's turn.");

  m.def(
      "load_group_model",
      [](const std::string& dir, const std::string& group_json, const ModelOptions& options, const std::string& backend,
         const std::string& name) {
        if (name != "draft" && name != "target")
          throw InvalidArgument("load_group_model: name must be 'draft' or 'target', got '" + name + "'");
        const Placement p = Placement::from_json("{\"" + name + "\": " + group_json + "}");
        const GroupPlacement& g = name == "draft" ? p.draft : p.target;
        nb::gil_scoped_release release;
        return std::shared_ptr<Model>(load_group_model(dir, g, options, backend, "placement." + name));
      },
      "checkpoint_dir"_a, "group"_a, "options"_a = ModelOptions(), "backend"_a = "cpu", "name"_a = "target",
      "Loads one worker group's model where its placement says (JSON of one group: tp, cores,\n"
      "threads_per_rank, devices, sm_partition; placement.h). A TP-1 folder is sharded at load time when\n"
      "tp > 1; a pre-sharded folder (convert_weights.py --tp N) is mapped in place. name ('draft' or\n"
      "'target') names the group in errors.");

  m.def(
      "load_model_pair",
      [](const std::string& target_dir, std::optional<std::string> draft_dir, const std::string& placement_json,
         const ModelOptions& options, const std::string& backend) {
        const Placement p = Placement::from_json(placement_json.empty() ? "{}" : placement_json);
        LoadedModels loaded;
        {
          nb::gil_scoped_release release;
          loaded = load_model_pair(target_dir, draft_dir.value_or(""), p, options, backend);
        }
        std::shared_ptr<Model> target(std::move(loaded.target)), draft(std::move(loaded.draft));
        return nb::make_tuple(target, draft ? nb::cast(draft) : nb::none(), loaded.context_note);
      },
      "target_dir"_a, "draft_dir"_a.none() = nb::none(), "placement"_a = "{}", "options"_a = ModelOptions(),
      "backend"_a = "cpu",
      "Loads an engine's target and optional draft where the placement JSON says ('{}': both on the\n"
      "backend's defaults), their contexts planned together against the memory free on the devices they\n"
      "share (load_model_pair, placement.h): options.max_context 0 gives each model its trained length,\n"
      "capped to what fits; an explicit value that does not fit raises InvalidRequestError with the\n"
      "numbers before anything is allocated. Returns (target, draft or None, note): note is one line\n"
      "when memory capped the default context, else ''.");

  m.def(
      "placement_normalize", [](const std::string& text) { return Placement::from_json(text).to_json(); },
      "placement"_a, "Validates a placement JSON text and returns it normalised (cores as one list per rank).");
  m.def(
      "placement_cuda_only_fields",
      [](const std::string& text) {
        const Placement p = Placement::from_json(text);
        std::vector<std::string> out;
        for (const auto& [name, group] : {std::pair{"draft", &p.draft}, std::pair{"target", &p.target}})
          for (const std::string& field : group->cuda_only_fields())
            out.push_back(std::string("placement.") + name + "." + field);
        return out;
      },
      "placement"_a,
      "The CUDA-only settings a placement JSON text asks for, as 'placement.<group>.<field>' (draft first;\n"
      "empty when none; GroupPlacement::cuda_only_fields): what a cpu-backend run refuses.");
  m.def(
      "placement_int4_problems",
      [](const std::string& text, const std::string& backend) {
        return group_problems(Placement::from_json(text), false, [&](const GroupPlacement& g) {
          return int4_backend_problem(backend, g.megakernel, g.tp);
        });
      },
      "placement"_a, "backend"_a,
      "What a placement JSON text asks for that int4 checkpoints cannot run with on `backend`, one\n"
      "'placement.<group>.<field>: <why>' per group (target first; empty when nothing;\n"
      "int4_backend_problem, swiftspec/model.h): on cuda the decode megakernel and tp > 1. The loaders\n"
      "refuse the same; Python asks first, before converting a model to int4.");
  m.def(
      "placement_backend_problems",
      [](const std::string& text, const std::string& backend) {
        return group_problems(Placement::from_json(text), true,
                              [&](const GroupPlacement& g) { return g.backend_problem(backend); });
      },
      "placement"_a, "backend"_a,
      "What a placement JSON text asks for that `backend` does not implement, one\n"
      "'placement.<group>.<field>: <why>' per group (draft first; empty when nothing;\n"
      "GroupPlacement::backend_problem): a kv_window on the cuda backend. load_model_pair refuses the same\n"
      "before loading; Python asks first.");
  m.def("int4_backend_problem", &int4_backend_problem, "backend"_a, "megakernel"_a, "tp"_a,
        "Why an int4 checkpoint cannot load on `backend` with the decode megakernel `megakernel` and `tp`\n"
        "tensor-parallel ranks ('<field>: <why>'), or '' when it can (int4_backend_problem, swiftspec/model.h).");
  m.def(
      "placement_group_places_nothing",
      [](const std::string& group_json) {
        return Placement::from_json("{\"draft\": " + group_json + "}").draft.places_nothing();
      },
      "group"_a,
      "Whether a group's placement JSON places nothing (GroupPlacement::places_nothing: TP 1, no cores, no\n"
      "threads_per_rank, no CUDA-only field).");
  m.def(
      "placement_automatic",
      [](int num_cores, int target_tp, int draft_tp) {
        return Placement::automatic(num_cores, target_tp, draft_tp).to_json();
      },
      "num_cores"_a = 0, "target_tp"_a = 1, "draft_tp"_a = 1,
      "The default split of this machine's cores (draft: max(draft_tp, cores/4), target: the rest), as JSON.");

  m.def(
      "tp_plan",
      [](const std::string& checkpoint_dir, int tp, int ffn_align) {
        const auto ckpt = Checkpoint::open(checkpoint_dir);  // int4: FFN bounds on whole groups, as the runtime cuts
        const int group = ckpt->quantization().int4() ? ckpt->quantization().group_size : 1;
        return TpPlan::make(ckpt->config(), tp, ffn_align, group).to_json();
      },
      "checkpoint_dir"_a, "tp"_a, "ffn_align"_a = 8,
      "The tensor-parallel plan (tensor_parallel.h) of a checkpoint over tp ranks, as JSON.");
  m.def(
      "tp_plan_of_config",
      [](const std::string& config_text, const std::string& origin, int tp, int ffn_align) {
        return TpPlan::make(ModelConfig::from_json_text(config_text, origin), tp, ffn_align).to_json();
      },
      "config_text"_a, "origin"_a, "tp"_a, "ffn_align"_a = 8,
      "The tensor-parallel plan (TpPlan::make, tensor_parallel.h) of a model over tp ranks, as JSON, from\n"
      "its config.json text (a float checkpoint's: FFN bounds on any row): what the converter writes into\n"
      "a pre-sharded folder (swiftspec.convert.tp_shard) is the plan the runtime cuts at load time.\n"
      "Raises CheckpointError '<origin>: ...' for a config the runtime refuses, InvalidRequestError for\n"
      "a tp or ffn_align it cannot plan (tp < 1, more ranks than attention heads, ffn_align < 1).");
}

}  // namespace swiftspec::python
