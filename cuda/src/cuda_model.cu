// The CUDA model (cuda_model.h): weights and KV cache on one GPU, the step
// pipeline of fused kernels, CUDA graphs per bucket, and the Model interface.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "device_memory.h"
#include "graph_cache.h"
#include "green_context.h"
#include "step_choice.h"
#include "kernels/decode_megakernel.h"
#include "kernels/epilogues.h"
#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"
#include "row_parallel.h"
#include "step_desc.h"
#include "tma_map.h"
#include "weight_layout.h"

namespace swiftspec {
namespace cuda {

namespace {

constexpr int kRows = kMaxStepTokens;  // activation buffers hold this many token rows

float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

size_t dtype_bytes(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    default: return 0;
  }
}

SrcType src_type(DType dt, const std::string& name) {
  switch (dt) {
    case DType::F32: return SrcType::F32;
    case DType::BF16: return SrcType::BF16;
    case DType::F16: return SrcType::F16;
    default: throw CheckpointError("tensor " + name + ": dtype must be F32, BF16 or F16 for the CUDA backend");
  }
}

std::vector<float> host_to_float(const HostWeight& w, const std::string& name) {
  size_t n = 1;
  for (int64_t d : w.shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  const unsigned char* p = static_cast<const unsigned char*>(w.data);
  for (size_t i = 0; i < n; ++i) {
    switch (w.dtype) {
      case DType::F32: std::memcpy(&out[i], p + 4 * i, 4); break;
      case DType::BF16: {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = bf16_bits_to_float(b);
        break;
      }
      case DType::F16: {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = f16_bits_to_float(b);
        break;
      }
      default: throw CheckpointError("tensor " + name + ": dtype must be F32, BF16 or F16 for the CUDA backend");
    }
  }
  return out;
}

/// True when the environment variable `name` is set to "1".
bool env_flag(const char* name) {
  const char* e = std::getenv(name);
  return e && std::string(e) == "1";
}

int bucket_nt(int n) {
  if (n <= 8) return 1;
  if (n <= 16) return 2;
  if (n <= 32) return 4;
  return 8;
}


/// What every entry point of the model makes current: its GPU (the caller's
/// thread may be on another one: a draft on GPU 1 and a target on GPU 0 run
/// in their own worker threads) and, with an SM partition, its green context.
struct ModelScope {
  ModelScope(int device, const GreenContext* green) : device(device), green(green) {}
  ModelScope(int device, const GreenContext* green, std::nothrow_t)
      : device(device, std::nothrow), green(green, std::nothrow) {}
  DeviceScope device;
  GreenScope green;
};

}  // namespace

class CudaModelImpl final : public CudaModel {
 public:
  CudaModelImpl(const ModelConfig& cfg, const ModelOptions& opt, const CudaModelOptions& copt)
      : cfg_(cfg), opt_(opt), copt_(copt), pdl_(copt.use_pdl) {
    if (const char* tune = std::getenv("SWIFTSPEC_STEP_TUNE")) {
      const std::string v(tune);
      if (v == "0") copt_.autotune = false;
      else if (!v.empty() && v != "1")
        throw InvalidArgument("SWIFTSPEC_STEP_TUNE must be 0 (no step tuning) or 1, got '" + v + "'");
    }
    check_config();
    DeviceScope device_scope(copt_.device);  // the caller's thread gets its device back afterwards
    cudaDeviceProp prop;
    SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, copt_.device));
    if (prop.major < 9)
      throw CudaError("the CUDA backend needs compute capability 9.0 (Hopper); device " +
                      std::to_string(copt_.device) + " (" + prop.name + ") is " +
                      std::to_string(prop.major) + "." + std::to_string(prop.minor));
    num_sms_ = prop.multiProcessorCount;
    // One-GPU disaggregation (SwiftSpec §4): with an SM partition, the stream
    // (and so every kernel, graph and copy of this model) lives in a green
    // context over those SMs, and the GEMM planner sizes persistent grids
    // for them (plan_gemm runs with the green context current: the occupancy
    // API then counts the partition's SMs). Events are made in the same
    // context as the stream (cuEventRecord requires it).
    if (has_sm_partition(copt_.sm_first, copt_.sm_count)) {
      green_ = std::make_unique<GreenContext>(copt_.device, copt_.sm_first, copt_.sm_count);
      num_sms_ = green_->sm_count();
    }
    // The megakernel's plan first: a shape it cannot run is refused before any
    // stream, event or buffer exists (nothing to leak).
    if (copt_.megakernel) plan_megakernel();
    ModelScope scope(copt_.device, green_.get());
    if (green_) stream_ = green_->create_stream(copt_.stream_priority);
    else SS_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, copt_.stream_priority));
    for (auto& e : desc_ev_) SS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    SS_CUDA_CHECK(cudaEventCreateWithFlags(&commit_ev_, cudaEventDisableTiming));
    allocate_state();
    if (copt_.megakernel) setup_megakernel();
  }

  ~CudaModelImpl() override {
    ModelScope scope(copt_.device, green_.get(), std::nothrow);  // the stream and events belong to the green context
    graphs_.clear();
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& e : desc_ev_)
      if (e) cudaEventDestroy(e);
    if (commit_ev_) cudaEventDestroy(commit_ev_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  /// Tunes every token bucket now (autotune), so that no request pays for it:
  /// tuned lazily, a bucket's first step took ~0.3-1 s, and in the real-pair
  /// benchmark the first requests of a configuration dropped to a quarter of
  /// their speed (run 18). Each bucket is timed on a synthetic step of its
  /// size over a committed context of up to 512 keys: a single-token decode
  /// for bucket 1 (a tree of 8 with the megakernel, which takes the decode
  /// steps), trees of 16 / 32 / 64 nodes (forks along chains, as drafts grow)
  /// for the others, or a prefill piece where max_tree is smaller. Only the
  /// timing matters, not the values the KV cache holds; the step writes tree
  /// slots or slots past the committed length and commits nothing.
  void tune_all_buckets() {
    if (!copt_.use_graphs) return;
    ModelScope scope(copt_.device, green_.get());
    struct RestoreCommitted {  // the synthetic steps borrow committed_; give it back whatever happens
      int& ref;
      int saved;
      ~RestoreCommitted() { ref = saved; }
    } restore{committed_, committed_};
    if (mk_ && copt_.autotune && copt_.megakernel_slot_bytes == 0 && !copt_.row_parallel && opt_.max_context >= 2) {
      // The megakernel's ring: a greedy decode step (arg-max, no logits) after up to 512 keys.
      committed_ = std::min(512, opt_.max_context - 1);
      ForwardBatch b;
      b.logits = LogitsMode::Last;
      b.tokens.push_back(0);
      b.positions.push_back(committed_);
      upload_synthetic_step(b);
      tune_megakernel(LogitsMode::Last, false);
    }
    for (int nt : {1, 2, 4, 8}) {
      if (!needs_tuning(nt)) continue;
      const int n = nt == 1 ? (mk_ ? 8 : 1) : 8 * nt;
      const bool tree = n > 1 && n <= opt_.max_tree;
      committed_ = std::max(0, std::min(512, opt_.max_context - n));
      ForwardBatch b;
      b.logits = LogitsMode::All;
      std::vector<int> depth(n, 0), parent(n, -1);
      for (int i = 0; i < n; ++i) {
        b.tokens.push_back(0);
        if (!tree) {
          b.positions.push_back(committed_ + i);
          continue;
        }
        parent[i] = i == 0 ? -1 : (i % 4 == 0 ? i / 2 : i - 1);
        depth[i] = i == 0 ? 0 : depth[parent[i]] + 1;
        b.positions.push_back(committed_ + depth[i]);
        b.tree_slots.push_back(i);
      }
      if (tree) {
        b.attend_offsets.push_back(0);
        for (int i = 0; i < n; ++i) {
          std::vector<int> chain;
          for (int j = i; j >= 0; j = parent[j]) chain.push_back(j);
          b.attend_slots.insert(b.attend_slots.end(), chain.rbegin(), chain.rend());
          b.attend_offsets.push_back(static_cast<int>(b.attend_slots.size()));
        }
      }
      if (committed_ + (tree ? 0 : n) > opt_.max_context) continue;
      upload_synthetic_step(b);
      run_step(nt, LogitsMode::All, false);
    }
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  /// The descriptor of tune_all_buckets' synthetic step `b` onto the device.
  void upload_synthetic_step(const ForwardBatch& b) {
    validate(b);
    auto d = std::make_unique<StepDesc>();  // ~17 KB: not on the stack
    const int na = fill_desc(*d, b, 0, static_cast<int>(b.tokens.size()));
    forget_logits_rows();  // the step rewrites logits_ / keys_
    upload_desc(*d, na);
  }

  // ---------------------------------------------------------------- loading
  void load_host(const WeightLookup& lookup, const WeightExists& exists) {
    ModelScope scope(copt_.device, green_.get());
    const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
    const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
    const int64_t V = cfg_.vocab_size;
    DeviceBuffer perm_qkv = upload_ints(qkv_row_permutation(cfg_.num_heads, cfg_.num_kv_heads, hd, cfg_.rope_style));
    DeviceBuffer perm_gu = upload_ints(gate_up_row_permutation(I));
    const std::vector<int> qkv_perm_host = qkv_row_permutation(cfg_.num_heads, cfg_.num_kv_heads, hd, cfg_.rope_style);

    for (int l = 0; l < cfg_.num_layers; ++l) {
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      Layer& L = layers_[l];
      // QKV: [q; k; v] in source dtype, then permute + fold input_layernorm.
      {
        const HostWeight q = lookup(pre + "self_attn.q_proj.weight", {nq, H});
        const HostWeight k = lookup(pre + "self_attn.k_proj.weight", {nkv, H});
        const HostWeight v = lookup(pre + "self_attn.v_proj.weight", {nkv, H});
        if (q.dtype != k.dtype || q.dtype != v.dtype)
          throw CheckpointError(pre + "self_attn: q/k/v projections must share one dtype");
        const HostWeight g = lookup(pre + "input_layernorm.weight", {H});
        upload_concat({&q, &k, &v}, pre + "self_attn.q_proj.weight");
        DeviceBuffer gamma = upload_floats(host_to_float(g, pre + "input_layernorm.weight"));
        launch_weight_transform(scratch_.get(), src_type(q.dtype, pre + "q_proj"), L.qkv.as<__nv_bfloat16>(),
                                nq + 2 * nkv, H, perm_qkv.as<int>(), gamma.as<float>(), stream_);
        SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
        const bool has_bias = cfg_.attention_bias || exists(pre + "self_attn.q_proj.bias");
        if (has_bias) {
          std::vector<float> cat;
          for (const char* nm : {"q", "k", "v"}) {
            const std::string name = pre + "self_attn." + nm + "_proj.bias";
            const HostWeight b = lookup(name, {std::string(nm) == "q" ? nq : nkv});
            const std::vector<float> f = host_to_float(b, name);
            cat.insert(cat.end(), f.begin(), f.end());
          }
          std::vector<float> perm(cat.size());
          for (size_t r = 0; r < perm.size(); ++r) perm[r] = cat[qkv_perm_host[r]];
          L.qkv_bias = upload_floats(perm);
        }
      }
      {
        const HostWeight o = lookup(pre + "self_attn.o_proj.weight", {H, nq});
        upload_concat({&o}, pre + "self_attn.o_proj.weight");
        launch_weight_transform(scratch_.get(), src_type(o.dtype, pre + "o_proj"), L.o.as<__nv_bfloat16>(), H, nq,
                                nullptr, nullptr, stream_);
        SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
      {
        const HostWeight gt = lookup(pre + "mlp.gate_proj.weight", {I, H});
        const HostWeight up = lookup(pre + "mlp.up_proj.weight", {I, H});
        if (gt.dtype != up.dtype) throw CheckpointError(pre + "mlp: gate/up projections must share one dtype");
        const HostWeight g = lookup(pre + "post_attention_layernorm.weight", {H});
        upload_concat({&gt, &up}, pre + "mlp.gate_proj.weight");
        DeviceBuffer gamma = upload_floats(host_to_float(g, pre + "post_attention_layernorm.weight"));
        launch_weight_transform(scratch_.get(), src_type(gt.dtype, pre + "gate_proj"), L.gu.as<__nv_bfloat16>(), 2 * I,
                                H, perm_gu.as<int>(), gamma.as<float>(), stream_);
        SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
      {
        const HostWeight d = lookup(pre + "mlp.down_proj.weight", {H, I});
        upload_concat({&d}, pre + "mlp.down_proj.weight");
        launch_weight_transform(scratch_.get(), src_type(d.dtype, pre + "down_proj"), L.down.as<__nv_bfloat16>(), H,
                                I, nullptr, nullptr, stream_);
        SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
    }
    const HostWeight emb = lookup("model.embed_tokens.weight", {V, H});
    upload_concat({&emb}, "model.embed_tokens.weight");
    launch_weight_transform(scratch_.get(), src_type(emb.dtype, "embed_tokens"), embed_.as<__nv_bfloat16>(),
                            static_cast<int>(V), H, nullptr, nullptr, stream_);
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const HostWeight gn = lookup("model.norm.weight", {H});
    DeviceBuffer gamma = upload_floats(host_to_float(gn, "model.norm.weight"));
    const bool separate_head = !cfg_.tie_word_embeddings && exists("lm_head.weight");
    const HostWeight head = separate_head ? lookup("lm_head.weight", {V, H}) : emb;
    upload_concat({&head}, separate_head ? "lm_head.weight" : "model.embed_tokens.weight");
    launch_weight_transform(scratch_.get(), src_type(head.dtype, "lm_head"), lm_.as<__nv_bfloat16>(),
                            static_cast<int>(V), H, nullptr, gamma.as<float>(), stream_);
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    scratch_.release();
    upload_megakernel_layers();
  }

  void init_random(uint64_t seed) {
    ModelScope scope(copt_.device, green_.get());
    const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
    const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
    uint64_t s = seed * 1000003ull + 17;
    auto fill = [&](DeviceBuffer& b, size_t count, int K) {
      launch_fill_random_bf16(b.as<__nv_bfloat16>(), count, 1.0f / std::sqrt(static_cast<float>(K)), s++, stream_);
    };
    for (Layer& L : layers_) {
      fill(L.qkv, static_cast<size_t>(nq + 2 * nkv) * H, H);
      if (L.qkv_bias) launch_fill_random_f32(L.qkv_bias.as<float>(), nq + 2 * nkv, 0.1f, s++, stream_);
      fill(L.o, static_cast<size_t>(H) * nq, nq);
      fill(L.gu, static_cast<size_t>(2) * I * H, H);
      fill(L.down, static_cast<size_t>(H) * I, I);
    }
    launch_fill_random_bf16(embed_.as<__nv_bfloat16>(), static_cast<size_t>(cfg_.vocab_size) * H, 1.0f, s++, stream_);
    fill(lm_, static_cast<size_t>(vocab_rows_) * H, H);
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    scratch_.release();
    upload_megakernel_layers();
  }

  // ---------------------------------------------------------------- Model
  const ModelConfig& config() const override { return cfg_; }
  const ModelOptions& options() const override { return opt_; }
  std::string backend_name() const override { return "cuda"; }
  int committed_len() const override { return committed_; }

  void run_forward(const ForwardBatch& batch, std::vector<float>& logits) override {
    ModelScope scope(copt_.device, green_.get());
    RowSink sink;
    sink.logits = &logits;
    run(batch, sink);
  }

  void forward_argmax(const ForwardBatch& batch, std::vector<int32_t>& argmax) override {
    ModelScope scope(copt_.device, green_.get());
    argmax.clear();
    for (unsigned long long key : run_argmax_keys(batch)) argmax.push_back(checked_key_index(key));
  }

  void forward_top_k(const ForwardBatch& batch, int k, bool with_log_normalizer, TopKLogits& out,
                     double inv_temperature = 1.0) override {
    const int vocab = cfg_.vocab_size;
    check_top_k(k, vocab, "forward_top_k");
    check_inv_temperature(inv_temperature, "forward_top_k");
    // What the GPU selection does not take, or the A/B of the host path: the default (rows to the host).
    if (top_k_on_host_ || !logits_top_k_supported(k, vocab)) {
      Model::forward_top_k(batch, k, with_log_normalizer, out, inv_temperature);
      return;
    }
    ModelScope scope(copt_.device, green_.get());
    out = TopKLogits{};
    out.k = k;
    out.inv_temperature = inv_temperature;
    if (k == 1 && !with_log_normalizer) {
      // The arg-max the LM head's epilogue already keyed: no logits written at all.
      for (unsigned long long key : run_argmax_keys(batch)) {
        out.ids.push_back(checked_key_index(key));
        out.logits.push_back(key_value(key));
      }
      note_no_logits_kept();  // read_logits_row then says so, as after the default's k = 1 pass
      return;
    }
    RowSink sink;
    sink.top = &out;
    sink.k = k;
    sink.log_normalizer = with_log_normalizer;
    sink.inv_temperature = inv_temperature;
    run(batch, sink);
  }

  void read_logits_row(int row, std::vector<float>& out) override {
    // The last forward_top_k took the host path (or forgot everything): the default's rows.
    if (!device_rows_kept_) {
      Model::read_logits_row(row, out);
      return;
    }
    if (row < 0 || row >= device_rows_total_)
      throw InvalidArgument("read_logits_row: row " + std::to_string(row) + " is outside [0, rows=" +
                            std::to_string(device_rows_total_) + ") of the last forward_top_k");
    const int first = device_rows_total_ - device_rows_in_buffer_;  // rows of the pass's last piece
    if (row < first)
      throw InvalidArgument("read_logits_row: row " + std::to_string(row) + " of the last forward_top_k was overwritten "
                            "by a later piece of the same pass (the device keeps its last " +
                            std::to_string(device_rows_in_buffer_) + " rows: a pass runs in pieces of " +
                            std::to_string(kMaxStepTokens) + " tokens)");
    ModelScope scope(copt_.device, green_.get());
    const size_t V = static_cast<size_t>(cfg_.vocab_size);
    out.resize(V);
    // run() synchronised the stream after the pass: logits_ holds its last piece's rows.
    SS_CUDA_CHECK(cudaMemcpyAsync(logits_host_.as<void>(), logits_.as<float>() + static_cast<size_t>(row - first) * V,
                                  sizeof(float) * V, cudaMemcpyDeviceToHost, stream_));
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(out.data(), logits_host_.as<void>(), sizeof(float) * V);
  }

  void commit_tree_slots(const std::vector<int32_t>& slots) override {
    const int n = static_cast<int>(slots.size());
    if (n == 0) return;
    if (committed_ + n > opt_.max_context)
      throw InvalidArgument("commit_tree_slots: committing " + std::to_string(n) + " slots to " +
                            std::to_string(committed_) + " committed entries exceeds max_context " +
                            std::to_string(opt_.max_context));
    ModelScope scope(copt_.device, green_.get());
    SS_CUDA_CHECK(cudaEventSynchronize(commit_ev_));
    int* h = commit_host_.as<int>();
    for (int i = 0; i < n; ++i) {
      if (slots[i] < 0 || slots[i] >= opt_.max_tree)
        throw InvalidArgument("commit_tree_slots: tree_slots[" + std::to_string(i) + "] = " +
                              std::to_string(slots[i]) + " is outside [0, max_tree=" +
                              std::to_string(opt_.max_tree) + ")");
      h[i] = opt_.max_context + slots[i];
    }
    SS_CUDA_CHECK(cudaMemcpyAsync(commit_idx_.get(), h, sizeof(int) * n, cudaMemcpyHostToDevice, stream_));
    SS_CUDA_CHECK(cudaEventRecord(commit_ev_, stream_));
    launch_kv_copy(kcache_.as<__nv_bfloat16>(), vcache_.as<__nv_bfloat16>(), cfg_.num_layers,
                   cfg_.num_kv_heads, slots_, cfg_.head_dim, commit_idx_.as<int>(), n, committed_, stream_);
    committed_ += n;
  }

  void truncate_committed(int len) override {
    if (len < 0 || len > committed_)
      throw InvalidArgument("truncate_committed: len " + std::to_string(len) + " is outside [0, committed_len=" +
                            std::to_string(committed_) + "]");
    committed_ = len;
  }

  void read_committed_kv(int layer, std::vector<float>& k, std::vector<float>& v) const override {
    std::vector<int> idx(committed_);
    for (int i = 0; i < committed_; ++i) idx[i] = i;
    read_kv(layer, idx, k, v);
  }

  void read_tree_kv(int layer, const std::vector<int32_t>& slots, std::vector<float>& k,
                    std::vector<float>& v) const override {
    std::vector<int> idx(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0 || slots[i] >= opt_.max_tree)
        throw InvalidArgument("read_tree_kv: slots[" + std::to_string(i) + "] = " + std::to_string(slots[i]) +
                              " is outside [0, max_tree=" + std::to_string(opt_.max_tree) + ")");
      idx[i] = opt_.max_context + slots[i];
    }
    read_kv(layer, idx, k, v);
  }

  // ---------------------------------------------------------------- CudaModel extras
  void debug_fill_committed_random(int len, uint64_t seed) override {
    if (len < 0 || len > opt_.max_context)
      throw InvalidArgument("debug_fill_committed_random: len " + std::to_string(len) +
                            " is outside [0, max_context]");
    ModelScope scope(copt_.device, green_.get());
    launch_kv_fill_random(kcache_.as<__nv_bfloat16>(), vcache_.as<__nv_bfloat16>(), cfg_.num_layers,
                          cfg_.num_kv_heads, slots_, cfg_.head_dim, len, seed, stream_);
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    committed_ = len;
  }

  int debug_prepare(const ForwardBatch& batch, bool write_logits) override {
    validate(batch);
    const int n = static_cast<int>(batch.tokens.size());
    if (n > kMaxStepTokens)
      throw InvalidArgument("debug_prepare: at most " + std::to_string(kMaxStepTokens) + " tokens");
    Prepared p;
    p.desc = std::make_unique<StepDesc>();
    p.n_attend = fill_desc(*p.desc, batch, 0, n);
    p.nt = bucket_nt(n);
    p.mode = batch.logits;
    p.write_logits = write_logits && batch.logits != LogitsMode::None;
    p.megakernel = mk_ && n == 1;
    prepared_.push_back(std::move(p));
    return static_cast<int>(prepared_.size()) - 1;
  }

  double debug_replay_ms(int id, int iters) override {
    if (id < 0 || id >= static_cast<int>(prepared_.size())) throw InvalidArgument("debug_replay_ms: bad step id");
    const Prepared& p = prepared_[id];
    ModelScope scope(copt_.device, green_.get());
    forget_logits_rows();  // the replayed steps rewrite logits_
    upload_desc(*p.desc, p.n_attend);
    auto step = [&] {
      if (p.megakernel) run_megakernel_step(p.mode, p.write_logits);
      else run_step(p.nt, p.mode, p.write_logits);
    };
    for (int i = 0; i < 3; ++i) step();
    std::vector<cudaEvent_t> ev(2 * iters);
    for (auto& e : ev) SS_CUDA_CHECK(cudaEventCreate(&e));
    for (int i = 0; i < iters; ++i) {
      SS_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream_));
      step();
      SS_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream_));
    }
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> ms(iters);
    for (int i = 0; i < iters; ++i) SS_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    for (auto& e : ev) cudaEventDestroy(e);
    std::sort(ms.begin(), ms.end());
    return ms[iters / 2];
  }

  void debug_poison_buffers() override {
    ModelScope scope(copt_.device, green_.get());
    forget_logits_rows();
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto* b : {&h32_, &h16_, &ssq_, &q_, &attn_, &act_, &logits_, &part_o_, &part_ml_, &mk_part_o_, &mk_part_ml_})
      if (b->bytes() > 0) SS_CUDA_CHECK(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), stream_));
    const size_t row = sizeof(__nv_bfloat16) * static_cast<size_t>(cfg_.head_dim);
    const size_t pitch = row * slots_;
    const size_t height = static_cast<size_t>(cfg_.num_layers) * cfg_.num_kv_heads;
    for (auto* b : {&kcache_, &vcache_})
      if (height > 0) SS_CUDA_CHECK(cudaMemset2DAsync(b->as<unsigned char>() + row * committed_, pitch, 0xFF,
                                      row * (slots_ - committed_), height, stream_));
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void debug_read_activations(const std::string& which, int rows, std::vector<float>& out) override {
    if (rows < 1 || rows > kRows) throw InvalidArgument("debug_read_activations: rows must be 1..64");
    ModelScope scope(copt_.device, green_.get());
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const int H = cfg_.hidden_size, nq = cfg_.num_heads * cfg_.head_dim, I = cfg_.intermediate_size;
    const DeviceBuffer* b = nullptr;
    int cols = 0;
    bool is_bf16 = true;
    if (which == "h32") { b = &h32_; cols = H; is_bf16 = false; }
    else if (which == "ssq") { b = &ssq_; cols = H / 16; is_bf16 = false; }
    else if (which == "q") { b = &q_; cols = nq; }
    else if (which == "attn") { b = &attn_; cols = nq; }
    else if (which == "act") { b = &act_; cols = I; }
    else throw InvalidArgument("debug_read_activations: unknown buffer '" + which + "'");
    const size_t n = static_cast<size_t>(rows) * cols;
    out.resize(n);
    if (is_bf16) {
      std::vector<uint16_t> tmp(n);
      SS_CUDA_CHECK(cudaMemcpy(tmp.data(), b->get(), n * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(tmp[i]);
    } else {
      SS_CUDA_CHECK(cudaMemcpy(out.data(), b->get(), n * 4, cudaMemcpyDeviceToHost));
    }
  }

  void debug_read_weight(const std::string& which, int layer, std::vector<float>& out) override {
    ModelScope scope(copt_.device, green_.get());
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const DeviceBuffer* b = nullptr;
    if (which == "embed") b = &embed_;
    else if (which == "lm") b = &lm_;
    else {
      if (layer < 0 || layer >= cfg_.num_layers) throw InvalidArgument("debug_read_weight: bad layer");
      const Layer& L = layers_[layer];
      if (which == "qkv") b = &L.qkv;
      else if (which == "o") b = &L.o;
      else if (which == "gate_up") b = &L.gu;
      else if (which == "down") b = &L.down;
      else throw InvalidArgument("debug_read_weight: unknown weight '" + which + "'");
    }
    std::vector<uint16_t> tmp(b->bytes() / 2);
    SS_CUDA_CHECK(cudaMemcpy(tmp.data(), b->get(), b->bytes(), cudaMemcpyDeviceToHost));
    out.resize(tmp.size());
    for (size_t i = 0; i < tmp.size(); ++i) out[i] = bf16_bits_to_float(tmp[i]);
  }

  int debug_attention_trace(std::vector<unsigned long long>& stamps) override {
    if (!attn_trace_) throw InvalidArgument("debug_attention_trace: the model was made without attention_trace");
    ModelScope scope(copt_.device, green_.get());
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    stamps.resize(attn_trace_.bytes() / sizeof(unsigned long long));
    SS_CUDA_CHECK(cudaMemcpy(stamps.data(), attn_trace_.get(), attn_trace_.bytes(), cudaMemcpyDeviceToHost));
    SS_CUDA_CHECK(cudaMemset(attn_trace_.get(), 0, attn_trace_.bytes()));  // the next read sees only later steps
    return cfg_.num_kv_heads;
  }

  int debug_megakernel_trace(std::vector<unsigned long long>& stamps) override {
    if (!mk_trace_) throw InvalidArgument("debug_megakernel_trace: the model was made without megakernel_trace");
    ModelScope scope(copt_.device, green_.get());
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    stamps.resize(mk_trace_.bytes() / sizeof(unsigned long long));
    SS_CUDA_CHECK(cudaMemcpy(stamps.data(), mk_trace_.get(), mk_trace_.bytes(), cudaMemcpyDeviceToHost));
    return mk_plan_.ctas;
  }

  size_t weight_bytes_per_step() const override {
    size_t b = 0;
    for (const Layer& L : layers_) b += L.qkv.bytes() + L.qkv_bias.bytes() + L.o.bytes() + L.gu.bytes() + L.down.bytes();
    b += lm_.bytes();
    b += static_cast<size_t>(cfg_.hidden_size) * 2;  // one embedding row
    return b;
  }

  int num_sms() const override { return num_sms_; }

  std::string debug_step_tuning() const override { return tuning_log_; }

  std::string debug_gemm_plans() const override {
    std::string out;
    for (const auto& [key, c] : plans_) {
      const int kind = key / 16;
      out += std::string(kind >= 0 && kind < kStepKernels ? step_kernel_name(kind) : "?") + " nt=" +
             std::to_string(key % 16) + " S=" + std::to_string(c.S) + " BR=" + std::to_string(c.BR) +
             " stages=" + std::to_string(c.stages) + " grid=" + std::to_string(c.grid_x) + "x" + std::to_string(c.S) +
             " ctas=" + std::to_string(c.grid_x * c.S) + "\n";
    }
    if (mk_)
      out += "megakernel ctas=" + std::to_string(mk_plan_.ctas) + " slots=" + std::to_string(mk_plan_.num_slots) +
             "x" + std::to_string(mk_plan_.slot_bytes) + " smem=" + std::to_string(mk_plan_.smem_bytes) +
             " max_splits=" + std::to_string(mk_plan_.max_splits) + " head_keys=" + std::to_string(mk_plan_.head_keys) +
             " head_parts=" + std::to_string(mk_plan_.head_parts) +
             " max_inflight=" + std::to_string(mk_plan_.max_inflight) +
             " release_hold=" + std::to_string(mk_plan_.release_hold) +
             " hold_until_input=" + std::to_string(mk_plan_.hold_until_input) +
             " attn_short=" + std::to_string(mk_plan_.attn_short) +
             " attn_prewait=" + std::to_string(mk_plan_.attn_prewait) +
             " merge_in_o=" + std::to_string(mk_plan_.merge_in_o) +
             " l2_prefetch_bytes=" + std::to_string(mk_plan_.l2_prefetch_bytes) + " cooperative\n";
    return out;
  }

  std::vector<int> debug_probe_sm_ids(int ctas) override {
    ModelScope scope(copt_.device, green_.get());
    return probe_sm_ids(stream_, ctas);
  }

 private:
  struct Layer {
    DeviceBuffer qkv, qkv_bias, o, gu, down;
  };
  struct Prepared {
    std::unique_ptr<StepDesc> desc;
    int n_attend = 0;
    int nt = 1;
    LogitsMode mode = LogitsMode::Last;
    bool write_logits = true;
    bool megakernel = false;  ///< a single-token step of a model with the megakernel
  };

  /// K/V of cache indices `idx` of `layer` as fp32 [idx.size(), kv_heads, head_dim].
  void read_kv(int layer, const std::vector<int>& idx, std::vector<float>& k, std::vector<float>& v) const {
    if (layer < 0 || layer >= cfg_.num_layers)
      throw InvalidArgument("read_kv: layer " + std::to_string(layer) + " is outside [0, num_layers=" +
                            std::to_string(cfg_.num_layers) + ")");
    ModelScope scope(copt_.device, green_.get());
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const int KVH = cfg_.num_kv_heads, hd = cfg_.head_dim;
    const size_t kv_layer = static_cast<size_t>(KVH) * slots_ * hd;
    std::vector<uint16_t> hk(static_cast<size_t>(KVH) * slots_ * hd), hv(hk.size());
    SS_CUDA_CHECK(cudaMemcpy(hk.data(), kcache_.as<__nv_bfloat16>() + kv_layer * layer, hk.size() * 2,
                             cudaMemcpyDeviceToHost));
    SS_CUDA_CHECK(cudaMemcpy(hv.data(), vcache_.as<__nv_bfloat16>() + kv_layer * layer, hv.size() * 2,
                             cudaMemcpyDeviceToHost));
    k.assign(idx.size() * KVH * hd, 0.f);
    v.assign(k.size(), 0.f);
    for (size_t i = 0; i < idx.size(); ++i)
      for (int h = 0; h < KVH; ++h)
        for (int d = 0; d < hd; ++d) {
          const size_t src = (static_cast<size_t>(h) * slots_ + idx[i]) * hd + d;
          const size_t dst = (i * KVH + h) * hd + d;
          k[dst] = bf16_bits_to_float(hk[src]);
          v[dst] = bf16_bits_to_float(hv[src]);
        }
  }

  void check_config() const {
    const auto bad = [](const std::string& m) { throw InvalidArgument("CUDA backend: " + m); };
    if (cfg_.hidden_size <= 0 || cfg_.hidden_size % 16) bad("hidden_size must be a positive multiple of 16");
    if (cfg_.intermediate_size <= 0 || cfg_.intermediate_size % 8) bad("intermediate_size must be a positive multiple of 8");
    if (cfg_.head_dim != 64 && cfg_.head_dim != 128) bad("head_dim must be 64 or 128");
    if (cfg_.num_heads <= 0 || cfg_.num_kv_heads <= 0 || cfg_.num_heads % cfg_.num_kv_heads)
      bad("num_heads must be a positive multiple of num_kv_heads");
    if (cfg_.num_heads / cfg_.num_kv_heads > 16) bad("at most 16 query heads per KV head");
    if (cfg_.vocab_size <= 0 || cfg_.num_layers < 0) bad("vocab_size must be positive and num_layers >= 0");
    if (opt_.max_context <= 0 || opt_.max_tree <= 0) bad("max_context and max_tree must be positive");
    if (copt_.gemm_engine < -1 || copt_.gemm_engine > 1) bad("gemm_engine must be -1 (default), 0 (mma) or 1 (wgmma)");
    if (copt_.megakernel && copt_.row_parallel)
      throw InvalidArgument("decode megakernel: not available with tensor parallelism (row_parallel)");
  }

  void allocate_state() {
    const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
    const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
    vocab_rows_ = (cfg_.vocab_size + 15) / 16 * 16;
    layers_.resize(cfg_.num_layers);
    for (Layer& L : layers_) {
      L.qkv.allocate(sizeof(__nv_bfloat16) * static_cast<size_t>(nq + 2 * nkv) * H);
      if (cfg_.attention_bias) L.qkv_bias.allocate(sizeof(float) * (nq + 2 * nkv));
      L.o.allocate(sizeof(__nv_bfloat16) * static_cast<size_t>(H) * nq);
      L.gu.allocate(sizeof(__nv_bfloat16) * static_cast<size_t>(2) * I * H);
      L.down.allocate(sizeof(__nv_bfloat16) * static_cast<size_t>(H) * I);
    }
    embed_.allocate(sizeof(__nv_bfloat16) * static_cast<size_t>(cfg_.vocab_size) * H);
    lm_.allocate(sizeof(__nv_bfloat16) * static_cast<size_t>(vocab_rows_) * H);
    SS_CUDA_CHECK(cudaMemset(lm_.get(), 0, lm_.bytes()));  // padding rows stay zero

    slots_ = opt_.max_context + opt_.max_tree;
    const size_t kv = sizeof(__nv_bfloat16) * static_cast<size_t>(cfg_.num_layers) * cfg_.num_kv_heads * slots_ * hd;
    kcache_.allocate(kv);
    vcache_.allocate(kv);
    SS_CUDA_CHECK(cudaMemset(kcache_.get(), 0, kv));
    SS_CUDA_CHECK(cudaMemset(vcache_.get(), 0, kv));

    h32_.allocate(sizeof(float) * kRows * H);
    h16_.allocate(sizeof(__nv_bfloat16) * kRows * H);
    ssq_.allocate(sizeof(float) * kRows * (H / 16));
    q_.allocate(sizeof(__nv_bfloat16) * kRows * nq);
    attn_.allocate(sizeof(__nv_bfloat16) * kRows * nq);
    act_.allocate(sizeof(__nv_bfloat16) * kRows * I);
    logits_.allocate(sizeof(float) * kRows * static_cast<size_t>(cfg_.vocab_size));
    keys_.allocate(sizeof(unsigned long long) * kRows);
    top_part_keys_.allocate(sizeof(unsigned long long) * kRows * kTopKSegments * kTopKMax);
    top_part_ms_.allocate(sizeof(double2) * kRows * kTopKSegments);
    top_part_nan_.allocate(sizeof(int) * kRows * kTopKSegments);
    top_scratch_ = {top_part_keys_.as<unsigned long long>(), top_part_ms_.as<double2>(), top_part_nan_.as<int>()};
    top_rows_.allocate(sizeof(TopKRow) * kRows);
    top_host_.allocate(sizeof(TopKRow) * kRows);
    max_chunks_ = (slots_ + kAttnChunk - 1) / kAttnChunk;
    part_o_.allocate(sizeof(float) * static_cast<size_t>(kRows) * cfg_.num_heads * max_chunks_ * hd);
    if (copt_.attention_trace) {
      attn_trace_.allocate(sizeof(unsigned long long) * attn_trace_per_layer() * cfg_.num_layers);
      SS_CUDA_CHECK(cudaMemset(attn_trace_.get(), 0, attn_trace_.bytes()));
    }
    part_ml_.allocate(sizeof(float2) * static_cast<size_t>(kRows) * cfg_.num_heads * max_chunks_);
    counters_.allocate(sizeof(int) * cfg_.num_kv_heads * kMaxStepTokens);
    desc_.allocate(sizeof(StepDesc));
    commit_idx_.allocate(sizeof(int) * opt_.max_tree);
    for (auto* b : {&h32_, &h16_, &ssq_, &q_, &attn_, &act_, &logits_, &keys_, &counters_, &desc_})
      SS_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
    inv_freq_ = upload_floats(rope_inv_freq(cfg_));
    for (auto& d : desc_host_) d.allocate(sizeof(StepDesc));
    logits_host_.allocate(sizeof(float) * kRows * static_cast<size_t>(cfg_.vocab_size));
    keys_host_.allocate(sizeof(unsigned long long) * kRows);
    commit_host_.allocate(sizeof(int) * opt_.max_tree);
    SS_CUDA_CHECK(cudaDeviceSynchronize());
  }

  /// The decode megakernel's shape and plan (CudaModelOptions::megakernel);
  /// throws InvalidArgument for a shape it cannot run.
  void plan_megakernel() {
    MegaShape ms;
    ms.hidden = cfg_.hidden_size;
    ms.intermediate = cfg_.intermediate_size;
    ms.num_heads = cfg_.num_heads;
    ms.num_kv_heads = cfg_.num_kv_heads;
    ms.head_dim = cfg_.head_dim;
    ms.vocab = cfg_.vocab_size;
    ms.vocab_rows = (cfg_.vocab_size + 15) / 16 * 16;
    ms.num_layers = cfg_.num_layers;
    ms.slots = opt_.max_context + opt_.max_tree;
    ms.max_context = opt_.max_context;
    ms.neox = cfg_.rope_style == RopeStyle::NeoX ? 1 : 0;
    ms.eps = cfg_.rms_norm_eps;
    SS_CUDA_CHECK(cudaDeviceGetAttribute(&mk_max_smem_, cudaDevAttrMaxSharedMemoryPerBlockOptin, copt_.device));
    mk_shape_ = ms;
    mk_plan_ = plan_decode_megakernel(ms, num_sms_, mk_max_smem_, megakernel_tuning(copt_.megakernel_slot_bytes));
  }

  /// CudaModelOptions' megakernel knobs, with ring slots of `slot_bytes`.
  MegaTuning megakernel_tuning(int slot_bytes) const {
    MegaTuning tune;
    tune.head_keys = copt_.megakernel_head_keys;
    tune.head_parts = copt_.megakernel_head_parts;
    tune.max_inflight = copt_.megakernel_max_inflight;
    tune.release_hold = copt_.megakernel_release_hold;
    tune.hold_until_input = copt_.megakernel_hold_until_input;
    tune.attn_short = copt_.megakernel_attn_short;
    tune.attn_prewait = copt_.megakernel_attn_prewait;
    tune.merge_in_o = copt_.megakernel_merge_in_o;
    tune.l2_prefetch_bytes = copt_.megakernel_l2_prefetch_bytes;
    tune.slot_bytes = slot_bytes;
    return tune;
  }

  /// Ring slot sizes the megakernel's tuner times besides the plan's default
  /// (32 KB). Run 21 (H200, 512 keys, one call): 53760 B 0.717 vs 0.743 ms at
  /// the 0.5B shape, 35840 B 1.309 vs 1.349 at the 1.5B (two 17.5 KB down
  /// rows per slot instead of one), the 8B no faster (4.193 / 4.447 vs 4.195).
  /// Run 22's sweep (call 7): 40960 B at the 0.5B 0.596 vs 0.611 ms (53760).
  static constexpr int kMegakernelSlotOptions[] = {35840, 40960, 53760};

  /// Chooses the megakernel's ring slot size by timing (autotune, unless
  /// CudaModelOptions::megakernel_slot_bytes fixes it) on the step whose
  /// descriptor is uploaded: the default plan and each slot option that fits
  /// (a slot holds whole rows, the ring at least two), as step_tuner.h
  /// chooses a layered step's settings. The slot size changes only how rows
  /// are grouped into copies, never a row's arithmetic, so every candidate
  /// gives the same bits (autotune_verify checks it). Leaves the winner as
  /// the step's graph and plan; a failed candidate keeps the default plan.
  void tune_megakernel(LogitsMode mode, bool write_logits) {
    std::vector<MegaPlan> plans{mk_plan_};
    std::vector<std::string> names{"default"};
    for (int sb : kMegakernelSlotOptions) {
      if (sb <= mk_plan_.slot_bytes) continue;
      try {
        plans.push_back(plan_decode_megakernel(mk_shape_, num_sms_, mk_max_smem_, megakernel_tuning(sb)));
        names.push_back(std::to_string(sb));
      } catch (const InvalidArgument&) {
        // a slot shorter than a weight row, or a ring of fewer than two slots: not a candidate
      }
    }
    if (plans.size() < 2) return;
    const MegaPlan keep = mk_plan_;
    const int key = megakernel_graph_key(mode, write_logits);
    try {
      for (const MegaPlan& pl : plans) configure_decode_megakernel(pl);  // outside any capture
      cudaGraphExec_t best = nullptr;
      const StepTuning t = tune_step(
          stream_, {TunerKnob{"mk.slot_bytes", names}}, {},
          [&](const StepSetting& s) {
            mk_plan_ = plans[s[0]];
            return capture_graph(stream_, [&](cudaStream_t st) { record_megakernel_step(st, mode, write_logits); });
          },
          &best, 5, 0.01, tuner_outputs(1));
      mk_plan_ = plans[t.chosen[0]];
      graphs_.put(key, best);
      tuning_log_ += "megakernel: " + t.summary() + "\n";
    } catch (const CudaError& e) {
      mk_plan_ = keep;
      tuning_log_ += std::string("megakernel: tuning failed, default kept: ") + e.what() + "\n";
    }
  }

  /// The decode megakernel's kernel attribute and scratch buffers (after plan_megakernel()).
  void setup_megakernel() {
    configure_decode_megakernel(mk_plan_);
    mk_layers_.allocate(sizeof(MegaLayer) * cfg_.num_layers);
    const size_t parts = static_cast<size_t>(cfg_.num_heads) * mk_plan_.max_splits;
    mk_part_o_.allocate(sizeof(float) * parts * cfg_.head_dim);
    mk_part_ml_.allocate(sizeof(float2) * parts);
    mk_sync_.allocate(sizeof(unsigned) * decode_megakernel_sync_words(mk_shape_));
    SS_CUDA_CHECK(cudaMemsetAsync(mk_sync_.get(), 0, mk_sync_.bytes(), stream_));
    if (copt_.megakernel_trace) {
      mk_trace_.allocate(sizeof(unsigned long long) * mega_trace_words(cfg_.num_layers, mk_plan_.ctas));
      SS_CUDA_CHECK(cudaMemsetAsync(mk_trace_.get(), 0, mk_trace_.bytes(), stream_));
    }
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    mk_ = true;
  }

  /// The megakernel's table of layer pointers: after loading, since loading
  /// may replace buffers (the q/k/v bias).
  void upload_megakernel_layers() {
    if (!mk_) return;
    const size_t kv_layer = static_cast<size_t>(cfg_.num_kv_heads) * slots_ * cfg_.head_dim;
    std::vector<MegaLayer> table(cfg_.num_layers);
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const Layer& L = layers_[l];
      table[l].qkv = L.qkv.as<__nv_bfloat16>();
      table[l].qkv_bias = L.qkv_bias ? L.qkv_bias.as<float>() : nullptr;
      table[l].o = L.o.as<__nv_bfloat16>();
      table[l].gu = L.gu.as<__nv_bfloat16>();
      table[l].down = L.down.as<__nv_bfloat16>();
      table[l].kcache = kcache_.as<__nv_bfloat16>() + kv_layer * l;
      table[l].vcache = vcache_.as<__nv_bfloat16>() + kv_layer * l;
    }
    SS_CUDA_CHECK(cudaMemcpyAsync(mk_layers_.get(), table.data(), mk_layers_.bytes(), cudaMemcpyHostToDevice, stream_));
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Uploads go through stream_ (and wait for it): a plain cudaMemcpy from
  // pageable memory may return before its DMA has landed, and kernels on the
  // non-blocking stream_ do not order after the legacy stream — a race that
  // once corrupted weights here.
  DeviceBuffer upload_ints(const std::vector<int>& v) {
    DeviceBuffer b(sizeof(int) * v.size());
    SS_CUDA_CHECK(cudaMemcpyAsync(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice, stream_));
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return b;
  }
  DeviceBuffer upload_floats(const std::vector<float>& v) {
    DeviceBuffer b(sizeof(float) * v.size());
    SS_CUDA_CHECK(cudaMemcpyAsync(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice, stream_));
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return b;
  }
  /// Copies the raw bytes of `parts` (same dtype) one after the other into scratch_.
  void upload_concat(std::initializer_list<const HostWeight*> parts, const std::string& name) {
    size_t total = 0;
    for (const HostWeight* p : parts) {
      size_t n = dtype_bytes(p->dtype);
      if (n == 0) throw CheckpointError("tensor " + name + ": dtype must be F32, BF16 or F16 for the CUDA backend");
      for (int64_t d : p->shape) n *= static_cast<size_t>(d);
      total += n;
    }
    if (scratch_.bytes() < total) {
      SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      scratch_.allocate(total);
    }
    size_t off = 0;
    for (const HostWeight* p : parts) {
      size_t n = dtype_bytes(p->dtype);
      for (int64_t d : p->shape) n *= static_cast<size_t>(d);
      SS_CUDA_CHECK(cudaMemcpyAsync(scratch_.as<unsigned char>() + off, p->data, n, cudaMemcpyHostToDevice, stream_));
      off += n;
    }
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // ---------------------------------------------------------------- steps
  void validate(const ForwardBatch& b) const {
    // The rules of every backend (ForwardBatch::validate); this one runs a tree in
    // pieces of kMaxStepTokens, which its "ancestors first" rule makes safe.
    b.validate(cfg_.vocab_size, committed_, opt_.max_context, opt_.max_tree);
  }

  /// Fills `d` with tokens [begin, begin+count) of `b`; returns the attend-list length.
  int fill_desc(StepDesc& d, const ForwardBatch& b, int begin, int count) const {
    std::memset(&d, 0, kStepDescHeaderBytes);
    d.n = count;
    d.is_tree = b.is_tree() ? 1 : 0;
    d.committed = committed_;
    d.last_row = count - 1;
    int na = 0;
    for (int i = 0; i < count; ++i) {
      const int g = begin + i;
      d.tokens[i] = b.tokens[g];
      d.positions[i] = b.positions[g];
      if (!b.is_tree()) {
        d.kv_index[i] = committed_ + i;
        d.prefix_len[i] = committed_ + i + 1;
        d.attend_off[i + 1] = 0;
      } else {
        d.kv_index[i] = opt_.max_context + b.tree_slots[g];
        d.prefix_len[i] = committed_;
        const int o0 = b.attend_offsets[g], o1 = b.attend_offsets[g + 1];
        if (na + (o1 - o0) > kMaxAttendSlots)
          throw InvalidArgument("forward: a step's attend lists exceed " + std::to_string(kMaxAttendSlots) +
                                " entries; use fewer or shallower tree nodes per call");
        for (int j = o0; j < o1; ++j) d.attend_slots[na++] = b.attend_slots[j];
        d.attend_off[i + 1] = na;
      }
    }
    return na;
  }

  void upload_desc(const StepDesc& d, int n_attend) {
    const int i = desc_i_;
    desc_i_ ^= 1;
    SS_CUDA_CHECK(cudaEventSynchronize(desc_ev_[i]));
    const size_t bytes = kStepDescHeaderBytes + sizeof(int) * n_attend;
    std::memcpy(desc_host_[i].as<void>(), &d, bytes);
    SS_CUDA_CHECK(cudaMemcpyAsync(desc_.get(), desc_host_[i].as<void>(), bytes, cudaMemcpyHostToDevice, stream_));
    SS_CUDA_CHECK(cudaEventRecord(desc_ev_[i], stream_));
  }

  /// Where run() puts each logits row: the whole row (`logits`), the arg-max key the LM
  /// head's epilogue made (`keys`), or its top-k selected on the GPU (`top`, with `k`
  /// and `log_normalizer`). Exactly one is set.
  struct RowSink {
    std::vector<float>* logits = nullptr;
    std::vector<unsigned long long>* keys = nullptr;
    TopKLogits* top = nullptr;
    int k = 0;
    bool log_normalizer = false;
    double inv_temperature = 1.0;  ///< of the log-normalizer
  };

  /// run() reading each logits row's arg-max key from the LM head's epilogue (no logits written).
  std::vector<unsigned long long> run_argmax_keys(const ForwardBatch& batch) {
    std::vector<unsigned long long> keys;
    RowSink sink;
    sink.keys = &keys;
    run(batch, sink);
    return keys;
  }

  /// The token id of an arg-max key; Error when the row held a NaN (argmax_key).
  static int checked_key_index(unsigned long long key) {
    if (argmax_key_is_nan(key)) throw Error(kNanLogitsMessage);
    return argmax_key_index(key);
  }
  /// The fp32 value of an arg-max key (-0 comes back as +0: argmax_key).
  static float key_value(unsigned long long key) {
    uint32_t u = static_cast<uint32_t>(key >> 32);
    u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
    float v;
    std::memcpy(&v, &u, sizeof v);
    return v;
  }

  /// Forgets the logits rows read_logits_row() reads (both the device's and the default's).
  void forget_logits_rows() {
    forget_kept_logits();
    device_rows_kept_ = false;
    device_rows_total_ = device_rows_in_buffer_ = 0;
  }

  void run(const ForwardBatch& b, const RowSink& sink) {
    validate(b);
    forget_logits_rows();  // every pass may rewrite logits_
    const int n = static_cast<int>(b.tokens.size());
    const size_t V = static_cast<size_t>(cfg_.vocab_size);
    const bool want_logits = sink.logits || sink.top;
    if (sink.logits) sink.logits->clear();
    if (sink.keys) sink.keys->clear();
    StepDesc& d = *scratch_desc_;
    for (int begin = 0; begin < n; begin += kMaxStepTokens) {
      const int cnt = std::min(kMaxStepTokens, n - begin);
      const bool last_piece = begin + cnt == n;
      LogitsMode mode = LogitsMode::None;
      if (b.logits == LogitsMode::All) mode = LogitsMode::All;
      if (b.logits == LogitsMode::Last && last_piece) mode = LogitsMode::Last;
      const int na = fill_desc(d, b, begin, cnt);
      upload_desc(d, na);
      if (mk_ && cnt == 1) run_megakernel_step(mode, want_logits && mode != LogitsMode::None);
      else run_step(bucket_nt(cnt), mode, want_logits && mode != LogitsMode::None);
      if (!b.is_tree()) committed_ += cnt;
      if (mode == LogitsMode::None) continue;
      const int rows = mode == LogitsMode::All ? cnt : 1;
      if (sink.logits) {
        SS_CUDA_CHECK(cudaMemcpyAsync(logits_host_.as<void>(), logits_.get(), sizeof(float) * rows * V,
                                      cudaMemcpyDeviceToHost, stream_));
        SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
        const float* h = logits_host_.as<float>();
        sink.logits->insert(sink.logits->end(), h, h + rows * V);
      } else if (sink.top) {
        // Only [rows, k] entries cross PCIe, not [rows, vocab] fp32 (top_k_logits.h).
        launch_logits_top_k(logits_.as<float>(), rows, cfg_.vocab_size, sink.k, sink.log_normalizer, top_scratch_,
                            top_rows_.as<TopKRow>(), stream_, sink.inv_temperature);
        SS_CUDA_CHECK(cudaMemcpyAsync(top_host_.as<void>(), top_rows_.get(), sizeof(TopKRow) * rows,
                                      cudaMemcpyDeviceToHost, stream_));
        SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int r = 0; r < rows; ++r) {
          const TopKRow& t = top_host_.as<TopKRow>()[r];
          if (t.nan) throw Error(kNanLogitsMessage);
          sink.top->ids.insert(sink.top->ids.end(), t.ids, t.ids + sink.k);
          sink.top->logits.insert(sink.top->logits.end(), t.values, t.values + sink.k);
          if (sink.log_normalizer) sink.top->log_normalizer.push_back(t.log_normalizer);
        }
        // read_logits_row: logits_ now holds this piece's rows, the pass's last ones so far.
        device_rows_total_ += rows;
        device_rows_in_buffer_ = rows;
      } else {
        SS_CUDA_CHECK(cudaMemcpyAsync(keys_host_.as<void>(), keys_.get(), sizeof(unsigned long long) * rows,
                                      cudaMemcpyDeviceToHost, stream_));
        SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
        const unsigned long long* h = keys_host_.as<unsigned long long>();
        sink.keys->insert(sink.keys->end(), h, h + rows);
      }
    }
    SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    device_rows_kept_ = sink.top != nullptr;  // the whole pass went through: its rows are readable
  }

  void run_step(int nt, LogitsMode mode, bool write_logits) {
    const int key = nt * 16 + static_cast<int>(mode) * 2 + (write_logits ? 1 : 0);
    if (!copt_.use_graphs) {
      record_step(stream_, nt, mode, write_logits, StepChoice{});
      return;
    }
    try {
      if (needs_tuning(nt)) {
        try {
          tune_bucket(nt, key, mode, write_logits);
        } catch (const CudaError& e) {
          // A candidate failed (a capture refused, out of memory): the bucket
          // keeps the default setting; a driver that refuses PDL altogether
          // fails the default capture below and falls back there.
          tuned_[nt] = StepChoice{};
          tuning_log_ += "nt=" + std::to_string(nt) + ": tuning failed, default kept: " + e.what() + "\n";
        }
      }
      const auto it = tuned_.find(nt);
      const StepChoice choice = it == tuned_.end() ? StepChoice{} : it->second;
      graphs_.launch(key, stream_, [&](cudaStream_t s) { record_step(s, nt, mode, write_logits, choice); });
    } catch (const CudaError&) {
      if (!pdl_) throw;
      // Some drivers refuse programmatic edges in captured graphs: fall back
      // (and keep the planner's plans: tuned choices were timed with PDL).
      pdl_ = false;
      graphs_.clear();
      tuned_.clear();
      graphs_.launch(key, stream_, [&](cudaStream_t s) { record_step(s, nt, mode, write_logits, StepChoice{}); });
    }
  }

  bool needs_tuning(int nt) const {
    return pdl_ && copt_.autotune && !copt_.row_parallel && !tuned_.count(nt);
  }

  /// Chooses bucket `nt`'s PDL edges and GEMM plan variants by timing the
  /// current step's graph under each candidate setting (step_tuner.h); the
  /// step's descriptor is already uploaded and replaying it is idempotent.
  /// Leaves the winner as `key`'s graph. The LM head's plan is tuned only in
  /// steps with every row's logits (a Last-logits step runs it at one row, the
  /// decode bucket's plan).
  void tune_bucket(int nt, int key, LogitsMode mode, bool write_logits) {
    const int H = cfg_.hidden_size, I = cfg_.intermediate_size;
    const int nq = cfg_.num_heads * cfg_.head_dim, nkv = cfg_.num_kv_heads * cfg_.head_dim;
    std::vector<std::string> options[kStepKernels];
    options[kStepQkv] = variant_names(plan_variants<EpiQKV>(kStepQkv, nq + 2 * nkv, H, nt));
    options[kStepOProj] = variant_names(plan_variants<EpiResidual>(kStepOProj, H, nq, nt));
    options[kStepGateUp] = variant_names(plan_variants<EpiSwiGLU>(kStepGateUp, 2 * I, H, nt));
    options[kStepDown] = variant_names(plan_variants<EpiResidual>(kStepDown, H, I, nt));
    if (mode == LogitsMode::All)
      options[kStepLmHead] = variant_names(plan_variants<EpiLMHead>(kStepLmHead, vocab_rows_, H, nt));
    options[kStepAttention] = attn_shared_prefix(nt, 0) ? std::vector<std::string>{"prefix", "blocks"}
                                                        : std::vector<std::string>{"blocks", "prefix"};
    const std::vector<TunerKnob> knobs = step_knobs(options);
    cudaGraphExec_t best = nullptr;
    const StepTuning t = tune_step(
        stream_, knobs, {step_setting_all_pdl_off()},
        [&](const StepSetting& setting) {
          const StepChoice c = step_choice_of(setting);
          return capture_graph(stream_, [&](cudaStream_t s) { record_step(s, nt, mode, write_logits, c); });
        },
        &best, 5, 0.01, tuner_outputs(8 * nt));
    graphs_.put(key, best);  // owned by the cache from here on, whatever follows
    tuned_[nt] = step_choice_of(t.chosen);
    tuning_log_ += "nt=" + std::to_string(nt) + ": " + t.summary() + "\n";
  }

  /// What the tuners compare bitwise with autotune_verify (tune_step's
  /// `outputs`): the arg-max keys of a step's first `rows` rows and their
  /// residual stream after the last layer; without autotune_verify, nothing.
  std::function<std::vector<uint8_t>()> tuner_outputs(int rows) {
    if (!copt_.autotune_verify) return {};
    return [this, rows] {
      const size_t kb = sizeof(unsigned long long) * rows, hb = sizeof(float) * rows * cfg_.hidden_size;
      std::vector<uint8_t> out(kb + hb);
      SS_CUDA_CHECK(cudaMemcpy(out.data(), keys_.get(), kb, cudaMemcpyDeviceToHost));
      SS_CUDA_CHECK(cudaMemcpy(out.data() + kb, h32_.get(), hb, cudaMemcpyDeviceToHost));
      return out;
    };
  }

  /// The plans a GEMM may run with in bucket `nt`: [0] the planner's, then
  /// the distinct ones with the other row-block size (warpgroups) and
  /// pipeline depths 3 / 4. The K slices, and so every output's reduction
  /// order, are the same in all of them (gemm_slices).
  template <class Epi>
  const std::vector<GemmConfig>& plan_variants(int kind, int N, int K, int nt) {
    const int k = kind * 16 + nt;
    auto it = plan_variants_.find(k);
    if (it != plan_variants_.end()) return it->second;
    std::vector<GemmConfig> v{plan<Epi>(kind, N, K, nt)};
    if (v[0].engine == GemmEngine::Wgmma) {
      for (int wg : {1, 2})
        for (int stages : {3, 4}) {
          GemmPlanHint hint;
          hint.engine = copt_.gemm_engine;
          hint.wg = wg;
          hint.stages = stages;
          GemmConfig c;
          try {
            c = plan_gemm<Epi>(N, K, nt, num_sms_, hint);
          } catch (const InvalidArgument&) {
            continue;  // does not fit this shape
          }
          const bool seen = std::any_of(v.begin(), v.end(), [&](const GemmConfig& o) {
            return o.WR == c.WR && o.BR == c.BR && o.stages == c.stages && o.xres == c.xres &&
                   o.palias == c.palias && o.grid_x == c.grid_x && o.S == c.S;
          });
          if (!seen && c.S == v[0].S) v.push_back(c);
        }
    }
    return plan_variants_.emplace(k, std::move(v)).first->second;
  }

  /// Whether bucket `nt`'s attention runs shared-prefix CTAs (AttnParams::
  /// shared_prefix; the same bits either way) under attention plan variant
  /// `variant` (the tuner's "plan.attn": 0 the default, 1 the other). The
  /// default: on where a step has several token blocks (nt >= 2, 16+ rows).
  static bool attn_shared_prefix(int nt, int variant) {
    const bool dflt = nt >= 2;
    return variant == 0 ? dflt : !dflt;
  }

  static std::vector<std::string> variant_names(const std::vector<GemmConfig>& v) {
    std::vector<std::string> names;
    for (const GemmConfig& c : v)
      names.push_back("br" + std::to_string(c.BR) + "st" + std::to_string(c.stages) + (c.palias ? "pa" : ""));
    return names;
  }

  /// The graph cache's key of a megakernel step (apart from the layered
  /// steps' keys, nt * 16 + ...).
  static int megakernel_graph_key(LogitsMode mode, bool write_logits) {
    return 1000 + static_cast<int>(mode) * 2 + (write_logits ? 1 : 0);
  }

  /// One single-token step as the decode megakernel (its own graph per
  /// logits mode). Always a cooperative launch: its CTAs wait on each other, so
  /// they must all be resident (a plain launch could deadlock beside another
  /// megakernel on the same SMs); there is deliberately no fallback.
  void run_megakernel_step(LogitsMode mode, bool write_logits) {
    const int key = megakernel_graph_key(mode, write_logits);
    auto rec = [&](cudaStream_t s) { record_megakernel_step(s, mode, write_logits); };
    if (!copt_.use_graphs) rec(stream_);
    else graphs_.launch(key, stream_, rec);
  }

  void record_megakernel_step(cudaStream_t s, LogitsMode mode, bool write_logits) {
    MegaParams p;
    p.s = mk_shape_;
    p.plan = mk_plan_;
    p.layers = mk_layers_.as<MegaLayer>();
    p.embed = embed_.as<__nv_bfloat16>();
    p.lm = lm_.as<__nv_bfloat16>();
    p.inv_freq = inv_freq_.as<float>();
    p.desc = desc_.as<StepDesc>();
    p.h32 = h32_.as<float>();
    p.q = q_.as<__nv_bfloat16>();
    p.attn = attn_.as<__nv_bfloat16>();
    p.act = act_.as<__nv_bfloat16>();
    p.part_o = mk_part_o_.as<float>();
    p.part_ml = mk_part_ml_.as<float2>();
    p.logits = write_logits ? logits_.as<float>() : nullptr;
    p.keys = keys_.as<unsigned long long>();
    p.sync = mk_sync_.as<unsigned>();
    p.lm_head = mode == LogitsMode::None ? 0 : 1;
    p.trace = mk_trace_ ? mk_trace_.as<unsigned long long>() : nullptr;
    launch_decode_megakernel(p, s);
  }

  const int* desc_field(size_t offset) const {
    return reinterpret_cast<const int*>(desc_.as<unsigned char>() + offset);
  }

  const CUtensorMap& tmap(const void* base, int rows, int cols, int box_rows) {
    const auto k = std::make_tuple(base, rows, cols, box_rows);
    auto it = maps_.find(k);
    if (it != maps_.end()) return it->second;
    return maps_.emplace(k, make_tma_map_bf16(base, rows, cols, cols, box_rows)).first->second;
  }

  template <class Epi>
  const GemmConfig& plan(int kind, int N, int K, int nt) {
    const int k = kind * 16 + nt;
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second;
    GemmPlanHint hint;
    hint.engine = copt_.gemm_engine;  // per model, the same for every bucket (batch invariance)
    return plans_.emplace(k, plan_gemm<Epi>(N, K, nt, num_sms_, hint)).first->second;
  }

  /// Launches GEMM `kind` with plan variant `variant` of its bucket (0: the planner's).
  template <class Epi>
  void gemm(int kind, const void* w, int N, int K, const void* x, int nt, const GemmArgs& args,
            const typename Epi::Params& ep, bool pdl, int variant, cudaStream_t s) {
    const GemmConfig& c = variant == 0 ? plan<Epi>(kind, N, K, nt) : plan_variants<Epi>(kind, N, K, nt).at(variant);
    launch_gemm<Epi>(c, tmap(w, N, K, c.BR), tmap(x, kRows, K, 8 * nt), args, ep, pdl, s);
  }

  /// Records one layered step with the launch settings `choice` (PDL edges,
  /// GEMM plan variants; no PDL at all when it is off for the model).
  void record_step(cudaStream_t s, int nt, LogitsMode mode, bool write_logits, const StepChoice& choice) {
    auto pdl = [&](StepKernel k) { return pdl_ && choice.pdl(k); };
    const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
    const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
    const int rows = 8 * nt;
    const StepDesc* desc = desc_.as<StepDesc>();
    const int* n_ptr = desc_field(offsetof(StepDesc, n));
    const size_t kv_layer = static_cast<size_t>(cfg_.num_kv_heads) * slots_ * hd;

    launch_embedding(embed_.as<__nv_bfloat16>(), H, desc, rows, h32_.as<float>(), h16_.as<__nv_bfloat16>(),
                     ssq_.as<float>(), keys_.as<unsigned long long>(), s);

    GemmArgs norm_args;
    norm_args.K = H;
    norm_args.m_active_ptr = n_ptr;
    norm_args.m_active_max = rows;
    norm_args.ssq = ssq_.as<float>();
    norm_args.ssq_stride = H / 16;
    norm_args.hidden = H;
    norm_args.eps = cfg_.rms_norm_eps;

    for (int l = 0; l < cfg_.num_layers; ++l) {
      Layer& L = layers_[l];
      __nv_bfloat16* kc = kcache_.as<__nv_bfloat16>() + kv_layer * l;
      __nv_bfloat16* vc = vcache_.as<__nv_bfloat16>() + kv_layer * l;
      {
        GemmArgs a = norm_args;
        a.N = nq + 2 * nkv;
        EpiQKV::Params e;
        e.bias = L.qkv_bias ? L.qkv_bias.as<float>() : nullptr;
        e.q = q_.as<__nv_bfloat16>();
        e.kcache = kc;
        e.vcache = vc;
        e.desc = desc;
        e.inv_freq = inv_freq_.as<float>();
        e.num_heads = cfg_.num_heads;
        e.num_kv_heads = cfg_.num_kv_heads;
        e.head_dim = hd;
        e.slots = slots_;
        e.neox = cfg_.rope_style == RopeStyle::NeoX ? 1 : 0;
        gemm<EpiQKV>(kStepQkv, L.qkv.get(), a.N, H, h16_.get(), nt, a, e, pdl(kStepQkv), choice.plan[kStepQkv], s);
      }
      {
        AttnParams p;
        p.q = q_.as<__nv_bfloat16>();
        p.kcache = kc;
        p.vcache = vc;
        p.out = attn_.as<__nv_bfloat16>();
        p.part_o = part_o_.as<float>();
        p.part_ml = part_ml_.as<float2>();
        p.counters = counters_.as<int>();
        p.desc = desc;
        p.num_heads = cfg_.num_heads;
        p.num_kv_heads = cfg_.num_kv_heads;
        p.head_dim = hd;
        p.group = cfg_.num_heads / cfg_.num_kv_heads;
        p.tokens_per_block = attn_tokens_per_block(p.group);
        p.shared_prefix = attn_shared_prefix(nt, choice.plan[kStepAttention]) ? 1 : 0;
        p.slots = slots_;
        p.max_context = opt_.max_context;
        p.max_chunks = max_chunks_;
        p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        p.trace = attn_trace_ ? attn_trace_.as<unsigned long long>() + attn_trace_per_layer() * l : nullptr;
        launch_attention(p, rows, pdl(kStepAttention), pdl_, s);
      }
      EpiResidual::Params res;
      res.h32 = h32_.as<float>();
      res.h16 = h16_.as<__nv_bfloat16>();
      res.ssq = ssq_.as<float>();
      res.hidden = H;
      {
        GemmArgs a;
        a.N = H;
        a.K = nq;
        a.m_active_ptr = n_ptr;
        a.m_active_max = rows;
        if (copt_.row_parallel)
          copt_.row_parallel->residual_gemm(RowParallel::kAttnOut, L.o.get(), attn_.get(), nt, a, res,
                                            pdl(kStepOProj), s);
        else
          gemm<EpiResidual>(kStepOProj, L.o.get(), H, nq, attn_.get(), nt, a, res, pdl(kStepOProj),
                            choice.plan[kStepOProj], s);
      }
      {
        GemmArgs a = norm_args;
        a.N = 2 * I;
        EpiSwiGLU::Params e;
        e.act = act_.as<__nv_bfloat16>();
        e.intermediate = I;
        gemm<EpiSwiGLU>(kStepGateUp, L.gu.get(), 2 * I, H, h16_.get(), nt, a, e, pdl(kStepGateUp),
                        choice.plan[kStepGateUp], s);
      }
      {
        GemmArgs a;
        a.N = H;
        a.K = I;
        a.m_active_ptr = n_ptr;
        a.m_active_max = rows;
        if (copt_.row_parallel)
          copt_.row_parallel->residual_gemm(RowParallel::kMlpDown, L.down.get(), act_.get(), nt, a, res,
                                            pdl(kStepDown), s);
        else
          gemm<EpiResidual>(kStepDown, L.down.get(), H, I, act_.get(), nt, a, res, pdl(kStepDown),
                            choice.plan[kStepDown], s);
      }
    }
    if (mode == LogitsMode::None) return;
    GemmArgs a = norm_args;
    a.N = vocab_rows_;
    EpiLMHead::Params e;
    e.logits = write_logits ? logits_.as<float>() : nullptr;
    e.vocab = cfg_.vocab_size;
    e.keys = keys_.as<unsigned long long>();
    if (mode == LogitsMode::Last) {
      a.m_active_ptr = nullptr;
      a.m_active_max = 1;
      a.x_row0_ptr = desc_field(offsetof(StepDesc, last_row));
      gemm<EpiLMHead>(kStepLmHead, lm_.get(), vocab_rows_, H, h16_.get(), 1, a, e, pdl(kStepLmHead), 0, s);
    } else {
      gemm<EpiLMHead>(kStepLmHead, lm_.get(), vocab_rows_, H, h16_.get(), nt, a, e, pdl(kStepLmHead),
                      choice.plan[kStepLmHead], s);
    }
  }

  ModelConfig cfg_;
  ModelOptions opt_;
  CudaModelOptions copt_;
  std::unique_ptr<GreenContext> green_;  ///< SM partition (null: whole GPU); outlives stream_ and events
  bool pdl_ = true;
  std::map<int, StepChoice> tuned_;  ///< per token bucket: the tuned launch settings (autotune)
  std::string tuning_log_;           ///< debug_step_tuning()
  int mk_max_smem_ = 0;              ///< opt-in shared memory per CTA (the megakernel's plans)
  int num_sms_ = 0;
  int slots_ = 0;
  int max_chunks_ = 0;
  int vocab_rows_ = 0;
  int committed_ = 0;
  cudaStream_t stream_ = nullptr;

  std::vector<Layer> layers_;
  DeviceBuffer embed_, lm_, inv_freq_;
  DeviceBuffer kcache_, vcache_;
  DeviceBuffer h32_, h16_, ssq_, q_, attn_, act_, logits_, keys_;
  DeviceBuffer part_o_, part_ml_, counters_, desc_, commit_idx_;
  DeviceBuffer scratch_;
  PinnedBuffer desc_host_[2];
  cudaEvent_t desc_ev_[2] = {nullptr, nullptr};
  int desc_i_ = 0;
  PinnedBuffer logits_host_, keys_host_, commit_host_;
  // forward_top_k on the GPU (launch_logits_top_k); SWIFTSPEC_TOP_K_ON_HOST=1 takes the
  // default host path instead (an A/B switch for benchmarks).
  DeviceBuffer top_part_keys_, top_part_ms_, top_part_nan_, top_rows_;
  PinnedBuffer top_host_;
  TopKScratch top_scratch_;
  const bool top_k_on_host_ = env_flag("SWIFTSPEC_TOP_K_ON_HOST");
  // read_logits_row after a forward_top_k selected on the GPU: the pass's rows so far
  // (device_rows_total_), the last device_rows_in_buffer_ of them still in logits_.
  bool device_rows_kept_ = false;
  int device_rows_total_ = 0, device_rows_in_buffer_ = 0;
  cudaEvent_t commit_ev_ = nullptr;
  std::unique_ptr<StepDesc> scratch_desc_ = std::make_unique<StepDesc>();

  // Decode megakernel (CudaModelOptions::megakernel)
  bool mk_ = false;
  MegaShape mk_shape_;
  MegaPlan mk_plan_;
  DeviceBuffer mk_layers_, mk_part_o_, mk_part_ml_, mk_sync_, mk_trace_;
  DeviceBuffer attn_trace_;  ///< CudaModelOptions::attention_trace
  size_t attn_trace_per_layer() const {
    return static_cast<size_t>(cfg_.num_kv_heads) * kMaxStepTokens * kAttnSplits * kAttnTraceStamps;
  }

  GraphCache graphs_;
  std::map<std::tuple<const void*, int, int, int>, CUtensorMap> maps_;
  std::map<int, GemmConfig> plans_;                   ///< (kind * 16 + nt): the planner's plan
  std::map<int, std::vector<GemmConfig>> plan_variants_;  ///< (kind * 16 + nt): [0] the planner's, then variants
  std::vector<Prepared> prepared_;
};

}  // namespace cuda

std::unique_ptr<CudaModel> make_cuda_model_from_host(const ModelConfig& config, const WeightLookup& lookup,
                                                     const WeightExists& exists, const ModelOptions& options,
                                                     const CudaModelOptions& cuda_options) {
  auto m = std::make_unique<cuda::CudaModelImpl>(config, options, cuda_options);
  m->load_host(lookup, exists);
  m->tune_all_buckets();
  return m;
}

std::unique_ptr<CudaModel> make_cuda_model_random(const ModelConfig& config, const ModelOptions& options,
                                                  const CudaModelOptions& cuda_options, uint64_t seed) {
  auto m = std::make_unique<cuda::CudaModelImpl>(config, options, cuda_options);
  m->init_random(seed);
  m->tune_all_buckets();
  return m;
}

}  // namespace swiftspec
