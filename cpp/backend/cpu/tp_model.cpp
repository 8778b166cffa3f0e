// TpCpuModel: a Model whose layers run over the tensor-parallel ranks of a WorkerGroup.
#include "backend/cpu/tp_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backend/cpu/cpu_model.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/rope.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/tp_weights.h"
#include "backend/cpu/zero_pages.h"
#include "swiftspec/error.h"
#include "swiftspec/worker_group.h"

namespace swiftspec {
namespace {

std::string str(long long v) { return std::to_string(v); }

// One rank: its weights, thread pool, KV cache and activations.
struct RankState {
  cpu::TpRankShard w;
  std::unique_ptr<cpu::ThreadPool> pool;
  // [layers][slots][kv_heads_per_rank * head_dim]
  cpu::ZeroPages k_committed, v_committed, k_tree, v_tree;  // zero pages, resident once written
  std::vector<float> x, h, q, k, v, attn, proj, gate, up, logits;
};

class TpCpuModel final : public Model {
 public:
  TpCpuModel(const ModelConfig& config, const TpPlan& plan, std::vector<cpu::TpRankShard> shards,
             const ModelOptions& options, const TpCpuOptions& tp)
      : config_(config), options_(options), plan_(plan), rope_(config_) {
    options_.num_threads = tp.threads_per_rank;
    options_.cpu_affinity = tp.rank_cores.empty() ? std::vector<int>{} : tp.rank_cores[0];
    kv_local_ = plan_.kv_heads_per_rank * config_.head_dim;
    for (int r = 0; r < plan_.tp; ++r) {
      auto R = std::make_unique<RankState>();
      R->w = std::move(shards[r]);
      R->pool = std::make_unique<cpu::ThreadPool>(tp.threads_per_rank,
                                                  tp.rank_cores.empty() ? std::vector<int>{} : tp.rank_cores[r]);
      const size_t committed = size_t(config_.num_layers) * options_.max_context * kv_local_;
      const size_t tree = size_t(config_.num_layers) * options_.max_tree * kv_local_;
      R->k_committed = cpu::ZeroPages(committed);
      R->v_committed = cpu::ZeroPages(committed);
      R->k_tree = cpu::ZeroPages(tree);
      R->v_tree = cpu::ZeroPages(tree);
      ranks_.push_back(std::move(R));
    }
    group_ = std::make_unique<WorkerGroup>(plan_.tp, tp.rank_cores, std::vector<std::unique_ptr<Communicator>>{},
                                           "tp" + str(plan_.tp));
  }

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  std::string backend_name() const override { return "cpu"; }
  int prefill_chunk_tokens() const override { return kCpuPrefillChunkTokens; }
  int committed_len() const override { return committed_; }

  void run_forward(const ForwardBatch& b, std::vector<float>& logits) override {
    validate(b);
    const int committed_before = committed_;
    group_->run([&](int r) { rank_forward(r, b, committed_before, logits); });
    if (!b.is_tree()) committed_ = committed_before + static_cast<int>(b.tokens.size());
  }

  void commit_tree_slots(const std::vector<int32_t>& slots) override {
    if (committed_ + static_cast<int64_t>(slots.size()) > options_.max_context)
      throw InvalidArgument("commit_tree_slots: committing " + str(slots.size()) +
                            " entries would exceed the context of " + str(options_.max_context));
    for (int32_t s : slots) check_slot(s, "commit_tree_slots: slot");
    const int base = committed_;
    group_->run([&](int r) {
      RankState& R = *ranks_[r];
      for (int l = 0; l < config_.num_layers; ++l)
        for (size_t i = 0; i < slots.size(); ++i) {
          std::copy_n(tree_row(R.k_tree, l, slots[i]), kv_local_, committed_row(R.k_committed, l, base + int(i)));
          std::copy_n(tree_row(R.v_tree, l, slots[i]), kv_local_, committed_row(R.v_committed, l, base + int(i)));
        }
    });
    committed_ += static_cast<int>(slots.size());
  }

  void truncate_committed(int len) override {
    if (len < 0 || len > committed_)
      throw InvalidArgument("truncate_committed: len " + str(len) + " outside [0, " + str(committed_) + "]");
    committed_ = len;
  }

  void read_committed_kv(int layer, std::vector<float>& k, std::vector<float>& v) const override {
    check_layer(layer);
    std::vector<int32_t> rows(committed_);
    for (int i = 0; i < committed_; ++i) rows[i] = i;
    gather_kv(layer, rows, false, k, v);
  }
  void read_tree_kv(int layer, const std::vector<int32_t>& slots, std::vector<float>& k,
                    std::vector<float>& v) const override {
    check_layer(layer);
    for (int32_t s : slots) check_slot(s, "read_tree_kv slot");
    gather_kv(layer, slots, true, k, v);
  }

 private:
  float* committed_row(cpu::ZeroPages& buf, int layer, int pos) const {
    return buf.data() + (size_t(layer) * options_.max_context + pos) * kv_local_;
  }
  float* tree_row(cpu::ZeroPages& buf, int layer, int slot) const {
    return buf.data() + (size_t(layer) * options_.max_tree + slot) * kv_local_;
  }
  const float* committed_row(const cpu::ZeroPages& buf, int layer, int pos) const {
    return buf.data() + (size_t(layer) * options_.max_context + pos) * kv_local_;
  }
  const float* tree_row(const cpu::ZeroPages& buf, int layer, int slot) const {
    return buf.data() + (size_t(layer) * options_.max_tree + slot) * kv_local_;
  }

  // K/V of model KV head g for `rows` (committed positions or tree slots), in
  // the unsharded layout [rows, num_kv_heads, head_dim]: read from the first
  // rank holding a copy of head g.
  void gather_kv(int layer, const std::vector<int32_t>& rows, bool tree, std::vector<float>& k,
                 std::vector<float>& v) const {
    const int hd = config_.head_dim, nkv = config_.num_kv_heads;
    k.assign(rows.size() * nkv * hd, 0.0f);
    v.assign(rows.size() * nkv * hd, 0.0f);
    for (int g = 0; g < nkv; ++g) {
      int rank = -1, slot = -1;
      for (int r = 0; r < plan_.tp && rank < 0; ++r)
        for (int m = 0; m < plan_.kv_heads_per_rank; ++m)
          if (plan_.kv_heads[r][m] == g) {
            rank = r;
            slot = m;
            break;
          }
      const RankState& R = *ranks_[rank];
      for (size_t i = 0; i < rows.size(); ++i) {
        const float* ks = tree ? tree_row(R.k_tree, layer, rows[i]) : committed_row(R.k_committed, layer, rows[i]);
        const float* vs = tree ? tree_row(R.v_tree, layer, rows[i]) : committed_row(R.v_committed, layer, rows[i]);
        std::copy_n(ks + size_t(slot) * hd, hd, k.data() + (i * nkv + g) * hd);
        std::copy_n(vs + size_t(slot) * hd, hd, v.data() + (i * nkv + g) * hd);
      }
    }
  }

  void check_layer(int layer) const {
    if (layer < 0 || layer >= config_.num_layers)
      throw InvalidArgument("layer " + str(layer) + " outside [0, " + str(config_.num_layers) + ")");
  }
  void check_slot(int slot, const char* what) const {
    if (slot < 0 || slot >= options_.max_tree)
      throw InvalidArgument(std::string(what) + " " + str(slot) + " outside the tree KV [0, " + str(options_.max_tree) +
                            ")");
  }
  void validate(const ForwardBatch& b) const;
  void rank_forward(int r, const ForwardBatch& b, int committed_before, std::vector<float>& logits);
  void attention(int r, int layer, const ForwardBatch& b, int committed_before);

  ModelConfig config_;
  ModelOptions options_;
  TpPlan plan_;
  cpu::Rope rope_;
  int kv_local_ = 0;
  int committed_ = 0;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::vector<float> gathered_;         // rank 0: [tp, rows, vocab_per_rank]
  std::unique_ptr<WorkerGroup> group_;  // last: its threads stop before the ranks' state goes
};

// The same checks, with the same messages, as the single-rank CPU model.
void TpCpuModel::validate(const ForwardBatch& b) const {
  b.validate(config_.vocab_size, committed_, options_.max_context, options_.max_tree);
}

// Attention of rank r's query heads, the arithmetic of the single-rank CPU
// model: keys in order (committed prefix, then the tree ancestors), scores
// by cpu::dot, softmax in fp32, values accumulated by cpu::axpy.
void TpCpuModel::attention(int r, int layer, const ForwardBatch& b, int committed_before) {
  RankState& R = *ranks_[r];
  const int n = static_cast<int>(b.tokens.size());
  const int nh = plan_.q_heads_per_rank, hd = config_.head_dim, nkv = plan_.kv_heads_per_rank;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* kc = committed_row(R.k_committed, layer, 0);
  const float* vc = committed_row(R.v_committed, layer, 0);
  const float* kt = tree_row(R.k_tree, layer, 0);
  const float* vt = tree_row(R.v_tree, layer, 0);
  const std::vector<int>& q_to_kv = plan_.q_to_kv[r];
  const float* q = R.q.data();
  float* out = R.attn.data();

  R.pool->parallel_for(n * nh, [&](int t0, int t1) {
    std::vector<float> scores;
    for (int t = t0; t < t1; ++t) {
      const int i = t / nh, h = t % nh, g = q_to_kv[h];
      float* o = out + (size_t(i) * nh + h) * hd;
      if (g < 0) {  // padding head: contributes nothing
        std::fill(o, o + hd, 0.0f);
        continue;
      }
      const float* qv = q + (size_t(i) * nh + h) * hd;
      const cpu::AttendedKeys keys =
          cpu::row_keys(b, i, committed_before, options_, kc, vc, kt, vt, g, hd, size_t(nkv) * hd);
      cpu::attend_row(qv, hd, scale, keys, scores, o);
    }
  });
}

void TpCpuModel::rank_forward(int r, const ForwardBatch& b, int committed_before, std::vector<float>& logits) {
  RankState& R = *ranks_[r];
  Communicator& comm = group_->comm(r);
  cpu::ThreadPool& pool = *R.pool;
  const int n = static_cast<int>(b.tokens.size());
  const int H = config_.hidden_size, hd = config_.head_dim;
  const int nh = plan_.q_heads_per_rank, nkv = plan_.kv_heads_per_rank, F = plan_.ffn_per_rank;
  const int qd = nh * hd;
  R.x.resize(size_t(n) * H);
  R.h.resize(size_t(n) * H);
  R.q.resize(size_t(n) * qd);
  R.k.resize(size_t(n) * kv_local_);
  R.v.resize(size_t(n) * kv_local_);
  R.attn.resize(size_t(n) * qd);
  R.proj.resize(size_t(n) * H);
  R.gate.resize(size_t(n) * F);
  R.up.resize(size_t(n) * F);

  const size_t row_bytes = size_t(H) * dtype_size(R.w.embed.dtype);
  for (int i = 0; i < n; ++i)
    cpu::to_float(static_cast<const char*>(R.w.embed.data) + size_t(b.tokens[i]) * row_bytes, R.w.embed.dtype, H,
                  R.x.data() + size_t(i) * H);

  for (int l = 0; l < config_.num_layers; ++l) {
    const cpu::TpLayerShard& L = R.w.layers[l];
    cpu::rms_norm(R.x.data(), L.input_norm.data(), n, H, config_.rms_norm_eps, R.h.data());
    cpu::linear(R.h.data(), n, L.q, L.q_bias.empty() ? nullptr : L.q_bias.data(), R.q.data(), pool);
    cpu::linear(R.h.data(), n, L.k, L.k_bias.empty() ? nullptr : L.k_bias.data(), R.k.data(), pool);
    cpu::linear(R.h.data(), n, L.v, L.v_bias.empty() ? nullptr : L.v_bias.data(), R.v.data(), pool);
    for (int i = 0; i < n; ++i) {
      rope_.apply(R.q.data() + size_t(i) * qd, nh, b.positions[i]);
      rope_.apply(R.k.data() + size_t(i) * kv_local_, nkv, b.positions[i]);
      float* kdst =
          b.is_tree() ? tree_row(R.k_tree, l, b.tree_slots[i]) : committed_row(R.k_committed, l, committed_before + i);
      float* vdst =
          b.is_tree() ? tree_row(R.v_tree, l, b.tree_slots[i]) : committed_row(R.v_committed, l, committed_before + i);
      std::copy_n(R.k.data() + size_t(i) * kv_local_, kv_local_, kdst);
      std::copy_n(R.v.data() + size_t(i) * kv_local_, kv_local_, vdst);
    }
    attention(r, l, b, committed_before);
    cpu::linear(R.attn.data(), n, L.o, nullptr, R.proj.data(), pool);  // row-parallel: a partial sum
    comm.all_reduce_sum(R.proj.data(), R.proj.size());
    for (size_t j = 0; j < R.x.size(); ++j) R.x[j] += R.proj[j];

    cpu::rms_norm(R.x.data(), L.post_attention_norm.data(), n, H, config_.rms_norm_eps, R.h.data());
    cpu::linear(R.h.data(), n, L.gate, nullptr, R.gate.data(), pool);
    cpu::linear(R.h.data(), n, L.up, nullptr, R.up.data(), pool);
    for (size_t j = 0; j < R.gate.size(); ++j) {
      const float g = R.gate[j];
      R.gate[j] = (g / (1.0f + std::exp(-g))) * R.up[j];  // SwiGLU: silu(gate) * up
    }
    cpu::linear(R.gate.data(), n, L.down, nullptr, R.proj.data(), pool);  // row-parallel
    comm.all_reduce_sum(R.proj.data(), R.proj.size());
    for (size_t j = 0; j < R.x.size(); ++j) R.x[j] += R.proj[j];
  }

  if (b.logits == LogitsMode::None) {
    if (r == 0) logits.clear();
    return;
  }
  // Vocabulary-parallel LM head, gathered to rank 0.
  const int first = b.logits == LogitsMode::Last ? n - 1 : 0;
  const int rows = n - first;
  const int V = config_.vocab_size, vpr = plan_.vocab_per_rank;
  cpu::rms_norm(R.x.data() + size_t(first) * H, R.w.final_norm.data(), rows, H, config_.rms_norm_eps, R.h.data());
  R.logits.assign(size_t(rows) * vpr, 0.0f);  // [rows, this rank's slice] then padding
  cpu::linear(R.h.data(), rows, R.w.lm_head, nullptr, R.logits.data(), pool);
  if (r == 0) gathered_.resize(size_t(plan_.tp) * rows * vpr);
  comm.gather(R.logits.data(), r == 0 ? gathered_.data() : nullptr, size_t(rows) * vpr, 0);
  if (r != 0) return;
  logits.resize(size_t(rows) * V);
  for (int s = 0; s < plan_.tp; ++s) {
    const int v0 = plan_.vocab_bounds[s], w = plan_.vocab_bounds[s + 1] - v0;
    const float* src = gathered_.data() + size_t(s) * rows * vpr;
    for (int i = 0; i < rows; ++i) std::copy_n(src + size_t(i) * w, w, logits.data() + size_t(i) * V + v0);
  }
}

// (max_context is checked by resolve_max_context.)
void check_options(const ModelOptions& o, const TpCpuOptions& tp, int degree) {
  if (o.max_tree < 1) throw InvalidArgument("max_tree must be >= 1, got " + str(o.max_tree));
  if (degree < 1) throw InvalidArgument("tp (TP degree) must be >= 1, got " + str(degree));
  if (tp.threads_per_rank < 1) throw InvalidArgument("threads_per_rank must be >= 1, got " + str(tp.threads_per_rank));
  if (!tp.rank_cores.empty() && static_cast<int>(tp.rank_cores.size()) != degree)
    throw InvalidArgument("rank_cores lists " + str(tp.rank_cores.size()) + " ranks for TP degree " + str(degree));
  check_kv_window(o, "cpu");
}

}  // namespace

ModelMemory tp_cpu_model_memory(const std::string& dir, const ModelConfig& config, const TpPlan& plan,
                                const ModelOptions& options, bool sharded_at_load) {
  ModelMemory m;
  m.name = model_name_of(dir);
  m.origin = dir + "/config.json";
  m.trained = config.context_limit();
  const uint64_t files = checkpoint_weight_bytes(dir);
  m.needs.push_back(
      {"cpu", cpu_memory_need(config, options, sharded_at_load ? 2 * files : files, plan.tp * plan.kv_heads_per_rank)});
  return m;
}

std::unique_ptr<Model> make_tp_cpu_model(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& requested,
                                         const TpCpuOptions& tp) {
  if (!checkpoint) throw InvalidArgument("make_tp_cpu_model: checkpoint is null");
  check_options(requested, tp, tp.tp);
  // int4: FFN bounds on whole quantization groups, so down_proj's slices keep their groups.
  const int ffn_group = checkpoint->quantization().int4() ? checkpoint->quantization().group_size : 1;
  const TpPlan plan = TpPlan::make(checkpoint->config(), tp.tp, tp.ffn_align, ffn_group);
  const ModelOptions options = resolve_max_context(
      requested, tp_cpu_model_memory(checkpoint->dir(), checkpoint->config(), plan, requested, true));
  std::vector<cpu::TpRankShard> shards;
  for (int r = 0; r < tp.tp; ++r) shards.push_back(cpu::shard_checkpoint(checkpoint, plan, r));
  return std::make_unique<TpCpuModel>(checkpoint->config(), plan, std::move(shards), options, tp);
}

std::unique_ptr<Model> make_tp_cpu_model_from_shards(const std::string& dir, const ModelOptions& requested,
                                                     const TpCpuOptions& tp_in) {
  auto ckpt = cpu::ShardedCheckpoint::open(dir);
  TpCpuOptions tp = tp_in;
  if (tp.tp == 0) tp.tp = ckpt->plan().tp;
  if (tp.tp != ckpt->plan().tp)
    throw InvalidArgument(dir + " is sharded for TP degree " + str(ckpt->plan().tp) + ", not " + str(tp.tp) +
                          " (convert it again with --tp " + str(tp.tp) + ", or use the TP-1 folder)");
  check_options(requested, tp, tp.tp);
  const ModelOptions options =
      resolve_max_context(requested, tp_cpu_model_memory(dir, ckpt->config(), ckpt->plan(), requested, false));
  std::vector<cpu::TpRankShard> shards;
  for (int r = 0; r < tp.tp; ++r) shards.push_back(cpu::ShardedCheckpoint::load_rank(ckpt, r));
  return std::make_unique<TpCpuModel>(ckpt->config(), ckpt->plan(), std::move(shards), options, tp);
}

}  // namespace swiftspec
