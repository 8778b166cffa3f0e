// The tensor-parallel CUDA model (swiftspec_cuda/tp_cuda_model.h): rank
// shards cut by the CPU backend's TpPlan code (backend/cpu/tp_weights.h),
// handed to one CudaModel per GPU through the CUDA loader's weight lookup,
// and run together by a WorkerGroup.
#include "swiftspec_cuda/tp_cuda_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>

#include "backend/cpu/tp_weights.h"
#include "common.h"
#include "multigpu/peer_allreduce.h"
#include "multigpu/row_parallel_impl.h"
#include "step_desc.h"
#include "swiftspec/error.h"
#include "swiftspec/sm_partition.h"
#include "swiftspec/worker_group.h"
#include "swiftspec_cuda/cuda_model.h"

namespace swiftspec {
namespace {

std::string str(long long v) { return std::to_string(v); }

HostWeight host_matrix(const cpu::WeightMatrix& w) {
  HostWeight h;
  h.dtype = w.dtype;
  h.shape = {w.n, w.k};
  h.data = w.data;
  return h;
}

HostWeight host_vector(const std::vector<float>& v) {
  HostWeight h;
  h.dtype = DType::F32;
  h.shape = {static_cast<int64_t>(v.size())};
  h.data = v.data();
  return h;
}

/// Rank shard -> the CUDA loader's lookup (checkpoint tensor names). `lm_head`:
/// the full (unsharded) LM head, or empty data when it is tied to the embedding.
HostWeight shard_tensor(const cpu::TpRankShard& s, const cpu::WeightMatrix& lm_head, const std::string& name,
                        const std::vector<int64_t>& expected) {
  HostWeight w;
  bool found = true;
  if (name == "model.embed_tokens.weight")
    w = host_matrix(s.embed);
  else if (name == "model.norm.weight")
    w = host_vector(s.final_norm);
  else if (name == "lm_head.weight" && lm_head.data)
    w = host_matrix(lm_head);
  else if (name.rfind("model.layers.", 0) == 0) {
    const size_t dot = name.find('.', 13);
    const int l = std::stoi(name.substr(13, dot - 13));
    const std::string rest = name.substr(dot + 1);
    if (l < 0 || l >= static_cast<int>(s.layers.size()))
      found = false;
    else {
      const cpu::TpLayerShard& L = s.layers[l];
      if (rest == "self_attn.q_proj.weight")
        w = host_matrix(L.q);
      else if (rest == "self_attn.k_proj.weight")
        w = host_matrix(L.k);
      else if (rest == "self_attn.v_proj.weight")
        w = host_matrix(L.v);
      else if (rest == "self_attn.o_proj.weight")
        w = host_matrix(L.o);
      else if (rest == "mlp.gate_proj.weight")
        w = host_matrix(L.gate);
      else if (rest == "mlp.up_proj.weight")
        w = host_matrix(L.up);
      else if (rest == "mlp.down_proj.weight")
        w = host_matrix(L.down);
      else if (rest == "input_layernorm.weight")
        w = host_vector(L.input_norm);
      else if (rest == "post_attention_layernorm.weight")
        w = host_vector(L.post_attention_norm);
      else if (rest == "self_attn.q_proj.bias" && !L.q_bias.empty())
        w = host_vector(L.q_bias);
      else if (rest == "self_attn.k_proj.bias" && !L.k_bias.empty())
        w = host_vector(L.k_bias);
      else if (rest == "self_attn.v_proj.bias" && !L.v_bias.empty())
        w = host_vector(L.v_bias);
      else
        found = false;
    }
  } else {
    found = false;
  }
  if (!found) throw CheckpointError("TP rank " + str(s.rank) + ": no tensor '" + name + "' in its shard");
  if (w.shape != expected) {
    std::string got, want;
    for (int64_t d : w.shape) got += (got.empty() ? "" : ", ") + str(d);
    for (int64_t d : expected) want += (want.empty() ? "" : ", ") + str(d);
    throw CheckpointError("TP rank " + str(s.rank) + ": tensor '" + name + "' has shape [" + got +
                          "], the rank's "
                          "CUDA model expects [" +
                          want + "]");
  }
  return w;
}

bool shard_has(const cpu::TpRankShard& s, const cpu::WeightMatrix& lm_head, const std::string& name) {
  if (name == "lm_head.weight") return lm_head.data != nullptr;
  const size_t bias = name.find("_proj.bias");
  if (bias != std::string::npos) return !s.layers.empty() && !s.layers[0].q_bias.empty();
  return true;
}

/// The CUDA attention's GQA map (local query head j reads local KV head
/// j / (q_heads_per_rank / kv_heads_per_rank)) must be the plan's, with no
/// padding heads.
void check_plan(const ModelConfig& c, const TpPlan& plan) {
  const int tp = plan.tp;
  const auto fail = [&](const std::string& why) {
    throw InvalidArgument("tensor parallelism on the CUDA backend: TP degree " + str(tp) + " over " + str(c.num_heads) +
                          " query / " + str(c.num_kv_heads) + " KV heads " + why +
                          " (the CUDA attention needs the same query and KV heads per rank, no padding heads and "
                          "no replicated KV heads: use a TP degree dividing " +
                          str(c.num_kv_heads) + ")");
  };
  if (plan.q_heads_per_rank * tp != c.num_heads) fail("needs padding query heads");
  if (plan.kv_heads_per_rank * tp != c.num_kv_heads) fail("needs replicated or padding KV heads");
  const int group = plan.q_heads_per_rank / plan.kv_heads_per_rank;
  for (int r = 0; r < tp; ++r)
    for (int j = 0; j < plan.q_heads_per_rank; ++j)
      if (plan.q_to_kv[r][j] != j / group) fail("maps query heads to KV heads out of GQA order");
}

class TpCudaModel final : public Model {
 public:
  TpCudaModel(const ModelConfig& config, const TpPlan& plan, std::vector<cpu::TpRankShard> shards,
              const ModelOptions& options, const TpCudaOptions& tp)
      : config_(config), options_(options), plan_(plan), devices_(tp.devices) {
    // The factories below have checked the plan (check_plan) before cutting the shards.
    const int n = plan_.tp;
    rank_config_ = config_;
    rank_config_.num_heads = plan_.q_heads_per_rank;
    rank_config_.num_kv_heads = plan_.kv_heads_per_rank;
    rank_config_.intermediate_size = plan_.ffn_per_rank;
    // The LM head stays whole on every rank: the rank shards hold a vocabulary
    // slice each, so an untied head is put back together from them.
    cpu::WeightMatrix lm_head;
    if (!config_.tie_word_embeddings) {
      const size_t row = size_t(config_.hidden_size) * dtype_size(shards[0].lm_head.dtype);
      lm_head_.resize(size_t(config_.vocab_size) * row);
      for (int r = 0; r < n; ++r)
        std::memcpy(lm_head_.data() + size_t(plan_.vocab_bounds[r]) * row, shards[r].lm_head.data,
                    size_t(shards[r].lm_head.n) * row);
      lm_head = cpu::WeightMatrix{lm_head_.data(), shards[0].lm_head.dtype, config_.vocab_size, config_.hidden_size};
    }
    bool shared_gpu = false;
    for (int r = 0; r < n; ++r) shared_gpu |= std::count(devices_.begin(), devices_.end(), devices_[r]) > 1;
    if (shared_gpu && tp.all_reduce != TpAllReduce::PeerTwoKernel)
      throw InvalidArgument(
          "tensor parallelism on the CUDA backend: ranks sharing a GPU need the PeerTwoKernel "
          "all-reduce (the fused one needs every GEMM CTA resident at once)");
    std::vector<std::shared_ptr<cuda::RowParallel>> hooks(n);
    if (tp.all_reduce == TpAllReduce::Nccl) {
#if defined(SWIFTSPEC_HAVE_NCCL)
      comms_ = make_nccl_group(devices_);
      for (int r = 0; r < n; ++r) {
        cudaDeviceProp prop;
        SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, devices_[r]));
        hooks[r] = cuda::make_nccl_row_parallel(*comms_[r], config_.hidden_size, prop.multiProcessorCount);
      }
#else
      throw InvalidArgument(
          "tensor parallelism on the CUDA backend: the NCCL all-reduce was asked for, but this "
          "build has no NCCL (SWIFTSPEC_NCCL)");
#endif
    } else {
      peers_ = std::make_unique<cuda::PeerGroup>(devices_, size_t(cuda::kMaxStepTokens) * config_.hidden_size, 2);
      for (int r = 0; r < n; ++r) {
        cudaDeviceProp prop;
        SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, devices_[r]));
        hooks[r] = cuda::make_peer_row_parallel(
            *peers_, r, prop.multiProcessorCount,
            tp.all_reduce == TpAllReduce::PeerFused ? cuda::PeerRowMode::Fused : cuda::PeerRowMode::TwoKernel);
      }
    }
    group_ = std::make_unique<WorkerGroup>(n, std::vector<std::vector<int>>{},
                                           std::vector<std::unique_ptr<Communicator>>{}, "cuda-tp" + str(n));
    ranks_.resize(n);
    scratch_.resize(n);
    group_->run([&](int r) {
      ModelOptions o = options_;
      o.device = devices_[r];
      CudaModelOptions co;
      co.device = devices_[r];
      co.gemm_engine = gemm_engine_code(o.gemm_engine);
      co.row_parallel = hooks[r];
      const cpu::TpRankShard& s = shards[r];
      WeightLookup lookup = [&](const std::string& name, const std::vector<int64_t>& shape) {
        return shard_tensor(s, lm_head, name, shape);
      };
      WeightExists exists = [&](const std::string& name) { return shard_has(s, lm_head, name); };
      ranks_[r] = make_cuda_model_from_host(rank_config_, lookup, exists, o, co);
    });
    lm_head_.clear();
    lm_head_.shrink_to_fit();
  }

  ~TpCudaModel() override {
    group_.reset();  // stop the rank threads first
    ranks_.clear();  // then the models, before the peer group their hooks point into
  }

  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  std::string backend_name() const override { return "cuda"; }
  int committed_len() const override { return ranks_[0]->committed_len(); }

  void run_forward(const ForwardBatch& batch, std::vector<float>& logits) override {
    // Rank 0's logits are returned; the other ranks run the same layers (and
    // all-reduces) but skip the LM head: every rank would compute the same
    // logits, and GPU time of ranks 1..N-1 may be shared with a draft.
    ForwardBatch no_logits = batch;
    no_logits.logits = LogitsMode::None;
    run_ranks("forward", [&](int r) {
      if (r == 0)
        ranks_[0]->forward(batch, logits);
      else
        ranks_[r]->forward_argmax(no_logits, scratch_[r]);
    });
  }

  void commit_tree_slots(const std::vector<int32_t>& slots) override {
    run_ranks("commit_tree_slots", [&](int r) { ranks_[r]->commit_tree_slots(slots); });
  }

  void truncate_committed(int len) override {
    check_usable();
    for (auto& m : ranks_) m->truncate_committed(len);
  }

  void read_committed_kv(int layer, std::vector<float>& k, std::vector<float>& v) const override {
    gather_kv(layer, nullptr, k, v);
  }
  void read_tree_kv(int layer, const std::vector<int32_t>& slots, std::vector<float>& k,
                    std::vector<float>& v) const override {
    gather_kv(layer, &slots, k, v);
  }

 private:
  // fn(rank) on every rank at once. A failure that every rank raised before
  // launching (validation: they all see the same request and state) leaves the
  // model usable; any other failure may have left a rank's step half run and
  // its peers waiting on the GPU, so the model refuses later calls.
  void run_ranks(const char* what, const std::function<void(int)>& fn) {
    check_usable();
    const int before = ranks_[0]->committed_len();
    try {
      group_->run(fn);
    } catch (const InvalidArgument&) {
      for (auto& m : ranks_)
        if (m->committed_len() != before) {
          failure_ = std::string(what) + " failed on some ranks after others had run";
          throw;
        }
      throw;  // raised by every rank before launching: the model is unchanged
    } catch (const std::exception& e) {
      failure_ = std::string(what) + ": " + e.what();
      throw;
    }
  }
  void check_usable() const {
    if (!failure_.empty())
      throw InvalidArgument("the tensor-parallel CUDA model is unusable after an earlier failure (" + failure_ +
                            "): its ranks may have been left mid-step; load it again");
  }

  // Every rank's KV heads put back in the model's layout [rows, num_kv_heads, head_dim].
  void gather_kv(int layer, const std::vector<int32_t>* slots, std::vector<float>& k, std::vector<float>& v) const {
    const int hd = config_.head_dim, nkv = config_.num_kv_heads, kpr = plan_.kv_heads_per_rank;
    std::vector<float> rk, rv;
    for (int r = 0; r < plan_.tp; ++r) {
      if (r == 0) check_usable();
      if (slots)
        ranks_[r]->read_tree_kv(layer, *slots, rk, rv);
      else
        ranks_[r]->read_committed_kv(layer, rk, rv);
      const size_t rows = rk.size() / (size_t(kpr) * hd);
      if (r == 0) {
        k.assign(rows * nkv * hd, 0.0f);
        v.assign(rows * nkv * hd, 0.0f);
      }
      for (size_t i = 0; i < rows; ++i)
        for (int m = 0; m < kpr; ++m) {
          const int g = plan_.kv_heads[r][m];
          std::copy_n(rk.data() + (i * kpr + m) * hd, hd, k.data() + (i * nkv + g) * hd);
          std::copy_n(rv.data() + (i * kpr + m) * hd, hd, v.data() + (i * nkv + g) * hd);
        }
    }
  }

  ModelConfig config_, rank_config_;
  ModelOptions options_;
  TpPlan plan_;
  std::vector<int> devices_;
  std::vector<uint8_t> lm_head_;  // the untied LM head while loading
  std::unique_ptr<cuda::PeerGroup> peers_;
#if defined(SWIFTSPEC_HAVE_NCCL)
  std::vector<std::unique_ptr<CudaCommunicator>> comms_;
#endif
  std::vector<std::unique_ptr<CudaModel>> ranks_;
  std::vector<std::vector<int32_t>> scratch_;  // ranks 1..N-1: forward_argmax's (empty) output
  std::string failure_;                        // set once a step failed part-way: the model is unusable
  std::unique_ptr<WorkerGroup> group_;
};

void check_options(const ModelOptions& o, const TpCudaOptions& tp) {
  if (tp.devices.size() < 2)
    throw InvalidArgument("tensor parallelism on the CUDA backend needs >= 2 devices, got " + str(tp.devices.size()));
  int count = 0;
  SS_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int d : tp.devices)
    if (d < 0 || d >= count)
      throw InvalidArgument("device " + str(d) + " does not exist (this machine has " + str(count) + " GPUs)");
  if (has_sm_partition(o.sm_first, o.sm_count))
    throw InvalidArgument("sm_partition is not supported with tensor parallelism on the CUDA backend");
  if (o.stream_priority != 0)
    throw InvalidArgument("stream_priority is not supported with tensor parallelism on the CUDA backend");
  if (o.megakernel) throw InvalidArgument("megakernel: not available with tensor parallelism (tp > 1)");
  if (o.max_context < 1 || o.max_tree < 1) throw InvalidArgument("max_context and max_tree must be >= 1");
  check_kv_window(o, "cuda");
}

}  // namespace

std::unique_ptr<Model> make_tp_cuda_model(std::shared_ptr<const Checkpoint> checkpoint, const ModelOptions& options,
                                          const TpCudaOptions& tp) {
  if (!checkpoint) throw InvalidArgument("make_tp_cuda_model: checkpoint is null");
  check_options(options, tp);
  const int n = static_cast<int>(tp.devices.size());
  if (checkpoint->quantization().int4())
    throw InvalidArgument("make_tp_cuda_model: " + int4_backend_problem("cuda", options.megakernel, n));
  const TpPlan plan = TpPlan::make(checkpoint->config(), n);
  check_plan(checkpoint->config(), plan);
  std::vector<cpu::TpRankShard> shards;
  for (int r = 0; r < n; ++r) shards.push_back(cpu::shard_checkpoint(checkpoint, plan, r));
  return std::make_unique<TpCudaModel>(checkpoint->config(), plan, std::move(shards), options, tp);
}

std::unique_ptr<Model> make_tp_cuda_model_from_shards(const std::string& dir, const ModelOptions& options,
                                                      const TpCudaOptions& tp) {
  auto ckpt = cpu::ShardedCheckpoint::open(dir);
  const int n = static_cast<int>(tp.devices.size());
  if (ckpt->plan().tp != n)
    throw InvalidArgument(dir + " is sharded for TP degree " + str(ckpt->plan().tp) + ", not " + str(n) +
                          " (convert it again with --tp " + str(n) + ", or use the TP-1 folder)");
  check_options(options, tp);
  check_plan(ckpt->config(), ckpt->plan());
  std::vector<cpu::TpRankShard> shards;
  for (int r = 0; r < n; ++r) shards.push_back(cpu::ShardedCheckpoint::load_rank(ckpt, r));
  return std::make_unique<TpCudaModel>(ckpt->config(), ckpt->plan(), std::move(shards), options, tp);
}

}  // namespace swiftspec
