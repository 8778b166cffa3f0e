// swiftspec_core: the asynchronous engine seen from Python — parallel tree
// generation with its timeline, placement-driven model loading (including
// tensor-parallel CPU models), and the tensor-parallel plan. Every call that
// runs a model releases the GIL; the token callback re-acquires it on the
// host thread (the caller's), never on a worker group's thread.
#include "python/bind_async.h"
#include "python/model_busy.h"
#include "python/request_hooks.h"
#include "python/result_dicts.h"

#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>

#include "swiftspec/async_engine.h"
#include "swiftspec/checkpoint.h"
#include "swiftspec/engine.h"
#include "swiftspec/error.h"
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

}  // namespace

void bind_async(nb::module_& m) {
  nb::class_<Timeline>(m, "Timeline",
                       "Per-round timeline of an async request (timeline.h): tracks 'target', 'draft', 'host'.")
      .def("chrome_trace", &Timeline::to_chrome_trace, "Chrome trace JSON text (chrome://tracing, ui.perfetto.dev).")
      .def("save_chrome_trace", &Timeline::save_chrome_trace, "path"_a, "Writes the Chrome trace JSON to path.")
      .def("summary", [](const Timeline& t) { return summary_dict(t.summary()); },
           "Critical-path summary (seconds): target_verify, target_wait, draft_grow, draft_wait, rounds,\n"
           "decode_span, target_utilization (= target_verify / decode_span).")
      .def("events", &events_list, "Every event as {'track', 'name', 'begin', 'end', 'round', 'args'}.");

  m.def(
      "generate_async",
      [](Engine& engine, const std::vector<int32_t>& prompt, int max_new_tokens, float temperature, int top_k,
         float top_p, uint64_t seed, const std::vector<int32_t>& stop_token_ids, int tree_budget, int max_depth,
         int branching, int expand_width, int growth_depth, int min_send_nodes, bool cost_aware_send,
         double min_expand_prob, bool record_timeline, nb::object on_tokens, nb::object cancel_check,
         int prefill_chunk) {
        if (!engine.draft()) throw InvalidArgument("async mode needs a draft model: load the engine with one");
        GenerationConfig cfg;
        cfg.max_new_tokens = max_new_tokens;
        cfg.sampling.temperature = temperature;
        cfg.sampling.top_k = top_k;
        cfg.sampling.top_p = top_p;
        cfg.sampling.seed = seed;
        cfg.stop_token_ids = stop_token_ids;
        cfg.mode = DecodeMode::Async;
        cfg.tree_budget = tree_budget;
        cfg.max_depth = max_depth;
        cfg.branching = branching;
        cfg.prefill_chunk = prefill_chunk;
        AsyncOptions opt;
        opt.speculative.expand_width = expand_width;
        opt.speculative.min_expand_prob = min_expand_prob;
        opt.growth_depth = growth_depth;
        opt.min_send_nodes = min_send_nodes;
        opt.cost_aware_send = cost_aware_send;
        opt.record_timeline = record_timeline;
        RequestHooks hooks(std::move(on_tokens), std::move(cancel_check));
        cfg.cancel_requested = hooks.cancel_requested();
        const TokenCallback cb = hooks.token_callback();
        GenerationResult res;
        auto rep = std::make_unique<AsyncReport>();
        {
          ModelBusy busy({&engine.target(), engine.draft()});
          nb::gil_scoped_release release;
          res = generate_speculative_async(engine.target(), *engine.draft(), prompt, cfg, cb, opt, rep.get());
        }
        hooks.rethrow();
        nb::dict out;
        out["tokens"] = res.tokens;
        out["stats"] = stats_dict(res.stats);
        out["report"] = report_dict(rep->speculation);
        out["timeline"] = nb::cast(new Timeline(std::move(rep->timeline)), nb::rv_policy::take_ownership);
        return out;
      },
      "engine"_a, "prompt"_a, "max_new_tokens"_a = 128, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f,
      "seed"_a = 0, "stop_token_ids"_a = std::vector<int32_t>{}, "tree_budget"_a = 16, "max_depth"_a = 8,
      "branching"_a = 2, "expand_width"_a = 0, "growth_depth"_a = 0, "min_send_nodes"_a = 1,
      "cost_aware_send"_a = true, "min_expand_prob"_a = 0.0, "record_timeline"_a = true, "on_tokens"_a = nb::none(),
      "cancel_check"_a = nb::none(), "prefill_chunk"_a = 0,
      "Parallel tree generation (async_engine.h) on an Engine's target and draft: the draft group grows\n"
      "the token tree while the target group verifies. Returns {'tokens', 'stats', 'report', 'timeline'}.\n"
      "growth_depth: depth limit of continuous growth below the root (0: 3*max_depth); min_send_nodes:\n"
      "verifiable nodes the draft waits for before handing a subtree to an idle target; cost_aware_send:\n"
      "also wait while one more draft step raises the expected token rate (async_send_policy.h).\n"
      "on_tokens, cancel_check, prefill_chunk: as Engine.generate (the host polls Ctrl-C and cancel_check\n"
      "while the groups prefill or verify; each group stops at its next prefill chunk).");

  m.def(
      "load_group_model",
      [](const std::string& dir, const std::string& group_json, const ModelOptions& options,
         const std::string& backend, const std::string& name) {
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
      "placement_normalize", [](const std::string& text) { return Placement::from_json(text).to_json(); }, "placement"_a,
      "Validates a placement JSON text and returns it normalised (cores as one list per rank).");
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
}

}  // namespace swiftspec::python
