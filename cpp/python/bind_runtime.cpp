#include "python/bind_runtime.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
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
#include "swiftspec/model.h"
#include "python/model_busy.h"
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

DecodeMode parse_mode(const std::string& s) {
  if (s == "target") return DecodeMode::TargetOnly;
  if (s == "serial") return DecodeMode::Serial;
  if (s == "async") return DecodeMode::Async;
  throw InvalidArgument("mode must be 'target', 'serial' or 'async', got '" + s + "'");
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
  d["max_position_embeddings"] = c.max_position_embeddings;
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
              "decoding (greedy speculative output can differ from target-only at near-ties)");

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
      .def("tensor_shape", [](const Checkpoint& c, const std::string& name) { return c.tensor(name).shape; },
           "name"_a);

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
            const ForwardBatch b = python_batch(mdl, std::move(tokens), std::move(positions), logits,
                                                std::move(tree_slots), std::move(attend_offsets),
                                                std::move(attend_slots), "forward");
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
             std::optional<std::vector<int32_t>> positions, const std::string& logits,
             std::vector<int32_t> tree_slots, std::vector<int32_t> attend_offsets,
             std::vector<int32_t> attend_slots, double inv_temperature) {
            const ForwardBatch b = python_batch(mdl, std::move(tokens), std::move(positions), logits,
                                                std::move(tree_slots), std::move(attend_offsets),
                                                std::move(attend_slots), "forward_top_k");
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

  m.def(
      "cancelled_stats",
      [](int prompt_tokens) {
        GenerationStats st;
        st.prompt_tokens = prompt_tokens;
        st.finish_reason = "cancelled";
        return stats_dict(st);
      },
      "prompt_tokens"_a,
      "The 'stats' dict (the keys every generate call returns) of a request cancelled before it ran:\n"
      "no new tokens, no steps, zero times, finish_reason 'cancelled'.");

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

  m.def(
      "load_model",
      [](const std::string& dir, const std::string& backend, const ModelOptions& options) {
        nb::gil_scoped_release release;
        return std::shared_ptr<Model>(load_model(Checkpoint::open(dir), backend, options));
      },
      "checkpoint_dir"_a, "backend"_a = "cpu", "options"_a = ModelOptions(),
      "Loads a converted checkpoint folder on a backend ('cpu' or 'cuda'). Raises CheckpointError\n"
      "naming the file/tensor/field, or InvalidRequestError for bad options.");

  nb::class_<Engine>(m, "Engine", "Decodes one request at a time with a target and an optional draft model.")
      .def(nb::init<std::shared_ptr<Model>, std::shared_ptr<Model>>(), "target"_a, "draft"_a.none() = nb::none())
      .def(
          "generate",
          [](Engine& eng, const std::vector<int32_t>& prompt, int max_new_tokens, float temperature, int top_k,
             float top_p, uint64_t seed, const std::vector<int32_t>& stop_token_ids, const std::string& mode,
             int tree_budget, int max_depth, int branching, nb::object on_tokens, nb::object cancel_check,
             int prefill_chunk) {
            GenerationConfig cfg;
            cfg.max_new_tokens = max_new_tokens;
            cfg.sampling.temperature = temperature;
            cfg.sampling.top_k = top_k;
            cfg.sampling.top_p = top_p;
            cfg.sampling.seed = seed;
            cfg.stop_token_ids = stop_token_ids;
            cfg.mode = parse_mode(mode);
            cfg.tree_budget = tree_budget;
            cfg.max_depth = max_depth;
            cfg.branching = branching;
            cfg.prefill_chunk = prefill_chunk;

            // Python callbacks run under the GIL; their exceptions (KeyboardInterrupt
            // included) cancel the request and are re-raised once the engine has returned.
            RequestHooks hooks(std::move(on_tokens), std::move(cancel_check));
            cfg.cancel_requested = hooks.cancel_requested();
            const TokenCallback cb = hooks.token_callback();
            GenerationResult res;
            {
              ModelBusy busy({&eng.target(), eng.draft()});
              nb::gil_scoped_release release;
              res = eng.generate(prompt, cfg, cb);
            }
            hooks.rethrow();
            nb::dict out;
            out["tokens"] = res.tokens;
            out["stats"] = stats_dict(res.stats);
            return out;
          },
          "prompt"_a, "max_new_tokens"_a = 128, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f,
          "seed"_a = 0, "stop_token_ids"_a = std::vector<int32_t>{}, "mode"_a = "target", "tree_budget"_a = 16,
          "max_depth"_a = 8, "branching"_a = 2, "on_tokens"_a = nb::none(), "cancel_check"_a = nb::none(),
          "prefill_chunk"_a = 0,
          "Decodes from prompt token ids. Returns {'tokens': [...], 'stats': {...}}. on_tokens(list[int])\n"
          "receives final tokens as they are committed; returning False cancels. The prompt is prefilled\n"
          "in passes of prefill_chunk tokens (0: the model's; the result does not depend on it); before\n"
          "each pass and each decode step, Ctrl-C (a pending SIGINT, on the main thread) raises\n"
          "KeyboardInterrupt and cancel_check() returning true cancels (finish_reason 'cancelled').");
}

}  // namespace swiftspec::python
