// swiftspec_core.spec: the speculative core seen from Python (tests, tools and
// the async engine's prototypes). Every numeric routine releases the GIL.
#include "python/bind_speculative.h"
#include "python/model_busy.h"
#include "python/engine_request.h"
#include "python/request_hooks.h"
#include "python/result_dicts.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "swiftspec/error.h"
#include "swiftspec/sampling.h"
#include "swiftspec/speculative.h"
#include "swiftspec/token_tree.h"
#include "swiftspec/tree_kv_cache.h"
#include "swiftspec/verification.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace swiftspec::python {
namespace {

using Probs2D = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Vec1D = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& data, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(data));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape, owner);
}

VerifierBias parse_bias(const std::string& s) {
  if (s == "none") return VerifierBias::None;
  if (s == "accept_first_child") return VerifierBias::AcceptFirstChild;
  if (s == "no_residual") return VerifierBias::NoResidual;
  throw InvalidArgument("verifier_bias must be 'none', 'accept_first_child' or 'no_residual', got '" + s + "'");
}

SpeculativeOptions::Growth parse_growth(const std::string& s) {
  if (s == "auto") return SpeculativeOptions::Growth::Auto;
  if (s == "top_k") return SpeculativeOptions::Growth::TopK;
  if (s == "sampled") return SpeculativeOptions::Growth::Sampled;
  throw InvalidArgument("growth must be 'auto', 'top_k' or 'sampled', got '" + s + "'");
}

LogitsMode parse_logits(const std::string& s) {
  if (s == "last") return LogitsMode::Last;
  if (s == "all") return LogitsMode::All;
  if (s == "none") return LogitsMode::None;
  throw InvalidArgument("logits must be 'last', 'all' or 'none', got '" + s + "'");
}

SamplingParams make_sampling(float temperature, int top_k, float top_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  p.validate();
  return p;
}

GenerationConfig make_config(int max_new_tokens, float temperature, int top_k, float top_p, uint64_t seed,
                             const std::vector<int32_t>& stop_token_ids, int tree_budget, int max_depth,
                             int branching) {
  GenerationConfig c;
  c.max_new_tokens = max_new_tokens;
  c.sampling.temperature = temperature;
  c.sampling.top_k = top_k;
  c.sampling.top_p = top_p;
  c.sampling.seed = seed;
  c.stop_token_ids = stop_token_ids;
  c.mode = DecodeMode::Serial;
  c.tree_budget = tree_budget;
  c.max_depth = max_depth;
  c.branching = branching;
  return c;
}

nb::dict result_dict(const VerificationResult& r) {
  nb::dict d;
  d["accepted_path"] = r.accepted_path;
  d["tokens"] = r.tokens;
  d["bonus_token"] = r.bonus_token;
  d["accepted"] = r.accepted();
  d["rejection_sampling_nodes"] = r.rejection_sampling_nodes;
  d["target_sampling_nodes"] = r.target_sampling_nodes;
  return d;
}

// Row `node` of a [rows, vocab] table through an optional index map.
NodeDistribution table_rows(const Probs2D& table, const std::optional<std::vector<int32_t>>& rows, int vocab,
                            const char* what) {
  const float* base = table.data();
  const int64_t nrows = static_cast<int64_t>(table.shape(0));
  if (static_cast<int>(table.shape(1)) != vocab) throw InvalidArgument(std::string(what) + " must have vocab columns");
  std::vector<int32_t> map = rows ? *rows : std::vector<int32_t>{};
  return [base, nrows, vocab, map, what](int node) -> const float* {
    const int64_t r = map.empty() ? node : (node < static_cast<int>(map.size()) ? map[node] : -1);
    if (r < 0 || r >= nrows)
      throw InvalidArgument(std::string(what) + ": no row for tree node " + std::to_string(node));
    return base + r * vocab;
  };
}

// The target side with its own random source (the runtime keeps Rng internal).
struct PyTreeVerifier {
  PyTreeVerifier(Model& target, const SamplingParams& s, VerifierBias bias)
      : verifier(target, s, bias), rng(s.seed), model(&target) {}
  TreeVerifier verifier;
  Rng rng;
  Model* model;
};

// Busy guards (model_busy.h) of the low-level objects, with the model when the call runs it.
BusyGuard busy(const TreeKvCache& c, const Model* model = nullptr) {
  return BusyGuard({{&c, "TreeKvCache"}, {model, nullptr}});
}
BusyGuard busy(const DraftTree& d, bool with_model = false) {
  const Model* model = with_model ? &d.cache().model() : nullptr;
  return BusyGuard({{&d, "DraftTree"}, {&d.cache(), "DraftTree"}, {model, nullptr}});
}
BusyGuard busy(const PyTreeVerifier& v, bool with_model, const DraftTree* drafter = nullptr) {
  return BusyGuard({{&v, "TreeVerifier"}, {with_model ? v.model : nullptr, nullptr}, {drafter, "DraftTree"}});
}

}  // namespace

void bind_speculative(nb::module_& parent) {
  nb::module_ m = parent.def_submodule(
      "spec", "Speculative core: token trees, tree KV bookkeeping, verification, serial tree generation");

  // ---------------------------------------------------------------- TokenTree
  nb::class_<TokenTree>(m, "TokenTree",
                        "A prefix-closed token tree; node 0 is the root (the pending token), nodes are in\n"
                        "topological order (parent index < child index). See cpp/include/swiftspec/token_tree.h.")
      .def(nb::init<int32_t>(), "root_token"_a)
      .def("reset", &TokenTree::reset, "root_token"_a)
      .def("__len__", &TokenTree::size)
      .def_prop_ro("size", &TokenTree::size)
      .def("add_child", &TokenTree::add_child, "parent"_a, "token"_a, "logprob"_a,
           "Adds a child (draft log-prob <= 0); returns its index.")
      .def("find_child", &TokenTree::find_child, "parent"_a, "token"_a)
      .def("set_expanded", &TokenTree::set_expanded, "node"_a, "draws"_a = std::vector<int32_t>{})
      .def("clear_draws", &TokenTree::clear_draws)
      .def("path_to", &TokenTree::path_to, "node"_a)
      .def("path_tokens", &TokenTree::path_tokens, "node"_a)
      .def_prop_ro("max_depth", &TokenTree::max_depth)
      .def_prop_ro("tokens",
                   [](const TokenTree& t) {
                     std::vector<int32_t> v;
                     for (auto& n : t.nodes()) v.push_back(n.token);
                     return v;
                   })
      .def_prop_ro("parents",
                   [](const TokenTree& t) {
                     std::vector<int32_t> v;
                     for (auto& n : t.nodes()) v.push_back(n.parent);
                     return v;
                   })
      .def_prop_ro("depths",
                   [](const TokenTree& t) {
                     std::vector<int32_t> v;
                     for (auto& n : t.nodes()) v.push_back(n.depth);
                     return v;
                   })
      .def_prop_ro("logprobs",
                   [](const TokenTree& t) {
                     std::vector<float> v;
                     for (auto& n : t.nodes()) v.push_back(n.logprob);
                     return v;
                   })
      .def_prop_ro("cum_logprobs",
                   [](const TokenTree& t) {
                     std::vector<double> v;
                     for (auto& n : t.nodes()) v.push_back(n.cum_logprob);
                     return v;
                   })
      .def(
          "children", [](const TokenTree& t, int i) { return t.node(i).children; }, "node"_a)
      .def(
          "expanded", [](const TokenTree& t, int i) { return t.node(i).expanded; }, "node"_a)
      .def(
          "draws", [](const TokenTree& t, int i) { return t.node(i).draws; }, "node"_a)
      .def(
          "attention_mask",
          [](const TokenTree& t) {
            const size_t n = t.size();
            return to_numpy<uint8_t>(t.attention_mask(), {n, n});
          },
          "Dense tree mask, uint8 [n, n]: row i is 1 at i and its ancestors.")
      .def(
          "ancestors_csr",
          [](const TokenTree& t) {
            std::vector<int32_t> off, val;
            t.ancestors_csr(off, val);
            return nb::make_tuple(off, val);
          },
          "(offsets [n+1], values): path root..i of each node i.")
      .def("positions", &TokenTree::positions, "base_position"_a)
      .def("select_best", &TokenTree::select_best, "budget"_a, "max_depth"_a, "node_limit"_a = -1)
      .def(
          "subtree",
          [](const TokenTree& t, const std::vector<int32_t>& nodes) {
            std::vector<int32_t> new_to_old;
            TokenTree s = t.subtree(nodes, &new_to_old);
            return std::make_pair(std::move(s), std::move(new_to_old));
          },
          "nodes"_a, "Returns (tree, new_to_old).")
      .def("reroot", &TokenTree::reroot, "new_root"_a, "Re-roots in place; returns old -> new index map (-1 dropped).")
      .def("check_invariants", &TokenTree::check_invariants)
      .def("copy", [](const TokenTree& t) { return TokenTree(t); });

  // ------------------------------------------------------------- verification
  m.def(
      "verify_greedy",
      [](const TokenTree& tree_in, Probs2D logits) {
        const TokenTree tree = tree_in;  // another thread may edit tree_in once the GIL is released
        if (static_cast<int>(logits.shape(0)) != tree.size())
          throw InvalidArgument("verify_greedy: logits must have one row per tree node");
        const int vocab = static_cast<int>(logits.shape(1));
        VerificationResult r;
        {
          nb::gil_scoped_release release;
          r = verify_greedy(tree, logits.data(), vocab);
        }
        return result_dict(r);
      },
      "tree"_a, "logits"_a, "Greedy verification; logits fp32 [tree size, vocab].");
  m.def(
      "verify_greedy_argmax",
      [](const TokenTree& tree_in, const std::vector<int32_t>& argmax) {
        const TokenTree tree = tree_in;
        return result_dict(verify_greedy(tree, argmax));
      },
      "tree"_a, "argmax"_a,
      "Greedy verification from the target's arg-max id per node ([tree size] ints, e.g. the ids of\n"
      "Model.forward_top_k with k=1): the same result as verify_greedy on the logits.");

  m.def(
      "verify_top_k_sampling",
      [](const TokenTree& tree_in, nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> top_ids,
         Probs2D top_logits, float temperature, float top_p, uint64_t seed, std::vector<int32_t> target_rows) {
        const TokenTree tree = tree_in;
        const int k = static_cast<int>(top_ids.shape(1));
        const int rows = static_cast<int>(top_ids.shape(0));
        if (top_logits.shape(0) != top_ids.shape(0) || top_logits.shape(1) != top_ids.shape(1))
          throw InvalidArgument("verify_top_k_sampling: top_ids and top_logits must have the same shape");
        if (target_rows.size() != static_cast<size_t>(tree.size()))
          throw InvalidArgument("verify_top_k_sampling: target_rows must give one row per tree node");
        for (int32_t row : target_rows)
          if (row < 0 || row >= rows)
            throw InvalidArgument("verify_top_k_sampling: target row " + std::to_string(row) + " outside [0, " +
                                  std::to_string(rows) + ")");
        SamplingParams params;
        params.temperature = temperature;
        params.top_k = k;
        params.top_p = top_p;
        params.validate();
        if (params.greedy()) throw InvalidArgument("verify_top_k_sampling: temperature must be > 0");
        Rng rng(seed);
        return result_dict(verify_by_target_sampling(tree, [&](int u) {
          const size_t e = static_cast<size_t>(target_rows[u]) * k;
          return sample_from_top_k(top_ids.data() + e, top_logits.data() + e, k, params, rng);
        }));
      },
      "tree"_a, "top_ids"_a, "top_logits"_a, "temperature"_a, "top_p"_a = 1.0f, "seed"_a = 0, "target_rows"_a,
      "What TreeVerifier does for a top-k sampled request on a tree without draws: target sampling at\n"
      "each visited node from its row's k best logits (top_ids int32 / top_logits fp32 [rows, k], as\n"
      "Model.forward_top_k returns; node u uses row target_rows[u]) with sample_from_top_k.");
  m.def(
      "sample_from_top_k",
      [](std::vector<int32_t> ids, std::vector<float> top_logits, float temperature, int top_k, float top_p,
         uint64_t seed, int n) {
        if (ids.size() != top_logits.size() || ids.empty())
          throw InvalidArgument("sample_from_top_k: ids and top_logits must be non-empty and of one length");
        if (n < 0) throw InvalidArgument("sample_from_top_k: n must be >= 0, got " + std::to_string(n));
        SamplingParams params;
        params.temperature = temperature;
        params.top_k = top_k;
        params.top_p = top_p;
        params.validate();
        Rng rng(seed);
        std::vector<int32_t> out;
        for (int i = 0; i < n; ++i)
          out.push_back(sample_from_top_k(ids.data(), top_logits.data(), static_cast<int>(ids.size()), params, rng));
        return out;
      },
      "ids"_a, "top_logits"_a, "temperature"_a, "top_k"_a, "top_p"_a = 1.0f, "seed"_a = 0, "n"_a = 1,
      "n draws of sample_from_top_k from one Rng(seed): ids / top_logits are a row's k best (largest first).");

  m.def(
      "verify_stochastic",
      [](const TokenTree& tree_in, Probs2D target_probs, std::optional<Probs2D> draft_probs, uint64_t seed,
         const std::string& bias, std::optional<std::vector<int32_t>> target_rows,
         std::optional<std::vector<int32_t>> draft_rows) {
        const TokenTree tree = tree_in;  // another thread may edit tree_in once the GIL is released
        const int vocab = static_cast<int>(target_probs.shape(1));
        NodeDistribution tp = table_rows(target_probs, target_rows, vocab, "target_probs");
        NodeDistribution dp;
        if (draft_probs) dp = table_rows(*draft_probs, draft_rows, vocab, "draft_probs");
        const VerifierBias b = parse_bias(bias);
        VerificationResult r;
        {
          nb::gil_scoped_release release;
          Rng rng(seed);
          r = verify_stochastic(tree, vocab, tp, dp, rng, b);
        }
        return result_dict(r);
      },
      "tree"_a, "target_probs"_a, "draft_probs"_a = nb::none(), "seed"_a = 0, "bias"_a = "none",
      "target_rows"_a = nb::none(), "draft_rows"_a = nb::none(),
      "Stochastic verification with a fresh Rng(seed). target_probs / draft_probs: fp32 tables\n"
      "[rows, vocab]; node i uses row target_rows[i] (identity when omitted). bias: 'none' or a\n"
      "test-only negative control ('accept_first_child', 'no_residual').");

  m.def(
      "sampling_distribution",
      [](Vec1D logits, float temperature, int top_k, float top_p) {
        const SamplingParams p = make_sampling(temperature, top_k, top_p, 0);
        std::vector<float> out;
        {
          nb::gil_scoped_release release;
          sampling_distribution(logits.data(), static_cast<int>(logits.shape(0)), p, out);
        }
        const size_t n = out.size();
        return to_numpy<float>(std::move(out), {n});
      },
      "logits"_a, "temperature"_a, "top_k"_a = 0, "top_p"_a = 1.0f,
      "The runtime's sampling distribution of one logits row (fp32 [vocab]).");

  m.def(
      "sample_from_head",
      [](std::vector<int32_t> ids, std::vector<float> top_logits, double log_normalizer, int vocab, float temperature,
         float top_p, std::vector<double> us, std::optional<Vec1D> row, int top_k) {
        if (ids.size() != top_logits.size() || ids.empty())
          throw InvalidArgument("sample_from_head: ids and top_logits must be non-empty and of one length");
        const SamplingParams params = make_sampling(temperature, top_k, top_p, 0);
        const bool have_row = row.has_value();
        const float* whole = have_row ? row->data() : nullptr;  // copied only when read (`row` outlives the loop)
        const size_t whole_n = have_row ? row->shape(0) : 0;
        std::vector<int32_t> tokens;
        std::vector<bool> read;
        {
          nb::gil_scoped_release release;
          for (double u : us) {
            bool fell = false;
            tokens.push_back(sample_from_head(
                ids.data(), top_logits.data(), static_cast<int>(ids.size()), log_normalizer, vocab, params, u,
                [&](std::vector<float>& out) {
                  if (!have_row) throw InvalidArgument("sample_from_head: the whole row is needed, but none was given");
                  out.assign(whole, whole + whole_n);
                },
                &fell));
            read.push_back(fell);
          }
        }
        return nb::make_tuple(tokens, read);
      },
      "ids"_a, "top_logits"_a, "log_normalizer"_a, "vocab"_a, "temperature"_a, "top_p"_a = 1.0f,
      "us"_a = std::vector<double>{}, "row"_a = nb::none(), "top_k"_a = 0,
      "sample_from_head for each uniform u of `us`: a row's k best (ids, top_logits, largest first) and\n"
      "log_normalizer = ln sum exp(logits / T) of the whole row; `row` (fp32 [vocab]) is what the draw reads\n"
      "when the head does not decide (None: InvalidRequestError then). Returns (tokens, read_whole_row).");

  m.def(
      "top_sampling_tokens",
      [](Vec1D logits, int count, float temperature, int top_k, float top_p) {
        const SamplingParams p = make_sampling(temperature, top_k, top_p, 0);
        std::vector<int32_t> tokens;
        std::vector<float> probs;
        {
          nb::gil_scoped_release release;
          top_sampling_tokens(logits.data(), static_cast<int>(logits.shape(0)), p, count, tokens, probs);
        }
        return nb::make_tuple(tokens, probs);
      },
      "logits"_a, "count"_a, "temperature"_a, "top_k"_a = 0, "top_p"_a = 1.0f,
      "top_sampling_tokens (sampling.h) of one fp32 logits row [vocab]: the `count` most likely tokens of\n"
      "the sampling distribution q (ties to the smaller id, q > 0 only) and their q. Returns (tokens, probs).");

  m.def(
      "top_sampling_tokens_from_head",
      [](std::vector<int32_t> ids, std::vector<float> top_logits, double log_normalizer, int vocab, int count,
         float temperature, int top_k, float top_p, std::optional<Vec1D> row) {
        if (ids.size() != top_logits.size() || ids.empty())
          throw InvalidArgument(
              "top_sampling_tokens_from_head: ids and top_logits must be non-empty and of one length");
        const SamplingParams params = make_sampling(temperature, top_k, top_p, 0);
        TopKLogits top;
        top.k = static_cast<int>(ids.size());
        top.ids = std::move(ids);
        top.logits = std::move(top_logits);
        top.log_normalizer = {log_normalizer};
        top.inv_temperature = 1.0 / params.temperature;
        const bool have_row = row.has_value();
        const float* whole = have_row ? row->data() : nullptr;
        const size_t whole_n = have_row ? row->shape(0) : 0;
        std::vector<int32_t> tokens;
        std::vector<float> probs;
        bool read = false;
        {
          nb::gil_scoped_release release;
          top_sampling_tokens_from_head(
              top, 0, vocab, params, count,
              [&](std::vector<float>& out) {
                if (!have_row)
                  throw InvalidArgument("top_sampling_tokens_from_head: the whole row is needed, but none was given");
                out.assign(whole, whole + whole_n);
              },
              tokens, probs, &read);
        }
        return nb::make_tuple(tokens, probs, read);
      },
      "ids"_a, "top_logits"_a, "log_normalizer"_a, "vocab"_a, "count"_a, "temperature"_a, "top_k"_a = 0,
      "top_p"_a = 1.0f, "row"_a = nb::none(),
      "top_sampling_tokens from a row's head: its k best (ids, top_logits, largest first) and log_normalizer =\n"
      "ln sum exp(logits / T) of the whole row; `row` (fp32 [vocab]) is read when the head does not decide\n"
      "(None: InvalidRequestError then). Returns (tokens, probs, read_whole_row).");

  m.def(
      "draw_iid",
      [](Vec1D q, int count, uint64_t seed) {
        Rng rng(seed);
        return draw_iid(q.data(), static_cast<int>(q.shape(0)), count, rng);
      },
      "q"_a, "count"_a, "seed"_a, "count i.i.d. draws from q with a fresh Rng(seed), in draw order.");

  m.def(
      "top_k_indices", [](Vec1D v, int k) { return top_k_indices(v.data(), static_cast<int>(v.shape(0)), k); },
      "values"_a, "k"_a);

  // -------------------------------------------------------------- TreeKvCache
  // Every method holds a busy guard (model_busy.h): a second thread gets InvalidRequestError
  // instead of racing the bookkeeping (or, for the calls that run it, the model). Trees are
  // copied before the GIL is released, so a thread editing one cannot change it under a call.
  nb::class_<TreeKvCache>(m, "TreeKvCache",
                          "Tree-slot bookkeeping of one model (tree_kv_cache.h). One call at a time: a call while\n"
                          "another thread's call runs raises InvalidRequestError ('the TreeKvCache is in use').")
      .def(nb::init<Model&>(), "model"_a, nb::keep_alive<1, 2>())
      .def_prop_ro("capacity", &TreeKvCache::capacity)
      .def_prop_ro("free_slots",
                   [](const TreeKvCache& c) {
                     BusyGuard g = busy(c);
                     return c.free_slots();
                   })
      .def_prop_ro("base_position",
                   [](const TreeKvCache& c) {
                     BusyGuard g = busy(c);
                     return c.base_position();
                   })
      .def_prop_ro("pending_tokens",
                   [](const TreeKvCache& c) {
                     BusyGuard g = busy(c);
                     return c.pending_tokens();
                   })
      .def_prop_ro("processed_count",
                   [](const TreeKvCache& c) {
                     BusyGuard g = busy(c);
                     return c.processed_count();
                   })
      .def(
          "processed",
          [](const TreeKvCache& c, int node) {
            BusyGuard g = busy(c);
            return c.processed(node);
          },
          "node"_a)
      .def(
          "slot",
          [](const TreeKvCache& c, int node) {
            BusyGuard g = busy(c);
            return c.slot(node);
          },
          "node"_a)
      .def("clear",
           [](TreeKvCache& c) {
             BusyGuard g = busy(c);
             c.clear();
           })
      .def(
          "prefill",
          [](TreeKvCache& c, const std::vector<int32_t>& tokens, const std::string& logits, int chunk) {
            std::vector<float> out;
            RequestHooks hooks{nb::none(), nb::none()};  // Ctrl-C between chunks
            const PrefillControl control{chunk, hooks.cancel_requested()};
            const LogitsMode mode = parse_logits(logits);
            {
              BusyGuard g = busy(c, &c.model());
              nb::gil_scoped_release release;
              c.prefill(tokens, mode, out, control);
            }
            hooks.rethrow();
            const size_t v = c.model().config().vocab_size, rows = out.size() / v;
            return to_numpy<float>(std::move(out), {rows, v});
          },
          "tokens"_a, "logits"_a = "last", "chunk"_a = 0,
          "Appends tokens to the committed region in passes of chunk tokens (0: the model's; the result\n"
          "equals one pass); Ctrl-C between passes raises KeyboardInterrupt. Returns logits [rows, vocab].")
      .def(
          "build_batch",
          [](const TreeKvCache& c, const TokenTree& tree, const std::vector<int32_t>& nodes) {
            std::vector<int32_t> slots;
            ForwardBatch b;
            {
              BusyGuard g = busy(c);
              b = c.build_batch(tree, nodes, LogitsMode::All, slots);
            }
            nb::dict d;
            d["tokens"] = b.tokens;
            d["positions"] = b.positions;
            d["tree_slots"] = b.tree_slots;
            d["attend_offsets"] = b.attend_offsets;
            d["attend_slots"] = b.attend_slots;
            return d;
          },
          "tree"_a, "nodes"_a, "The tree-mode batch forward_nodes would run (nothing recorded).")
      .def(
          "forward_nodes",
          [](TreeKvCache& c, const TokenTree& tree_in, const std::vector<int32_t>& nodes, const std::string& logits) {
            const TokenTree tree = tree_in;
            const LogitsMode mode = parse_logits(logits);
            std::vector<float> out;
            int row0;
            {
              BusyGuard g = busy(c, &c.model());
              nb::gil_scoped_release release;
              row0 = c.forward_nodes(tree, nodes, mode, out);
            }
            const size_t v = c.model().config().vocab_size, rows = out.size() / v;
            return nb::make_tuple(row0, to_numpy<float>(std::move(out), {rows, v}));
          },
          "tree"_a, "nodes"_a, "logits"_a = "all",
          "Processes pending tokens + nodes in one forward; returns (row of nodes[0], logits).")
      .def(
          "commit_path",
          [](TreeKvCache& c, const TokenTree& tree_in, const std::vector<int32_t>& path) {
            const TokenTree tree = tree_in;
            BusyGuard g = busy(c, &c.model());
            nb::gil_scoped_release release;
            return c.commit_path(tree, path);
          },
          "tree"_a, "path"_a)
      .def(
          "remap",
          [](TreeKvCache& c, const std::vector<int32_t>& map) {
            BusyGuard g = busy(c);
            c.remap(map);
          },
          "old_to_new"_a);

  // ---------------------------------------------------------------- DraftTree
  // Guarded like TreeKvCache; the guard covers the DraftTree's own cache too (`cache` hands
  // it out) and, in the calls that run it, the draft model.
  nb::class_<DraftTree>(m, "DraftTree",
                        "The draft side: grows, selects and re-roots the token tree. One call at a time: a call\n"
                        "while another thread's call runs raises InvalidRequestError ('the DraftTree is in use').")
      .def(
          "__init__",
          [](DraftTree* self, Model& draft, int tree_budget, int max_depth, int branching, float temperature, int top_k,
             float top_p, uint64_t seed, const std::string& growth, int expand_width, double min_expand_prob) {
            GenerationConfig c = make_config(1, temperature, top_k, top_p, seed, {}, tree_budget, max_depth, branching);
            c.validate();
            SpeculativeOptions o;
            o.growth = parse_growth(growth);
            o.expand_width = expand_width;
            o.min_expand_prob = min_expand_prob;
            new (self) DraftTree(draft, c, o, seed);
          },
          "draft"_a, "tree_budget"_a = 16, "max_depth"_a = 8, "branching"_a = 2, "temperature"_a = 0.0f, "top_k"_a = 0,
          "top_p"_a = 1.0f, "seed"_a = 0, "growth"_a = "auto", "expand_width"_a = 0, "min_expand_prob"_a = -1.0,
          nb::keep_alive<1, 2>())
      .def(
          "start",
          [](DraftTree& d, const std::vector<int32_t>& prompt, int32_t first_token) {
            RequestHooks hooks{nb::none(), nb::none()};  // Ctrl-C between prefill chunks
            const PrefillControl control{0, hooks.cancel_requested()};
            {
              BusyGuard g = busy(d, true);
              nb::gil_scoped_release release;
              d.start(prompt, first_token, control);
            }
            hooks.rethrow();
          },
          "prompt"_a, "first_token"_a, "Prefills the prompt and roots the tree at first_token.")
      .def(
          "can_grow",
          [](const DraftTree& d, int depth) {
            BusyGuard g = busy(d);
            return d.can_grow(depth);
          },
          "depth_limit"_a)
      .def(
          "selectable_nodes",
          [](const DraftTree& d, int depth) {
            BusyGuard g = busy(d);
            return d.selectable_nodes(depth);
          },
          "depth_limit"_a)
      .def(
          "grow_step",
          [](DraftTree& d, int depth_limit, int max_new_nodes) {
            BusyGuard g = busy(d, true);
            nb::gil_scoped_release release;
            return d.grow_step(depth_limit, max_new_nodes);
          },
          "depth_limit"_a, "max_new_nodes"_a = -1)
      .def(
          "grow_to",
          [](DraftTree& d, int budget, int depth_limit) {
            BusyGuard g = busy(d, true);
            nb::gil_scoped_release release;
            d.grow_to(budget, depth_limit);
          },
          "budget"_a, "depth_limit"_a)
      .def(
          "select",
          [](const DraftTree& d, int budget, int depth_limit) {
            BusyGuard g = busy(d);
            std::vector<int32_t> to_draft;
            TokenTree t = d.select(budget, depth_limit, to_draft);
            return std::make_pair(std::move(t), std::move(to_draft));
          },
          "budget"_a, "depth_limit"_a, "Returns (subtree, to_draft index map).")
      .def(
          "draft_probs",
          [](const DraftTree& d, int node) -> nb::object {
            BusyGuard g = busy(d);
            const float* q = d.draft_probs(node);
            if (!q) return nb::none();
            const size_t v = d.cache().model().config().vocab_size;
            return nb::cast(to_numpy<float>(std::vector<float>(q, q + v), {v}));
          },
          "node"_a)
      .def(
          "advance",
          [](DraftTree& d, const std::vector<int32_t>& accepted_tokens, int32_t bonus) {
            BusyGuard g = busy(d, true);
            nb::gil_scoped_release release;
            return d.advance(accepted_tokens, bonus);
          },
          "accepted_tokens"_a, "bonus"_a)
      .def_prop_ro(
          "tree",
          [](const DraftTree& d) {
            BusyGuard g = busy(d);
            return TokenTree(d.tree());
          },
          "A copy of the current tree.")
      .def_prop_ro("cache", &DraftTree::cache, nb::rv_policy::reference_internal)
      .def_prop_ro("growth", [](const DraftTree& d) { return tree_growth_name(d.growth()); })
      .def_prop_ro("expand_width", &DraftTree::expand_width)
      .def_prop_ro("steps",
                   [](const DraftTree& d) {
                     BusyGuard g = busy(d);
                     return d.steps();
                   })
      .def_prop_ro("time",
                   [](const DraftTree& d) {
                     BusyGuard g = busy(d);
                     return d.time();
                   })
      .def_prop_ro("drafted_nodes",
                   [](const DraftTree& d) {
                     BusyGuard g = busy(d);
                     return d.drafted_nodes();
                   })
      .def_prop_ro("batch_rows",
                   [](const DraftTree& d) {
                     BusyGuard g = busy(d);
                     return d.batch_rows();
                   })
      .def_prop_ro(
          "whole_rows_read",
          [](const DraftTree& d) {
            BusyGuard g = busy(d);
            return d.whole_rows_read();
          },
          "Drafted rows whose whole logits were read on the host (DraftTree::whole_rows_read).");

  // ------------------------------------------------------------- TreeVerifier
  nb::class_<PyTreeVerifier>(m, "TreeVerifier",
                             "The target side: verifies a tree in one forward, commits. One call at a time, as\n"
                             "DraftTree ('the TreeVerifier is in use').")
      .def(
          "__init__",
          [](PyTreeVerifier* self, Model& target, float temperature, int top_k, float top_p, uint64_t seed,
             const std::string& bias) {
            new (self) PyTreeVerifier(target, make_sampling(temperature, top_k, top_p, seed), parse_bias(bias));
          },
          "target"_a, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f, "seed"_a = 0, "bias"_a = "none",
          nb::keep_alive<1, 2>())
      .def(
          "start",
          [](PyTreeVerifier& v, const std::vector<int32_t>& prompt) {
            RequestHooks hooks{nb::none(), nb::none()};  // Ctrl-C between prefill chunks
            const PrefillControl control{0, hooks.cancel_requested()};
            int32_t first;
            {
              BusyGuard g = busy(v, true);
              nb::gil_scoped_release release;
              first = v.verifier.start(prompt, v.rng, control);
            }
            hooks.rethrow();
            return first;
          },
          "prompt"_a, "Prefills; returns the first token.")
      .def(
          "verify",
          [](PyTreeVerifier& v, const TokenTree& tree_in, std::optional<const DraftTree*> drafter,
             std::optional<std::vector<int32_t>> to_draft) {
            const TokenTree tree = tree_in;
            NodeDistribution dp;
            const DraftTree* d = drafter && *drafter && to_draft ? *drafter : nullptr;
            if (d) {
              std::vector<int32_t> map = *to_draft;
              dp = [d, map](int u) { return d->draft_probs(map.at(u)); };
            }
            VerificationResult r;
            {
              BusyGuard g = busy(v, true, d);  // the drafter's distributions are read during the call
              nb::gil_scoped_release release;
              r = v.verifier.verify(tree, dp, v.rng);
            }
            return result_dict(r);
          },
          "tree"_a, "drafter"_a = nb::none(), "to_draft"_a = nb::none(),
          "Verifies and commits; draft distributions come from drafter via to_draft (Sampled growth).")
      .def_prop_ro("steps",
                   [](const PyTreeVerifier& v) {
                     BusyGuard g = busy(v, false);
                     return v.verifier.steps();
                   })
      .def_prop_ro("time",
                   [](const PyTreeVerifier& v) {
                     BusyGuard g = busy(v, false);
                     return v.verifier.time();
                   })
      .def_prop_ro(
          "whole_rows_read",
          [](const PyTreeVerifier& v) {
            BusyGuard g = busy(v, false);
            return v.verifier.whole_rows_read();
          },
          "Verified rows whose whole logits came to the host (TreeVerifier::whole_rows_read).");

  // ------------------------------------------------------ serial generation
  m.def(
      "generate_serial",
      [](Model& target, Model& draft, const std::vector<int32_t>& prompt, int max_new_tokens, double temperature,
         int top_k, double top_p, uint64_t seed, const std::vector<int32_t>& stop_token_ids, int tree_budget,
         int max_depth, int branching, const std::string& growth, int expand_width, double min_expand_prob,
         const std::string& verifier_bias, nb::object on_tokens, nb::object cancel_check, int prefill_chunk) {
        GenerationConfig cfg = request_config(max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids,
                                              DecodeMode::Serial, tree_budget, max_depth, branching, prefill_chunk);
        SpeculativeOptions opt;
        opt.growth = parse_growth(growth);
        opt.expand_width = expand_width;
        opt.min_expand_prob = min_expand_prob;
        opt.verifier_bias = parse_bias(verifier_bias);
        RequestHooks hooks(std::move(on_tokens), std::move(cancel_check));
        cfg.cancel_requested = hooks.cancel_requested();
        const TokenCallback cb = hooks.token_callback();
        GenerationResult res;
        SpeculationReport rep;
        {
          ModelBusy busy({&target, &draft});
          nb::gil_scoped_release release;
          res = generate_speculative_serial(target, draft, prompt, cfg, cb, opt, &rep);
        }
        hooks.rethrow();
        nb::dict out;
        out["tokens"] = res.tokens;
        out["stats"] = stats_dict(res.stats);
        out["report"] = report_dict(rep);
        return out;
      },
      "target"_a, "draft"_a, "prompt"_a, "max_new_tokens"_a = 128, "temperature"_a = 0.0, "top_k"_a = 0,
      "top_p"_a = 1.0, "seed"_a = 0, "stop_token_ids"_a = std::vector<int32_t>{}, "tree_budget"_a = 16,
      "max_depth"_a = 8, "branching"_a = 2, "growth"_a = "auto", "expand_width"_a = 0, "min_expand_prob"_a = -1.0,
      "verifier_bias"_a = "none", "on_tokens"_a = nb::none(), "cancel_check"_a = nb::none(), "prefill_chunk"_a = 0,
      "Serial tree generation (speculative.h) with explicit options. Returns {'tokens', 'stats',\n"
      "'report'}; report has the growth rule, the verification scheme(s) used, per-step acceptance.\n"
      "on_tokens, cancel_check, prefill_chunk: as Engine.generate.");
}

}  // namespace swiftspec::python
