// Whole tiny models with int4 projections (issue 31) on the CUDA backend's layered step: the
// int4 GEMM with the model's epilogues (QKV with RoPE and the K/V cache, the residual with the
// next norm's weight on h16, SwiGLU), the norm weights on the activations, the load-time
// re-layout with the QKV and gate/up row permutations, concatenated q/k/v and gate/up
// tensors; against the fp32 CPU reference model (reference_model.h) over the dequantized
// weights (q - z) * s, which are exactly what the CPU backend's int4 computes with.
//
// Inputs: tiny_config models (check_harness.h) whose seven projections per layer are drawn
// as int4 (random nibbles, zero points 0..15 with q != z: no zero weight; fp16 scales sized
// like the bf16 checks' weights), everything else bf16 as in the bf16 model checks. Outputs:
// logits of a 70-token prefill (every row), a decode step, a 20-node tree, a 130-token
// prompt with the last row's logits (decode steps of 64: int4 models have no prefill path);
// buffers poisoned before each run. Limits: relative Frobenius error 1e-2 (the bf16 checks'
// limit) or, where more, 1.25x the error of the model's bf16 twin on the same inputs (the same
// model with each projection stored as bf16 of its dequantized values, run through the bf16
// path: the activations are rounded to bf16 alike, and int4 weights with few distinct values
// make some tiny models more sensitive to that rounding than the bf16 checks' models), and the
// exactness contract bitwise (batch-64 rows
// == batch-1 decode, a tree path == decoding it alone). The step tuner's candidates are
// verified bitwise against the default (autotune_verify). Refusals: the megakernel, the
// prefill path and a group size the int4 GEMM cannot run, before anything is allocated; a
// float tensor where an int4 projection is expected.
#include "check_int4_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "check_harness.h"
#include "reference_model.h"

namespace swiftspec::cuda_check {

namespace {

/// One projection in the checkpoint format (docs/checkpoint_format.md, "int4 weights").
struct Int4Tensor {
  std::vector<uint8_t> q;   ///< [N][K/2], element 2j in the low nibble of byte j
  std::vector<uint16_t> s;  ///< fp16 bits [N][K/G]
  std::vector<uint8_t> z;   ///< [N][K/G]
};

/// Every `*_proj.weight` of `tw` replaced by a random int4 tensor of group size G whose
/// dequantized values (q - z) * s go into tw.f (the reference's weights).
std::map<std::string, Int4Tensor> quantize_projections(TinyWeights& tw, int G, Rng& rng) {
  std::map<std::string, Int4Tensor> out;
  for (auto& [name, shape] : tw.shape) {
    if (name.size() < 12 || name.compare(name.size() - 12, 12, "_proj.weight") != 0) continue;
    const int N = static_cast<int>(shape[0]), K = static_cast<int>(shape[1]), ng = K / G;
    // The bf16 checks' weights are about 1/sqrt(K); |q - z| averages about 5.
    const int exp = 15 + static_cast<int>(std::floor(std::log2(1.0 / (5.0 * std::sqrt(static_cast<double>(K))))));
    Int4Tensor t;
    t.s.resize(static_cast<size_t>(N) * ng);
    t.z.resize(t.s.size());
    std::vector<float> scale(t.s.size());
    for (size_t i = 0; i < t.s.size(); ++i) {
      const uint32_t man = static_cast<uint32_t>(rng.g() & 0x3FF), sign = static_cast<uint32_t>(rng.g() & 1);
      t.s[i] = static_cast<uint16_t>((sign << 15) | (static_cast<uint32_t>(exp) << 10) | man);
      scale[i] = (sign ? -1.f : 1.f) * std::ldexp(static_cast<float>(1024 + man), exp - 25);  // a normal half, exactly
      t.z[i] = static_cast<uint8_t>(rng.below(16));
    }
    t.q.assign(static_cast<size_t>(N) * K / 2, 0);
    std::vector<float>& w = tw.f[name];
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        const size_t gi = static_cast<size_t>(n) * ng + k / G;
        int v = rng.below(16);
        if (v == t.z[gi]) v = (v + 1 + rng.below(15)) & 15;  // q != z
        t.q[static_cast<size_t>(n) * (K / 2) + k / 2] |= static_cast<uint8_t>(v << (4 * (k & 1)));
        w[static_cast<size_t>(n) * K + k] = static_cast<float>(v - static_cast<int>(t.z[gi])) * scale[gi];
      }
    out[name] = std::move(t);
  }
  return out;
}

/// A CUDA model of `tw` with the int4 projections `q4` (group size G); bf16 tensors from `bf16`
/// where it holds them (the bf16 twin's projections), else from tw.bf.
std::unique_ptr<CudaModel> tiny_model(const ModelConfig& cfg, TinyWeights& tw, std::map<std::string, Int4Tensor>& q4,
                                      int G, const ModelOptions& opt, const CudaModelOptions& copt,
                                      const std::map<std::string, std::vector<uint16_t>>* bf16 = nullptr) {
  WeightLookup lookup = [&tw, &q4, G, bf16](const std::string& name, const std::vector<int64_t>& shp) {
    if (!shp.empty() && tw.shape.count(name) && shp != tw.shape[name])
      throw CheckpointError("test checkpoint: shape of " + name);
    HostWeight h;
    auto it4 = q4.find(name);
    if (it4 != q4.end()) {
      h.dtype = DType::U8;
      h.shape = tw.shape[name];
      h.data = it4->second.q.data();
      h.scales = it4->second.s.data();
      h.zeros = it4->second.z.data();
      h.group_size = G;
      return h;
    }
    const std::vector<uint16_t>* data = nullptr;
    if (bf16 && bf16->count(name))
      data = &bf16->at(name);
    else if (tw.bf.count(name))
      data = &tw.bf.at(name);
    else
      throw CheckpointError("test checkpoint: missing " + name);
    h.dtype = DType::BF16;
    h.shape = tw.shape[name];
    h.data = data->data();
    return h;
  };
  WeightExists exists = [&tw](const std::string& name) { return tw.bf.count(name) > 0; };
  return make_cuda_model_from_host(cfg, lookup, exists, opt, copt);
}

CudaModelOptions int4_options(int G) {
  CudaModelOptions copt;
  copt.int4_group_size = G;
  copt.large_prefill = false;
  copt.autotune_verify = true;
  return copt;
}

/// The bf16 twin of an int4 model: every projection bf16 of its dequantized values (tw.f).
std::unique_ptr<CudaModel> bf16_twin(const ModelConfig& cfg, TinyWeights& tw,
                                     const std::map<std::string, Int4Tensor>& q4, const ModelOptions& opt,
                                     std::map<std::string, std::vector<uint16_t>>& storage) {
  for (const auto& kv : q4) {
    const std::vector<float>& w = tw.f[kv.first];
    std::vector<uint16_t>& b = storage[kv.first];
    b.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) b[i] = f2bf(w[i]);
  }
  CudaModelOptions copt;
  copt.large_prefill = false;
  std::map<std::string, Int4Tensor> none;
  return tiny_model(cfg, tw, none, 0, opt, copt, &storage);
}

/// One model case. With `twin` the bf16 twin runs the same inputs (the same seed draws them) and
/// only its four logit errors are kept, in `twin_errs`; otherwise the int4 model is checked, each
/// logit error against max(1e-2, 1.25 x the twin's error of that output).
void check_case(const std::string& tag, const ModelConfig& cfg, int G, uint64_t seed, bool twin,
                std::vector<double>& twin_errs) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  std::map<std::string, Int4Tensor> q4 = quantize_projections(tw, G, rng);
  ModelOptions opt;
  opt.max_context = 400;
  opt.max_tree = 128;
  std::map<std::string, std::vector<uint16_t>> twin_storage;
  auto m = twin ? bf16_twin(cfg, tw, q4, opt, twin_storage) : tiny_model(cfg, tw, q4, G, opt, int4_options(G));
  int n_err = 0;  // which logit error this is (0..3)
  // Records a logit error (the int4 pass) or keeps it (the twin pass).
  auto logit_check = [&](const char* what, double err, bool ok, const std::string& more) {
    if (twin) {
      twin_errs.push_back(err);
      ++n_err;
      return;
    }
    const double tw_err = n_err < static_cast<int>(twin_errs.size()) ? twin_errs[n_err] : 0.0;
    const double limit = std::max(1e-2, 1.25 * tw_err);
    ++n_err;
    char d[240];
    std::snprintf(d, sizeof d, "%s(bf16 twin %.3e)", more.c_str(), tw_err);
    record(what, err, limit, ok && err < limit, d);
  };
  RefModel ref(cfg, tw.f);
  RefState st = ref.empty_state();
  const int V = cfg.vocab_size;
  char name[200], det[200];
  size_t bad = 0;
  const std::string t = "int4 model[" + tag + " G=" + std::to_string(G) + "]";

  // prefill of 70 tokens (a step of 64 and one of 6), every row's logits
  std::vector<int> prompt(70);
  for (int& x : prompt) x = rng.below(V);
  std::vector<float> lg, rl;
  m->debug_poison_buffers();
  m->forward(append_batch(prompt, 0, LogitsMode::All), lg);
  for (int i = 0; i < 70; ++i) {
    const std::vector<float> r = ref.step(st, prompt[i], i);
    rl.insert(rl.end(), r.begin(), r.end());
  }
  double err = rel_err(lg, rl, &bad);
  std::snprintf(name, sizeof name, "%s prefill 70 tokens, all logits", t.c_str());
  std::snprintf(det, sizeof det, "(nonfinite=%zu, size %zu) ", bad, lg.size());
  logit_check(name, err, bad == 0 && lg.size() == static_cast<size_t>(70) * V, det);

  // rows 60..69 of the batched prefill == decoding them one by one
  if (!twin) {
    m->truncate_committed(60);
    int mism = 0;
    for (int i = 60; i < 70; ++i) {
      std::vector<float> one;
      m->forward(append_batch({prompt[i]}, i, LogitsMode::Last), one);
      if (std::memcmp(one.data(), lg.data() + static_cast<size_t>(i) * V, sizeof(float) * V) != 0) ++mism;
    }
    std::snprintf(name, sizeof name, "%s batch-64 rows bitwise == batch-1 decode", t.c_str());
    std::snprintf(det, sizeof det, "(%d of 10 rows differ)", mism);
    record(name, mism, 0, mism == 0, det);
  }

  // one decode step
  int C = 70;
  {
    const int tok = rng.below(V);
    std::vector<float> one;
    m->debug_poison_buffers();
    m->forward(append_batch({tok}, C, LogitsMode::Last), one);
    err = rel_err(one, ref.step(st, tok, C), &bad);
    std::snprintf(name, sizeof name, "%s decode at position %d", t.c_str(), C);
    logit_check(name, err, bad == 0, "");
    ++C;
  }

  // a 20-node tree: logits against the reference, its deepest path bitwise == decoding it alone
  {
    Tree tr = make_tree(20, C, V, opt.max_tree, rng);
    std::vector<float> tl, want;
    m->debug_poison_buffers();
    m->forward(tr.batch, tl);
    for (int i = 0; i < 20; ++i) {
      std::vector<int> chain;
      for (int j = i; j >= 0; j = tr.parent[j]) chain.push_back(j);
      std::reverse(chain.begin(), chain.end());
      RefState s2 = st;
      std::vector<float> r;
      for (int j : chain) r = ref.step(s2, tr.token[j], C + tr.depth[j]);
      want.insert(want.end(), r.begin(), r.end());
    }
    err = rel_err(tl, want, &bad);
    std::snprintf(name, sizeof name, "%s tree of 20 nodes, all logits", t.c_str());
    std::snprintf(det, sizeof det, "(nonfinite=%zu) ", bad);
    logit_check(name, err, bad == 0 && tl.size() == static_cast<size_t>(20) * V, det);
    int deep = 0;
    for (int i = 0; i < 20; ++i)
      if (tr.depth[i] > tr.depth[deep]) deep = i;
    std::vector<int> path;
    for (int j = deep; j >= 0; j = tr.parent[j]) path.push_back(j);
    std::reverse(path.begin(), path.end());
    int mism = 0;
    for (size_t a = 0; a < path.size(); ++a) {
      std::vector<float> one;
      m->forward(append_batch({tr.token[path[a]]}, C + static_cast<int>(a), LogitsMode::Last), one);
      if (std::memcmp(one.data(), tl.data() + static_cast<size_t>(path[a]) * V, sizeof(float) * V) != 0) ++mism;
    }
    std::snprintf(name, sizeof name, "%s tree-20 path logits bitwise == decode alone", t.c_str());
    std::snprintf(det, sizeof det, "(%d of %zu path nodes differ)", mism, path.size());
    if (!twin) record(name, mism, 0, mism == 0, det);
    m->truncate_committed(C);
  }

  // a 130-token prompt, the last row's logits: three decode steps (int4 models take no prefill path)
  {
    std::vector<int> more(130);
    for (int& x : more) x = rng.below(V);
    std::vector<float> last;
    m->debug_poison_buffers();
    m->forward(append_batch(more, C, LogitsMode::Last), last);
    std::vector<float> r;
    for (int i = 0; i < 130; ++i) r = ref.step(st, more[i], C + i);
    err = rel_err(last, r, &bad);
    std::snprintf(name, sizeof name, "%s 130-token prompt, last logits", t.c_str());
    logit_check(name, err, bad == 0 && m->committed_len() == C + 130, "");
  }
  if (!twin) std::printf("%s plans:\n%s", t.c_str(), m->debug_gemm_plans().c_str());
}

/// Options and values an int4 model must refuse.
void check_refusals() {
  const ModelConfig cfg = tiny_config("llama", 256, 512, 4, 2, 64, 1000, false, false, RopeStyle::NeoX, true);
  Rng rng(31);
  TinyWeights tw = make_weights(cfg, rng);
  std::map<std::string, Int4Tensor> q4 = quantize_projections(tw, 64, rng);
  ModelOptions opt;
  opt.max_context = 64;
  opt.max_tree = 16;
  auto expect = [&](const std::string& what, const CudaModelOptions& copt, std::map<std::string, Int4Tensor>& tensors,
                    const std::string& needle) {
    std::string msg;
    try {
      tiny_model(cfg, tw, tensors, 64, opt, copt);
    } catch (const std::exception& e) {
      msg = e.what();
    }
    const bool ok = msg.find(needle) != std::string::npos;
    record("int4 model refuses " + what, ok ? 0.0 : 1.0, 0.0, ok, "(" + (msg.empty() ? "accepted" : msg) + ")");
  };
  CudaModelOptions mk = int4_options(64);
  mk.megakernel = true;
  expect("the megakernel", mk, q4, "decode megakernel: int4 weights");
  CudaModelOptions pre = int4_options(64);
  pre.large_prefill = true;
  expect("the prefill path", pre, q4, "large_prefill: int4 weights");
  expect("a group size of 48", int4_options(48), q4, "group size must be a multiple of 32");
  // group-64 tensors handed to a model told 128: named, not misread
  expect("tensors of another group size", int4_options(128), q4, "int4 projections of group size 128 expected");
  std::map<std::string, Int4Tensor> none;  // every projection handed as bf16
  expect("a float projection", int4_options(64), none, "got a float tensor");
}

}  // namespace

void check_int4_model() {
  try {
    check_refusals();
    struct Case {
      const char* tag;
      ModelConfig cfg;
      int G;
      uint64_t seed;
    };
    const Case cases[] = {
        {"llama-like", tiny_config("llama", 256, 512, 4, 2, 64, 1000, false, false, RopeStyle::NeoX, true), 64, 11},
        {"qwen2-like", tiny_config("qwen2", 512, 1024, 4, 1, 128, 2048, true, true, RopeStyle::Interleaved, false), 128,
         12},
        {"gqa7", tiny_config("qwen2", 448, 1216, 7, 1, 64, 1536, true, true, RopeStyle::NeoX, false), 32, 13},
    };
    for (const Case& c : cases) {
      std::vector<double> twin_errs;
      check_case(c.tag, c.cfg, c.G, c.seed, true, twin_errs);
      check_case(c.tag, c.cfg, c.G, c.seed, false, twin_errs);
    }
  } catch (const std::exception& e) {
    record("int4 model checks (aborted)", NAN, 0.0, false, std::string("exception: ") + e.what());
  }
}

}  // namespace swiftspec::cuda_check
