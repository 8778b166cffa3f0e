// swiftspec-cuda-check: correctness checks of the CUDA backend on the GPU.
//
//  1. Skinny GEMM (all token buckets, several N x K incl. cluster split-K and
//     persistent row-block loops) against a double-precision CPU product, on
//     fresh random bf16 inputs (no zeros), outputs poisoned (NaN) before each
//     run; rows past M must stay untouched; row 0 must be bit-identical for
//     every M (batch invariance).
//  2. Whole tiny models (Llama-style with llama3 RoPE scaling and a vocab that
//     is not a multiple of 16; Qwen2-style with q/k/v bias, tied embeddings and
//     interleaved RoPE; a 7:1 GQA group; YaRN RoPE scaling) against an fp32 CPU reference:
//     prefill > 64 tokens (logits of every row), decode, tree verification of
//     12 / 20 / 64 nodes; and the exactness contract of model.h: tree logits
//     and K/V bit-identical to decoding the same path alone, batch-of-64 rows
//     bit-identical to batch-of-1, commit_tree_slots copying K/V exactly.
// Relative error = ||out - ref||_F / ||ref||_F, limit 1e-2 (bf16).
//     Model::forward_top_k on the GPU against the host selection from the same
//     logits, and the top-k kernel alone on rows with ties, +-0, -inf and NaN.
//  3. The decode megakernel: single-token steps vs the fp32 reference and vs
//     the layered path (tiny models, 30..200 steps; the benchmark shapes).
//  4. The int4-weight skinny GEMM (check_int4.cu): against an fp64 product of the same
//     int4 values at the model shapes, batch invariance bitwise; then tiny models with int4
//     projections against the fp32 reference (check_int4_model.cu); run last (never run on a
//     GPU when written: a fault there cannot take the checks above down).
//  Long contexts (with the models', and alone with --long-only): the attention, trees and prefill
//     at up to 40000 keys (check_long_context.cu); the step tuner's context bands and the
//     megakernel's hand-over (check_context_bands.cu).
// Usage: swiftspec-cuda-check [--json PATH] [--megakernel-only | --long-only | --int4-only].
// Exit status 1 if any check fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "device_memory.h"
#include "kernels/decode_megakernel.h"
#include "kernels/epilogues.h"
#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"
#include "check_harness.h"
#include "check_context_bands.h"
#include "check_int4.h"
#include "check_int4_model.h"
#include "check_long_context.h"
#include "reference_model.h"
#include "model_shapes.h"
#include "swiftspec_cuda/cuda_model.h"
#include "tma_map.h"

using namespace swiftspec;
using namespace swiftspec::cuda;
using namespace swiftspec::cuda_check;

namespace {

int bucket_nt(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// ---------------------------------------------------------------------------
// 1. GEMM
// ---------------------------------------------------------------------------
void check_gemm(int N, int K, const std::vector<int>& Ms, Rng& rng, int num_sms, cudaStream_t st,
                const GemmPlanHint& hint = {}) {
  constexpr int R = kMaxStepTokens;
  std::vector<uint16_t> w(static_cast<size_t>(N) * K), x(static_cast<size_t>(R) * K);
  const float ws = 1.0f / std::sqrt(static_cast<float>(K));
  for (auto& v : w) v = f2bf(rng.sym(ws));
  for (auto& v : x) v = f2bf(rng.sym(1.0f));
  std::vector<float> ref(static_cast<size_t>(R) * N);
  const int maxM = *std::max_element(Ms.begin(), Ms.end());
  parallel_for(N, [&](int n) {
    for (int m = 0; m < maxM; ++m) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        s += static_cast<double>(bf2f(w[static_cast<size_t>(n) * K + k])) * bf2f(x[static_cast<size_t>(m) * K + k]);
      ref[static_cast<size_t>(m) * N + n] = static_cast<float>(s);
    }
  });
  DeviceBuffer dw(w.size() * 2), dx(x.size() * 2), dout(sizeof(float) * R * N);
  SS_CUDA_CHECK(cudaMemcpyAsync(dw.get(), w.data(), dw.bytes(), cudaMemcpyHostToDevice, st));
  SS_CUDA_CHECK(cudaMemcpyAsync(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice, st));
  std::vector<float> row0_m1;
  std::vector<float> out(static_cast<size_t>(R) * N);
  for (int M : Ms) {
    const int nt = bucket_nt(M);
    const GemmConfig c = plan_gemm<EpiPlain>(N, K, nt, num_sms, hint);
    const CUtensorMap wm = make_tma_map_bf16(dw.get(), N, K, K, c.BR);
    const CUtensorMap xm = make_tma_map_bf16(dx.get(), R, K, K, 8 * nt);
    GemmArgs a;
    a.N = N;
    a.K = K;
    a.m_active_max = M;
    EpiPlain::Params e;
    e.out = dout.as<float>();
    e.ldo = N;
    SS_CUDA_CHECK(cudaMemsetAsync(dout.get(), 0xFF, dout.bytes(), st));
    launch_gemm<EpiPlain>(c, wm, xm, a, e, false, st);
    SS_CUDA_CHECK(cudaStreamSynchronize(st));
    SS_CUDA_CHECK(cudaMemcpy(out.data(), dout.get(), dout.bytes(), cudaMemcpyDeviceToHost));
    std::vector<float> o(out.begin(), out.begin() + static_cast<size_t>(M) * N);
    std::vector<float> r(ref.begin(), ref.begin() + static_cast<size_t>(M) * N);
    size_t bad = 0;
    const double err = rel_err(o, r, &bad);
    size_t touched = 0;  // rows >= M must keep the poison pattern
    for (size_t i = static_cast<size_t>(M) * N; i < out.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &out[i], 4);
      if (u != 0xFFFFFFFFu) ++touched;
    }
    char name[128], det[200];
    const char* eng = c.engine == GemmEngine::Mma ? "mma" : (c.split_n ? "wgmma-n8" : "wgmma");
    std::snprintf(name, sizeof name, "gemm[%s] N=%d K=%d M=%d", eng, N, K, M);
    std::snprintf(det, sizeof det,
                  "(S=%d BR=%d stages=%d xres=%d palias=%d grid=%dx%d nonfinite=%zu rows>=M written=%zu)", c.S, c.BR,
                  c.stages, c.xres, c.palias, c.grid_x, c.S, bad, touched);
    record(name, err, 1e-2, err < 1e-2 && bad == 0 && touched == 0, det);
    std::vector<float> row0(out.begin(), out.begin() + N);
    if (row0_m1.empty()) {
      row0_m1 = row0;
    } else {
      const bool same = std::memcmp(row0.data(), row0_m1.data(), sizeof(float) * N) == 0;
      std::snprintf(name, sizeof name, "gemm[%s] N=%d K=%d M=%d row0 bitwise == M=%d", eng, N, K, M, Ms[0]);
      record(name, same ? 0.0 : 1.0, 0.0, same);
    }
  }
}

/// The fused-RMSNorm path of the GEMM: ssq partials of X per 16 columns, the
/// kernel computes 1/rms per token (spread over the cluster) and scales.
void check_gemm_rms(int N, int K, const std::vector<int>& Ms, Rng& rng, int num_sms, cudaStream_t st,
                    const GemmPlanHint& hint = {}) {
  constexpr int R = kMaxStepTokens;
  std::vector<uint16_t> w(static_cast<size_t>(N) * K), x(static_cast<size_t>(R) * K);
  for (auto& v : w) v = f2bf(rng.sym(1.0f / std::sqrt(static_cast<float>(K))));
  for (auto& v : x) v = f2bf(rng.sym(3.0f));
  std::vector<float> ssq(static_cast<size_t>(R) * (K / 16));
  std::vector<double> rinv(R);
  for (int m = 0; m < R; ++m) {
    double tot = 0;
    for (int t = 0; t < K / 16; ++t) {
      float s = 0;
      for (int j = 0; j < 16; ++j) {
        const float v = bf2f(x[static_cast<size_t>(m) * K + t * 16 + j]);
        s += v * v;
      }
      ssq[static_cast<size_t>(m) * (K / 16) + t] = s;
      tot += s;
    }
    rinv[m] = 1.0 / std::sqrt(tot / K + 1e-6);
  }
  const int maxM = *std::max_element(Ms.begin(), Ms.end());
  std::vector<float> ref(static_cast<size_t>(R) * N);
  parallel_for(N, [&](int n) {
    for (int m = 0; m < maxM; ++m) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        s += static_cast<double>(bf2f(w[static_cast<size_t>(n) * K + k])) * bf2f(x[static_cast<size_t>(m) * K + k]);
      ref[static_cast<size_t>(m) * N + n] = static_cast<float>(s * rinv[m]);
    }
  });
  DeviceBuffer dw(w.size() * 2), dx(x.size() * 2), dssq(ssq.size() * 4), dout(sizeof(float) * R * N);
  SS_CUDA_CHECK(cudaMemcpyAsync(dw.get(), w.data(), dw.bytes(), cudaMemcpyHostToDevice, st));
  SS_CUDA_CHECK(cudaMemcpyAsync(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice, st));
  SS_CUDA_CHECK(cudaMemcpyAsync(dssq.get(), ssq.data(), dssq.bytes(), cudaMemcpyHostToDevice, st));
  std::vector<float> out(static_cast<size_t>(R) * N);
  for (int M : Ms) {
    const int nt = bucket_nt(M);
    const GemmConfig c = plan_gemm<EpiPlainRms>(N, K, nt, num_sms, hint);
    const CUtensorMap wm = make_tma_map_bf16(dw.get(), N, K, K, c.BR);
    const CUtensorMap xm = make_tma_map_bf16(dx.get(), R, K, K, 8 * nt);
    GemmArgs a;
    a.N = N;
    a.K = K;
    a.m_active_max = M;
    a.ssq = dssq.as<float>();
    a.ssq_stride = K / 16;
    a.hidden = K;
    a.eps = 1e-6f;
    EpiPlainRms::Params e;
    e.out = dout.as<float>();
    e.ldo = N;
    SS_CUDA_CHECK(cudaMemsetAsync(dout.get(), 0xFF, dout.bytes(), st));
    launch_gemm<EpiPlainRms>(c, wm, xm, a, e, false, st);
    SS_CUDA_CHECK(cudaStreamSynchronize(st));
    SS_CUDA_CHECK(cudaMemcpy(out.data(), dout.get(), dout.bytes(), cudaMemcpyDeviceToHost));
    std::vector<float> o(out.begin(), out.begin() + static_cast<size_t>(M) * N);
    std::vector<float> r(ref.begin(), ref.begin() + static_cast<size_t>(M) * N);
    size_t bad = 0;
    const double err = rel_err(o, r, &bad);
    char name[128], det[200];
    std::snprintf(name, sizeof name, "gemm+rmsnorm[%s] N=%d K=%d M=%d", c.engine == GemmEngine::Wgmma ? "wgmma" : "mma",
                  N, K, M);
    std::snprintf(det, sizeof det, "(S=%d BR=%d stages=%d xres=%d palias=%d grid=%dx%d nonfinite=%zu)", c.S, c.BR,
                  c.stages, c.xres, c.palias, c.grid_x, c.S, bad);
    record(name, err, 1e-2, err < 1e-2 && bad == 0, det);
  }
}

// ---------------------------------------------------------------------------
// 2. Tiny models
// ---------------------------------------------------------------------------
int argmax_of(const float* v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

/// Mismatches of `got` against the host reference select_top_k_logits(`logits`): ids and
/// the number of rows exactly, values bitwise (or as floats with `values_as_floats`: the
/// fused arg-max returns -0 as +0), log-normalizers to `lse_tol` relative. Returns the
/// worst relative log-normalizer error in `lse_err`.
int top_k_mismatches(const TopKLogits& got, const std::vector<float>& logits, int vocab, int k, bool lse,
                     bool values_as_floats, double& lse_err, double inv_t = 1.0) {
  TopKLogits want;
  select_top_k_logits(logits.data(), static_cast<int>(logits.size() / vocab), vocab, k, lse, want, inv_t);
  lse_err = 0.0;
  if (got.k != want.k || got.ids.size() != want.ids.size() || got.logits.size() != want.logits.size() ||
      got.log_normalizer.size() != want.log_normalizer.size() || got.inv_temperature != want.inv_temperature)
    return 1 << 20;
  int bad = 0;
  for (size_t i = 0; i < want.ids.size(); ++i) {
    const bool same_value = values_as_floats ? got.logits[i] == want.logits[i]
                                             : std::memcmp(&got.logits[i], &want.logits[i], sizeof(float)) == 0;
    bad += (got.ids[i] != want.ids[i] || !same_value) ? 1 : 0;
  }
  for (size_t r = 0; r < want.log_normalizer.size(); ++r)
    lse_err = std::max(lse_err, std::fabs(got.log_normalizer[r] - want.log_normalizer[r]) /
                                    std::max(1.0, std::fabs(want.log_normalizer[r])));
  return bad;
}

/// launch_logits_top_k on synthetic rows of a 151936-token vocabulary against the host
/// reference: random rows, ties at the maximum (equal values at scattered ids, a row of one
/// value), -0 and +0 as the maximum, -inf entries, and a NaN row that must be flagged.
void check_logits_top_k(Rng& rng, cudaStream_t st) {
  const int V = 151936, rows = 64;
  std::vector<float> h(static_cast<size_t>(rows) * V);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (auto& x : h) x = nd(rng.g);
  auto row = [&](int r) { return h.data() + static_cast<size_t>(r) * V; };
  for (int id : {5, 100, 77777, V - 1}) row(1)[id] = 40.f;  // 4-way tie at the maximum
  for (int id : {6, 101}) row(1)[id] = 39.f;
  std::fill(row(2), row(2) + V, 1.25f);  // every id ties
  std::fill(row(3), row(3) + V, -1.f);
  row(3)[10] = -0.0f;
  row(3)[7] = 0.0f;  // -0 == +0: ids 7 then 10
  row(3)[9] = -0.0f;
  for (int i = 0; i < V; i += 3) row(4)[i] = -INFINITY;         // -inf entries
  row(5)[1234] = NAN;                                           // flagged
  for (int i = 0; i < 1000; ++i) row(6)[rng.below(V)] = 100.f;  // ties spread over segments
  DeviceBuffer d_logits, d_keys, d_ms, d_nan, d_out;
  d_logits.allocate(sizeof(float) * h.size());
  d_keys.allocate(sizeof(unsigned long long) * kMaxStepTokens * kTopKSegments * kTopKMax);
  d_ms.allocate(sizeof(double2) * kMaxStepTokens * kTopKSegments);
  d_nan.allocate(sizeof(int) * kMaxStepTokens * kTopKSegments);
  d_out.allocate(sizeof(TopKRow) * kMaxStepTokens);
  SS_CUDA_CHECK(cudaMemcpy(d_logits.get(), h.data(), sizeof(float) * h.size(), cudaMemcpyHostToDevice));
  const TopKScratch scratch{d_keys.as<unsigned long long>(), d_ms.as<double2>(), d_nan.as<int>()};
  std::vector<TopKRow> out(rows);
  for (int k : {1, 3, kTopKListMax, kTopKListMax + 1, 50, kTopKMax}) {
    SS_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, d_out.bytes()));  // poisoned
    launch_logits_top_k(d_logits.as<float>(), rows, V, k, true, scratch, d_out.as<TopKRow>(), st);
    SS_CUDA_CHECK(cudaMemcpyAsync(out.data(), d_out.get(), sizeof(TopKRow) * rows, cudaMemcpyDeviceToHost, st));
    SS_CUDA_CHECK(cudaStreamSynchronize(st));
    int bad = 0;
    double lse_err = 0.0;
    for (int r = 0; r < rows; ++r) {
      if (r == 5) {
        bad += out[r].nan == 1 ? 0 : 1;
        continue;
      }
      TopKLogits got;
      got.k = k;
      got.ids.assign(out[r].ids, out[r].ids + k);
      got.logits.assign(out[r].values, out[r].values + k);
      got.log_normalizer.push_back(out[r].log_normalizer);
      double e = 0.0;
      const std::vector<float> one(row(r), row(r) + V);
      bad += out[r].nan != 0 ? 1 : top_k_mismatches(got, one, V, k, true, false, e);
      lse_err = std::max(lse_err, e);
    }
    char name[128], det[128];
    std::snprintf(name, sizeof name, "logits top-k kernel, 64 rows x 151936, k=%d (ties, +-0, -inf, NaN)", k);
    std::snprintf(det, sizeof det, "(%d mismatched entries/rows; worst ln Z rel. error %.2e)", bad, lse_err);
    record(name, lse_err, 1e-12, bad == 0 && lse_err < 1e-12, det);
  }
  // The normaliser at a temperature (sample_from_head: ln sum exp(x / T)): inverse temperatures
  // 1 / 0.7, 1 / 1.5 and 1 / 0.05 against the host log_normalizer(row, V, inv_t); the selection
  // unchanged (ids and values bitwise); inv_t = 1 bit-identical to the launch without it.
  for (int k : {8, kTopKMax}) {
    std::vector<TopKRow> base(rows);
    launch_logits_top_k(d_logits.as<float>(), rows, V, k, true, scratch, d_out.as<TopKRow>(), st);
    SS_CUDA_CHECK(cudaMemcpyAsync(base.data(), d_out.get(), sizeof(TopKRow) * rows, cudaMemcpyDeviceToHost, st));
    SS_CUDA_CHECK(cudaStreamSynchronize(st));
    int bad = 0;
    double lse_err = 0.0;
    for (double inv_t : {1.0, 1.0 / 0.7, 1.0 / 1.5, 1.0 / 0.05}) {
      SS_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, d_out.bytes()));  // poisoned
      launch_logits_top_k(d_logits.as<float>(), rows, V, k, true, scratch, d_out.as<TopKRow>(), st, inv_t);
      SS_CUDA_CHECK(cudaMemcpyAsync(out.data(), d_out.get(), sizeof(TopKRow) * rows, cudaMemcpyDeviceToHost, st));
      SS_CUDA_CHECK(cudaStreamSynchronize(st));
      for (int r = 0; r < rows; ++r) {
        if (r == 5) {
          bad += out[r].nan == 1 ? 0 : 1;
          continue;
        }
        bad += std::memcmp(out[r].ids, base[r].ids, sizeof(int) * k) != 0 ? 1 : 0;
        bad += std::memcmp(out[r].values, base[r].values, sizeof(float) * k) != 0 ? 1 : 0;
        if (inv_t == 1.0)
          bad += std::memcmp(&out[r].log_normalizer, &base[r].log_normalizer, sizeof(double)) != 0 ? 1 : 0;
        const double want = log_normalizer(row(r), V, inv_t);
        lse_err = std::max(lse_err, std::fabs(out[r].log_normalizer - want) / std::max(1.0, std::fabs(want)));
      }
    }
    char name[128], det[128];
    std::snprintf(name, sizeof name, "logits top-k kernel, k=%d: ln sum exp(x / T) at T = 1, 0.7, 1.5, 0.05", k);
    std::snprintf(det, sizeof det, "(%d mismatched rows; worst ln Z_T rel. error %.2e)", bad, lse_err);
    // The device and the host sum V positive fp64 terms in different orders: each sum is within
    // (V - 1) u of the exact one (u = 2^-53), so that bounds their difference in ln Z_T (run of
    // 2026-11-30: 7.0e-12 at T = 0.05, where exp(20 (x - max)) spreads the terms most).
    const double bound = static_cast<double>(V) * std::ldexp(1.0, -53) * 2.0;
    record(name, lse_err, bound, bad == 0 && lse_err < bound, det);
  }
}

/// `append`: tokens appended after the first trees (c2), in steps of 64; a long one (> 16 * 64
/// committed keys) makes the attention's CTAs loop over several chunks each.
void check_model(const std::string& tag, const ModelConfig& cfg, uint64_t seed, int append = 160) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = append + 200;
  opt.max_tree = 128;
  CudaModelOptions copt;
  auto m = tiny_model(cfg, tw, opt, copt);
  cuda_check::RefModel ref(cfg, tw.f);
  cuda_check::RefState st = ref.empty_state();
  const int V = cfg.vocab_size;
  char name[160], det[200];

  // (a) prefill of 70 tokens (steps of 64 + 6), logits of every row
  std::vector<int> prompt(70);
  for (auto& t : prompt) t = rng.below(V);
  std::vector<float> lg;
  m->debug_poison_buffers();
  m->forward(append_batch(prompt, 0, LogitsMode::All), lg);
  std::vector<float> rl;
  for (int i = 0; i < 70; ++i) {
    const std::vector<float> r = ref.step(st, prompt[i], i);
    rl.insert(rl.end(), r.begin(), r.end());
  }
  size_t bad = 0;
  double err = rel_err(lg, rl, &bad);
  std::snprintf(name, sizeof name, "model[%s] prefill 70 tokens, all logits", tag.c_str());
  std::snprintf(det, sizeof det, "(nonfinite=%zu, size %zu)", bad, lg.size());
  record(name, err, 1e-2, err < 1e-2 && bad == 0 && lg.size() == static_cast<size_t>(70) * V, det);

  // (e) batch invariance: rows 60..69 of the batched prefill == decoding them one by one
  {
    m->truncate_committed(60);
    int mism = 0;
    for (int i = 60; i < 70; ++i) {
      std::vector<float> one;
      m->forward(append_batch({prompt[i]}, i, LogitsMode::Last), one);
      if (std::memcmp(one.data(), lg.data() + static_cast<size_t>(i) * V, sizeof(float) * V) != 0) ++mism;
    }
    std::snprintf(name, sizeof name, "model[%s] batch-64 rows bitwise == batch-1 decode", tag.c_str());
    std::snprintf(det, sizeof det, "(%d of 10 rows differ)", mism);
    record(name, mism, 0, mism == 0, det);
  }

  // (b) decode one token; (f) argmax on the GPU
  int C = 70;
  {
    const int tok = rng.below(V);
    std::vector<float> one;
    m->debug_poison_buffers();
    m->forward(append_batch({tok}, C, LogitsMode::Last), one);
    const std::vector<float> r = ref.step(st, tok, C);
    err = rel_err(one, r, &bad);
    std::snprintf(name, sizeof name, "model[%s] decode at position %d", tag.c_str(), C);
    record(name, err, 1e-2, err < 1e-2 && bad == 0);
    m->truncate_committed(C);
    std::vector<int32_t> am;
    m->forward_argmax(append_batch({tok}, C, LogitsMode::Last), am);
    const int want = argmax_of(one.data(), V);
    std::snprintf(name, sizeof name, "model[%s] GPU argmax == argmax(logits)", tag.c_str());
    std::snprintf(det, sizeof det, "(gpu %d, host %d)", am.empty() ? -1 : am[0], want);
    record(name, am.size() == 1 && am[0] == want ? 0 : 1, 0, am.size() == 1 && am[0] == want, det);
    ++C;
  }

  // (c) tree verification, exactness, commit
  const auto check_tree = [&](int nodes) {
    Tree t = make_tree(nodes, C, V, opt.max_tree, rng);
    std::vector<float> tl;
    m->debug_poison_buffers();
    m->forward(t.batch, tl);
    std::vector<float> tr;
    for (int i = 0; i < nodes; ++i) {
      std::vector<int> chain;
      for (int j = i; j >= 0; j = t.parent[j]) chain.push_back(j);
      std::reverse(chain.begin(), chain.end());
      cuda_check::RefState s2 = st;
      std::vector<float> r;
      for (int j : chain) r = ref.step(s2, t.token[j], C + t.depth[j]);
      tr.insert(tr.end(), r.begin(), r.end());
    }
    err = rel_err(tl, tr, &bad);
    std::snprintf(name, sizeof name, "model[%s] tree of %d nodes, all logits", tag.c_str(), nodes);
    std::snprintf(det, sizeof det, "(nonfinite=%zu)", bad);
    record(name, err, 1e-2, err < 1e-2 && bad == 0 && tl.size() == static_cast<size_t>(nodes) * V, det);

    // deepest path
    int deep = 0;
    for (int i = 0; i < nodes; ++i)
      if (t.depth[i] > t.depth[deep]) deep = i;
    std::vector<int> path;
    for (int j = deep; j >= 0; j = t.parent[j]) path.push_back(j);
    std::reverse(path.begin(), path.end());
    std::vector<int32_t> pslots;
    for (int j : path) pslots.push_back(t.slot[j]);
    const int L = cfg.num_layers - 1;
    std::vector<float> tk, tv;
    m->read_tree_kv(L, pslots, tk, tv);
    int mism = 0;
    for (size_t a = 0; a < path.size(); ++a) {
      std::vector<float> one;
      m->forward(append_batch({t.token[path[a]]}, C + static_cast<int>(a), LogitsMode::Last), one);
      if (std::memcmp(one.data(), tl.data() + static_cast<size_t>(path[a]) * V, sizeof(float) * V) != 0) ++mism;
    }
    std::snprintf(name, sizeof name, "model[%s] tree-%d path logits bitwise == decode alone", tag.c_str(), nodes);
    std::snprintf(det, sizeof det, "(%d of %zu path nodes differ)", mism, path.size());
    record(name, mism, 0, mism == 0, det);
    std::vector<float> ck, cv;
    m->read_committed_kv(L, ck, cv);
    const size_t row = static_cast<size_t>(cfg.num_kv_heads) * cfg.head_dim;
    const bool kv_same = std::memcmp(ck.data() + C * row, tk.data(), sizeof(float) * tk.size()) == 0 &&
                         std::memcmp(cv.data() + C * row, tv.data(), sizeof(float) * tv.size()) == 0;
    std::snprintf(name, sizeof name, "model[%s] tree-%d path K/V bitwise == decode alone", tag.c_str(), nodes);
    record(name, kv_same ? 0 : 1, 0, kv_same);
    m->truncate_committed(C);
    m->commit_tree_slots(pslots);
    m->read_committed_kv(L, ck, cv);
    const bool commit_same = m->committed_len() == C + static_cast<int>(path.size()) &&
                             std::memcmp(ck.data() + C * row, tk.data(), sizeof(float) * tk.size()) == 0 &&
                             std::memcmp(cv.data() + C * row, tv.data(), sizeof(float) * tv.size()) == 0;
    std::snprintf(name, sizeof name, "model[%s] commit_tree_slots copies K/V exactly", tag.c_str());
    record(name, commit_same ? 0 : 1, 0, commit_same);
    for (int j : path) ref.step(st, t.token[j], C + t.depth[j]);
    C += static_cast<int>(path.size());

    // (d) decode after the commit
    const int tok = rng.below(V);
    std::vector<float> one;
    m->debug_poison_buffers();
    m->forward(append_batch({tok}, C, LogitsMode::Last), one);
    const std::vector<float> r = ref.step(st, tok, C);
    err = rel_err(one, r, &bad);
    std::snprintf(name, sizeof name, "model[%s] decode after committing a %zu-node path", tag.c_str(), path.size());
    record(name, err, 1e-2, err < 1e-2 && bad == 0);
    ++C;
  };
  for (int nodes : {12, 20, 64}) check_tree(nodes);

  // (c2) a longer committed prefix: `append` tokens appended in steps of 64 (the attention's shared-prefix
  // CTAs take the whole committed chunks in append mode), then a 40-node tree over the whole committed
  // chunks (3-4 of them, or > 16 with a long append: a CTA then loops over several): logits against the
  // reference, the path bitwise == decode alone (per-block CTAs).
  {
    std::vector<int> more(append);
    for (auto& t : more) t = rng.below(V);
    std::vector<float> ml;
    m->debug_poison_buffers();
    m->forward(append_batch(more, C, LogitsMode::All), ml);
    std::vector<float> mr;
    for (int i = 0; i < append; ++i) {
      const std::vector<float> r = ref.step(st, more[i], C + i);
      mr.insert(mr.end(), r.begin(), r.end());
    }
    err = rel_err(ml, mr, &bad);
    std::snprintf(name, sizeof name, "model[%s] append %d tokens after %d, all logits", tag.c_str(), append, C);
    std::snprintf(det, sizeof det, "(nonfinite=%zu)", bad);
    record(name, err, 1e-2, err < 1e-2 && bad == 0 && ml.size() == static_cast<size_t>(append) * V, det);
    C += append;
    check_tree(40);
  }

  // (g) forward_top_k (Model::forward_top_k on the GPU) == the host selection from forward()'s logits:
  // a 20-node tree (k = 1 fused arg-max; 2 .. kTopKMax on the GPU, register lists up to 16, sorted segments
  // beyond; kTopKMax + 1 on the host path) and a
  // decode step; a k outside [1, vocab] is refused before the pass (the committed length stays).
  {
    Tree t = make_tree(20, C, V, opt.max_tree, rng);
    std::vector<float> tl;
    m->forward(t.batch, tl);
    int bad = 0;
    double worst = 0.0;
    for (int k : {1, 2, 8, kTopKListMax, 50, kTopKMax, kTopKMax + 1}) {
      for (bool lse : {false, true}) {
        TopKLogits top;
        m->forward_top_k(t.batch, k, lse, top);
        double e = 0.0;
        bad += top_k_mismatches(top, tl, V, k, lse, k == 1 && !lse, e);
        worst = std::max(worst, e);
      }
    }
    const int tok = rng.below(V);
    std::vector<float> one;
    m->forward(append_batch({tok}, C, LogitsMode::Last), one);
    m->truncate_committed(C);
    TopKLogits top;
    m->forward_top_k(append_batch({tok}, C, LogitsMode::Last), 2, true, top);
    double e = 0.0;
    bad += top_k_mismatches(top, one, V, 2, true, false, e);
    worst = std::max(worst, e);
    bad += m->committed_len() == C + 1 ? 0 : 1;
    m->truncate_committed(C);
    bool refused = false;
    try {
      m->forward_top_k(append_batch({tok}, C, LogitsMode::Last), 0, false, top);
    } catch (const InvalidArgument&) {
      refused = m->committed_len() == C;
    }
    std::snprintf(name, sizeof name, "model[%s] forward_top_k == top-k of forward() logits", tag.c_str());
    std::snprintf(det, sizeof det, "(%d mismatches; worst ln Z rel. error %.2e; k=0 refused: %d)", bad, worst,
                  refused ? 1 : 0);
    record(name, worst, 1e-12, bad == 0 && worst < 1e-12 && refused, det);
  }

  // (g2) the normaliser at a temperature (forward_top_k's inv_temperature, what sample_from_head reads)
  // and Model::read_logits_row: the same 20-node tree's rows at T = 0.7 (k = 8 and kTopKMax on the GPU,
  // kTopKMax + 1 on the host path) against the host log_normalizer(row, V, 1 / T); every row read back
  // bitwise equal to forward()'s; the errors: a row out of range, after a k = 1 pass without
  // normaliser, after a later forward(); a 70-node tree (two pieces of at most kMaxStepTokens): rows of
  // its last piece readable, an earlier piece's refused.
  {
    Tree t = make_tree(20, C, V, opt.max_tree, rng);
    std::vector<float> tl;
    m->forward(t.batch, tl);
    const int rows = static_cast<int>(tl.size() / V);
    const double inv_t = 1.0 / 0.7;
    int bad = 0;
    double worst = 0.0;
    for (int k : {8, kTopKMax, kTopKMax + 1}) {
      TopKLogits top;
      m->forward_top_k(t.batch, k, true, top, inv_t);
      double e = 0.0;
      bad += top_k_mismatches(top, tl, V, k, true, false, e, inv_t);
      worst = std::max(worst, e);
      std::vector<float> one;
      for (int r = 0; r < rows; ++r) {
        m->read_logits_row(r, one);
        bad += (one.size() == static_cast<size_t>(V) &&
                std::memcmp(one.data(), tl.data() + static_cast<size_t>(r) * V, sizeof(float) * V) == 0)
                   ? 0
                   : 1;
      }
    }
    auto refuses = [&](int r, const char* needle) {
      std::vector<float> one;
      try {
        m->read_logits_row(r, one);
      } catch (const InvalidArgument& ex) {
        return std::strstr(ex.what(), needle) != nullptr ? 0 : 1;
      }
      return 1;
    };
    bad += refuses(rows, "is outside [0, rows=20)");
    bad += refuses(-1, "is outside [0, rows=20)");
    TopKLogits top;
    m->forward_top_k(t.batch, 1, false, top);
    bad += refuses(0, "kept no logits");
    m->forward_top_k(t.batch, 8, true, top, inv_t);
    bad += refuses(0, "") == 0 ? 1 : 0;  // readable again
    m->forward(t.batch, tl);
    bad += refuses(0, "a later pass of this model replaced");
    int pieces_bad = 0;
    if (opt.max_tree >= 70) {
      Tree big = make_tree(70, C, V, opt.max_tree, rng);
      std::vector<float> bl;
      m->forward(big.batch, bl);
      m->forward_top_k(big.batch, kTopKMax, true, top, inv_t);
      double e = 0.0;
      pieces_bad += top_k_mismatches(top, bl, V, kTopKMax, true, false, e, inv_t);
      worst = std::max(worst, e);
      std::vector<float> one;
      const int first_kept = 70 - (70 % kMaxStepTokens == 0 ? kMaxStepTokens : 70 % kMaxStepTokens);
      for (int r = 0; r < 70; ++r) {
        if (r < first_kept) {
          pieces_bad += refuses(r, "overwritten by a later piece");
          continue;
        }
        m->read_logits_row(r, one);
        pieces_bad += std::memcmp(one.data(), bl.data() + static_cast<size_t>(r) * V, sizeof(float) * V) == 0 ? 0 : 1;
      }
    }
    std::snprintf(name, sizeof name, "model[%s] forward_top_k at T = 0.7 and read_logits_row", tag.c_str());
    std::snprintf(det, sizeof det, "(%d mismatches, %d in the 70-node tree; worst ln Z_T rel. error %.2e)", bad,
                  pieces_bad, worst);
    record(name, worst, 1e-12, bad == 0 && pieces_bad == 0 && worst < 1e-12, det);
  }

  // bad input is rejected
  bool threw = false;
  try {
    std::vector<float> one;
    m->forward(append_batch({V}, C, LogitsMode::Last), one);
  } catch (const InvalidArgument&) {
    threw = true;
  }
  std::snprintf(name, sizeof name, "model[%s] token id >= vocab -> InvalidArgument", tag.c_str());
  record(name, threw ? 0 : 1, 0, threw);
}

// ---------------------------------------------------------------------------
// 3. The decode megakernel (CudaModelOptions::megakernel)
// ---------------------------------------------------------------------------
/// Single-token steps of a megakernel model against the fp32 CPU reference
/// and against the layered path of the same weights (a second model), over
/// a 70-token prompt and `steps` decode steps (attention by query heads, in
/// up to `head_parts` CTAs each, up to `head_keys` keys (MegaPlan::head_keys,
/// head_parts), then over 1..5 key splits and a merge); bitwise
/// repeatability; GPU arg-max; a tree-mode single-node step; a step without
/// logits; K/V written into the cache.
/// CudaModelOptions::autotune: the tuned model (it times each bucket's step
/// graph under several launch settings when it is made, then keeps one: PDL
/// edges, GEMM plan variants; with autotune_verify every candidate's outputs
/// must equal the default's bitwise, or the model is not made) gives the same
/// logits, bit for bit, as a model without PDL, over a prefill (buckets 8 and
/// 1), decode steps and a 40-node tree (bucket 8 again, bucket 4 via a
/// 20-node tree), and it reports one tuning line per bucket (all four are
/// tuned when the model is made).
void check_step_tuning(const ModelConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = 320;
  opt.max_tree = 128;
  CudaModelOptions tuned, nopdl;
  tuned.autotune = true;
  tuned.autotune_verify = true;
  nopdl.use_pdl = false;
  auto a = tiny_model(cfg, tw, opt, tuned);
  auto b = tiny_model(cfg, tw, opt, nopdl);
  std::vector<int> prompt(70);
  for (auto& t : prompt) t = rng.below(cfg.vocab_size);
  std::vector<ForwardBatch> steps{append_batch(prompt, 0, LogitsMode::All)};
  for (int i = 0; i < 3; ++i) steps.push_back(append_batch({rng.below(cfg.vocab_size)}, 70 + i, LogitsMode::Last));
  steps.push_back(make_tree(40, 73, cfg.vocab_size, opt.max_tree, rng).batch);
  steps.push_back(make_tree(20, 73, cfg.vocab_size, opt.max_tree, rng).batch);
  int differ = 0;
  for (const ForwardBatch& s : steps) {
    std::vector<float> la, lb;
    a->forward(s, la);
    b->forward(s, lb);
    if (la.size() != lb.size() || std::memcmp(la.data(), lb.data(), sizeof(float) * la.size()) != 0) ++differ;
  }
  const std::string log = a->debug_step_tuning();
  const int lines = static_cast<int>(std::count(log.begin(), log.end(), '\n'));
  std::printf("step tuning of the tiny model:\n%s", log.c_str());
  char det[160];
  std::snprintf(det, sizeof det, "(%d of %zu steps differ; %d buckets tuned)", differ, steps.size(), lines);
  record("step autotune: logits bitwise == untuned no-PDL model (prefill, decode, trees)", differ, 0,
         differ == 0 && lines == 4, det);
}

void check_megakernel(const std::string& tag, const ModelConfig& cfg, uint64_t seed, int steps, int head_keys = -1,
                      int head_parts = 0, int max_inflight = -1, int slot_bytes = 0, int release_hold = -1,
                      int hold_until_input = -1, int attn_prewait = -1, int merge_in_o = -1, int sm_count = 0) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = 320;
  opt.max_tree = 128;
  CudaModelOptions mko;
  mko.megakernel = true;
  mko.megakernel_head_keys = head_keys;
  mko.megakernel_head_parts = head_parts;
  mko.megakernel_max_inflight = max_inflight;
  mko.megakernel_slot_bytes = slot_bytes;
  mko.megakernel_release_hold = release_hold;
  mko.megakernel_hold_until_input = hold_until_input;
  mko.megakernel_attn_prewait = attn_prewait;
  mko.megakernel_merge_in_o = merge_in_o;
  mko.sm_count = sm_count;  // a green context of the first sm_count SMs (0: the whole GPU)
  opt.max_context = std::max(opt.max_context, 70 + steps + 16);
  auto mk = tiny_model(cfg, tw, opt, mko);
  auto lay = tiny_model(cfg, tw, opt, CudaModelOptions{});
  std::printf("megakernel[%s] plan: %s", tag.c_str(), mk->debug_gemm_plans().c_str());
  cuda_check::RefModel ref(cfg, tw.f);
  cuda_check::RefState st = ref.empty_state();
  const int V = cfg.vocab_size;
  char name[200], det[200];

  std::vector<int> prompt(70);
  for (auto& t : prompt) t = rng.below(V);
  std::vector<float> a, b;
  mk->forward(append_batch(prompt, 0, LogitsMode::Last), a);
  lay->forward(append_batch(prompt, 0, LogitsMode::Last), b);
  for (int i = 0; i < 70; ++i) ref.step(st, prompt[i], i);
  int C = 70;
  double worst_ref = 0, worst_lay = 0;
  size_t bad = 0;
  int argmax_diff = 0;
  for (int i = 0; i < steps; ++i, ++C) {
    const int tok = rng.below(V);
    if (i % 16 == 0) mk->debug_poison_buffers();
    mk->forward(append_batch({tok}, C, LogitsMode::Last), a);
    lay->forward(append_batch({tok}, C, LogitsMode::Last), b);
    const std::vector<float> r = ref.step(st, tok, C);
    size_t nb = 0;
    worst_ref = std::max(worst_ref, rel_err(a, r, &nb));
    bad += nb;
    worst_lay = std::max(worst_lay, rel_err(a, b, &nb));
    if (argmax_of(a.data(), V) != argmax_of(r.data(), V)) ++argmax_diff;
  }
  std::snprintf(name, sizeof name, "megakernel[%s] %d decode steps (pos 70..%d) vs fp32 reference", tag.c_str(), steps,
                C - 1);
  std::snprintf(det, sizeof det, "(worst step; nonfinite=%zu; argmax differs at %d steps)", bad, argmax_diff);
  record(name, worst_ref, 1e-2, worst_ref < 1e-2 && bad == 0, det);
  std::snprintf(name, sizeof name, "megakernel[%s] %d decode steps vs the layered path", tag.c_str(), steps);
  record(name, worst_lay, 1e-2, worst_lay < 1e-2);

  // K/V of the decoded positions (last layer) vs the layered model's
  {
    std::vector<float> k1, v1, k2, v2;
    mk->read_committed_kv(cfg.num_layers - 1, k1, v1);
    lay->read_committed_kv(cfg.num_layers - 1, k2, v2);
    size_t nb = 0;
    const double e = std::max(rel_err(k1, k2, &nb), rel_err(v1, v2, &nb));
    std::snprintf(name, sizeof name, "megakernel[%s] K/V written to the cache vs the layered path", tag.c_str());
    record(name, e, 1e-2, e < 1e-2 && nb == 0 && k1.size() == k2.size());
  }
  // repeatable bitwise; GPU arg-max of the same step
  {
    const int tok = rng.below(V);
    std::vector<float> a2;
    mk->forward(append_batch({tok}, C, LogitsMode::Last), a);
    mk->truncate_committed(C);
    mk->forward(append_batch({tok}, C, LogitsMode::Last), a2);
    const bool same = a.size() == a2.size() && std::memcmp(a.data(), a2.data(), sizeof(float) * a.size()) == 0;
    std::snprintf(name, sizeof name, "megakernel[%s] the same step twice is bitwise equal", tag.c_str());
    record(name, same ? 0 : 1, 0, same);
    mk->truncate_committed(C);
    std::vector<int32_t> am;
    mk->forward_argmax(append_batch({tok}, C, LogitsMode::Last), am);
    const int want = argmax_of(a.data(), V);
    std::snprintf(name, sizeof name, "megakernel[%s] GPU argmax == argmax(logits)", tag.c_str());
    std::snprintf(det, sizeof det, "(gpu %d, host %d)", am.empty() ? -1 : am[0], want);
    record(name, am.size() == 1 && am[0] == want ? 0 : 1, 0, am.size() == 1 && am[0] == want, det);
    mk->truncate_committed(C);
    lay->truncate_committed(C);
  }
  // a tree-mode step of one node (its K/V in a tree slot, attending the
  // committed prefix and itself), then a 3-node tree (layered path) under it
  {
    const int tok = rng.below(V);
    ForwardBatch t1 = ForwardBatch::tree({tok}, {-1}, C);
    t1.logits = LogitsMode::All;
    mk->debug_poison_buffers();
    mk->forward(t1, a);
    cuda_check::RefState s2 = st;
    const std::vector<float> r = ref.step(s2, tok, C);
    size_t nb = 0;
    const double e = rel_err(a, r, &nb);
    std::snprintf(name, sizeof name, "megakernel[%s] tree step of 1 node vs fp32 reference", tag.c_str());
    record(name, e, 1e-2, e < 1e-2 && nb == 0);
  }
  // a step without logits (LogitsMode::None) still writes its K/V
  {
    const int t0 = rng.below(V), t1 = rng.below(V);
    std::vector<float> none;
    mk->forward(append_batch({t0}, C, LogitsMode::None), none);
    ref.step(st, t0, C);
    ++C;
    mk->forward(append_batch({t1}, C, LogitsMode::Last), a);
    const std::vector<float> r = ref.step(st, t1, C);
    size_t nb = 0;
    const double e = rel_err(a, r, &nb);
    std::snprintf(name, sizeof name, "megakernel[%s] step without logits, then decode, vs fp32 reference", tag.c_str());
    record(name, e, 1e-2, e < 1e-2 && nb == 0 && none.empty());
    ++C;
  }
}

/// A megakernel decode step of a benchmark shape (random weights, 512
/// random committed K/V) against the layered path of the same weights.
void check_megakernel_shape(const std::string& shape, int head_keys = -1, int head_parts = 0, int max_inflight = -1,
                            int release_hold = -1, int hold_until_input = -1, int attn_short = -1,
                            int attn_prewait = -1) {
  const ModelConfig cfg = shape_config(shape);
  ModelOptions opt;
  opt.max_context = 1024;
  opt.max_tree = 128;
  CudaModelOptions mko;
  mko.megakernel = true;
  mko.megakernel_head_keys = head_keys;
  mko.megakernel_head_parts = head_parts;
  mko.megakernel_max_inflight = max_inflight;
  mko.megakernel_release_hold = release_hold;
  mko.megakernel_hold_until_input = hold_until_input;
  mko.megakernel_attn_short = attn_short;
  mko.megakernel_attn_prewait = attn_prewait;
  std::vector<float> a, b;
  {
    auto mk = make_cuda_model_random(cfg, opt, mko, 42);
    mk->debug_fill_committed_random(512, 43);
    std::printf("megakernel[%s] plan: %s", shape.c_str(), mk->debug_gemm_plans().c_str());
    mk->forward(append_batch({1234}, 512, LogitsMode::Last), a);
  }
  {
    auto lay = make_cuda_model_random(cfg, opt, CudaModelOptions{}, 42);
    lay->debug_fill_committed_random(512, 43);
    lay->forward(append_batch({1234}, 512, LogitsMode::Last), b);
  }
  size_t nb = 0;
  const double e = rel_err(a, b, &nb);
  const int am = argmax_of(a.data(), cfg.vocab_size), bm = argmax_of(b.data(), cfg.vocab_size);
  char name[200], det[200];
  char inflight[96] = "";
  if (max_inflight >= 0) std::snprintf(inflight, sizeof inflight, ", %d chunks in flight", max_inflight);
  if (release_hold >= 0)
    std::snprintf(inflight + std::strlen(inflight), sizeof inflight - std::strlen(inflight), ", hold %d%s",
                  release_hold,
                  hold_until_input == 1   ? " to input"
                  : hold_until_input == 2 ? " to attention"
                  : hold_until_input == 0 ? " to release"
                                          : "");
  if (attn_short == 0)
    std::snprintf(inflight + std::strlen(inflight), sizeof inflight - std::strlen(inflight), ", batched attention");
  if (attn_prewait == 0)
    std::snprintf(inflight + std::strlen(inflight), sizeof inflight - std::strlen(inflight), ", K/V after the wait");
  std::snprintf(name, sizeof name, "megakernel[%s shape%s%s%s] decode at 512 vs the layered path", shape.c_str(),
                head_keys == 0  ? ", split units"
                : head_keys > 0 ? ", whole heads"
                                : "",
                head_parts == 1 ? ", one CTA per head" : "", inflight);
  std::snprintf(det, sizeof det, "(argmax %d vs %d, nonfinite=%zu)", am, bm, nb);
  record(name, e, 1e-2, e < 1e-2 && nb == 0, det);
}

/// The first tokens of a sequence decoded one at a time by the megakernel,
/// from position 0, against the fp32 reference: 1..`steps` keys, so a query
/// head runs in fewer parts than planned (min(head_parts, keys)) and the
/// CTAs of the unused parts take the attention's no-unit path.
void check_megakernel_first_tokens(const std::string& tag, const ModelConfig& cfg, uint64_t seed, int steps,
                                   int merge_in_o = -1) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = 64;
  CudaModelOptions mko;
  mko.megakernel = true;
  mko.megakernel_merge_in_o = merge_in_o;
  auto mk = tiny_model(cfg, tw, opt, mko);
  cuda_check::RefModel ref(cfg, tw.f);
  cuda_check::RefState st = ref.empty_state();
  double worst = 0;
  size_t bad = 0;
  std::vector<float> a;
  for (int i = 0; i < steps; ++i) {
    const int tok = rng.below(cfg.vocab_size);
    mk->debug_poison_buffers();
    mk->forward(append_batch({tok}, i, LogitsMode::Last), a);
    size_t nb = 0;
    worst = std::max(worst, rel_err(a, ref.step(st, tok, i), &nb));
    bad += nb;
  }
  char name[200], det[120];
  std::snprintf(name, sizeof name, "megakernel[%s] first %d tokens one at a time vs fp32 reference", tag.c_str(),
                steps);
  std::snprintf(det, sizeof det, "(worst step; nonfinite=%zu)", bad);
  record(name, worst, 1e-2, worst < 1e-2 && bad == 0, det);
}

/// The ring's waits of a megakernel trace (kMegaRingWords per op slot and
/// CTA, cycles; the CTA's clock words turn them into ns), audited: each CTA's
/// clock is sane (0.5-3.5 GHz); a GEMV op's consumer wait for bytes fits in
/// the op's own span (start .. end stamps; 25 % + 1 us for the clock's
/// drift from its run average and the global timer's tick); the producer's idle time is part of its
/// unconsumed time; a CTA without rows in an op, and the attention / merge
/// slots, have no waits; the producer's waits fit in the CTA's run. Also
/// counts the CTAs whose producer blocked at all and those whose consumers
/// waited for bytes at all.
struct RingWordsAudit {
  int bad_clock = 0, bad_ring = 0, producer_blocked = 0, consumer_blocked = 0, ctas = 0;
  int inflight_ctas = 0;    ///< CTAs whose producer waited for bytes in flight at all
  int partly_idle_ops = 0;  ///< (CTA, op)s with 0 < idle < unconsumed
  double ghz_min = 0, ghz_max = 0;
  std::string summary() const {
    char b[200];
    std::snprintf(b, sizeof b,
                  "SM clock %.2f-%.2f GHz, bad clocks %d, bad ring words %d; CTAs whose producer / consumers blocked "
                  "%d / %d of %d, producer waited on bytes in flight %d; ops partly idle %d",
                  ghz_min, ghz_max, bad_clock, bad_ring, producer_blocked, consumer_blocked, ctas, inflight_ctas,
                  partly_idle_ops);
    return b;
  }
};
RingWordsAudit audit_ring_words(const std::vector<unsigned long long>& t, int L, int G) {
  RingWordsAudit a;
  a.ctas = G;
  if (t.size() != mega_trace_words(L, G)) {
    a.bad_ring = 1;
    return a;
  }
  const size_t ring = mega_trace_ring_offset(L, G), clk = mega_trace_clock_offset(L, G);
  double ghz_min = 1e9, ghz_max = 0;
  for (int c = 0; c < G; ++c) {
    const unsigned long long* cw = &t[clk + static_cast<size_t>(c) * kMegaClockWords];
    const bool clock_ok = cw[2] > cw[0] && cw[3] > cw[1];
    const double npc = clock_ok ? static_cast<double>(cw[3] - cw[1]) / static_cast<double>(cw[2] - cw[0]) : 0.0;
    if (!clock_ok || npc < 1.0 / 3.5 || npc > 1.0 / 0.5) {
      ++a.bad_clock;
      continue;
    }
    ghz_min = std::min(ghz_min, 1.0 / npc);
    ghz_max = std::max(ghz_max, 1.0 / npc);
    double producer_ns = 0, consumer_ns = 0, inflight_ns = 0;
    for (int slot = 0; slot <= 6 * L; ++slot) {
      const unsigned long long* s3 = &t[(static_cast<size_t>(slot) * G + c) * kMegaTraceStamps];
      const unsigned long long* w = &t[ring + (static_cast<size_t>(slot) * G + c) * kMegaRingWords];
      const int kind = slot % 6;
      const bool gemv = slot == 6 * L || kind == 0 || kind == 3 || kind == 4 || kind == 5;
      const bool rows = gemv && s3[2] != 0;  // a CTA with rows stamps its arrival
      if (!rows) {
        for (int k = 0; k < kMegaRingWords; ++k) a.bad_ring += w[k] != 0 ? 1 : 0;
        continue;
      }
      const double span = s3[1] >= s3[0] ? static_cast<double>(s3[1] - s3[0]) : 0.0;
      if (w[0] * npc > 1.25 * span + 1000.0) ++a.bad_ring;  // + a global-timer tick
      if (w[3] > w[2]) ++a.bad_ring;                        // idle is a part of unconsumed
      a.partly_idle_ops += w[3] > 0 && w[3] < w[2] ? 1 : 0;
      inflight_ns += static_cast<double>(w[1]) * npc;
      consumer_ns += static_cast<double>(w[0]) * npc;
      producer_ns += static_cast<double>(w[1] + w[2] + w[4]) * npc;  // inflight, unconsumed, held
    }
    if (producer_ns > 1.25 * static_cast<double>(cw[3] - cw[1]) + 1000.0) ++a.bad_ring;
    a.producer_blocked += producer_ns > 0 ? 1 : 0;
    a.inflight_ctas += inflight_ns > 0 ? 1 : 0;
    a.consumer_blocked += consumer_ns > 0 ? 1 : 0;
  }
  if (ghz_max > 0) a.ghz_min = ghz_min, a.ghz_max = ghz_max;
  return a;
}

/// The megakernel trace (CudaModelOptions::megakernel_trace; MegaParams::trace):
/// a traced decode step gives the same logits, bit for bit, as an untraced
/// one; every op stamp of a CTA with rows is ordered (arrival <= start <= end
/// where present); and head_attention's phase stamps are set, in order, for
/// exactly the CTAs that ran a head unit (units = heads x parts: CTAs 0 .. that).
void check_megakernel_trace(const std::string& tag, const ModelConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = 200;
  CudaModelOptions plain;
  plain.megakernel = true;
  CudaModelOptions traced = plain;
  traced.megakernel_trace = true;
  auto a = tiny_model(cfg, tw, opt, plain);
  auto b = tiny_model(cfg, tw, opt, traced);
  std::vector<int> prompt(100);
  for (auto& t : prompt) t = rng.below(cfg.vocab_size);
  std::vector<float> la, lb;
  a->forward(append_batch(prompt, 0, LogitsMode::Last), la);
  b->forward(append_batch(prompt, 0, LogitsMode::Last), lb);
  const int tok = rng.below(cfg.vocab_size);
  a->forward(append_batch({tok}, 100, LogitsMode::Last), la);
  b->forward(append_batch({tok}, 100, LogitsMode::Last), lb);
  const bool same = la.size() == lb.size() && std::memcmp(la.data(), lb.data(), sizeof(float) * la.size()) == 0;
  std::vector<unsigned long long> t;
  const int G = b->debug_megakernel_trace(t);
  const int L = cfg.num_layers;
  const std::string plan = b->debug_gemm_plans();
  const size_t at = plan.find("head_parts=");
  const int P = at == std::string::npos ? 0 : std::atoi(plan.c_str() + at + 11);
  const int units = cfg.num_heads * P;
  int bad_ops = 0, bad_phases = 0;
  const bool sized = t.size() == mega_trace_words(L, G);
  if (sized) {
    for (int slot = 0; slot <= 6 * L; ++slot)
      for (int c = 0; c < G; ++c) {
        const unsigned long long* s3 = &t[(static_cast<size_t>(slot) * G + c) * kMegaTraceStamps];
        if (s3[0] == 0 || s3[1] < s3[0] || (s3[2] != 0 && s3[2] > s3[0])) ++bad_ops;
      }
    const size_t off = mega_trace_attn_offset(L, G);
    for (int l = 0; l < L; ++l)
      for (int c = 0; c < G; ++c) {
        const unsigned long long* ph = &t[off + (static_cast<size_t>(l) * G + c) * kMegaAttnStamps];
        bool ok = true;
        if (c < units) {
          for (int k = 0; k < kMegaAttnStamps; ++k) ok = ok && ph[k] != 0 && (k == 0 || ph[k] >= ph[k - 1]);
        } else {
          for (int k = 0; k < kMegaAttnStamps; ++k) ok = ok && ph[k] == 0;
        }
        if (!ok) ++bad_phases;
      }
  }
  const RingWordsAudit ring = audit_ring_words(t, L, G);
  char name[200], det[360];
  std::snprintf(name, sizeof name,
                "megakernel[%s] trace: same bits, op and attention-phase stamps in order, ring waits", tag.c_str());
  std::snprintf(det, sizeof det, "(bitwise %s; %zu words; %d head units; bad op stamps %d, bad phase rows %d; %s)",
                same ? "equal" : "DIFFERENT", t.size(), units, bad_ops, bad_phases, ring.summary().c_str());
  const int bad = bad_ops + bad_phases + ring.bad_clock + ring.bad_ring;
  record(name, bad, 0, same && sized && P > 1 && bad == 0, det);
}

/// The ring's waits at a real model shape (random weights, `fill_keys`
/// committed keys, 3 traced decode steps): audited as in audit_ring_words,
/// and, since every CTA streams far more than its ring holds and the step
/// stops at every handoff: every CTA's producer waited for bytes in flight
/// (its first refill comes right after it issued the ring's first chunks),
/// some CTA's consumers waited for bytes (the ring starts empty), and some
/// op's wait for consumption was partly idle (the rings fill at handoffs;
/// the probes of the landing order work).
void check_megakernel_ring_waits(const std::string& shape, int fill_keys) {
  const ModelConfig cfg = shape_config(shape);
  ModelOptions opt;
  opt.max_context = 1024;
  CudaModelOptions co;
  co.megakernel = true;
  co.megakernel_trace = true;
  auto m = make_cuda_model_random(cfg, opt, co, 42);
  m->debug_fill_committed_random(fill_keys, 43);
  Rng rng(45);
  std::vector<float> logits;
  for (int i = 0; i < 3; ++i)
    m->forward(append_batch({rng.below(cfg.vocab_size)}, fill_keys + i, LogitsMode::Last), logits);
  std::vector<unsigned long long> t;
  const int G = m->debug_megakernel_trace(t);
  const RingWordsAudit a = audit_ring_words(t, cfg.num_layers, G);
  char name[200], det[240];
  std::snprintf(name, sizeof name, "megakernel[%s shape] trace: ring waits audited, every producer waited on HBM",
                shape.c_str());
  std::snprintf(det, sizeof det, "(%s)", a.summary().c_str());
  const int bad = a.bad_clock + a.bad_ring + (G - a.inflight_ctas) + (a.consumer_blocked > 0 ? 0 : 1) +
                  (a.partly_idle_ops > 0 ? 0 : 1);
  record(name, bad, 0, bad == 0, det);
}

/// A megakernel setting that changes no arithmetic gives the same logits, bit
/// for bit, as a baseline: `steps` decode steps after `fill_keys` random
/// committed keys, random weights, each step compared. `base` and `variant`
/// set each model's CudaModelOptions explicitly (so the check still compares
/// two settings once a default changes); the variant's plan must contain
/// every string of `expect` (the knob reached the plan, the step takes the
/// path it tests), else the check fails. Used for MegaPlan::merge_in_o (the
/// parts of a head merged by the O projection's input load, with part 0's
/// operations in part 0's order), the L2 prefetch (a hint: this is a smoke
/// test that it runs and leaves the bits alone) and fixed ring slot sizes.
template <class Base, class Variant>
void check_megakernel_same_bits(const std::string& what, const ModelConfig& cfg, int fill_keys, int steps, Base&& base,
                                Variant&& variant, const std::vector<std::string>& expect) {
  ModelOptions opt;
  opt.max_context = 1024;
  opt.max_tree = 128;
  std::vector<std::vector<float>> out[2];
  std::string missing;
  for (int v = 0; v < 2; ++v) {
    CudaModelOptions mko;
    mko.megakernel = true;
    if (v == 0)
      base(mko);
    else
      variant(mko);
    auto m = make_cuda_model_random(cfg, opt, mko, 42);
    m->debug_fill_committed_random(fill_keys, 43);
    if (v == 1) {
      const std::string plan = m->debug_gemm_plans();
      std::printf("megakernel[%s] plan: %s", what.c_str(), plan.c_str());
      for (const auto& e : expect)
        if (plan.find(e) == std::string::npos) missing += (missing.empty() ? "" : ", ") + e;
    }
    Rng rng(44);
    for (int i = 0; i < steps; ++i) {
      std::vector<float> a;
      m->forward(append_batch({rng.below(cfg.vocab_size)}, fill_keys + i, LogitsMode::Last), a);
      out[v].push_back(std::move(a));
    }
  }
  int differ = 0;
  for (int i = 0; i < steps; ++i)
    if (out[0][i].size() != out[1][i].size() ||
        std::memcmp(out[0][i].data(), out[1][i].data(), sizeof(float) * out[0][i].size()) != 0)
      ++differ;
  char name[200], det[300];
  std::snprintf(name, sizeof name, "megakernel[%s]: logits bitwise == the baseline's", what.c_str());
  std::snprintf(det, sizeof det, "(%d of %d steps differ%s%s)", differ, steps,
                missing.empty() ? "" : "; the plan lacks: ", missing.c_str());
  record(name, differ, 0, differ == 0 && missing.empty(), det);
}

/// merge_in_o against part 0's merge: the plan must run whole heads in more
/// than one part for all `fill_keys + steps` keys (head_keys at least that).
void check_merge_in_o_bits(const std::string& what, const ModelConfig& cfg, int fill_keys, int steps) {
  check_megakernel_same_bits(
      what + " merge in O", cfg, fill_keys, steps, [](CudaModelOptions& o) { o.megakernel_merge_in_o = 0; },
      [](CudaModelOptions& o) { o.megakernel_merge_in_o = 1; }, {"merge_in_o=1", "head_parts=4"});
}

/// The megakernel's ring slot size chosen by timing (autotune): made with
/// autotune_verify (every candidate's arg-max and residual bitwise the
/// default's, or the model is not made), it logs its choice, and its decode
/// steps give the same logits, bit for bit, as an untuned model's.
void check_megakernel_slot_tuning(const ModelConfig& cfg) {
  Rng rng(12);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = 200;
  CudaModelOptions tuned_opt;
  tuned_opt.megakernel = true;
  tuned_opt.autotune_verify = true;
  CudaModelOptions plain_opt;
  plain_opt.megakernel = true;
  plain_opt.autotune = false;
  auto tuned = tiny_model(cfg, tw, opt, tuned_opt);
  auto plain = tiny_model(cfg, tw, opt, plain_opt);
  const std::string log = tuned->debug_step_tuning();
  const bool logged =
      log.find("megakernel: default ") != std::string::npos && log.find("mk.slot_bytes=") != std::string::npos;
  std::printf("megakernel slot tuning: %s", log.c_str());
  std::vector<int> prompt(40);
  for (auto& tok : prompt) tok = rng.below(cfg.vocab_size);
  std::vector<float> a, b;
  tuned->forward(append_batch(prompt, 0, LogitsMode::Last), a);
  plain->forward(append_batch(prompt, 0, LogitsMode::Last), b);
  int differ = 0;
  for (int i = 0; i < 20; ++i) {
    const int tok = rng.below(cfg.vocab_size);
    tuned->forward(append_batch({tok}, 40 + i, LogitsMode::Last), a);
    plain->forward(append_batch({tok}, 40 + i, LogitsMode::Last), b);
    if (a.size() != b.size() || std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) != 0) ++differ;
  }
  char det[120];
  std::snprintf(det, sizeof det, "(%d of 20 steps differ; choice logged: %s)", differ, logged ? "yes" : "no");
  record("megakernel: ring slot size tuned (autotune_verify), decode bitwise == untuned", differ, 0,
         differ == 0 && logged, det);
}

/// A megakernel knob out of range (CudaModelOptions::megakernel_*): the model
/// is not made, InvalidArgument names the knob.
void check_megakernel_plan_errors(const ModelConfig& cfg) {
  Rng rng(11);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = 128;
  int bad = 0;
  auto refused = [&](const char* needle, auto&& set) {
    CudaModelOptions mko;
    mko.megakernel = true;
    set(mko);
    try {
      tiny_model(cfg, tw, opt, mko);
    } catch (const InvalidArgument& ex) {
      if (std::strstr(ex.what(), needle) != nullptr) return;
      std::printf("  unexpected message: %s\n", ex.what());
    }
    ++bad;
  };
  refused("max_inflight must be", [](CudaModelOptions& o) { o.megakernel_max_inflight = 17; });
  refused("max_inflight must be", [](CudaModelOptions& o) { o.megakernel_max_inflight = -2; });
  refused("release_hold must be", [](CudaModelOptions& o) { o.megakernel_release_hold = 17; });
  refused("release_hold must be", [](CudaModelOptions& o) { o.megakernel_release_hold = -3; });
  refused("hold_until_input must be", [](CudaModelOptions& o) { o.megakernel_hold_until_input = 3; });
  refused("attn_short must be", [](CudaModelOptions& o) { o.megakernel_attn_short = 5; });
  refused("attn_prewait must be", [](CudaModelOptions& o) { o.megakernel_attn_prewait = 2; });
  refused("merge_in_o must be", [](CudaModelOptions& o) { o.megakernel_merge_in_o = 3; });
  refused("l2_prefetch_bytes must be", [](CudaModelOptions& o) { o.megakernel_l2_prefetch_bytes = 1000; });  // not % 16
  refused("l2_prefetch_bytes must be", [](CudaModelOptions& o) { o.megakernel_l2_prefetch_bytes = 8 << 20; });
  refused("merge_in_o merges at most", [](CudaModelOptions& o) {
    o.megakernel_merge_in_o = 1;
    o.megakernel_head_parts = 8;
  });
  refused("slot_bytes must be", [](CudaModelOptions& o) { o.megakernel_slot_bytes = 1000; });  // not % 128
  refused("slot_bytes must be", [](CudaModelOptions& o) { o.megakernel_slot_bytes = 1024; });  // < one row
  refused("head_parts must be", [](CudaModelOptions& o) { o.megakernel_head_parts = 3; });
  refused("head_keys must be", [](CudaModelOptions& o) { o.megakernel_head_keys = -5; });
  record("megakernel: knobs out of range -> InvalidArgument naming the knob (15 cases)", bad, 0, bad == 0, "");
}

/// Two megakernel models with different shared-memory plans in one process
/// (a 0.5B draft, then a 1.5B target, as the async engine makes them): the
/// first must still run after the second is made.
void check_megakernel_two_plans() {
  ModelOptions opt;
  opt.max_context = 1024;
  opt.max_tree = 128;
  CudaModelOptions mko;
  mko.megakernel = true;
  auto small = make_cuda_model_random(shape_config("qwen2.5-0.5b"), opt, mko, 42);
  auto large = make_cuda_model_random(shape_config("qwen2.5-1.5b"), opt, mko, 43);
  bool ok = true;
  std::string why;
  try {
    std::vector<int32_t> a, b;
    small->forward_argmax(append_batch({1234}, 0, LogitsMode::Last), a);
    large->forward_argmax(append_batch({1234}, 0, LogitsMode::Last), b);
    ok = a.size() == 1 && b.size() == 1;
  } catch (const std::exception& e) {
    ok = false;
    why = e.what();
  }
  char det[200];
  std::snprintf(det, sizeof det, "(%s; plans: %s / %s)", why.empty() ? "ran" : why.substr(0, 80).c_str(),
                small->debug_gemm_plans().substr(small->debug_gemm_plans().find("megakernel")).substr(0, 40).c_str(),
                large->debug_gemm_plans().substr(large->debug_gemm_plans().find("megakernel")).substr(0, 40).c_str());
  record("megakernel: two models with different plans in one process both run", ok ? 0 : 1, 0, ok, det);
}

/// Locates a model mismatch: a model of `cfg`, decoding tokens one by one
/// from position 0, comparing the last layer's q / attention / SwiGLU output,
/// the final residual and the logits with the reference at every step.
void diagnose_model(const std::string& tag, const ModelConfig& cfg, const CudaModelOptions& copt, uint64_t seed) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
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
  ModelOptions opt;
  opt.max_context = 128;
  opt.max_tree = 16;
  auto m = make_cuda_model_from_host(cfg, lookup, exists, opt, copt);
  cuda_check::RefModel ref(cfg, tw.f);
  cuda_check::RefState st = ref.empty_state();
  const int L = cfg.num_layers;
  for (int pos = 0; pos < 3; ++pos) {
    const int tok = rng.below(cfg.vocab_size);
    std::vector<float> lg;
    m->forward(append_batch({tok}, pos, LogitsMode::Last), lg);
    cuda_check::RefTrace tr;
    const std::vector<float> rl = ref.step(st, tok, pos, &tr);
    std::vector<float> g;
    char name[200];
    auto cmp = [&](const char* what, const std::vector<float>& refv) {
      if (refv.empty()) return;
      if (std::string(what) != "logits")
        m->debug_read_activations(what, 1, g);
      else
        g = lg;
      size_t bad = 0;
      const double e = rel_err(g, refv, &bad);
      std::snprintf(name, sizeof name, "diag[%s] pos %d %s", tag.c_str(), pos, what);
      char det[200] = "";
      if (!(e < 1e-2)) {
        // first values and the index of the largest difference
        size_t worst = 0;
        for (size_t i = 0; i < g.size(); ++i)
          if (std::fabs(g[i] - refv[i]) > std::fabs(g[worst] - refv[worst])) worst = i;
        std::snprintf(det, sizeof det,
                      "gpu[0..3] %.4g %.4g %.4g %.4g ref %.4g %.4g %.4g %.4g worst@%zu gpu %.4g ref %.4g", g[0], g[1],
                      g[2], g[3], refv[0], refv[1], refv[2], refv[3], worst, g[worst], refv[worst]);
      }
      record(name, e, 1e-2, e < 1e-2 && bad == 0, det);
    };
    if (L > 0) {
      cmp("q", tr.q[L - 1]);
      cmp("attn", tr.attn[L - 1]);
      cmp("act", tr.act[L - 1]);
    }
    cmp("h32", tr.h_final);
    cmp("logits", rl);
    // Host emulation of the GPU's own last step from GPU-side data: splits a
    // mismatch into "weights on the device differ from the checkpoint" and
    // "a kernel computes something else than its inputs say".
    {
      // Device weights vs the test's host copy and vs a fresh host copy made
      // from the same seed: tells device-side from host-side corruption.
      Rng rng2(seed);
      TinyWeights fresh = make_weights(cfg, rng2);
      for (const char* wname : {"embed", "qkv"}) {
        if (std::string(wname) == "qkv" && L == 0) continue;
        std::vector<float> dv;
        m->debug_read_weight(wname, 0, dv);
        size_t d_tw = 0, d_fresh = 0, tw_fresh = 0;
        if (std::string(wname) == "embed") {
          const auto& a = tw.f["model.embed_tokens.weight"];
          const auto& b = fresh.f["model.embed_tokens.weight"];
          for (size_t i = 0; i < a.size(); ++i) {
            d_tw += dv[i] != a[i];
            d_fresh += dv[i] != b[i];
            tw_fresh += a[i] != b[i];
          }
        } else if (L > 0) {
          const auto& a = tw.f["model.layers.0.self_attn.q_proj.weight"];
          const auto& b = fresh.f["model.layers.0.self_attn.q_proj.weight"];
          for (size_t i = 0; i < a.size(); ++i) tw_fresh += a[i] != b[i];
        }
        std::snprintf(name, sizeof name, "diag[%s] pos %d %s: device!=host %zu device!=fresh %zu host!=fresh %zu",
                      tag.c_str(), pos, wname, d_tw, d_fresh, tw_fresh);
        record(name, static_cast<double>(d_tw + tw_fresh), 0, d_tw + tw_fresh == 0);
      }
    }
    if (pos == 0) {
      const int H = cfg.hidden_size, V = cfg.vocab_size;
      std::vector<float> lmw, h32, ssq;
      m->debug_read_weight("lm", 0, lmw);
      m->debug_read_activations("h32", 1, h32);
      m->debug_read_activations("ssq", 1, ssq);
      const auto& src = cfg.tie_word_embeddings ? tw.f["model.embed_tokens.weight"] : tw.f["lm_head.weight"];
      const auto& gam = tw.f["model.norm.weight"];
      size_t wdiff = 0;
      for (int n = 0; n < V; ++n)
        for (int k = 0; k < H; ++k)
          if (bf2f(f2bf(src[static_cast<size_t>(n) * H + k] * gam[k])) != lmw[static_cast<size_t>(n) * H + k]) ++wdiff;
      std::snprintf(name, sizeof name, "diag[%s] LM weights on device == bf16(W*g)", tag.c_str());
      char det[200];
      std::snprintf(det, sizeof det, "(%zu of %d differ)", wdiff, V * H);
      record(name, wdiff, 0, wdiff == 0, det);
      double ss = 0, ssg = 0;
      for (int i = 0; i < H; ++i) ss += static_cast<double>(h32[i]) * h32[i];
      for (int t = 0; t < H / 16; ++t) ssg += ssq[t];
      const double rinv = 1.0 / std::sqrt(ssq.empty() ? 0.0 : ssg / H + cfg.rms_norm_eps);
      std::vector<float> emu(V);
      for (int n = 0; n < V; ++n) {
        double acc = 0;
        for (int k = 0; k < H; ++k)
          acc += static_cast<double>(lmw[static_cast<size_t>(n) * H + k]) * bf2f(f2bf(h32[k]));
        emu[n] = static_cast<float>(acc * rinv);
      }
      size_t bad = 0;
      const double e = rel_err(lg, emu, &bad);
      std::snprintf(name, sizeof name, "diag[%s] GPU logits == host emulation from device data", tag.c_str());
      std::snprintf(det, sizeof det,
                    "(ssq sum %.4g vs host %.4g; gpu[0..2] %.4g %.4g %.4g emu %.4g %.4g %.4g ref %.4g %.4g %.4g)", ssg,
                    ss, lg[0], lg[1], lg[2], emu[0], emu[1], emu[2], rl[0], rl[1], rl[2]);
      record(name, e, 1e-2, e < 1e-2, det);
    }
  }
}

/// YaRN as Qwen2.5 uses it past 32K (factor 4), here past 64 positions: the ramp covers pairs 0-5
/// of 32, the rest is interpolated, and cos/sin carry the attention factor 0.1 ln 4 + 1.
ModelConfig yarn_config() {
  ModelConfig c = tiny_config("qwen2", 448, 1216, 7, 1, 64, 1536, true, true, RopeStyle::NeoX, false);
  c.rope_scaling.type = RopeScalingType::Yarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 64;
  return c;
}

void write_json(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  std::fprintf(f, "{\n  \"checks\": [\n");
  for (size_t i = 0; i < g_results.size(); ++i) {
    const Result& r = g_results[i];
    std::fprintf(f, "    {\"name\": \"%s\", \"err\": %.6e, \"limit\": %.1e, \"pass\": %s, \"detail\": \"%s\"}%s\n",
                 r.name.c_str(), r.err, r.limit, r.pass ? "true" : "false", r.detail.c_str(),
                 i + 1 < g_results.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  bool diag_only = false, megakernel_only = false, long_only = false, int4_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json" && i + 1 < argc) json = argv[++i];
    if (std::string(argv[i]) == "--diag-only") diag_only = true;
    if (std::string(argv[i]) == "--megakernel-only") megakernel_only = true;
    if (std::string(argv[i]) == "--long-only") long_only = true;
    if (std::string(argv[i]) == "--int4-only") int4_only = true;
  }
  if (diag_only) {
    try {
      ModelConfig c1 = tiny_config("llama", 256, 512, 4, 2, 64, 1000, false, false, RopeStyle::NeoX, true);
      c1.num_layers = 1;
      diagnose_model("llama L=1", c1, CudaModelOptions{}, 12);
    } catch (const std::exception& e) {
      std::printf("diag aborted: %s\n", e.what());
    }
    return 0;
  }
  try {
    cudaDeviceProp prop;
    SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    cudaStream_t st;
    SS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Rng rng(20261129);
    const int sms = prop.multiProcessorCount;
    if (int4_only) {
      check_int4();
      check_int4_model();
    }
    if (long_only) {
      check_long_context();
      check_context_bands();
    }
    if (!long_only && !int4_only) {
      if (!megakernel_only) {
        check_gemm(512, 256, {1, 8, 64}, rng, sms, st);
        check_gemm(1008, 256, {1, 40}, rng, sms, st);
        check_gemm(256, 512, {1, 64}, rng, sms, st);
        check_gemm_rms(512, 256, {1, 9, 64}, rng, sms, st);
        check_gemm_rms(2048, 1536, {1, 64}, rng, sms, st);
        check_gemm_rms(4096, 4096, {1, 64}, rng, sms, st);
        {
          ModelConfig c1 = tiny_config("llama", 256, 512, 4, 2, 64, 1000, false, false, RopeStyle::NeoX, true);
          ModelConfig c0 = c1;
          c0.num_layers = 0;
          c1.num_layers = 1;
          CudaModelOptions dflt, nopdl, nograph;
          nopdl.use_pdl = false;
          nograph.use_graphs = false;
          nograph.use_pdl = false;
          diagnose_model("llama L=0", c0, dflt, 11);
          diagnose_model("llama L=1", c1, dflt, 12);
          diagnose_model("llama L=1 no-pdl", c1, nopdl, 12);
          diagnose_model("llama L=1 no-graph", c1, nograph, 12);
          ModelConfig q1 = tiny_config("qwen2", 512, 1024, 4, 1, 128, 2048, true, true, RopeStyle::Interleaved, false);
          q1.num_layers = 1;
          diagnose_model("qwen2 L=1", q1, dflt, 13);
        }
        check_step_tuning(tiny_config("llama", 256, 512, 4, 2, 64, 1000, false, false, RopeStyle::NeoX, true), 14);
        check_gemm(2048, 1536, {1, 5, 8, 9, 16, 17, 32, 33, 64}, rng, prop.multiProcessorCount, st);
        check_gemm(4096, 4096, {1, 64}, rng, prop.multiProcessorCount, st);
        check_gemm(1152, 896, {1, 13, 64}, rng, prop.multiProcessorCount, st);
        check_gemm(896, 4864, {1, 40}, rng, prop.multiProcessorCount, st);
        check_gemm(32000, 1024, {1, 8}, rng, prop.multiProcessorCount, st);
        // wgmma engine: activations streamed (slice too large to stay resident at
        // M = 64), forced streaming / 2 warpgroups / shallow pipeline; and the
        // mma.sync engine kept working (SWIFTSPEC_GEMM_ENGINE=mma selects it).
        check_gemm(1024, 14336, {1, 17, 64}, rng, prop.multiProcessorCount, st);
        {
          GemmPlanHint h;
          h.engine = 1;
          h.xres = 0;
          h.wg = 2;
          h.stages = 2;
          check_gemm(2048, 1536, {1, 9, 33, 64}, rng, prop.multiProcessorCount, st, h);
          h.xres = 1;
          h.wg = 1;
          h.stages = 5;
          check_gemm_rms(1152, 896, {1, 64}, rng, prop.multiProcessorCount, st, h);
          GemmPlanHint hp;  // partials after the stages (the default aliases them in one-round launches)
          hp.engine = 1;
          hp.palias = 0;
          check_gemm(4096, 4096, {1, 64}, rng, prop.multiProcessorCount, st, hp);
          check_gemm_rms(2048, 1536, {1, 64}, rng, prop.multiProcessorCount, st, hp);
          GemmPlanHint hs;  // n8 instructions only
          hs.engine = 1;
          hs.split_n = 1;
          check_gemm(2048, 1536, {1, 9, 33, 64}, rng, prop.multiProcessorCount, st, hs);
          GemmPlanHint hm;
          hm.engine = 0;
          check_gemm(2048, 1536, {1, 5, 16, 33, 64}, rng, prop.multiProcessorCount, st, hm);
          check_gemm(896, 4864, {1, 40}, rng, prop.multiProcessorCount, st, hm);
          check_gemm_rms(2048, 1536, {1, 64}, rng, prop.multiProcessorCount, st, hm);
        }
        check_logits_top_k(rng, st);
        check_model("llama-like", tiny_config("llama", 256, 512, 4, 2, 64, 1000, false, false, RopeStyle::NeoX, true),
                    1, 1060);
        check_model("qwen2-like",
                    tiny_config("qwen2", 512, 1024, 4, 1, 128, 2048, true, true, RopeStyle::Interleaved, false), 2);
        check_model("gqa7", tiny_config("qwen2", 448, 1216, 7, 1, 64, 1536, true, true, RopeStyle::NeoX, false), 3);
        check_model("qwen2-yarn", yarn_config(), 7, 1060);
        check_long_context();
        check_context_bands();
      }
      const ModelConfig qwen2_like =
          tiny_config("qwen2", 512, 1024, 4, 1, 128, 2048, true, true, RopeStyle::Interleaved, false);
      const ModelConfig gqa7 = tiny_config("qwen2", 448, 1216, 7, 1, 64, 1536, true, true, RopeStyle::NeoX, false);
      // Head units up to head_keys keys, split units and a merge beyond: the
      // first two cross from one to the other mid-sequence.
      check_megakernel("llama-like hk150",
                       tiny_config("llama", 256, 512, 4, 2, 64, 1000, false, false, RopeStyle::NeoX, true), 4, 200,
                       150);
      check_megakernel("qwen2-like hk100", qwen2_like, 5, 60, 100);
      // head_dim 128: more than 256 keys take head_attention's loads two batches
      check_megakernel("qwen2-like long hk1024 P1", qwen2_like, 8, 260, 1024, 1);
      check_megakernel("gqa7", gqa7, 6, 60);
      check_megakernel("qwen2-yarn", yarn_config(), 7, 60);
      check_megakernel("gqa7 split", gqa7, 6, 60, 0);
      check_megakernel("gqa7 P8", gqa7, 6, 60, -1, 8);
      check_megakernel("gqa7 P2", gqa7, 6, 60, -1, 2);
      // The producer's cap on chunks in flight (MegaPlan::max_inflight): one
      // chunk of one row (4 KB slots: many chunks per op), and two of the default size.
      check_megakernel("gqa7 inflight1 slot4K", gqa7, 6, 40, -1, 0, 1, 4096);
      check_megakernel("qwen2-like inflight2", qwen2_like, 5, 40, -1, 0, 2);
      check_megakernel("gqa7 hold1 slot4K", gqa7, 6, 40, -1, 0, -1, 4096, 1);
      check_megakernel("qwen2-like hold16", qwen2_like, 5, 40, -1, 0, -1, 0, 16);
      check_megakernel("gqa7 hold2 to input slot4K", gqa7, 6, 40, -1, 0, -1, 4096, 2, 1);
      check_megakernel("gqa7 split hold16 to input", gqa7, 6, 40, 0, 0, -1, 0, 16, 1);
      check_megakernel("gqa7 hold2 to attention", gqa7, 6, 40, -1, 0, -1, 0, 2, 2);
      check_megakernel("gqa7 split hold2 to attention", gqa7, 6, 40, 0, 0, -1, 0, 2, 2);
      // every K/V load of the head parts after the wait for QKV (the default issues the committed ones before it)
      check_megakernel("gqa7 no prewait", gqa7, 6, 40, -1, 0, -1, 0, -1, -1, 0);
      check_megakernel("qwen2-like long hk1024 P1 no prewait", qwen2_like, 8, 260, 1024, 1, -1, 0, -1, -1, 0);
      check_megakernel_plan_errors(gqa7);
      check_megakernel_slot_tuning(gqa7);
      {
        ModelConfig g16 = tiny_config("llama", 512, 1024, 16, 1, 64, 1000, false, false, RopeStyle::NeoX, false);
        g16.num_layers = 3;
        check_megakernel("gqa16 L=3", g16, 7, 30);
        check_megakernel("gqa16 L=3 split", g16, 7, 30, 0);
      }
      for (const char* sh : {"qwen2.5-0.5b", "qwen2.5-1.5b", "llama3-8b"}) check_megakernel_shape(sh);
      // The defaults at 512 keys are whole heads in 4 parts; the split units and
      // one CTA per head as well.
      check_megakernel_shape("qwen2.5-0.5b", 0);
      check_megakernel_shape("llama3-8b", 0);
      check_megakernel_shape("qwen2.5-1.5b", 1024, 1);
      check_megakernel_shape("qwen2.5-0.5b", -1, 0, 2);
      check_megakernel_shape("qwen2.5-0.5b", -1, 0, -1, 2);
      // every refill past an op held, ops longer than the ring (this configuration once deadlocked)
      check_megakernel_shape("qwen2.5-1.5b", -1, 0, -1, 16);
      check_megakernel_shape("qwen2.5-1.5b", -1, 0, -1, 16, 1);
      check_megakernel_shape("llama3-8b", -1, 0, -1, 2, 1);
      check_megakernel_shape("qwen2.5-0.5b", -1, 0, -1, 0);          // no hold
      check_megakernel_shape("qwen2.5-1.5b", -1, 0, -1, 2, 0);       // hold until the release
      check_megakernel_shape("llama3-8b", -1, 0, -1, -1, -1, 0);     // attention parts batched
      check_megakernel_shape("qwen2.5-1.5b", -1, 0, -1, -1, -1, 1);  // short attention parts at head_dim 128
      check_megakernel_shape("qwen2.5-0.5b", -1, 0, -1, 2, 2);
      check_megakernel_shape("qwen2.5-0.5b", -1, 0, -1, -1, -1, -1, 0);  // K/V loads after the wait
      check_megakernel_shape("llama3-8b", -1, 0, -1, -1, -1, -1, 0);
      check_megakernel_two_plans();
      // Last, so that a fault in a setting written since the last GPU run (run
      // 23: merge_in_o, the L2 prefetch, the first-token and 16-SM paths)
      // cannot take the checks above down with it.
      // the parts of a head merged by the O projection's input load (merge_in_o)
      check_megakernel("gqa7 merge in O", gqa7, 6, 40, -1, 0, -1, 0, -1, -1, -1, 1);
      check_megakernel("gqa7 P2 merge in O", gqa7, 6, 40, -1, 2, -1, 0, -1, -1, -1, 1);
      check_megakernel("llama-like hk150 merge in O",
                       tiny_config("llama", 256, 512, 4, 2, 64, 1000, false, false, RopeStyle::NeoX, true), 4, 200, 150,
                       0, -1, 0, -1, -1, -1, 1);
      check_merge_in_o_bits("gqa7", gqa7, 100, 12);
      // 1..6 keys: fewer parts than planned; with and without merge_in_o
      check_megakernel_first_tokens("gqa7", gqa7, 10, 6);
      check_megakernel_first_tokens("gqa7 merge in O", gqa7, 10, 6, 1);
      {
        // 32 query heads in a 16-SM green context: one part per head, two heads
        // per CTA (the attention's wait is done by each CTA's first unit only)
        ModelConfig g32 = tiny_config("llama", 2048, 1024, 32, 2, 64, 1000, false, false, RopeStyle::NeoX, false);
        g32.num_layers = 2;
        check_megakernel("gqa32 L=2 in 16 SMs", g32, 9, 20, -1, 0, -1, 0, -1, -1, -1, -1, 16);
      }
      check_merge_in_o_bits("qwen2-like", qwen2_like, 100, 12);
      check_megakernel_trace("gqa7", gqa7, 13);
      check_megakernel_ring_waits("qwen2.5-0.5b", 512);
      check_megakernel_ring_waits("qwen2.5-1.5b", 512);
      for (const char* sh : {"qwen2.5-0.5b", "qwen2.5-1.5b", "llama3-8b"})
        check_merge_in_o_bits(std::string(sh) + " shape", shape_config(sh), 512, 3);
      // the L2 prefetch of the gate/up tail: a hint, so a smoke test (it runs,
      // the bits stay); 1 MiB is past every row of the tiny model
      const auto no_prefetch = [](CudaModelOptions& o) { o.megakernel_l2_prefetch_bytes = 0; };
      check_megakernel_same_bits("gqa7 l2 prefetch 1 MiB (smoke)", gqa7, 100, 6, no_prefetch,
                                 [](CudaModelOptions& o) { o.megakernel_l2_prefetch_bytes = 1 << 20; },
                                 {"l2_prefetch_bytes=1048576"});
      // (at the 0.5B the ring holds every gate/up row of a CTA: nothing to prefetch)
      for (const char* sh : {"qwen2.5-1.5b", "llama3-8b"})
        check_megakernel_same_bits(std::string(sh) + " shape, l2 prefetch 128 KB (smoke)", shape_config(sh), 512, 3,
                                   no_prefetch, [](CudaModelOptions& o) { o.megakernel_l2_prefetch_bytes = 128 << 10; },
                                   {"l2_prefetch_bytes=131072"});
      // each ring slot size the tuner may pick, fixed, against fixed 32 KB slots
      for (int sb : {35840, 40960, 53760})
        check_megakernel_same_bits(
            "qwen2.5-0.5b shape, " + std::to_string(sb) + " B slots vs 32 KB", shape_config("qwen2.5-0.5b"), 512, 3,
            [](CudaModelOptions& o) { o.megakernel_slot_bytes = 32768; },
            [sb](CudaModelOptions& o) { o.megakernel_slot_bytes = sb; }, {"x" + std::to_string(sb) + " "});
      if (!megakernel_only) {
        check_int4();
        check_int4_model();
      }
    }  // !long_only && !int4_only
    cudaStreamDestroy(st);
  } catch (const std::exception& e) {
    std::printf("CHECK %-58s err=nan limit=0 FAIL exception: %s\n", "(aborted)", e.what());
    g_results.push_back({"(aborted)", NAN, 0, false, e.what()});
  }
  int fails = 0;
  for (const auto& r : g_results) fails += r.pass ? 0 : 1;
  std::printf("checks: %zu, failed: %d\n", g_results.size(), fails);
  if (!json.empty()) write_json(json);
  return fails ? 1 : 0;
}
