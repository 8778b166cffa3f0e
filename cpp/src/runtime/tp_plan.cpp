// TpPlan: the split of heads, FFN rows and vocabulary over the ranks of a group.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "swiftspec/error.h"
#include "json_error.h"
#include "json_int.h"
#include "json_read.h"
#include "swiftspec/tensor_parallel.h"

namespace swiftspec {
namespace {

using json = nlohmann::json;

std::string str(long long v) { return std::to_string(v); }

int split(long long total, int r, int parts) { return static_cast<int>(total * r / parts); }

}  // namespace

TpPlan TpPlan::make(const ModelConfig& c, int tp, int ffn_align, int ffn_group) {
  if (tp < 1) throw InvalidArgument("tp (TP degree) must be >= 1, got " + str(tp));
  if (ffn_align < 1) throw InvalidArgument("ffn_align must be >= 1, got " + str(ffn_align));
  if (ffn_group < 1 || (c.intermediate_size > 0 && c.intermediate_size % ffn_group != 0))
    throw InvalidArgument("ffn_group must be >= 1 and divide intermediate_size " + str(c.intermediate_size) + ", got " +
                          str(ffn_group));
  if (c.num_heads < 1 || c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0 || c.intermediate_size < 1 ||
      c.vocab_size < 1)
    throw InvalidArgument("TpPlan: invalid model config (heads " + str(c.num_heads) + ", kv heads " +
                          str(c.num_kv_heads) + ", intermediate " + str(c.intermediate_size) + ")");
  if (tp > c.num_heads)  // every rank owns at least one query head (and allocates its own KV cache)
    throw InvalidArgument("tp (TP degree) " + str(tp) + " exceeds the model's " + str(c.num_heads) +
                          " attention heads: each rank needs at least one");
  TpPlan p;
  p.tp = tp;
  const int group = c.num_heads / c.num_kv_heads;
  p.q_heads_per_rank = (c.num_heads + tp - 1) / tp;
  p.q_heads.assign(tp, std::vector<int>(p.q_heads_per_rank, -1));
  p.q_to_kv.assign(tp, std::vector<int>(p.q_heads_per_rank, -1));
  std::vector<std::vector<int>> kv(tp);
  for (int r = 0; r < tp; ++r) {
    const int h0 = split(c.num_heads, r, tp), h1 = split(c.num_heads, r + 1, tp);
    for (int h = h0; h < h1; ++h) {
      const int j = h - h0;
      p.q_heads[r][j] = h;
      const int g = h / group;
      auto it = std::find(kv[r].begin(), kv[r].end(), g);
      if (it == kv[r].end()) {
        kv[r].push_back(g);
        it = kv[r].end() - 1;
      }
      p.q_to_kv[r][j] = static_cast<int>(it - kv[r].begin());
    }
  }
  p.kv_heads_per_rank = 1;
  for (const auto& k : kv) p.kv_heads_per_rank = std::max(p.kv_heads_per_rank, static_cast<int>(k.size()));
  p.kv_heads.assign(tp, std::vector<int>(p.kv_heads_per_rank, -1));
  for (int r = 0; r < tp; ++r) std::copy(kv[r].begin(), kv[r].end(), p.kv_heads[r].begin());

  p.vocab_per_rank = (c.vocab_size + tp - 1) / tp;
  int ffn = 0;  // the largest slice: ceil(I/tp) when ffn_group is 1
  for (int r = 0; r <= tp; ++r) {
    p.ffn_bounds.push_back(ffn_group * split(c.intermediate_size / ffn_group, r, tp));
    p.vocab_bounds.push_back(split(c.vocab_size, r, tp));
    if (r > 0) ffn = std::max(ffn, p.ffn_bounds[r] - p.ffn_bounds[r - 1]);
  }
  p.ffn_per_rank = (ffn + ffn_align - 1) / ffn_align * ffn_align;
  return p;
}

std::string TpPlan::to_json() const {
  json j;
  j["tp_degree"] = tp;
  j["q_heads_per_rank"] = q_heads_per_rank;
  j["kv_heads_per_rank"] = kv_heads_per_rank;
  j["ffn_per_rank"] = ffn_per_rank;
  j["vocab_per_rank"] = vocab_per_rank;
  j["q_heads"] = q_heads;
  j["kv_heads"] = kv_heads;
  j["q_to_kv"] = q_to_kv;
  j["ffn_bounds"] = ffn_bounds;
  j["vocab_bounds"] = vocab_bounds;
  return j.dump();
}

TpPlan TpPlan::from_json(const std::string& text, const std::string& origin) {
  const json j = parse_json_checked(text, origin + ": tensor_parallel is not valid JSON: ");
  if (!j.is_object()) throw CheckpointError(origin + ": tensor_parallel must be an object, got " + json_brief(j));
  TpPlan p;
  // Integers through read_int32, not get_to: that read 1.5 as 1, wrapped 2^32 + 1 to 1, and turned
  // 1e300 into an undefined float-to-int conversion.
  auto integer = [&](const json& v, const std::string& field) {
    int out = 0;
    if (read_int32(v, out) != JsonInt::Ok)
      throw CheckpointError(origin + ": tensor_parallel field '" + field + "' must hold 32-bit integers, got " +
                            json_brief(v));
    return out;
  };
  auto field = [&](const char* key) -> const json& {
    if (!j.contains(key)) throw CheckpointError(origin + ": tensor_parallel lacks field '" + key + "'");
    return j.at(key);
  };
  auto list = [&](const json& v, const std::string& name) {
    if (!v.is_array())
      throw CheckpointError(origin + ": tensor_parallel field '" + name + "' must be a list, got " + json_brief(v));
    std::vector<int> out;
    for (const json& x : v) out.push_back(integer(x, name));
    return out;
  };
  auto rows = [&](const char* key) {
    const json& v = field(key);
    if (!v.is_array())
      throw CheckpointError(origin + ": tensor_parallel field '" + key + "' must be a list of lists, got " +
                            json_brief(v));
    std::vector<std::vector<int>> out;
    for (const json& row : v) out.push_back(list(row, key));
    return out;
  };
  p.tp = integer(field("tp_degree"), "tp_degree");
  p.q_heads_per_rank = integer(field("q_heads_per_rank"), "q_heads_per_rank");
  p.kv_heads_per_rank = integer(field("kv_heads_per_rank"), "kv_heads_per_rank");
  p.ffn_per_rank = integer(field("ffn_per_rank"), "ffn_per_rank");
  p.vocab_per_rank = integer(field("vocab_per_rank"), "vocab_per_rank");
  p.q_heads = rows("q_heads");
  p.kv_heads = rows("kv_heads");
  p.q_to_kv = rows("q_to_kv");
  p.ffn_bounds = list(field("ffn_bounds"), "ffn_bounds");
  p.vocab_bounds = list(field("vocab_bounds"), "vocab_bounds");
  return p;
}

void TpPlan::validate(const ModelConfig& c, const std::string& origin) const {
  auto fail = [&](const std::string& what) { throw CheckpointError(origin + ": tensor_parallel: " + what); };
  if (tp < 1) fail("tp_degree must be >= 1, got " + str(tp));
  auto sized = [&](const std::vector<std::vector<int>>& v, int inner, const char* name) {
    if (static_cast<int>(v.size()) != tp) fail(std::string(name) + " must have tp_degree rows");
    for (const auto& row : v)
      if (static_cast<int>(row.size()) != inner) fail(std::string(name) + " rows must have " + str(inner) + " entries");
  };
  if (q_heads_per_rank < 1 || kv_heads_per_rank < 1 || ffn_per_rank < 1 || vocab_per_rank < 1)
    fail("per-rank sizes must be >= 1");
  sized(q_heads, q_heads_per_rank, "q_heads");
  sized(q_to_kv, q_heads_per_rank, "q_to_kv");
  sized(kv_heads, kv_heads_per_rank, "kv_heads");
  const int group = c.num_heads / std::max(1, c.num_kv_heads);
  std::vector<int> owners(c.num_heads, 0);
  for (int r = 0; r < tp; ++r)
    for (int j = 0; j < q_heads_per_rank; ++j) {
      const int h = q_heads[r][j], m = q_to_kv[r][j];
      if (h < 0) {
        if (m != -1) fail("padding query head (rank " + str(r) + ", slot " + str(j) + ") must map to KV slot -1");
        continue;
      }
      if (h >= c.num_heads) fail("query head " + str(h) + " outside [0, " + str(c.num_heads) + ")");
      ++owners[h];
      if (m < 0 || m >= kv_heads_per_rank || kv_heads[r][m] != h / group)
        fail("query head " + str(h) + " on rank " + str(r) + " must map to the local slot of KV head " +
             str(h / group));
    }
  for (int h = 0; h < c.num_heads; ++h)
    if (owners[h] != 1) fail("query head " + str(h) + " is owned by " + str(owners[h]) + " ranks (must be 1)");
  for (int r = 0; r < tp; ++r)
    for (int k : kv_heads[r])
      if (k < -1 || k >= c.num_kv_heads) fail("KV head " + str(k) + " outside [0, " + str(c.num_kv_heads) + ")");
  auto bounds = [&](const std::vector<int>& b, int total, int per_rank, const char* name) {
    if (static_cast<int>(b.size()) != tp + 1 || b.front() != 0 || b.back() != total)
      fail(std::string(name) + " must have tp_degree+1 entries from 0 to " + str(total));
    for (int r = 0; r < tp; ++r)
      if (b[r + 1] < b[r] || b[r + 1] - b[r] > per_rank)
        fail(std::string(name) + " slice of rank " + str(r) + " is not within 0.." + str(per_rank) + " rows");
  };
  bounds(ffn_bounds, c.intermediate_size, ffn_per_rank, "ffn_bounds");
  bounds(vocab_bounds, c.vocab_size, vocab_per_rank, "vocab_bounds");
}

}  // namespace swiftspec
