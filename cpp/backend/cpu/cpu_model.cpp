#include "backend/cpu/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

#include "backend/cpu/int4_weights.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/rope.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/zero_pages.h"
#include "swiftspec/error.h"

namespace swiftspec {
namespace {

using cpu::WeightMatrix;

struct Layer {
  WeightMatrix q, k, v, o, gate, up, down;
  std::vector<float> q_bias, k_bias, v_bias;  // empty without attention bias
  std::vector<float> input_norm, post_attention_norm;
};

class CpuModel final : public Model {
 public:
  CpuModel(std::shared_ptr<const Checkpoint> ckpt, const ModelOptions& options)
      : ckpt_(std::move(ckpt)),
        config_(ckpt_->config()),
        options_(options),
        pool_(options.num_threads, options.cpu_affinity),
        rope_(config_) {
    if (ckpt_->dtype() != DType::F32 && ckpt_->dtype() != DType::BF16)
      throw CheckpointError(ckpt_->dir() + ": the CPU backend reads float32, bfloat16 or int4 weights, not " +
                            dtype_name(ckpt_->dtype()));
    const int64_t H = config_.hidden_size, I = config_.intermediate_size;
    const int64_t qd = int64_t(config_.num_heads) * config_.head_dim;
    const int64_t kvd = int64_t(config_.num_kv_heads) * config_.head_dim;
    embed_ = matrix("model.embed_tokens.weight", config_.vocab_size, H);
    lm_head_ = config_.tie_word_embeddings ? embed_ : matrix("lm_head.weight", config_.vocab_size, H);
    final_norm_ = vec("model.norm.weight", H);
    layers_.resize(config_.num_layers);
    for (int l = 0; l < config_.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Layer& L = layers_[l];
      L.q = projection(p + "self_attn.q_proj", qd, H);
      L.k = projection(p + "self_attn.k_proj", kvd, H);
      L.v = projection(p + "self_attn.v_proj", kvd, H);
      L.o = projection(p + "self_attn.o_proj", H, qd);
      if (config_.attention_bias) {
        L.q_bias = vec(p + "self_attn.q_proj.bias", qd);
        L.k_bias = vec(p + "self_attn.k_proj.bias", kvd);
        L.v_bias = vec(p + "self_attn.v_proj.bias", kvd);
      }
      L.gate = projection(p + "mlp.gate_proj", I, H);
      L.up = projection(p + "mlp.up_proj", I, H);
      L.down = projection(p + "mlp.down_proj", H, I);
      L.input_norm = vec(p + "input_layernorm.weight", H);
      L.post_attention_norm = vec(p + "post_attention_layernorm.weight", H);
    }
    kv_dim_ = static_cast<int>(kvd);
    const size_t per_layer_committed = size_t(options_.max_context) * kv_dim_;
    const size_t per_layer_tree = size_t(options_.max_tree) * kv_dim_;
    // Zero pages that cost memory only once written (zero_pages.h): loading does not touch the
    // cache, whose size follows max_context.
    k_committed_ = cpu::ZeroPages(per_layer_committed * config_.num_layers);
    v_committed_ = cpu::ZeroPages(per_layer_committed * config_.num_layers);
    k_tree_ = cpu::ZeroPages(per_layer_tree * config_.num_layers);
    v_tree_ = cpu::ZeroPages(per_layer_tree * config_.num_layers);
  }

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  std::string backend_name() const override { return "cpu"; }
  int prefill_chunk_tokens() const override { return kCpuPrefillChunkTokens; }
  int committed_len() const override { return committed_; }

  void run_forward(const ForwardBatch& batch, std::vector<float>& logits) override;
  void commit_tree_slots(const std::vector<int32_t>& tree_slots) override;
  void truncate_committed(int len) override {
    if (len < 0 || len > committed_)
      throw InvalidArgument("truncate_committed: len " + std::to_string(len) + " outside [0, " +
                            std::to_string(committed_) + "]");
    committed_ = len;
  }
  void read_committed_kv(int layer, std::vector<float>& k, std::vector<float>& v) const override {
    check_layer(layer);
    const size_t n = size_t(committed_) * kv_dim_;
    k.assign(k_layer_committed(layer), k_layer_committed(layer) + n);
    v.assign(v_layer_committed(layer), v_layer_committed(layer) + n);
  }
  void read_tree_kv(int layer, const std::vector<int32_t>& slots, std::vector<float>& k,
                    std::vector<float>& v) const override {
    check_layer(layer);
    k.resize(slots.size() * kv_dim_);
    v.resize(slots.size() * kv_dim_);
    for (size_t i = 0; i < slots.size(); ++i) {
      check_slot(slots[i], "read_tree_kv slot");
      std::copy_n(k_layer_tree(layer) + size_t(slots[i]) * kv_dim_, kv_dim_, k.data() + i * kv_dim_);
      std::copy_n(v_layer_tree(layer) + size_t(slots[i]) * kv_dim_, kv_dim_, v.data() + i * kv_dim_);
    }
  }

 private:
  WeightMatrix matrix(const std::string& name, int64_t n, int64_t k) const {
    const TensorView& t = ckpt_->tensor(name, {n, k});
    return WeightMatrix{t.data, t.dtype, static_cast<int>(n), static_cast<int>(k)};
  }
  // A linear projection `prefix` (".weight" in a float checkpoint; ".qweight", ".scales",
  // ".zeros" in an int4 one). The embedding and the LM head stay float (matrix()).
  WeightMatrix projection(const std::string& prefix, int64_t n, int64_t k) const {
    if (ckpt_->quantization().int4()) return cpu::load_int4_matrix(*ckpt_, prefix, n, k);
    return matrix(prefix + ".weight", n, k);
  }
  std::vector<float> vec(const std::string& name, int64_t n) const {
    const TensorView& t = ckpt_->tensor(name, {n});
    std::vector<float> out(n);
    cpu::to_float(t.data, t.dtype, n, out.data());
    return out;
  }
  void check_layer(int layer) const {
    if (layer < 0 || layer >= config_.num_layers)
      throw InvalidArgument("layer " + std::to_string(layer) + " outside [0, " + std::to_string(config_.num_layers) +
                            ")");
  }
  void check_slot(int slot, const char* what) const {
    if (slot < 0 || slot >= options_.max_tree)
      throw InvalidArgument(std::string(what) + " " + std::to_string(slot) + " outside the tree KV [0, " +
                            std::to_string(options_.max_tree) + ")");
  }
  void validate(const ForwardBatch& b) const;

  float* k_layer_committed(int l) { return k_committed_.data() + size_t(l) * options_.max_context * kv_dim_; }
  float* v_layer_committed(int l) { return v_committed_.data() + size_t(l) * options_.max_context * kv_dim_; }
  float* k_layer_tree(int l) { return k_tree_.data() + size_t(l) * options_.max_tree * kv_dim_; }
  float* v_layer_tree(int l) { return v_tree_.data() + size_t(l) * options_.max_tree * kv_dim_; }
  const float* k_layer_committed(int l) const { return const_cast<CpuModel*>(this)->k_layer_committed(l); }
  const float* v_layer_committed(int l) const { return const_cast<CpuModel*>(this)->v_layer_committed(l); }
  const float* k_layer_tree(int l) const { return const_cast<CpuModel*>(this)->k_layer_tree(l); }
  const float* v_layer_tree(int l) const { return const_cast<CpuModel*>(this)->v_layer_tree(l); }

  void attention(int layer, const ForwardBatch& b, int committed_before, const float* q, float* out);

  std::shared_ptr<const Checkpoint> ckpt_;
  ModelConfig config_;
  ModelOptions options_;
  cpu::ThreadPool pool_;
  cpu::Rope rope_;
  WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  int kv_dim_ = 0;
  int committed_ = 0;
  cpu::ZeroPages k_committed_, v_committed_, k_tree_, v_tree_;  ///< [layers][slots][kv_heads * head_dim] fp32
};

void CpuModel::validate(const ForwardBatch& b) const {
  b.validate(config_.vocab_size, committed_, options_.max_context, options_.max_tree);
}

void CpuModel::attention(int layer, const ForwardBatch& b, int committed_before, const float* q, float* out) {
  const int n = static_cast<int>(b.tokens.size());
  const int nh = config_.num_heads, hd = config_.head_dim;
  const int group = config_.num_heads / config_.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* kc = k_layer_committed(layer);
  const float* vc = v_layer_committed(layer);
  const float* kt = k_layer_tree(layer);
  const float* vt = v_layer_tree(layer);

  pool_.parallel_for(n * nh, [&](int t0, int t1) {
    std::vector<float> scores;
    for (int t = t0; t < t1; ++t) {
      const int i = t / nh, h = t % nh, g = h / group;
      const float* qv = q + (size_t(i) * nh + h) * hd;
      float* o = out + (size_t(i) * nh + h) * hd;
      // Keys in order: the committed prefix, then (tree mode) the ancestors; under a window, the
      // sinks and recent keys of that sequence.
      const cpu::AttendedKeys keys =
          cpu::row_keys(b, i, committed_before, options_, kc, vc, kt, vt, g, hd, size_t(config_.num_kv_heads) * hd);
      cpu::attend_row(qv, hd, scale, keys, scores, o);
    }
  });
}

void CpuModel::run_forward(const ForwardBatch& b, std::vector<float>& logits) {
  validate(b);
  const int n = static_cast<int>(b.tokens.size());
  const int H = config_.hidden_size, I = config_.intermediate_size;
  const int nh = config_.num_heads, nkv = config_.num_kv_heads, hd = config_.head_dim;
  const int qd = nh * hd;

  std::vector<float> x(size_t(n) * H), h(size_t(n) * H), q(size_t(n) * qd), k(size_t(n) * kv_dim_),
      v(size_t(n) * kv_dim_), attn(size_t(n) * qd), proj(size_t(n) * H), gate(size_t(n) * I), up(size_t(n) * I);

  for (int i = 0; i < n; ++i) {
    const size_t row_bytes = size_t(H) * dtype_size(embed_.dtype);
    cpu::to_float(static_cast<const char*>(embed_.data) + size_t(b.tokens[i]) * row_bytes, embed_.dtype, H,
                  x.data() + size_t(i) * H);
  }

  const int committed_before = committed_;
  for (int l = 0; l < config_.num_layers; ++l) {
    Layer& L = layers_[l];
    cpu::rms_norm(x.data(), L.input_norm.data(), n, H, config_.rms_norm_eps, h.data());
    cpu::linear(h.data(), n, L.q, L.q_bias.empty() ? nullptr : L.q_bias.data(), q.data(), pool_);
    cpu::linear(h.data(), n, L.k, L.k_bias.empty() ? nullptr : L.k_bias.data(), k.data(), pool_);
    cpu::linear(h.data(), n, L.v, L.v_bias.empty() ? nullptr : L.v_bias.data(), v.data(), pool_);
    for (int i = 0; i < n; ++i) {
      rope_.apply(q.data() + size_t(i) * qd, nh, b.positions[i]);
      rope_.apply(k.data() + size_t(i) * kv_dim_, nkv, b.positions[i]);
      float* kdst = b.is_tree() ? k_layer_tree(l) + size_t(b.tree_slots[i]) * kv_dim_
                                : k_layer_committed(l) + size_t(committed_before + i) * kv_dim_;
      float* vdst = b.is_tree() ? v_layer_tree(l) + size_t(b.tree_slots[i]) * kv_dim_
                                : v_layer_committed(l) + size_t(committed_before + i) * kv_dim_;
      std::copy_n(k.data() + size_t(i) * kv_dim_, kv_dim_, kdst);
      std::copy_n(v.data() + size_t(i) * kv_dim_, kv_dim_, vdst);
    }
    attention(l, b, committed_before, q.data(), attn.data());
    cpu::linear(attn.data(), n, L.o, nullptr, proj.data(), pool_);
    for (size_t j = 0; j < x.size(); ++j) x[j] += proj[j];

    cpu::rms_norm(x.data(), L.post_attention_norm.data(), n, H, config_.rms_norm_eps, h.data());
    cpu::linear(h.data(), n, L.gate, nullptr, gate.data(), pool_);
    cpu::linear(h.data(), n, L.up, nullptr, up.data(), pool_);
    for (size_t j = 0; j < gate.size(); ++j) {
      const float g = gate[j];
      gate[j] = (g / (1.0f + std::exp(-g))) * up[j];  // SwiGLU: silu(gate) * up
    }
    cpu::linear(gate.data(), n, L.down, nullptr, proj.data(), pool_);
    for (size_t j = 0; j < x.size(); ++j) x[j] += proj[j];
  }
  if (!b.is_tree()) committed_ = committed_before + n;

  if (b.logits == LogitsMode::None) {
    logits.clear();
    return;
  }
  const int first = b.logits == LogitsMode::Last ? n - 1 : 0;
  const int rows = n - first;
  cpu::rms_norm(x.data() + size_t(first) * H, final_norm_.data(), rows, H, config_.rms_norm_eps, h.data());
  logits.resize(size_t(rows) * config_.vocab_size);
  cpu::linear(h.data(), rows, lm_head_, nullptr, logits.data(), pool_);
}

void CpuModel::commit_tree_slots(const std::vector<int32_t>& tree_slots) {
  if (committed_ + static_cast<int64_t>(tree_slots.size()) > options_.max_context)
    throw InvalidArgument("commit_tree_slots: committing " + std::to_string(tree_slots.size()) +
                          " entries would exceed the context of " + std::to_string(options_.max_context));
  for (int32_t s : tree_slots) check_slot(s, "commit_tree_slots: slot");
  for (int l = 0; l < config_.num_layers; ++l) {
    for (size_t i = 0; i < tree_slots.size(); ++i) {
      std::copy_n(k_layer_tree(l) + size_t(tree_slots[i]) * kv_dim_, kv_dim_,
                  k_layer_committed(l) + size_t(committed_ + i) * kv_dim_);
      std::copy_n(v_layer_tree(l) + size_t(tree_slots[i]) * kv_dim_, kv_dim_,
                  v_layer_committed(l) + size_t(committed_ + i) * kv_dim_);
    }
  }
  committed_ += static_cast<int>(tree_slots.size());
}

}  // namespace

MemoryNeed cpu_memory_need(const ModelConfig& c, const ModelOptions& o, uint64_t weight_bytes, int kv_heads_stored) {
  const uint64_t f = sizeof(float);
  const uint64_t kv_heads = kv_heads_stored > 0 ? kv_heads_stored : c.num_kv_heads;
  const uint64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, L = c.num_layers;
  const uint64_t qd = uint64_t(c.num_heads) * c.head_dim, kvd = uint64_t(c.num_kv_heads) * c.head_dim;
  const uint64_t kv_row = 2 * L * kv_heads * c.head_dim * f;  // K and V of one slot, every layer
  const unsigned hw = std::thread::hardware_concurrency();
  const uint64_t threads = o.num_threads > 0 ? o.num_threads : (hw > 0 ? hw : 1);
  // The largest pass: a prefill chunk or a whole tree of max_tree nodes.
  const uint64_t rows = std::max<uint64_t>(kCpuPrefillChunkTokens, std::max(o.max_tree, 0));
  MemoryNeed n;
  n.weight_bytes = weight_bytes;
  n.kv_bytes_per_token = kv_row;
  n.kv_fixed_bytes = kv_row * std::max(o.max_tree, 0);
  // run_forward's activations (x, h, q, k, v, attn, proj, gate, up), its logits and the copy
  // forward_top_k keeps of them, [rows, vocab] each; the norms and biases converted to fp32.
  n.workspace_bytes = rows * (3 * H + 2 * qd + 2 * kvd + 2 * I) * f + 2 * rows * V * f + L * (2 * H + qd + 2 * kvd) * f;
  // attention(): each worker thread's scores over the keys a row attends.
  n.workspace_bytes_per_token = threads * f;
  return n;
}

std::unique_ptr<Model> make_cpu_model(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options) {
  return std::make_unique<CpuModel>(std::move(checkpoint), options);
}

}  // namespace swiftspec
