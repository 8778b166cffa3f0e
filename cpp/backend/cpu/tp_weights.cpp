// Tensor-parallel rank weights: load-time sharding of a TP-1 checkpoint, and
// pre-sharded folders.
#include "backend/cpu/tp_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "backend/cpu/int4_weights.h"
#include "swiftspec/error.h"
#include "src/runtime/json_error.h"
#include "src/runtime/json_int.h"
#include "src/runtime/json_read.h"

namespace swiftspec::cpu {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string str(long long v) { return std::to_string(v); }

void check_dtype(DType dt, const std::string& where) {
  if (dt != DType::F32 && dt != DType::BF16)
    throw CheckpointError(where + ": the CPU backend reads float32 or bfloat16 weights, not " + dtype_name(dt));
}

std::vector<float> to_vec(const TensorView& t) {
  std::vector<float> out(t.numel());
  to_float(t.data, t.dtype, t.numel(), out.data());
  return out;
}

// Builds padded shards by copying row blocks / column blocks of a matrix.
class ShardBuilder {
 public:
  ShardBuilder(TpRankShard& s, DType dt) : s_(s), dt_(dt), es_(dtype_size(dt)) {}

  // Rows: for each entry of `blocks` ({first source row, row count} or
  // {-1, count} for zeros), in order. Source is [*, k].
  WeightMatrix rows(const TensorView& src, const std::vector<std::pair<int, int>>& blocks, int k) {
    int n = 0;
    for (auto [b, cnt] : blocks) n += cnt;
    uint8_t* dst = alloc(size_t(n) * k);
    const auto* base = static_cast<const uint8_t*>(src.data);
    size_t row = 0;
    for (auto [b, cnt] : blocks) {
      if (b >= 0) std::memcpy(dst + row * k * es_, base + size_t(b) * k * es_, size_t(cnt) * k * es_);
      row += cnt;
    }
    return WeightMatrix{dst, dt_, n, k};
  }

  // Columns: every one of the `n` source rows [n, src_k] keeps the column
  // blocks listed (or zeros), giving [n, sum of counts].
  WeightMatrix cols(const TensorView& src, int n, int src_k, const std::vector<std::pair<int, int>>& blocks) {
    int k = 0;
    for (auto [b, cnt] : blocks) k += cnt;
    uint8_t* dst = alloc(size_t(n) * k);
    const auto* base = static_cast<const uint8_t*>(src.data);
    for (int i = 0; i < n; ++i) {
      size_t col = 0;
      for (auto [b, cnt] : blocks) {
        if (b >= 0)
          std::memcpy(dst + (size_t(i) * k + col) * es_, base + (size_t(i) * src_k + b) * es_, size_t(cnt) * es_);
        col += cnt;
      }
    }
    return WeightMatrix{dst, dt_, n, k};
  }

  // The int4 forms (int4.h layout: qweight U8 [n, k/2], scales F16 [n, k/G], zeros U8 [n, k/G]).
  // A padding row or column gets q = z = 0 and scale 0: it dequantizes to exactly 0, like the
  // float paths' zero padding.

  // Rows of the int4 matrix `src` (its packed bytes, scales and zero points), as rows() does.
  WeightMatrix rows_int4(const WeightMatrix& src, const std::vector<std::pair<int, int>>& blocks) {
    int n = 0;
    for (auto [b, cnt] : blocks) n += cnt;
    const size_t qb = size_t(src.k) / 2, gb = size_t(src.k) / src.group_size;
    uint8_t* q = bytes(size_t(n) * qb);
    auto* sc = reinterpret_cast<uint16_t*>(bytes(size_t(n) * gb * sizeof(uint16_t)));
    uint8_t* z = bytes(size_t(n) * gb);
    const auto* src_q = static_cast<const uint8_t*>(src.data);
    size_t row = 0;
    for (auto [b, cnt] : blocks) {
      if (b >= 0) {
        std::memcpy(q + row * qb, src_q + size_t(b) * qb, size_t(cnt) * qb);
        std::memcpy(sc + row * gb, src.scales + size_t(b) * gb, size_t(cnt) * gb * sizeof(uint16_t));
        std::memcpy(z + row * gb, src.zeros + size_t(b) * gb, size_t(cnt) * gb);
      }
      row += cnt;
    }
    return int4_matrix(q, sc, z, n, src.k, src.group_size);
  }

  // Column blocks of the int4 matrix `src`, as cols() does. A rank's slice may start or end inside
  // one of src's groups of G columns (o_proj: heads of 64 columns, groups of 128), so the shard's
  // group size is the largest g dividing G and the start and length of every run of adjacent
  // blocks (real columns or padding); each shard group
  // repeats the scale and zero point of the source group it lies in: the same dequantized
  // values. `where` names the projection in the error when g is not a multiple of 8 (the int4
  // kernels' unit).
  WeightMatrix cols_int4(const WeightMatrix& src, const std::vector<std::pair<int, int>>& in_blocks, int tp,
                         const std::string& where) {
    // Adjacent blocks merged (a rank's heads are contiguous columns), so only the slice's ends count.
    std::vector<std::pair<int, int>> blocks;
    for (auto [b, cnt] : in_blocks) {
      if (!blocks.empty()) {
        auto& [pb, pcnt] = blocks.back();
        if ((b < 0 && pb < 0) || (b >= 0 && pb >= 0 && b == pb + pcnt)) {
          pcnt += cnt;
          continue;
        }
      }
      blocks.emplace_back(b, cnt);
    }
    const int G = src.group_size;
    int g = G, k = 0;
    for (auto [b, cnt] : blocks) {
      g = std::gcd(g, cnt);
      if (b >= 0) g = std::gcd(g, b);
      k += cnt;
    }
    if (g % 8 != 0)
      throw CheckpointError(where + ": tensor parallelism (tp " + str(tp) + ") with int4 weights (group size " +
                            str(G) + ") would cut its input columns at a multiple of only " + str(g) +
                            " (a rank's slice must start and end on a multiple of 8); use another tp degree or a "
                            "bfloat16 checkpoint");
    const int n = src.n, src_groups = src.k / G, groups = k / g;
    const size_t qb = size_t(k) / 2;
    uint8_t* q = bytes(size_t(n) * qb);
    auto* sc = reinterpret_cast<uint16_t*>(bytes(size_t(n) * groups * sizeof(uint16_t)));
    uint8_t* z = bytes(size_t(n) * groups);
    const auto* src_q = static_cast<const uint8_t*>(src.data);
    for (int i = 0; i < n; ++i) {
      int col = 0;
      for (auto [b, cnt] : blocks) {
        if (b >= 0) {
          std::memcpy(q + size_t(i) * qb + col / 2, src_q + size_t(i) * (src.k / 2) + b / 2, size_t(cnt) / 2);
          for (int j = 0; j < cnt / g; ++j) {
            const size_t from = size_t(i) * src_groups + (b + j * g) / G, to = size_t(i) * groups + col / g + j;
            sc[to] = src.scales[from];
            z[to] = src.zeros[from];
          }
        }
        col += cnt;
      }
    }
    return int4_matrix(q, sc, z, n, k, g);
  }

 private:
  uint8_t* alloc(size_t elems) { return bytes(elems * es_); }
  uint8_t* bytes(size_t count) {
    s_.owned.emplace_back(count, uint8_t{0});
    return s_.owned.back().data();
  }
  static WeightMatrix int4_matrix(const uint8_t* q, const uint16_t* scales, const uint8_t* zeros, int n, int k, int g) {
    WeightMatrix w;
    w.data = q;
    w.dtype = DType::U8;
    w.n = n;
    w.k = k;
    w.scales = scales;
    w.zeros = zeros;
    w.group_size = g;
    return w;
  }
  TpRankShard& s_;
  DType dt_;
  size_t es_;
};

// {first row, count} blocks of `heads` (model head index or -1) of `dim` rows each.
std::vector<std::pair<int, int>> head_blocks(const std::vector<int>& heads, int dim) {
  std::vector<std::pair<int, int>> b;
  for (int h : heads) b.emplace_back(h >= 0 ? h * dim : -1, dim);
  return b;
}

std::vector<float> head_bias(const TensorView& t, const std::vector<int>& heads, int dim) {
  const std::vector<float> full = to_vec(t);
  std::vector<float> out(heads.size() * dim, 0.0f);
  for (size_t j = 0; j < heads.size(); ++j)
    if (heads[j] >= 0) std::copy_n(full.data() + size_t(heads[j]) * dim, dim, out.data() + j * dim);
  return out;
}

json read_json(const std::string& path) { return read_json_file(path, kMaxSmallJsonBytes, "manifest"); }

std::string rank_file(int r, int n) { return "model-tp" + str(r) + "-of-" + str(n) + ".safetensors"; }
constexpr const char* kSharedFile = "model-tp-shared.safetensors";

}  // namespace

TpRankShard shard_checkpoint(std::shared_ptr<const Checkpoint> ckpt, const TpPlan& plan, int r) {
  const ModelConfig& c = ckpt->config();
  plan.validate(c, ckpt->dir());
  if (r < 0 || r >= plan.tp)
    throw InvalidArgument("shard_checkpoint: rank " + str(r) + " outside [0, " + str(plan.tp) + ")");
  check_dtype(ckpt->dtype(), ckpt->dir());  // an int4 checkpoint's float tensors (embedding, norms, biases): BF16
  const DType dt = ckpt->dtype();
  const int H = c.hidden_size, hd = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  const int qd = c.num_heads * hd, kvd = c.num_kv_heads * hd;
  TpRankShard s;
  s.rank = r;
  s.keep_alive.push_back(ckpt);
  ShardBuilder b(s, dt);

  const TensorView& embed = ckpt->tensor("model.embed_tokens.weight", {V, H});
  s.embed = WeightMatrix{embed.data, dt, V, H};
  const TensorView& lm = c.tie_word_embeddings ? embed : ckpt->tensor("lm_head.weight", {V, H});
  const int v0 = plan.vocab_bounds[r], v1 = plan.vocab_bounds[r + 1];
  s.lm_head = WeightMatrix{static_cast<const uint8_t*>(lm.data) + size_t(v0) * H * dtype_size(dt), dt, v1 - v0, H};
  s.final_norm = to_vec(ckpt->tensor("model.norm.weight", {H}));

  const int f0 = plan.ffn_bounds[r], f1 = plan.ffn_bounds[r + 1];
  const std::vector<std::pair<int, int>> ffn_rows = {{f0, f1 - f0}, {-1, plan.ffn_per_rank - (f1 - f0)}};
  const auto q_blocks = head_blocks(plan.q_heads[r], hd), kv_blocks = head_blocks(plan.kv_heads[r], hd);
  // A projection [n, k] cut by rows (column-parallel) or by input columns (row-parallel), from
  // `prefix`.weight, or from its int4 tensors (int4_weights.h) in an int4 checkpoint.
  const bool int4 = ckpt->quantization().int4();
  auto rows = [&](const std::string& prefix, int n, int k, const std::vector<std::pair<int, int>>& blocks) {
    if (int4) return b.rows_int4(load_int4_matrix(*ckpt, prefix, n, k), blocks);
    return b.rows(ckpt->tensor(prefix + ".weight", {n, k}), blocks, k);
  };
  auto cols = [&](const std::string& prefix, int n, int k, const std::vector<std::pair<int, int>>& blocks) {
    if (int4)
      return b.cols_int4(load_int4_matrix(*ckpt, prefix, n, k), blocks, plan.tp, ckpt->dir() + ": '" + prefix + "'");
    return b.cols(ckpt->tensor(prefix + ".weight", {n, k}), n, k, blocks);
  };
  s.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + str(l) + ".";
    TpLayerShard& L = s.layers[l];
    L.q = rows(p + "self_attn.q_proj", qd, H, q_blocks);
    L.k = rows(p + "self_attn.k_proj", kvd, H, kv_blocks);
    L.v = rows(p + "self_attn.v_proj", kvd, H, kv_blocks);
    L.o = cols(p + "self_attn.o_proj", H, qd, q_blocks);
    if (c.attention_bias) {
      L.q_bias = head_bias(ckpt->tensor(p + "self_attn.q_proj.bias", {qd}), plan.q_heads[r], hd);
      L.k_bias = head_bias(ckpt->tensor(p + "self_attn.k_proj.bias", {kvd}), plan.kv_heads[r], hd);
      L.v_bias = head_bias(ckpt->tensor(p + "self_attn.v_proj.bias", {kvd}), plan.kv_heads[r], hd);
    }
    L.gate = rows(p + "mlp.gate_proj", I, H, ffn_rows);
    L.up = rows(p + "mlp.up_proj", I, H, ffn_rows);
    L.down = cols(p + "mlp.down_proj", H, I, ffn_rows);
    L.input_norm = to_vec(ckpt->tensor(p + "input_layernorm.weight", {H}));
    L.post_attention_norm = to_vec(ckpt->tensor(p + "post_attention_layernorm.weight", {H}));
  }
  return s;
}

bool ShardedCheckpoint::is_sharded(const std::string& dir) {
  const std::string path = (fs::path(dir) / "manifest.json").string();
  if (!fs::is_regular_file(path)) return false;
  try {
    const json m = read_json(path);
    int tp = 0;  // read_int32: tp_degree 2^32 + 2 was read as 2
    return m.is_object() && m.contains("tp_degree") && read_int32(m["tp_degree"], tp) == JsonInt::Ok && tp > 1;
  } catch (const CheckpointError&) {
    return false;
  }
}

std::shared_ptr<ShardedCheckpoint> ShardedCheckpoint::open(const std::string& dir) {
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  const json m = read_json(mpath);
  auto fail = [&](const std::string& what) { throw CheckpointError(mpath + ": " + what); };
  if (!m.is_object() || optional_string(m, "format", mpath) != "swiftspec-checkpoint")
    fail("field 'format' must be \"swiftspec-checkpoint\"");
  int version = 0, n = 0;  // read_int32, not get<int>(): 2^32 + 2 was read as 2
  if (!m.contains("format_version") || read_int32(m["format_version"], version) != JsonInt::Ok || version != 2)
    fail("a tensor-parallel folder has format_version 2");
  if (!m.contains("tp_degree") || read_int32(m["tp_degree"], n) != JsonInt::Ok || n < 2)
    fail("field 'tp_degree' must be an integer >= 2 in a tensor-parallel folder");
  auto ckpt = std::shared_ptr<ShardedCheckpoint>(new ShardedCheckpoint());
  ckpt->dir_ = dir;
  const std::string dtype = optional_string(m, "dtype", mpath);
  if (dtype == "float32")
    ckpt->dtype_ = DType::F32;
  else if (dtype == "bfloat16")
    ckpt->dtype_ = DType::BF16;
  else
    fail("field 'dtype' must be \"float32\" or \"bfloat16\", got " + json_brief(dtype));
  if (!m.contains("tensor_parallel") || !m["tensor_parallel"].is_object()) fail("missing object 'tensor_parallel'");
  ckpt->config_ = ModelConfig::from_json_file((fs::path(dir) / "config.json").string());
  ckpt->plan_ = TpPlan::from_json(m["tensor_parallel"].dump(), mpath);
  ckpt->plan_.validate(ckpt->config_, mpath);
  if (ckpt->plan_.tp != n) fail("tensor_parallel.tp_degree " + str(ckpt->plan_.tp) + " != tp_degree " + str(n));
  std::vector<std::string> expected{kSharedFile};
  for (int r = 0; r < n; ++r) expected.push_back(rank_file(r, n));
  std::vector<std::string> files;
  if (m.contains("files") && m["files"].is_array())
    for (const auto& f : m["files"])
      if (f.is_string()) files.push_back(f.get<std::string>());
  if (files != expected)
    fail(std::string("field 'files' must list ") + kSharedFile + " then model-tp{r}-of-" + str(n) +
         ".safetensors for r = 0.." + str(n - 1));
  ckpt->shared_ = std::make_unique<SafetensorsFile>((fs::path(dir) / kSharedFile).string());
  for (int r = 0; r < n; ++r)
    ckpt->ranks_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / rank_file(r, n)).string()));
  // The config's sizes against the tensors before load_rank allocates by them (num_hidden_layers
  // 2,000,000 made 2,000,000 layer slots first), as check_sizes_against_tensors does for TP-1 folders.
  const ModelConfig& c = ckpt->config_;
  const int64_t H = c.hidden_size;
  ckpt->tensor(*ckpt->shared_, "model.embed_tokens.weight", {c.vocab_size, H});
  ckpt->tensor(*ckpt->ranks_[0], "model.layers.0.self_attn.q_proj.weight",
               {int64_t{ckpt->plan_.q_heads_per_rank} * c.head_dim, H});
  const std::string last = "model.layers." + str(c.num_layers - 1) + ".input_layernorm.weight";
  if (!ckpt->shared_->tensors().count(last))
    throw CheckpointError(ckpt->shared_->path() + ": missing tensor '" + last +
                          "' (config.json says num_hidden_layers = " + str(c.num_layers) + ")");
  ckpt->tensor(*ckpt->shared_, last, {H});
  return ckpt;
}

const TensorView& ShardedCheckpoint::tensor(const SafetensorsFile& f, const std::string& name,
                                            const std::vector<int64_t>& shape) const {
  auto it = f.tensors().find(name);
  if (it == f.tensors().end()) throw CheckpointError(f.path() + ": missing tensor '" + name + "'");
  const TensorView& t = it->second;
  auto shape_str = [](const std::vector<int64_t>& s) {
    std::string o = "[";
    for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + str(s[i]);
    return o + "]";
  };
  if (t.shape != shape)
    throw CheckpointError(f.path() + ": tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " +
                          shape_str(shape) + " from the tensor-parallel plan");
  if (t.dtype != dtype_)
    throw CheckpointError(f.path() + ": tensor '" + name + "' has dtype " + dtype_name(t.dtype) +
                          " but the manifest says " + dtype_name(dtype_));
  return t;
}

TpRankShard ShardedCheckpoint::load_rank(std::shared_ptr<const ShardedCheckpoint> ckpt, int r) {
  const ModelConfig& c = ckpt->config_;
  const TpPlan& p = ckpt->plan_;
  if (r < 0 || r >= p.tp) throw InvalidArgument("load_rank: rank " + str(r) + " outside [0, " + str(p.tp) + ")");
  const DType dt = ckpt->dtype_;
  const int64_t H = c.hidden_size, hd = c.head_dim, V = c.vocab_size;
  const int64_t ql = int64_t(p.q_heads_per_rank) * hd, kvl = int64_t(p.kv_heads_per_rank) * hd, Fl = p.ffn_per_rank;
  const SafetensorsFile& sh = *ckpt->shared_;
  const SafetensorsFile& rf = *ckpt->ranks_[r];
  auto mat = [&](const SafetensorsFile& f, const std::string& name, int64_t n, int64_t k) {
    return WeightMatrix{ckpt->tensor(f, name, {n, k}).data, dt, static_cast<int>(n), static_cast<int>(k)};
  };
  auto vec = [&](const SafetensorsFile& f, const std::string& name, int64_t n) {
    return to_vec(ckpt->tensor(f, name, {n}));
  };
  TpRankShard s;
  s.rank = r;
  s.keep_alive.push_back(ckpt);
  s.embed = mat(sh, "model.embed_tokens.weight", V, H);
  s.lm_head = mat(rf, "lm_head.weight", p.vocab_bounds[r + 1] - p.vocab_bounds[r], H);
  s.final_norm = vec(sh, "model.norm.weight", H);
  s.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string pre = "model.layers." + str(l) + ".";
    TpLayerShard& L = s.layers[l];
    L.q = mat(rf, pre + "self_attn.q_proj.weight", ql, H);
    L.k = mat(rf, pre + "self_attn.k_proj.weight", kvl, H);
    L.v = mat(rf, pre + "self_attn.v_proj.weight", kvl, H);
    L.o = mat(rf, pre + "self_attn.o_proj.weight", H, ql);
    if (c.attention_bias) {
      L.q_bias = vec(rf, pre + "self_attn.q_proj.bias", ql);
      L.k_bias = vec(rf, pre + "self_attn.k_proj.bias", kvl);
      L.v_bias = vec(rf, pre + "self_attn.v_proj.bias", kvl);
    }
    L.gate = mat(rf, pre + "mlp.gate_proj.weight", Fl, H);
    L.up = mat(rf, pre + "mlp.up_proj.weight", Fl, H);
    L.down = mat(rf, pre + "mlp.down_proj.weight", H, Fl);
    L.input_norm = vec(sh, pre + "input_layernorm.weight", H);
    L.post_attention_norm = vec(sh, pre + "post_attention_layernorm.weight", H);
  }
  return s;
}

}  // namespace swiftspec::cpu
