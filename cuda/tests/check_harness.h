// Shared pieces of the CUDA checks (swiftspec-cuda-check): the report (record -> CHECK lines
// and the JSON), random inputs without zeros, relative errors, tiny random models with their
// fp32 CPU reference weights, trees and append batches.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "swiftspec/config.h"
#include "swiftspec/model.h"
#include "swiftspec_cuda/cuda_model.h"

namespace swiftspec::cuda_check {

using swiftspec::CudaModel;
using swiftspec::CudaModelOptions;
using swiftspec::ForwardBatch;
using swiftspec::LogitsMode;
using swiftspec::ModelConfig;
using swiftspec::ModelOptions;
using swiftspec::RopeStyle;

struct Result {
  std::string name;
  double err;
  double limit;
  bool pass;
  std::string detail;
};
inline std::vector<Result> g_results;

inline void record(const std::string& name, double err, double limit, bool pass, const std::string& detail = "") {
  g_results.push_back({name, err, limit, pass, detail});
  std::printf("CHECK %-58s err=%.3e limit=%.1e %s %s\n", name.c_str(), err, limit, pass ? "PASS" : "FAIL",
              detail.c_str());
  std::fflush(stdout);
}

inline uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t r = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + r) >> 16);
}
inline float bf2f(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  /// Uniform in +-[0.05, 1] * scale: never zero.
  float sym(float scale) {
    std::uniform_real_distribution<float> u(0.05f, 1.0f);
    const float m = u(g) * scale;
    return (g() & 1) ? m : -m;
  }
  int below(int n) { return static_cast<int>(g() % static_cast<uint64_t>(n)); }
  double unit() { return std::uniform_real_distribution<double>(0, 1)(g); }
};

template <class F>
void parallel_for(int n, F f) {
  const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      for (int i = t; i < n; i += nt) f(i);
    });
  for (auto& x : th) x.join();
}

inline double rel_err(const std::vector<float>& out, const std::vector<float>& ref, size_t* nonfinite) {
  double num = 0, den = 0;
  size_t bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      ++bad;
      continue;
    }
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (nonfinite) *nonfinite = bad;
  return std::sqrt(num / std::max(den, 1e-300));
}

struct TinyWeights {
  std::map<std::string, std::vector<uint16_t>> bf;
  std::map<std::string, std::vector<int64_t>> shape;
  std::map<std::string, std::vector<float>> f;
  void add(const std::string& name, std::vector<int64_t> shp, Rng& rng, float scale, float offset = 0.f) {
    size_t n = 1;
    for (auto d : shp) n *= static_cast<size_t>(d);
    std::vector<uint16_t> b(n);
    std::vector<float> fl(n);
    for (size_t i = 0; i < n; ++i) {
      b[i] = f2bf(offset + rng.sym(scale));
      fl[i] = bf2f(b[i]);
    }
    bf[name] = std::move(b);
    f[name] = std::move(fl);
    shape[name] = std::move(shp);
  }
};

inline TinyWeights make_weights(const ModelConfig& c, Rng& rng) {
  TinyWeights w;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t nq = c.num_heads * hd, nkv = c.num_kv_heads * hd;
  w.add("model.embed_tokens.weight", {c.vocab_size, H}, rng, 1.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.add(p + "input_layernorm.weight", {H}, rng, 0.5f, 1.0f);
    w.add(p + "post_attention_layernorm.weight", {H}, rng, 0.5f, 1.0f);
    const float hs = 1.0f / std::sqrt(static_cast<float>(H));
    w.add(p + "self_attn.q_proj.weight", {nq, H}, rng, 2.0f * hs);
    w.add(p + "self_attn.k_proj.weight", {nkv, H}, rng, 2.0f * hs);
    w.add(p + "self_attn.v_proj.weight", {nkv, H}, rng, hs);
    if (c.attention_bias) {
      w.add(p + "self_attn.q_proj.bias", {nq}, rng, 0.3f);
      w.add(p + "self_attn.k_proj.bias", {nkv}, rng, 0.3f);
      w.add(p + "self_attn.v_proj.bias", {nkv}, rng, 0.3f);
    }
    w.add(p + "self_attn.o_proj.weight", {H, nq}, rng, 1.0f / std::sqrt(static_cast<float>(nq)));
    w.add(p + "mlp.gate_proj.weight", {I, H}, rng, hs);
    w.add(p + "mlp.up_proj.weight", {I, H}, rng, hs);
    w.add(p + "mlp.down_proj.weight", {H, I}, rng, 1.0f / std::sqrt(static_cast<float>(I)));
  }
  w.add("model.norm.weight", {H}, rng, 0.5f, 1.0f);
  if (!c.tie_word_embeddings) w.add("lm_head.weight", {c.vocab_size, H}, rng, 1.0f / std::sqrt(static_cast<float>(H)));
  return w;
}

struct Tree {
  std::vector<int> parent, depth, token, slot;
  ForwardBatch batch;
};

inline Tree make_tree(int n, int committed, int vocab, int max_tree, Rng& rng) {
  Tree t;
  std::vector<int> perm(max_tree);
  for (int i = 0; i < max_tree; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng.g);
  for (int i = 0; i < n; ++i) {
    const int p = (i == 0 || rng.unit() < 0.25) ? -1 : rng.below(i);
    t.parent.push_back(p);
    t.depth.push_back(p < 0 ? 0 : t.depth[p] + 1);
    t.token.push_back(rng.below(vocab));
    t.slot.push_back(perm[i]);
  }
  ForwardBatch& b = t.batch;
  b.attend_offsets.push_back(0);
  for (int i = 0; i < n; ++i) {
    b.tokens.push_back(t.token[i]);
    b.positions.push_back(committed + t.depth[i]);
    b.tree_slots.push_back(t.slot[i]);
    std::vector<int> chain;
    for (int j = i; j >= 0; j = t.parent[j]) chain.push_back(t.slot[j]);
    std::reverse(chain.begin(), chain.end());
    b.attend_slots.insert(b.attend_slots.end(), chain.begin(), chain.end());
    b.attend_offsets.push_back(static_cast<int>(b.attend_slots.size()));
  }
  b.logits = LogitsMode::All;
  return t;
}

inline ForwardBatch append_batch(const std::vector<int>& toks, int start, LogitsMode mode) {
  ForwardBatch b;
  b.tokens = toks;
  for (size_t i = 0; i < toks.size(); ++i) b.positions.push_back(start + static_cast<int>(i));
  b.logits = mode;
  return b;
}

/// A CUDA model of the tiny weights `tw` (checkpoint names, bf16).
inline std::unique_ptr<CudaModel> tiny_model(const ModelConfig& cfg, TinyWeights& tw, const ModelOptions& opt,
                                             const CudaModelOptions& copt) {
  WeightLookup lookup = [&tw](const std::string& name, const std::vector<int64_t>& shp) {
    auto it = tw.bf.find(name);
    if (it == tw.bf.end()) throw CheckpointError("test checkpoint: missing " + name);
    if (!shp.empty() && shp != tw.shape[name]) throw CheckpointError("test checkpoint: shape of " + name);
    HostWeight h;
    h.dtype = DType::BF16;
    h.shape = tw.shape[name];
    h.data = it->second.data();
    return h;
  };
  WeightExists exists = [&tw](const std::string& name) { return tw.bf.count(name) > 0; };
  return make_cuda_model_from_host(cfg, lookup, exists, opt, copt);
}

inline ModelConfig tiny_config(const std::string& arch, int H, int I, int heads, int kv, int hd, int V, bool bias,
                               bool tie, RopeStyle rs, bool llama3) {
  ModelConfig c;
  c.architecture = arch;
  c.vocab_size = V;
  c.hidden_size = H;
  c.intermediate_size = I;
  c.num_layers = 2;
  c.num_heads = heads;
  c.num_kv_heads = kv;
  c.head_dim = hd;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = llama3 ? 500000.0 : 1000000.0;
  c.rope_style = rs;
  c.rope_scaling.type = llama3 ? RopeScalingType::Llama3 : RopeScalingType::None;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 64;
  c.tie_word_embeddings = tie;
  c.attention_bias = bias;
  return c;
}

}  // namespace swiftspec::cuda_check
