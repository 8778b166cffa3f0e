// plan_contexts (memory_plan.h): the context each model gets, bounded by the memory free.
#include "swiftspec/memory_plan.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "swiftspec/error.h"

namespace swiftspec {

uint64_t MemoryNeed::kv_bytes(int64_t context) const {
  return kv_fixed_bytes + kv_bytes_per_token * static_cast<uint64_t>(std::max<int64_t>(context, 0));
}

uint64_t MemoryNeed::workspace(int64_t context) const {
  const int64_t c = std::max<int64_t>(context, 0);
  return workspace_bytes + workspace_bytes_per_token * static_cast<uint64_t>(c) +
         (workspace_of_context ? workspace_of_context(c) : 0);
}

uint64_t MemoryNeed::bytes(int64_t context) const { return weight_bytes + kv_bytes(context) + workspace(context); }

uint64_t cuda_projection_bytes(uint64_t n, uint64_t k, int int4_group_size) {
  if (int4_group_size <= 0) return 2 * n * k;
  const uint64_t g = static_cast<uint64_t>(int4_group_size);
  if (k % g != 0)
    throw InvalidArgument("cuda_projection_bytes: the int4 group size " + std::to_string(g) +
                          " does not divide K = " + std::to_string(k));
  return n * k / 2 + 4 * n * (k / g);
}

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(uint64_t(1) << 30));
  else if (bytes >= (uint64_t(1) << 20))
    std::snprintf(buf, sizeof buf, "%.0f MiB", b / double(uint64_t(1) << 20));
  else if (bytes >= 1024)
    std::snprintf(buf, sizeof buf, "%.0f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  return buf;
}

std::string model_name_of(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const size_t slash = d.rfind('/');
  return slash == std::string::npos ? d : d.substr(slash + 1);
}

FreeMemory apply_free_memory_test_hook(FreeMemory measured, const std::string& device) {
  const char* hook = std::getenv("SWIFTSPEC_TEST_FREE_BYTES");
  if (hook == nullptr || *hook == '\0') return measured;
  const std::string text(hook);
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || text.find('-') != std::string::npos)
    throw InvalidArgument(
        "SWIFTSPEC_TEST_FREE_BYTES (a test hook: the free memory to assume) must be a byte count, "
        "got '" +
        text + "'");
  FreeMemory out;
  out.bytes = v;
  out.where = (device == "RAM" ? "in RAM" : "on " + device) + std::string(" (SWIFTSPEC_TEST_FREE_BYTES, a test hook)");
  out.known = true;
  return out;
}

FreeMemory cpu_free_memory() {
  FreeMemory m;
  m.where = "in RAM (MemAvailable)";
  m.known = false;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (in && std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream s(line.substr(13));
    unsigned long long kib = 0;
    if (s >> kib) {
      m.bytes = static_cast<uint64_t>(kib) * 1024;  // /proc/meminfo counts kB (KiB)
      m.known = true;
    }
    break;
  }
  return apply_free_memory_test_hook(m, "RAM");
}

namespace {

std::string str(long long v) { return std::to_string(v); }

/// Rounds a context that memory caps down to a tidy value: a multiple of 1024 tokens from 4096
/// up, of 256 from 256 up (an estimate is not byte-exact: a round number leaves a little slack).
int64_t round_context(int64_t c) {
  if (c >= 4096) return c / 1024 * 1024;
  if (c >= 256) return c / 256 * 256;
  return c;
}

/// "A", "A and B", "A, B and C".
std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " and " : ", ";
    out += names[i];
  }
  return out;
}

struct Planner {
  const std::vector<ContextRequest>& models;
  const std::vector<FreeMemory>& devices;
  std::vector<int64_t> limit;  // each model's context before memory: requested, trained or the fallback

  bool is_default(size_t m) const { return models[m].requested == 0; }

  /// Bytes the models need on device d when model m gets ctx(m) tokens.
  template <typename Ctx>
  uint64_t total_on(int d, const Ctx& ctx) const {
    uint64_t total = 0;
    for (size_t m = 0; m < models.size(); ++m)
      for (const auto& [dev, need] : models[m].needs)
        if (dev == d) total += need.bytes(ctx(m));
    return total;
  }
  static uint64_t budget(const FreeMemory& f, double share) {
    return share >= 1.0 ? f.bytes : static_cast<uint64_t>(static_cast<double>(f.bytes) * share);
  }
  /// The first device where the models do not fit in `share` of its free bytes; -1: they fit.
  template <typename Ctx>
  int failing_device(const Ctx& ctx, double share) const {
    for (size_t d = 0; d < devices.size(); ++d)
      if (devices[d].known && total_on(static_cast<int>(d), ctx) > budget(devices[d], share))
        return static_cast<int>(d);
    return -1;
  }
  /// The largest C in [1, hi] such that every model at context_at(m, C) fits in `share` of
  /// each device's free bytes; 0 when not even C = 1 does.
  template <typename CtxAt>
  int64_t largest_fitting(int64_t hi, const CtxAt& context_at, double share) const {
    int64_t lo = 0;  // fits (vacuously: "nothing")
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (failing_device([&](size_t m) { return context_at(m, mid); }, share) < 0)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
  std::vector<size_t> models_on(int d) const {
    std::vector<size_t> out;
    for (size_t m = 0; m < models.size(); ++m)
      for (const auto& entry : models[m].needs)
        if (entry.first == d) {
          out.push_back(m);
          break;
        }
    return out;
  }
  const MemoryNeed* need_on(size_t m, int d) const {
    for (const auto& entry : models[m].needs)
      if (entry.first == d) return &entry.second;
    return nullptr;
  }
};

}  // namespace

ContextPlan plan_contexts(const std::vector<ContextRequest>& models, const std::vector<FreeMemory>& devices) {
  Planner p{models, devices, {}};
  bool any_default = false, any_explicit = false;
  for (const ContextRequest& r : models) {
    if (r.requested < 0)
      throw InvalidArgument("max_context must be >= 1 (0: the model's default), got " + str(r.requested));
    if (r.requested > 0 && r.trained > 0 && r.requested > r.trained)
      throw InvalidArgument("max_context " + str(r.requested) + " exceeds the model's max_position_embeddings " +
                            str(r.trained) + " (" + r.origin +
                            "): it was not trained for longer contexts; use at most " + str(r.trained));
    for (const auto& entry : r.needs)
      if (entry.first < 0 || entry.first >= static_cast<int>(devices.size()))
        throw InvalidArgument("plan_contexts: model " + r.name + " names device " + str(entry.first) + " of " +
                              str(devices.size()));
    p.limit.push_back(r.requested > 0 ? r.requested : (r.trained > 0 ? r.trained : kFallbackMaxContext));
    (r.requested > 0 ? any_explicit : any_default) = true;
  }

  // 1. Explicit contexts must fit in all of the free memory (default models counted at 1 token:
  //    they shrink to what is left, below).
  if (any_explicit) {
    auto explicit_ctx = [&](size_t m) { return p.is_default(m) ? int64_t(1) : p.limit[m]; };
    const int d = p.failing_device(explicit_ctx, 1.0);
    if (d >= 0) {
      int64_t hi = 0;
      for (size_t m = 0; m < models.size(); ++m)
        if (!p.is_default(m)) hi = std::max(hi, p.limit[m]);
      const int64_t at_most =
          round_context(p.largest_fitting(hi, [&](size_t m, int64_t c) { return std::min(p.limit[m], c); }, 1.0));
      const std::vector<size_t> on = p.models_on(d);
      std::vector<size_t> expl;
      for (size_t m : on)
        if (!p.is_default(m)) expl.push_back(m);
      bool same = true;
      for (size_t m : expl) same = same && p.limit[m] == p.limit[expl[0]];
      std::string msg;
      for (size_t i = 0; i < expl.size(); ++i) {
        const size_t m = expl[i];
        const std::string kv = format_bytes(p.need_on(m, d)->kv_bytes(p.limit[m]));
        if (i == 0)
          msg = "max_context " + str(p.limit[m]) + " needs " + kv + " of KV cache for " + models[m].name;
        else
          msg += " and " + (same ? "" : "max_context " + str(p.limit[m]) + " needs ") + kv + " for " + models[m].name;
      }
      std::vector<std::string> others;
      for (size_t m : on)
        if (p.is_default(m)) others.push_back(models[m].name);
      msg += " (" + format_bytes(p.total_on(d, explicit_ctx)) + " with " + (on.size() == 1 ? "its" : "their") +
             " weights and workspaces" + (others.empty() ? "" : ", " + join_names(others) + " at 1 token") + "), " +
             format_bytes(devices[d].bytes) + " free " + devices[d].where;
      if (at_most >= 1) {
        msg += "; at most " + str(at_most) + " fits";
      } else {
        const uint64_t fixed = p.total_on(d, [](size_t) { return int64_t(0); });
        msg += "; not even 1 token fits: the weights and workspaces alone need " + format_bytes(fixed);
      }
      throw InvalidArgument(msg);
    }
  }

  ContextPlan plan;
  plan.contexts.assign(p.limit.begin(), p.limit.end());
  if (!any_default) return plan;

  // 2. Default contexts: all of them if they fit in kDefaultContextMemoryShare of the free
  //    memory, else capped together to the largest common value that does.
  const double share = kDefaultContextMemoryShare;
  int64_t longest = 0;
  for (size_t m = 0; m < models.size(); ++m)
    if (p.is_default(m)) longest = std::max(longest, p.limit[m]);
  auto context_at = [&](size_t m, int64_t c) { return p.is_default(m) ? std::min(p.limit[m], c) : p.limit[m]; };
  const int d = p.failing_device([&](size_t m) { return context_at(m, longest); }, share);
  if (d < 0) return plan;

  const int64_t fitting = p.largest_fitting(longest, context_at, share);
  const int64_t cap = round_context(fitting);
  std::vector<std::string> names;
  bool all_trained = true;
  for (size_t m : p.models_on(d)) {
    names.push_back(models[m].name);
    if (p.is_default(m) && models[m].trained == 0) all_trained = false;
  }
  const bool one = names.size() == 1;
  const std::string full_need = format_bytes(p.total_on(d, [&](size_t m) { return context_at(m, longest); }));
  const std::string free_text = format_bytes(devices[d].bytes) + " free " + devices[d].where;
  const std::string percent = str(static_cast<long long>(share * 100 + 0.5)) + "%";
  int64_t shortest_default = longest;
  for (size_t m = 0; m < models.size(); ++m)
    if (p.is_default(m)) shortest_default = std::min(shortest_default, p.limit[m]);
  if (cap < std::min<int64_t>(kMinDefaultContext, shortest_default)) {
    const int64_t c = std::min<int64_t>(kMinDefaultContext, shortest_default);
    throw InvalidArgument("not enough memory for " + join_names(names) + ": with a context of " + str(c) + " tokens " +
                          (one ? "it needs " : "they need ") +
                          format_bytes(p.total_on(d, [&](size_t m) { return context_at(m, c); })) + " with " +
                          (one ? "its" : "their") + " weights and workspaces, " + free_text +
                          ", of which a default context plans for " + percent + "; free memory, or use smaller models");
  }
  for (size_t m = 0; m < models.size(); ++m)
    if (p.is_default(m)) plan.contexts[m] = static_cast<int>(std::min(p.limit[m], cap));
  plan.note = "context " + str(cap) + " tokens for " + join_names(names) + ", not the " + str(longest) + " " +
              (all_trained ? (one ? "it was trained for" : "they were trained for") : "of the default") +
              ": that needs " + full_need + " with " + (one ? "its" : "their") + " weights and workspaces, " +
              free_text + ", of which a default context plans for " + percent + "; give max_context to choose another";
  return plan;
}

}  // namespace swiftspec
