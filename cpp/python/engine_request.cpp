#include "python/engine_request.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "python/model_busy.h"
#include "python/request_hooks.h"
#include "python/result_dicts.h"
#include "swiftspec/error.h"

namespace nb = nanobind;

namespace swiftspec::python {
namespace {

// The async options Python can set, each with the setter of its AsyncOptions field.
struct AsyncOptionField {
  const char* name;
  const char* type;  // as messages name it
  void (*set)(AsyncOptions&, nb::handle);
};

const AsyncOptionField kAsyncOptionFields[] = {
    {"cost_aware_send", "True or False", [](AsyncOptions& o, nb::handle v) { o.cost_aware_send = nb::cast<bool>(v); }},
    {"expand_width", "an int", [](AsyncOptions& o, nb::handle v) { o.speculative.expand_width = nb::cast<int>(v); }},
    {"growth_depth", "an int", [](AsyncOptions& o, nb::handle v) { o.growth_depth = nb::cast<int>(v); }},
    {"min_expand_prob", "a number",
     [](AsyncOptions& o, nb::handle v) { o.speculative.min_expand_prob = nb::cast<double>(v); }},
    {"min_send_nodes", "an int", [](AsyncOptions& o, nb::handle v) { o.min_send_nodes = nb::cast<int>(v); }},
    {"record_timeline", "True or False", [](AsyncOptions& o, nb::handle v) { o.record_timeline = nb::cast<bool>(v); }},
};

}  // namespace

GenerationConfig request_config(int max_new_tokens, double temperature, int top_k, double top_p, uint64_t seed,
                                const std::vector<int32_t>& stop_token_ids, DecodeMode mode, int tree_budget,
                                int max_depth, int branching, int prefill_chunk) {
  SamplingRequest sampling;
  sampling.temperature = GivenNumber::real(temperature);
  sampling.top_p = GivenNumber::real(top_p);
  sampling.top_k = GivenNumber::integer(int64_t{top_k});
  sampling.seed = GivenNumber::integer(seed);
  GenerationConfig c;
  c.max_new_tokens = max_new_tokens;
  c.sampling = sampling.params();
  c.stop_token_ids = stop_token_ids;
  c.mode = mode;
  c.tree_budget = tree_budget;
  c.max_depth = max_depth;
  c.branching = branching;
  c.prefill_chunk = prefill_chunk;
  return c;
}

AsyncOptions async_options_from(const nb::dict& given) {
  AsyncOptions options;
  options.speculative.min_expand_prob = 0.0;  // the binding's default: grow until the budget
  std::vector<std::string> unknown;           // as repr() shows them
  for (auto [key, value] : given) {
    const AsyncOptionField* field = nullptr;
    for (const AsyncOptionField& f : kAsyncOptionFields)
      if (nb::isinstance<nb::str>(key) && nb::cast<std::string>(key) == f.name) field = &f;
    if (!field) {
      unknown.push_back(nb::cast<std::string>(nb::repr(key)));
      continue;
    }
    try {
      field->set(options, value);
    } catch (const nb::cast_error&) {
      throw InvalidArgument(std::string("async_options: ") + field->name + " must be " + field->type + ", got " +
                            nb::cast<std::string>(nb::repr(value)));
    }
  }
  if (!unknown.empty()) {
    std::sort(unknown.begin(), unknown.end());
    std::string message = "async_options: unknown option(s) ";
    for (size_t i = 0; i < unknown.size(); ++i) message += (i ? ", " : "") + unknown[i];
    message += "; known: ";
    for (size_t i = 0; i < std::size(kAsyncOptionFields); ++i)
      message += (i ? ", " : "") + std::string(kAsyncOptionFields[i].name);
    throw InvalidArgument(message);
  }
  return options;
}

GenerationResult run_engine_request(Engine& engine, const std::vector<int32_t>& prompt, const GenerationConfig& config,
                                    const TokenCallback& on_tokens, const AsyncOptions* async_options,
                                    AsyncReport* async_report) {
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<Engine::Turn> turn = engine.wait_for_turn(config.cancel_requested);
  if (!turn)
    return Engine::cancelled_before_start(static_cast<int>(prompt.size()),
                                          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  ModelBusy busy({&engine.target(), engine.draft()});  // other engines and direct calls over these models
  return engine.generate(*turn, prompt, config, on_tokens, async_options, async_report);
}

nb::dict run_request(Engine& engine, const std::vector<int32_t>& prompt, GenerationConfig config, nb::object on_tokens,
                     nb::object cancel_check, const std::optional<AsyncOptions>& async_options) {
  // Python callbacks run under the GIL; their exceptions (KeyboardInterrupt included) cancel the
  // request and are re-raised once the engine has returned.
  RequestHooks hooks(std::move(on_tokens), std::move(cancel_check));
  config.cancel_requested = hooks.cancel_requested();
  const TokenCallback cb = hooks.token_callback();
  const bool async = config.mode == DecodeMode::Async;
  const bool reported = async || config.mode == DecodeMode::Auto;
  const AsyncOptions options = async_options ? *async_options : async_options_from(nb::dict());
  std::unique_ptr<AsyncReport> report;
  if (reported) report = std::make_unique<AsyncReport>();
  GenerationResult res;
  {
    nb::gil_scoped_release release;
    res = run_engine_request(engine, prompt, config, cb, async || async_options ? &options : nullptr, report.get());
  }
  hooks.rethrow();
  nb::dict out;
  out["tokens"] = res.tokens;
  out["stats"] = stats_dict(res.stats);
  // (auto without a draft decodes target-only: nothing to report)
  if (async || (reported && !report->speculation.budget_per_round.empty()))
    out["report"] = report_dict(report->speculation);
  if (async) out["timeline"] = nb::cast(new Timeline(std::move(report->timeline)), nb::rv_policy::take_ownership);
  return out;
}

GivenNumber given_number(nb::handle value) {
  GivenNumber g;
  g.shown = nb::cast<std::string>(nb::repr(value));
  PyObject* v = value.ptr();
  if (PyFloat_Check(v)) {
    g.kind = GivenNumber::Kind::Real;
    g.value = PyFloat_AsDouble(v);
  } else if (PyLong_Check(v) && !PyBool_Check(v)) {
    g.kind = GivenNumber::Kind::Integer;
    nb::int_ zero(0);
    const int negative = PyObject_RichCompareBool(v, zero.ptr(), Py_LT);
    if (negative < 0) throw nb::python_error();
    g.value = PyLong_AsDouble(v);
    if (g.value == -1.0 && PyErr_Occurred()) {  // beyond a double: only its sign matters
      PyErr_Clear();
      g.value = negative ? -HUGE_VAL : HUGE_VAL;
    }
    if (!negative) {
      const unsigned long long exact = PyLong_AsUnsignedLongLong(v);
      if (exact == static_cast<unsigned long long>(-1) && PyErr_Occurred())
        PyErr_Clear();  // 2**64 or more
      else
        g.exact = exact;
    }
  } else {
    g.kind = GivenNumber::Kind::Other;
  }
  return g;
}

}  // namespace swiftspec::python
