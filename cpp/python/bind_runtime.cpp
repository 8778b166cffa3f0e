#include "python/bind_runtime.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <exception>
#include <optional>
#include <utility>

#include "swiftspec/checkpoint.h"
#include "swiftspec/engine.h"
#include "swiftspec/error.h"
#include "swiftspec/memory_plan.h"
#include "swiftspec/model.h"
#include "swiftspec/rope.h"
#include "python/model_busy.h"
#include "python/engine_request.h"
#include "python/request_hooks.h"
#include "python/result_dicts.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace swiftspec::python {
namespace {

// Raises the Python class swiftspec.errors.<name> with `msg`. The text may
// quote bytes of a bad file that are not UTF-8: they are escaped, not allowed
// to turn the error into a UnicodeDecodeError.
void raise_python_error(const char* name, const char* msg) {
  nb::object cls = nb::module_::import_("swiftspec.errors").attr(name);
  PyObject* text = PyUnicode_DecodeUTF8(msg, static_cast<Py_ssize_t>(std::strlen(msg)), "backslashreplace");
  if (text == nullptr) {  // cannot happen with backslashreplace; keep some message
    PyErr_Clear();
    PyErr_SetString(cls.ptr(), "(error text could not be decoded)");
    return;
  }
  PyErr_SetObject(cls.ptr(), text);
  Py_DECREF(text);
}

LogitsMode parse_logits_mode(const std::string& s) {
  if (s == "last") return LogitsMode::Last;
  if (s == "all") return LogitsMode::All;
  if (s == "none") return LogitsMode::None;
  throw InvalidArgument("logits must be 'last', 'all' or 'none', got '" + s + "'");
}

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<2>> to_numpy_2d(std::vector<T>&& data, size_t rows, size_t cols) {
  auto* heap = new std::vector<T>(std::move(data));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<2>>(heap->data(), {rows, cols}, owner);
}

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy_1d(std::vector<T>&& data) {
  auto* heap = new std::vector<T>(std::move(data));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), {heap->size()}, owner);
}

/// The ForwardBatch of Model.forward / Model.forward_top_k's arguments (see their docstrings).
ForwardBatch python_batch(const Model& mdl, std::vector<int32_t> tokens, std::optional<std::vector<int32_t>> positions,
                          const std::string& logits, std::vector<int32_t> tree_slots,
                          std::vector<int32_t> attend_offsets, std::vector<int32_t> attend_slots, const char* who) {
  ForwardBatch b;
  b.logits = parse_logits_mode(logits);
  b.tokens = std::move(tokens);
  if (positions) {
    b.positions = std::move(*positions);
  } else {
    if (!tree_slots.empty()) throw InvalidArgument(std::string(who) + ": tree mode needs explicit positions");
    b = ForwardBatch::append(b.tokens, mdl.committed_len(), b.logits);
  }
  b.tree_slots = std::move(tree_slots);
  b.attend_offsets = std::move(attend_offsets);
  b.attend_slots = std::move(attend_slots);
  return b;
}

/// None (plain RoPE), or the scaling as the runtime resolved it (HF key names; YaRN's
/// attention_factor as derived when config.json leaves it out).
nb::object rope_scaling_dict(const RopeScaling& s) {
  if (s.type == RopeScalingType::None) return nb::none();
  nb::dict d;
  d["rope_type"] = s.type == RopeScalingType::Llama3 ? "llama3" : "yarn";
  d["factor"] = s.factor;
  d["original_max_position_embeddings"] = s.original_max_position_embeddings;
  if (s.type == RopeScalingType::Llama3) {
    d["low_freq_factor"] = s.low_freq_factor;
    d["high_freq_factor"] = s.high_freq_factor;
  } else {
    d["beta_fast"] = s.beta_fast;
    d["beta_slow"] = s.beta_slow;
    d["attention_factor"] = rope_attention_factor(s);
    d["truncate"] = s.truncate;
  }
  return d;
}

nb::dict config_dict(const ModelConfig& c) {
  nb::dict d;
  d["architecture"] = c.architecture;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_layers"] = c.num_layers;
  d["num_heads"] = c.num_heads;
  d["num_kv_heads"] = c.num_kv_heads;
  d["head_dim"] = c.head_dim;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["rope_theta"] = c.rope_theta;
  d["rope_style"] = c.rope_style == RopeStyle::NeoX ? "neox" : "interleaved";
  d["rope_scaling"] = rope_scaling_dict(c.rope_scaling);
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["context_limit"] = c.context_limit();
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  d["attention_bias"] = c.attention_bias;
  d["bos_token_id"] = c.bos_token_id;
  d["eos_token_ids"] = c.eos_token_ids;
  return d;
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const CheckpointError& e) {
      raise_python_error("CheckpointError", e.what());
    } catch (const InvalidArgument& e) {
      raise_python_error("InvalidRequestError", e.what());
    } catch (const Error& e) {
      raise_python_error("SwiftspecError", e.what());
    }
  });

  nb::class_<ModelOptions>(m, "ModelOptions", "Per-model runtime options (KV capacity, threads, placement).")
      .def(nb::init<>())
      .def_rw("max_context", &ModelOptions::max_context, "committed KV capacity in tokens")
      .def_rw("max_tree", &ModelOptions::max_tree, "tree KV capacity in nodes")
      .def_rw("num_threads", &ModelOptions::num_threads, "CPU worker threads (0: all cores)")
      .def_rw("cpu_affinity", &ModelOptions::cpu_affinity, "cores to pin CPU workers to")
      .def_rw("device", &ModelOptions::device, "CUDA device ordinal (cuda backend)")
      .def_rw("sm_first", &ModelOptions::sm_first,
              "first SM of the model's green-context partition (cuda backend; model.h)")
      .def_rw("sm_count", &ModelOptions::sm_count,
              "SMs of the model's partition (0: up to the last SM; sm_first = sm_count = 0: whole GPU)")
      .def_rw("stream_priority", &ModelOptions::stream_priority,
              "priority of the model's CUDA stream (lower is higher; clamped to the device's range)")
      .def_rw("gemm_engine", &ModelOptions::gemm_engine,
              "GEMM engine of the model (cuda backend): '' (default, wgmma), 'wgmma' or 'mma'")
      .def_rw("megakernel", &ModelOptions::megakernel,
              "single-token steps as one persistent kernel (cuda backend, tp 1; default False); a decode step "
              "is then not bitwise equal to a row of a tree step: meant for draft models and target-only "
              "decoding (greedy speculative output can differ from target-only at near-ties)")
      .def_rw("kv_window_sinks", &ModelOptions::kv_window_sinks,
              "attention window (cpu backend): the first committed keys every row attends (attention sinks); "
              "only with kv_window_recent > 0")
      .def_rw("kv_window_recent", &ModelOptions::kv_window_recent,
              "attention window (cpu backend): the committed keys just before each row that it attends; 0 "
              "(default): full attention. For a draft (StreamingLLM-style): the target verifies with its full "
              "KV, so outputs stay the target's (model.h)");

  nb::class_<Checkpoint>(m, "Checkpoint", "A converted checkpoint folder (memory-mapped safetensors).")
      .def_static("open", &Checkpoint::open, "dir"_a, nb::call_guard<nb::gil_scoped_release>(),
                  "Opens and validates a checkpoint folder; raises CheckpointError naming the problem.")
      .def_prop_ro("dir", &Checkpoint::dir)
      .def_prop_ro("config", [](const Checkpoint& c) { return config_dict(c.config()); })
      .def_prop_ro("dtype", [](const Checkpoint& c) { return std::string(dtype_name(c.dtype())); })
      .def_prop_ro("quantization",
                   [](const Checkpoint& c) {
                     nb::dict d;  // empty for float weights; {"bits": 4, "group_size": G} for int4
                     if (c.quantization().int4()) {
                       d["bits"] = c.quantization().bits;
                       d["group_size"] = c.quantization().group_size;
                     }
                     return d;
                   })
      .def("has", &Checkpoint::has, "name"_a)
      .def("tensor_shape", [](const Checkpoint& c, const std::string& name) { return c.tensor(name).shape; }, "name"_a);

  nb::class_<Model>(m, "Model", "A decoder model with its committed + tree KV cache on one backend.")
      .def_prop_ro("config", [](const Model& mdl) { return config_dict(mdl.config()); })
      .def_prop_ro("backend", &Model::backend_name)
      .def_prop_ro("committed_len", &Model::committed_len)
      .def_prop_ro("max_context", [](const Model& mdl) { return mdl.options().max_context; })
      .def_prop_ro("max_tree", [](const Model& mdl) { return mdl.options().max_tree; })
      .def(
          "forward",
          [](Model& mdl, std::vector<int32_t> tokens, std::optional<std::vector<int32_t>> positions,
             const std::string& logits, std::vector<int32_t> tree_slots, std::vector<int32_t> attend_offsets,
             std::vector<int32_t> attend_slots) {
            const ForwardBatch b =
                python_batch(mdl, std::move(tokens), std::move(positions), logits, std::move(tree_slots),
                             std::move(attend_offsets), std::move(attend_slots), "forward");
            std::vector<float> out;
            {
              ModelBusy busy({&mdl});
              nb::gil_scoped_release release;
              mdl.forward(b, out);
            }
            const size_t vocab = mdl.config().vocab_size;
            const size_t rows = vocab ? out.size() / vocab : 0;
            return to_numpy_2d(std::move(out), rows, vocab);
          },
          "tokens"_a, "positions"_a = nb::none(), "logits"_a = "last", "tree_slots"_a = std::vector<int32_t>{},
          "attend_offsets"_a = std::vector<int32_t>{}, "attend_slots"_a = std::vector<int32_t>{},
          "Runs the model over new tokens. Append mode (default): tokens extend the committed KV at\n"
          "positions committed_len, committed_len+1, ... Tree mode: give tree_slots (one per token),\n"
          "positions and the CSR attend_offsets/attend_slots (ancestors in depth order, own slot last).\n"
          "Returns fp32 logits [rows, vocab] for logits='last' (1 row), 'all' (n rows) or 'none' (0).")
      .def(
          "forward_top_k",
          [](Model& mdl, std::vector<int32_t> tokens, int k, bool log_normalizer,
             std::optional<std::vector<int32_t>> positions, const std::string& logits, std::vector<int32_t> tree_slots,
             std::vector<int32_t> attend_offsets, std::vector<int32_t> attend_slots, double inv_temperature) {
            const ForwardBatch b =
                python_batch(mdl, std::move(tokens), std::move(positions), logits, std::move(tree_slots),
                             std::move(attend_offsets), std::move(attend_slots), "forward_top_k");
            TopKLogits top;
            {
              ModelBusy busy({&mdl});
              nb::gil_scoped_release release;
              mdl.forward_top_k(b, k, log_normalizer, top, inv_temperature);
            }
            const size_t rows = top.rows();
            nb::object lse = nb::none();
            if (log_normalizer) lse = nb::cast(to_numpy_1d(std::move(top.log_normalizer)));
            return nb::make_tuple(to_numpy_2d(std::move(top.ids), rows, k), to_numpy_2d(std::move(top.logits), rows, k),
                                  lse);
          },
          "tokens"_a, "k"_a, "log_normalizer"_a = false, "positions"_a = nb::none(), "logits"_a = "last",
          "tree_slots"_a = std::vector<int32_t>{}, "attend_offsets"_a = std::vector<int32_t>{},
          "attend_slots"_a = std::vector<int32_t>{}, "inv_temperature"_a = 1.0,
          "forward() reduced to each logits row's k largest entries (Model::forward_top_k; the cuda backend\n"
          "selects them on the GPU). Same arguments and KV effects as forward(). Returns (ids int32 [rows, k],\n"
          "largest logit first, ties to the smaller id; logits fp32 [rows, k]; log_normalizer float64 [rows]\n"
          "= ln sum exp(logits * inv_temperature) of each row, or None unless asked). Raises\n"
          "InvalidArgumentError for k outside [1, vocab] or inv_temperature not finite and > 0 (before the\n"
          "pass), SwiftspecError for NaN logits. read_logits_row(r) then reads a whole row of this pass.")
      .def(
          "read_logits_row",
          [](Model& mdl, int row) {
            std::vector<float> out;
            {
              ModelBusy busy({&mdl});
              nb::gil_scoped_release release;
              mdl.read_logits_row(row, out);
            }
            return to_numpy_1d(std::move(out));
          },
          "row"_a,
          "Row `row` (fp32 [vocab]) of the logits of this model's last forward_top_k (Model::read_logits_row):\n"
          "bit-identical to forward()'s row. Raises InvalidArgumentError when no forward_top_k ran, a later\n"
          "pass replaced it, that pass kept no logits (k = 1 without log_normalizer) or row is out of range.")
      .def(
          "commit_tree_slots",
          [](Model& mdl, const std::vector<int32_t>& slots) {
            ModelBusy busy({&mdl});
            nb::gil_scoped_release release;
            mdl.commit_tree_slots(slots);
          },
          "tree_slots"_a)
      .def(
          "truncate_committed",
          [](Model& mdl, int length) {
            ModelBusy busy({&mdl});
            mdl.truncate_committed(length);
          },
          "length"_a)
      .def(
          "read_committed_kv",
          [](const Model& mdl, int layer) {
            std::vector<float> k, v;
            {
              ModelBusy busy({&mdl});
              mdl.read_committed_kv(layer, k, v);
            }
            const size_t w = size_t(mdl.config().num_kv_heads) * mdl.config().head_dim;
            const size_t rows = k.size() / w;
            return nb::make_tuple(to_numpy_2d(std::move(k), rows, w), to_numpy_2d(std::move(v), rows, w));
          },
          "layer"_a, "K and V of the committed region, fp32 [committed_len, kv_heads*head_dim] each.")
      .def(
          "read_tree_kv",
          [](const Model& mdl, int layer, const std::vector<int32_t>& slots) {
            std::vector<float> k, v;
            {
              ModelBusy busy({&mdl});
              mdl.read_tree_kv(layer, slots, k, v);
            }
            const size_t w = size_t(mdl.config().num_kv_heads) * mdl.config().head_dim;
            return nb::make_tuple(to_numpy_2d(std::move(k), slots.size(), w),
                                  to_numpy_2d(std::move(v), slots.size(), w));
          },
          "layer"_a, "slots"_a, "K and V of the given tree slots, fp32 [len(slots), kv_heads*head_dim] each.");

  {
    // The decode modes the runtime knows (generation.h kDecodeModes): the one list the CLI, the
    // server and the bench offer.
    std::vector<std::string> modes;
    for (DecodeMode mode : kDecodeModes) modes.push_back(decode_mode_name(mode));
    m.attr("DECODE_MODES") = nb::tuple(nb::cast(modes));
  }

  m.def(
      "check_sampling",
      [](nb::handle temperature, nb::handle top_p, nb::handle top_k, nb::handle seed,
         const std::map<std::string, std::string>& names, bool explain, uint64_t seeds, const std::string& seed_note,
         std::optional<std::vector<std::string>> given) {
        SamplingRequest r;
        r.temperature = given_number(temperature);
        r.top_p = given_number(top_p);
        r.top_k = given_number(top_k);
        r.seed = given_number(seed);
        for (const auto& [key, name] : names) {
          std::string* field = key == "temperature" ? &r.names.temperature
                               : key == "top_p"     ? &r.names.top_p
                               : key == "top_k"     ? &r.names.top_k
                               : key == "seed"      ? &r.names.seed
                                                    : nullptr;
          if (!field)
            throw InvalidArgument("check_sampling: names has the unknown key '" + key +
                                  "' (keys: temperature, top_p, top_k, seed)");
          *field = name;
        }
        r.explain = explain;
        r.seeds = seeds;
        r.seed_note = seed_note;
        r.params();
        if (given) r.refuse_unused_under_greedy(*given);
      },
      "temperature"_a = 0.0, "top_p"_a = 1.0, "top_k"_a = 0, "seed"_a = 0,
      "names"_a = std::map<std::string, std::string>{}, "explain"_a = false, "seeds"_a = 1, "seed_note"_a = "",
      "given"_a = nb::none(),
      "The one check of the sampling parameters (SamplingRequest, sampling.h) for every caller: the\n"
      "values as given (a float, an int, or anything else: named as not a number; Python converts numpy\n"
      "numbers first). Raises InvalidRequestError naming the parameter as `names` spells it (default: its\n"
      "keyword; e.g. {'top_p': '--top-p'}) and the value: temperature not a finite number >= 0, beyond\n"
      "float32 or below its smallest normal number (but 0); top_p outside (0, 1]; top_k not an integer\n"
      "in [0, 2**31 - 1]; seed not an integer >= 0 with seed + seeds - 1 within 64 bits (seed_note says\n"
      "why, in that message). explain: messages state each domain and its off value (swiftspec bench).\n"
      "given: the parameters the caller set explicitly ('top_p', 'top_k', 'seed'), refused under greedy\n"
      "decoding (temperature 0), where they have no effect.");

  m.def(
      "parse_model_config",
      [](const std::string& text, const std::string& origin) {
        return config_dict(ModelConfig::from_json_text(text, origin));
      },
      "text"_a, "origin"_a,
      "Parses a checkpoint's config.json text as the runtime does when it loads the checkpoint\n"
      "(ModelConfig::from_json_text, config.h) and returns the model configuration as a dict. Raises\n"
      "CheckpointError '<origin>: ...' naming the field the runtime refuses (the converters check the\n"
      "config they are about to write with it).");

  nb::class_<MemoryNeed>(m, "MemoryNeed",
                         "What a model needs in memory on one device, in bytes (memory_plan.h): weights, KV cache\n"
                         "per context token and for the tree slots, workspaces.")
      .def_ro("weight_bytes", &MemoryNeed::weight_bytes)
      .def_ro("kv_bytes_per_token", &MemoryNeed::kv_bytes_per_token)
      .def_ro("kv_fixed_bytes", &MemoryNeed::kv_fixed_bytes)
      .def_ro("workspace_bytes", &MemoryNeed::workspace_bytes)
      .def_ro("workspace_bytes_per_token", &MemoryNeed::workspace_bytes_per_token)
      .def("kv_bytes", &MemoryNeed::kv_bytes, "context"_a, "KV cache bytes for a context of `context` tokens.")
      .def("bytes", &MemoryNeed::bytes, "context"_a,
           "Every byte the model needs with a context of `context` tokens (weights, KV cache, workspaces).");

  m.def(
      "memory_need",
      [](const std::string& dir, const std::string& backend, const ModelOptions& options) {
        const ModelMemory mm = model_memory(*Checkpoint::open(dir), backend, options);
        return mm.needs.at(0).second;
      },
      "checkpoint_dir"_a, "backend"_a = "cpu", "options"_a = ModelOptions(),
      "What a model over checkpoint_dir needs on `backend` with `options` (its max_tree, threads...;\n"
      "max_context is not read): a MemoryNeed, whose bytes(context) is what loading it with that\n"
      "max_context plans for (model_memory, model.h).");
  m.def(
      "free_memory",
      []() {
        const FreeMemory f = cpu_free_memory();
        nb::dict d;
        d["bytes"] = f.bytes;
        d["where"] = f.where;
        d["known"] = f.known;
        return d;
      },
      "The RAM free for models as the context plan measures it (cpu_free_memory, memory_plan.h):\n"
      "{'bytes': MemAvailable in bytes, 'where': 'in RAM (MemAvailable)', 'known': bool}. The test hook\n"
      "SWIFTSPEC_TEST_FREE_BYTES replaces the byte count.");

  m.def(
      "resolve_max_context",
      [](const std::string& text, const std::string& origin, int max_context) {
        const ModelConfig config = ModelConfig::from_json_text(text, origin);
        ContextRequest r;  // the trained-length part of the rule: no device, so no memory bound
        r.name = origin;
        r.origin = origin;
        r.requested = max_context;
        r.trained = config.context_limit();
        return plan_contexts({r}, {}).contexts[0];
      },
      "config_text"_a, "origin"_a, "max_context"_a = 0,
      "The KV capacity in tokens that a model of this config.json text may get when it is loaded with\n"
      "max_context (0: the model's default, its max_position_embeddings, longer with YaRN scaling:\n"
      "ModelConfig::context_limit), by the rule every loader applies\n"
      "(plan_contexts, memory_plan.h) without loading anything and without the memory bound (that needs the\n"
      "weights: memory_need, load_model_pair): a default may still be capped at load when memory is short.\n"
      "Raises InvalidRequestError naming both numbers for a max_context the model cannot take,\n"
      "CheckpointError '<origin>: ...' for a config the runtime refuses.");

  m.def(
      "rope_tables",
      [](const std::string& text, const std::string& origin) {
        const ModelConfig c = ModelConfig::from_json_text(text, origin);
        nb::dict d;
        d["inv_freq"] = rope_inv_freq(c);
        d["attention_scale"] = rope_attention_scale(c);
        return d;
      },
      "text"_a, "origin"_a,
      "The RoPE tables both backends rotate with (swiftspec/rope.h) for a config.json text:\n"
      "{'inv_freq': list of head_dim/2 fp32 values (radians per position), 'attention_scale': the fp32\n"
      "factor cos and sin are multiplied by (YaRN's attention factor; 1.0 otherwise)}. Raises\n"
      "CheckpointError '<origin>: ...' as parse_model_config does.");

  m.def(
      "load_model",
      [](const std::string& dir, const std::string& backend, const ModelOptions& options) {
        nb::gil_scoped_release release;
        return std::shared_ptr<Model>(load_model(Checkpoint::open(dir), backend, options));
      },
      "checkpoint_dir"_a, "backend"_a = "cpu", "options"_a = ModelOptions(),
      "Loads a converted checkpoint folder on a backend ('cpu' or 'cuda'). options.max_context 0: the\n"
      "model's trained length (max_position_embeddings), capped to what the memory free holds. Raises\n"
      "CheckpointError naming the file/tensor/field, or InvalidRequestError for bad options (an explicit\n"
      "max_context beyond the trained length or the free memory: with the numbers, before allocating).");

  nb::class_<Engine>(m, "Engine",
                     "Decodes one request at a time with a target and an optional draft model. A request from\n"
                     "another thread waits for its turn (its cancel_check polled meanwhile); one from a callback of\n"
                     "the running request is refused (it would wait for itself). See cpp/include/swiftspec/engine.h.")
      .def(nb::init<std::shared_ptr<Model>, std::shared_ptr<Model>>(), "target"_a, "draft"_a.none() = nb::none())
      .def(
          "context_length",
          [](const Engine& eng, const std::string& mode) { return eng.context_length(parse_decode_mode(mode)); },
          "mode"_a = "target",
          "The context of a request in `mode` ('auto', 'target', 'serial', 'async'), tokens: the target's\n"
          "max_context, or the smaller of the target's and the draft's when the draft speculates. The\n"
          "prompt plus max_new_tokens must fit in it (generate refuses it otherwise, naming both lengths).")
      .def(
          "generate",
          [](Engine& eng, const std::vector<int32_t>& prompt, int max_new_tokens, double temperature, int top_k,
             double top_p, uint64_t seed, const std::vector<int32_t>& stop_token_ids, const std::string& mode,
             int tree_budget, int max_depth, int branching, nb::object on_tokens, nb::object cancel_check,
             int prefill_chunk, nb::object async_options) {
            GenerationConfig cfg =
                request_config(max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids, parse_decode_mode(mode),
                               tree_budget, max_depth, branching, prefill_chunk);
            std::optional<AsyncOptions> options;
            if (!async_options.is_none()) {
              if (!nb::isinstance<nb::dict>(async_options))
                throw InvalidArgument(std::string("async_options must be a dict, got ") +
                                      Py_TYPE(async_options.ptr())->tp_name);
              options = async_options_from(nb::borrow<nb::dict>(async_options));
            }
            return run_request(eng, prompt, cfg, std::move(on_tokens), std::move(cancel_check), options);
          },
          "prompt"_a, "max_new_tokens"_a = 128, "temperature"_a = 0.0, "top_k"_a = 0, "top_p"_a = 1.0, "seed"_a = 0,
          "stop_token_ids"_a = std::vector<int32_t>{}, "mode"_a = "target", "tree_budget"_a = 16, "max_depth"_a = 8,
          "branching"_a = 2, "on_tokens"_a = nb::none(), "cancel_check"_a = nb::none(), "prefill_chunk"_a = 0,
          "async_options"_a = nb::none(),
          "Decodes from prompt token ids. Returns {'tokens': [...], 'stats': {...}} (mode 'async': also\n"
          "'report' and 'timeline', as generate_async; mode 'auto' with a draft: also 'report', with\n"
          "budget_per_round (0: a target-only round), round_reasons and caught_up_tokens). on_tokens(list[int]) "
          "receives final tokens as they\n"
          "are committed; returning False cancels. The prompt is prefilled in passes of prefill_chunk tokens\n"
          "(0: the model's; the result does not depend on it); before each pass and each decode step, Ctrl-C\n"
          "(a pending SIGINT, on the main thread) raises KeyboardInterrupt and cancel_check() returning true\n"
          "cancels (finish_reason 'cancelled'), also while the request waits for its turn behind another\n"
          "thread's (then at once, without tokens). async_options (mode 'async' only): a dict of\n"
          "generate_async's options (expand_width, growth_depth, min_send_nodes, cost_aware_send,\n"
          "min_expand_prob, record_timeline); an unknown one is refused by name.")
      .def(
          "close",
          [](Engine& eng) {
            RequestHooks hooks{nb::none(), nb::none()};  // Ctrl-C while it waits for a running request
            {
              nb::gil_scoped_release release;
              eng.close(hooks.cancel_requested());
            }
            hooks.rethrow();
          },
          "Waits for a running request to end, then releases the models; later calls raise\n"
          "InvalidRequestError 'the engine is closed'. Refused from a callback of a request running on this\n"
          "engine (it would wait for itself). Idempotent.")
      .def_prop_ro("closed", &Engine::closed)
      .def("check_open", &Engine::check_open,
           "Raises InvalidRequestError once the engine is closed, or in a fork()ed child of the process that\n"
           "made it (the models' worker threads did not survive the fork).")
      .def("running_on_this_thread", &Engine::running_on_this_thread,
           "Whether the calling thread runs a request of this engine (is inside one of its callbacks).");
}

}  // namespace swiftspec::python
