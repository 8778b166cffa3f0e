// Placement: parsing, defaults, and loading a group's model where it says.
#include "swiftspec/placement.h"

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "backend/cpu/tp_model.h"
#include "backend/cpu/tp_weights.h"
#include "swiftspec/checkpoint.h"
#include "json_int.h"
#include "json_error.h"
#include "json_read.h"
#include "swiftspec/error.h"
#include "swiftspec/memory_plan.h"
#include "swiftspec/tensor_parallel.h"

#ifdef SWIFTSPEC_WITH_CUDA
#include "swiftspec_cuda/memory_plan.h"
#include "swiftspec_cuda/tp_cuda_model.h"
#endif

namespace swiftspec {
namespace {

using json = nlohmann::json;
std::string str(long long v) { return std::to_string(v); }

int machine_cores() {
  const int n = static_cast<int>(std::thread::hardware_concurrency());
  return n > 0 ? n : 1;
}

// Normalises a flat core list into [tp] per-rank lists (see placement.h).
std::vector<std::vector<int>> split_cores(const std::vector<int>& flat, int tp, const std::string& where) {
  std::vector<std::vector<int>> out(tp);
  if (flat.empty()) return {};
  const int n = static_cast<int>(flat.size());
  if (n < tp) {
    for (int r = 0; r < tp; ++r) out[r] = {flat[r % n]};
  } else {
    if (n % tp != 0)
      throw InvalidArgument(where + ".cores: " + str(n) + " cores do not split evenly over tp = " + str(tp) +
                            " ranks (give one list per rank)");
    for (int r = 0; r < tp; ++r) out[r].assign(flat.begin() + r * (n / tp), flat.begin() + (r + 1) * (n / tp));
  }
  return out;
}

/// An integer field, refusing what JSON conversion would coerce (1.5 -> 1,
/// true -> 1) or wrap (2^40 -> 0).
int strict_int(const json& v, const std::string& what) {
  int out = 0;
  switch (read_int32(v, out)) {
    case JsonInt::NotInteger:
      throw InvalidArgument(what + " must be an integer, got " + json_brief(v));
    case JsonInt::OutOfRange:
      throw InvalidArgument(what + " is out of range: " + json_brief(v));
    case JsonInt::Ok:
      break;
  }
  return out;
}

GroupPlacement parse_group(const json& j, const std::string& where) {
  if (!j.is_object()) throw InvalidArgument(where + " must be an object");
  GroupPlacement g;
  const json* cores = nullptr;  // parsed once tp is known
  for (const auto& [key, value] : j.items()) {
    try {
      if (key == "tp") {
        g.tp = strict_int(value, where + ".tp");
      } else if (key == "cores") {
        cores = &value;
      } else if (key == "threads_per_rank") {
        g.threads_per_rank = strict_int(value, where + ".threads_per_rank");
      } else if (key == "devices") {
        g.devices = value.get<std::vector<int>>();
      } else if (key == "stream_priority") {
        g.stream_priority = strict_int(value, where + ".stream_priority");
      } else if (key == "gemm_engine") {
        g.gemm_engine = value.get<std::string>();
      } else if (key == "megakernel") {
        if (!value.is_boolean()) throw InvalidArgument(where + ".megakernel must be true or false");
        g.megakernel = value.get<bool>();
      } else if (key == "kv_window") {
        if (!value.is_array() || value.size() != 2) throw InvalidArgument(where + ".kv_window must be [sinks, recent]");
        g.kv_window_sinks = strict_int(value[0], where + ".kv_window sinks");
        g.kv_window_recent = strict_int(value[1], where + ".kv_window recent");
      } else if (key == "sm_partition") {
        const auto p = value.get<std::vector<int>>();
        if (p.size() != 2) throw InvalidArgument(where + ".sm_partition must be [first SM, SM count]");
        g.sm_first = p[0];
        g.sm_count = p[1];
      } else {
        throw InvalidArgument(where + ": unknown field '" + key +
                              "' (fields: tp, cores, threads_per_rank, devices, sm_partition, stream_priority, "
                              "gemm_engine, megakernel, kv_window)");
      }
    } catch (const json::exception& e) {
      throw InvalidArgument(where + "." + key + " has the wrong type: " + json_error_text(e));
    }
  }
  if (g.tp < 1) throw InvalidArgument(where + ".tp must be >= 1, got " + str(g.tp));
  if (cores) {
    try {
      if (!cores->is_array()) throw InvalidArgument(where + ".cores must be a list");
      if (!cores->empty() && (*cores)[0].is_array())
        g.cores = cores->get<std::vector<std::vector<int>>>();
      else
        g.cores = split_cores(cores->get<std::vector<int>>(), g.tp, where);
    } catch (const json::exception& e) {
      throw InvalidArgument(where + ".cores must be a list of core ids or one list per rank: " + json_error_text(e));
    }
  }
  return g;
}

json group_json(const GroupPlacement& g) {
  json j;
  j["tp"] = g.tp;
  j["cores"] = g.cores;
  j["threads_per_rank"] = g.threads_per_rank;
  if (!g.devices.empty()) j["devices"] = g.devices;
  if (has_sm_partition(g.sm_first, g.sm_count)) j["sm_partition"] = {g.sm_first, g.sm_count};
  if (g.stream_priority != 0) j["stream_priority"] = g.stream_priority;
  if (!g.gemm_engine.empty()) j["gemm_engine"] = g.gemm_engine;
  if (g.megakernel) j["megakernel"] = true;
  if (g.has_kv_window()) j["kv_window"] = {g.kv_window_sinks, g.kv_window_recent};
  return j;
}

// Options carrying only the group's attention window.
ModelOptions window_options(const GroupPlacement& g) {
  ModelOptions o;
  o.kv_window_sinks = g.kv_window_sinks;
  o.kv_window_recent = g.kv_window_recent;
  return o;
}

void validate_group(const GroupPlacement& g, const std::string& where) {
  if (g.tp < 1) throw InvalidArgument(where + ".tp must be >= 1, got " + str(g.tp));
  if (g.threads_per_rank < 0)
    throw InvalidArgument(where + ".threads_per_rank must be >= 0 (0: one per core), got " + str(g.threads_per_rank));
  // Beyond a few threads per core they only cost memory; far beyond, the system refuses them.
  const int max_threads = std::max(256, 8 * machine_cores());
  if (g.threads_per_rank > max_threads)
    throw InvalidArgument(where + ".threads_per_rank must be at most " + str(max_threads) + ", got " +
                          str(g.threads_per_rank));
  if (!g.cores.empty()) {
    if (static_cast<int>(g.cores.size()) != g.tp)
      throw InvalidArgument(where + ".cores lists " + str(g.cores.size()) + " ranks for tp = " + str(g.tp));
    const int n = machine_cores();
    for (int r = 0; r < g.tp; ++r) {
      if (g.cores[r].empty()) throw InvalidArgument(where + ".cores of rank " + str(r) + " is empty");
      for (int c : g.cores[r])
        if (c < 0 || c >= n)
          throw InvalidArgument(where + ".cores: core " + str(c) + " does not exist (this machine has cores 0.." +
                                str(n - 1) + ")");
    }
  }
  if (!g.devices.empty() && static_cast<int>(g.devices.size()) != g.tp)
    throw InvalidArgument(where + ".devices lists " + str(g.devices.size()) + " GPUs for tp = " + str(g.tp));
  check_sm_partition_form(g.sm_first, g.sm_count, where + ".sm_partition");
  if (!g.gemm_engine.empty() && g.gemm_engine != "wgmma" && g.gemm_engine != "mma")
    throw InvalidArgument(where + ".gemm_engine must be \"wgmma\" or \"mma\", got \"" + g.gemm_engine + "\"");
  try {
    check_kv_window(window_options(g), "cpu");  // (the bounds; a backend's refusal comes at load)
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(where + ".kv_window [" + str(g.kv_window_sinks) + ", " + str(g.kv_window_recent) +
                          "]: " + e.what());
  }
}

// The GPU of rank r (devices, else r).
int rank_device(const GroupPlacement& g, int r) { return g.devices.empty() ? r : g.devices[r]; }

}  // namespace

std::vector<std::string> GroupPlacement::cuda_only_fields() const {
  const bool set[] = {!devices.empty(), has_sm_partition(sm_first, sm_count), stream_priority != 0,
                      !gemm_engine.empty(), megakernel};
  static_assert(sizeof(set) / sizeof(set[0]) == std::size(kCudaOnlyFields));
  std::vector<std::string> out;
  for (size_t i = 0; i < std::size(kCudaOnlyFields); ++i)
    if (set[i]) out.push_back(kCudaOnlyFields[i]);
  return out;
}

std::string GroupPlacement::backend_problem(const std::string& backend) const {
  return kv_window_backend_problem(backend, kv_window_recent);
}

bool GroupPlacement::places_nothing() const {
  return tp == 1 && cores.empty() && threads_per_rank == 0 && cuda_only_fields().empty() && !has_kv_window();
}

int GroupPlacement::resolved_threads(int default_threads) const {
  if (threads_per_rank > 0) return threads_per_rank;
  if (!cores.empty()) return static_cast<int>(cores[0].size());
  return tp == 1 ? default_threads : 1;
}

Placement Placement::from_json(const std::string& text) {
  // Depth and number range checked first: an error message below quotes values, and a value
  // nested 100,000 deep would have overflowed the stack wherever it was copied or serialized.
  if (const std::string problem = json_text_problem(text); !problem.empty())
    throw InvalidArgument("placement is not valid JSON: " + problem);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument("placement is not valid JSON: " + one_line(json_error_text(e)));
  }
  if (!j.is_object()) throw InvalidArgument("placement must be a JSON object with 'draft' and/or 'target'");
  Placement p;
  for (const auto& [key, value] : j.items()) {
    if (key == "draft")
      p.draft = parse_group(value, "placement.draft");
    else if (key == "target")
      p.target = parse_group(value, "placement.target");
    else
      throw InvalidArgument("placement: unknown group '" + key + "' (groups: draft, target)");
  }
  p.validate();
  return p;
}

std::string Placement::to_json() const {
  json j;
  j["draft"] = group_json(draft);
  j["target"] = group_json(target);
  return j.dump();
}

Placement Placement::automatic(int num_cores, int target_tp, int draft_tp) {
  if (num_cores <= 0) num_cores = machine_cores();
  if (target_tp < 1 || draft_tp < 1)
    throw InvalidArgument("automatic placement: TP degrees must be >= 1, got target " + str(target_tp) + ", draft " +
                          str(draft_tp));
  Placement p;
  p.draft.tp = draft_tp;
  p.target.tp = target_tp;
  std::vector<int> draft_cores, target_cores;
  if (num_cores == 1) {
    draft_cores = target_cores = {0};
  } else {
    const int nd = std::min(num_cores - 1, std::max(draft_tp, num_cores / 4));
    for (int c = 0; c < nd; ++c) draft_cores.push_back(c);
    for (int c = nd; c < num_cores; ++c) target_cores.push_back(c);
  }
  auto assign = [](GroupPlacement& g, const std::vector<int>& cores) {
    const int n = static_cast<int>(cores.size());
    g.cores.assign(g.tp, {});
    if (n < g.tp) {
      for (int r = 0; r < g.tp; ++r) g.cores[r] = {cores[r % n]};
    } else {
      for (int r = 0; r < g.tp; ++r)
        g.cores[r].assign(cores.begin() + r * n / g.tp, cores.begin() + (r + 1) * n / g.tp);
    }
  };
  assign(p.draft, draft_cores);
  assign(p.target, target_cores);
  p.validate();
  return p;
}

void Placement::validate() const {
  validate_group(draft, "placement.draft");
  validate_group(target, "placement.target");
  if (target.has_kv_window())
    throw InvalidArgument(
        "placement.target.kv_window: the target attends its full KV (it verifies the draft's proposals, so "
        "outputs stay its own); an attention window applies to the draft group only");
  // Two groups may share a GPU; their SM partitions there must be disjoint.
  if (!sm_partitions_overlap(draft.sm_first, draft.sm_count, target.sm_first, target.sm_count)) return;
  for (int a = 0; a < draft.tp; ++a)
    for (int b = 0; b < target.tp; ++b)
      if (rank_device(draft, a) == rank_device(target, b)) {
        auto shown = [](const GroupPlacement& g) { return "[" + str(g.sm_first) + ", " + str(g.sm_count) + "]"; };
        throw InvalidArgument("placement: draft.sm_partition " + shown(draft) + " and target.sm_partition " +
                              shown(target) + " overlap on GPU " + str(rank_device(draft, a)) +
                              " (count 0 means up to the last SM); give the groups disjoint SM ranges");
      }
}

namespace {
/// Refuses, naming `where` ("placement.target"), a group the checkpoint at `dir` cannot load
/// with on `backend` when its weights are int4 (int4_backend_problem, model.h).
void check_int4_group(const std::string& dir, const GroupPlacement& g, const std::string& backend,
                      const std::string& where) {
  // Only the cuda backend refuses anything; pre-sharded folders are never int4 (the sharding
  // converter refuses int4 folders).
  if (backend != "cuda" || cpu::ShardedCheckpoint::is_sharded(dir)) return;
  if (!Checkpoint::open(dir)->quantization().int4()) return;
  const std::string problem = int4_backend_problem(backend, g.megakernel, g.tp);
  if (!problem.empty()) throw InvalidArgument(where + "." + problem);
}
/// Refuses, naming `where`, what the group asks for that `backend` does not implement
/// (GroupPlacement::backend_problem): before either model is planned or loaded.
void check_backend_group(const GroupPlacement& g, const std::string& backend, const std::string& where) {
  const std::string problem = g.backend_problem(backend);
  if (!problem.empty()) throw InvalidArgument(where + "." + problem);
}
}  // namespace

ModelMemory group_model_memory(const std::string& dir, const GroupPlacement& g, const ModelOptions& base,
                               const std::string& backend) {
  ModelOptions opt = base;
  opt.num_threads = g.resolved_threads(base.num_threads);
  opt.gemm_engine = g.gemm_engine;
  opt.megakernel = g.megakernel;
  const bool sharded = cpu::ShardedCheckpoint::is_sharded(dir);
  if (backend == "cpu") {
    if (sharded) {
      auto ckpt = cpu::ShardedCheckpoint::open(dir);
      return tp_cpu_model_memory(dir, ckpt->config(), ckpt->plan(), opt, false);
    }
    auto ckpt = Checkpoint::open(dir);
    if (g.tp == 1) return model_memory(*ckpt, "cpu", opt);
    const int ffn_group = ckpt->quantization().int4() ? ckpt->quantization().group_size : 1;
    return tp_cpu_model_memory(dir, ckpt->config(),
                               TpPlan::make(ckpt->config(), g.tp, TpCpuOptions{}.ffn_align, ffn_group), opt, true);
  }
  if (g.tp == 1 && !sharded) {
    opt.device = rank_device(g, 0);
    return model_memory(*Checkpoint::open(dir), backend, opt);
  }
#ifdef SWIFTSPEC_WITH_CUDA
  if (backend == "cuda") {
    // Each rank's CudaModel holds its share of the heads and the FFN (as make_tp_cuda_model
    // sizes it from the plan), on its own GPU.
    ModelMemory m;
    m.name = model_name_of(dir);
    m.origin = dir + "/config.json";
    ModelConfig config;
    TpPlan plan;
    int dtype_bytes = 2, int4_group = 0;
    if (sharded) {
      auto ckpt = cpu::ShardedCheckpoint::open(dir);
      config = ckpt->config();
      plan = ckpt->plan();
      dtype_bytes = static_cast<int>(dtype_size(ckpt->dtype()));
    } else {
      auto ckpt = Checkpoint::open(dir);
      config = ckpt->config();
      plan = TpPlan::make(config, g.tp);
      dtype_bytes = static_cast<int>(dtype_size(ckpt->dtype()));
      if (ckpt->quantization().int4()) int4_group = ckpt->quantization().group_size;
    }
    m.trained = config.context_limit();
    ModelConfig rank = config;
    rank.num_heads = plan.q_heads_per_rank;
    rank.num_kv_heads = plan.kv_heads_per_rank;
    rank.intermediate_size = plan.ffn_per_rank;
    for (int r = 0; r < plan.tp; ++r)
      m.needs.push_back({"cuda:" + str(rank_device(g, r)), cuda_memory_need(rank, opt, dtype_bytes, int4_group)});
    return m;
  }
#endif
  throw InvalidArgument("backend '" + backend +
                        "': tensor parallelism needs a build with the CUDA backend "
                        "(SWIFTSPEC_CUDA=ON); use tp 1 or the cpu backend");
}

LoadedModels load_model_pair(const std::string& target_dir, const std::string& draft_dir, const Placement& placement,
                             const ModelOptions& base, const std::string& backend) {
  validate_group(placement.target, "placement.target");
  if (!draft_dir.empty()) validate_group(placement.draft, "placement.draft");
  check_backend_group(placement.target, backend, "placement.target");
  if (!draft_dir.empty()) check_backend_group(placement.draft, backend, "placement.draft");
  check_int4_group(target_dir, placement.target, backend, "placement.target");
  if (!draft_dir.empty()) check_int4_group(draft_dir, placement.draft, backend, "placement.draft");
  // Both models' needs first, planned together (they may share the RAM or a GPU), before
  // either allocates anything.
  std::vector<ModelMemory> memory{group_model_memory(target_dir, placement.target, base, backend)};
  if (!draft_dir.empty()) memory.push_back(group_model_memory(draft_dir, placement.draft, base, backend));
  const ContextPlan plan = plan_model_contexts(memory, std::vector<int>(memory.size(), base.max_context));
  LoadedModels out;
  out.context_note = plan.note;
  ModelOptions opt = base;
  opt.max_context = plan.contexts[0];
  out.target = load_group_model(target_dir, placement.target, opt, backend, "placement.target");
  if (!draft_dir.empty()) {
    opt.max_context = plan.contexts[1];
    out.draft = load_group_model(draft_dir, placement.draft, opt, backend, "placement.draft");
  }
  return out;
}

std::unique_ptr<Model> load_group_model(const std::string& dir, const GroupPlacement& g, const ModelOptions& base,
                                        const std::string& backend, const std::string& where) {
  validate_group(g, where);
  ModelOptions opt = base;
  opt.num_threads = g.resolved_threads(base.num_threads);
  opt.cpu_affinity = g.cores.empty() ? std::vector<int>{} : g.cores[0];
  opt.kv_window_sinks = g.kv_window_sinks;
  opt.kv_window_recent = g.kv_window_recent;
  if (backend != "cpu") {
    check_int4_group(dir, g, backend, where);
    if (g.tp != 1 || cpu::ShardedCheckpoint::is_sharded(dir)) {
#ifdef SWIFTSPEC_WITH_CUDA
      if (backend == "cuda") {
        if (has_sm_partition(g.sm_first, g.sm_count) || g.stream_priority != 0)
          throw InvalidArgument(where +
                                ": sm_partition and stream_priority are not supported with tp > 1 on the "
                                "cuda backend");
        TpCudaOptions tpo;
        for (int r = 0; r < g.tp; ++r) tpo.devices.push_back(rank_device(g, r));
        ModelOptions o = base;
        o.gemm_engine = g.gemm_engine;
        o.megakernel = g.megakernel;
        o.kv_window_sinks = g.kv_window_sinks;
        o.kv_window_recent = g.kv_window_recent;
        try {
          // The context, bounded by what each rank's GPU has free (before any allocation).
          const ModelOptions resolved = resolve_max_context(o, group_model_memory(dir, g, base, backend));
          if (cpu::ShardedCheckpoint::is_sharded(dir)) return make_tp_cuda_model_from_shards(dir, resolved, tpo);
          return make_tp_cuda_model(Checkpoint::open(dir), resolved, tpo);
        } catch (const InvalidArgument& e) {
          throw InvalidArgument(where + ": " + e.what());  // name the group, as the TP-1 path does
        }
      }
#endif
      throw InvalidArgument("backend '" + backend +
                            "': tensor parallelism needs a build with the CUDA backend "
                            "(SWIFTSPEC_CUDA=ON); use tp 1 or the cpu backend");
    }
    opt.device = rank_device(g, 0);
    opt.sm_first = g.sm_first;
    opt.sm_count = g.sm_count;
    opt.stream_priority = g.stream_priority;
    opt.gemm_engine = g.gemm_engine;
    opt.megakernel = g.megakernel;
    try {
      return load_model(Checkpoint::open(dir), backend, opt);
    } catch (const InvalidArgument& e) {
      // The CUDA backend checks the partition against the device; name the group.
      const std::string msg = e.what();
      if (msg.rfind("sm_partition", 0) == 0 || msg.rfind("device", 0) == 0) throw InvalidArgument(where + "." + msg);
      if (msg.rfind("ModelOptions.kv_window", 0) == 0) throw InvalidArgument(where + ".kv_window: " + msg);
      throw;
    }
  }
  const std::vector<std::string> cuda_only = g.cuda_only_fields();
  if (!cuda_only.empty()) {
    const std::string& field = cuda_only[0];
    const bool places = field == "devices" || field == "sm_partition";  // what 'cores' does on the cpu
    throw InvalidArgument(
        where + "." + field + (field == "sm_partition" ? " [" + str(g.sm_first) + ", " + str(g.sm_count) + "]" : "") +
        " applies to the cuda backend only" + (places ? "; on the cpu backend place groups with 'cores'" : ""));
  }
  TpCpuOptions tp;
  tp.tp = g.tp;
  tp.rank_cores = g.cores;
  tp.threads_per_rank = std::max(1, opt.num_threads > 0 ? opt.num_threads : machine_cores() / g.tp);
  if (cpu::ShardedCheckpoint::is_sharded(dir)) return make_tp_cpu_model_from_shards(dir, opt, tp);
  auto ckpt = Checkpoint::open(dir);
  if (g.tp == 1) return load_model(ckpt, "cpu", opt);
  return make_tp_cpu_model(ckpt, opt, tp);
}

}  // namespace swiftspec
