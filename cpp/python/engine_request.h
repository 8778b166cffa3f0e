// One generation request from Python's arguments, shared by every binding that runs one
// (Engine.generate, generate_async, spec.generate_serial): its GenerationConfig, its async
// options, and running it in the engine's turn (engine.h) with its models marked busy
// (model_busy.h). Also the conversion of Python values into the sampling parameters'
// GivenNumber (swiftspec_core.check_sampling).
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "swiftspec/async_engine.h"
#include "swiftspec/engine.h"
#include "swiftspec/generation.h"
#include "swiftspec/sampling.h"

namespace swiftspec::python {

/// A request's config from its arguments: the sampling parameters checked and narrowed to
/// float32 by SamplingRequest::params (messages name the Python keywords), the rest as given
/// (GenerationConfig::validate checks them when the request runs).
GenerationConfig request_config(int max_new_tokens, double temperature, int top_k, double top_p, uint64_t seed,
                                const std::vector<int32_t>& stop_token_ids, DecodeMode mode, int tree_budget,
                                int max_depth, int branching, int prefill_chunk);

/// AsyncOptions from Python keyword values (swiftspec.Engine.generate's async_options,
/// generate_async's keywords): the binding's defaults (AsyncOptions's, but min_expand_prob 0:
/// grow until the budget) with the given ones: expand_width, growth_depth, min_send_nodes,
/// cost_aware_send, min_expand_prob, record_timeline. An unknown name or a value of the wrong
/// type throws InvalidArgument naming it ("async_options: unknown option(s) 'x'; known: ...").
AsyncOptions async_options_from(const nanobind::dict& given);

/// Runs a request on `engine` (call with the GIL released): waits for the engine's turn (polling
/// config.cancel_requested), marks its models busy, and decodes (Engine::generate). Cancelled
/// while it waits: no tokens, finish_reason "cancelled".
GenerationResult run_engine_request(Engine& engine, const std::vector<int32_t>& prompt, const GenerationConfig& config,
                                    const TokenCallback& on_tokens, const AsyncOptions* async_options = nullptr,
                                    AsyncReport* async_report = nullptr);

/// A request of the Python bindings (Engine.generate, generate_async): runs it as
/// run_engine_request does, with the GIL released, its Python hooks (on_tokens, cancel_check:
/// request_hooks.h) re-raising what they raised, and returns {'tokens', 'stats'}; in async mode
/// also 'report' and 'timeline' (swiftspec_core.Timeline), under `async_options` (default:
/// async_options_from({})). Call with the GIL held.
nanobind::dict run_request(Engine& engine, const std::vector<int32_t>& prompt, GenerationConfig config,
                           nanobind::object on_tokens, nanobind::object cancel_check,
                           const std::optional<AsyncOptions>& async_options);

/// A Python value as a sampling parameter: a float is Real, an int (not a bool) Integer, anything
/// else Other; shown as repr() shows it. (Python converts numpy numbers to int or float first.)
GivenNumber given_number(nanobind::handle value);

}  // namespace swiftspec::python
