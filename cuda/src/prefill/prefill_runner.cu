// The CUDA model's prefill pass (prefill_runner.h).
#include "prefill/prefill_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common.h"
#include "prefill/attention_prefill.h"
#include "prefill/gemm_large.h"
#include "prefill/prefill_ops.h"
#include "swiftspec/rope.h"

namespace swiftspec::cuda {

namespace {

struct Sizes {
  size_t hidden, nq, nqkv, inter, ywidth;
};

Sizes sizes_of(const ModelConfig& c) {
  Sizes s;
  s.hidden = static_cast<size_t>(c.hidden_size);
  s.nq = static_cast<size_t>(c.num_heads) * c.head_dim;
  s.nqkv = s.nq + 2 * static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  s.inter = static_cast<size_t>(c.intermediate_size);
  s.ywidth = std::max(s.nqkv, 2 * s.inter);
  return s;
}

}  // namespace

size_t PrefillRunner::device_bytes(const ModelConfig& cfg) {
  const Sizes s = sizes_of(cfg);
  const size_t T = kPrefillMaxTokens;
  return T * (s.hidden * 4 + s.hidden * 2 + 4 + s.ywidth * 4 + s.nq * 2 * 2 + s.inter * 2 + 2 * 4) +
         gemm_large_workspace_bytes();
}

PrefillRunner::PrefillRunner(const ModelConfig& cfg) {
  const Sizes s = sizes_of(cfg);
  const size_t T = kPrefillMaxTokens;
  h32_.allocate(T * s.hidden * sizeof(float));
  h16_.allocate(T * s.hidden * sizeof(__nv_bfloat16));
  rinv_.allocate(T * sizeof(float));
  y_.allocate(T * s.ywidth * sizeof(float));
  q_.allocate(T * s.nq * sizeof(__nv_bfloat16));
  attn_.allocate(T * s.nq * sizeof(__nv_bfloat16));
  act_.allocate(T * s.inter * sizeof(__nv_bfloat16));
  ids_.allocate(2 * T * sizeof(int32_t));
  workspace_.allocate(gemm_large_workspace_bytes());
  ids_host_.allocate(2 * T * sizeof(int32_t));
  SS_CUDA_CHECK(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming));
}

PrefillRunner::~PrefillRunner() {
  if (upload_done_) cudaEventDestroy(upload_done_);
}

void PrefillRunner::run(const PrefillModelView& v, const int32_t* tokens, const int32_t* positions, int M,
                        int committed, cudaStream_t stream) {
  if (M < 1 || M > kPrefillMaxTokens)
    throw InvalidArgument("prefill pass of " + std::to_string(M) + " tokens: must be 1.." +
                          std::to_string(kPrefillMaxTokens));
  const ModelConfig& c = *v.cfg;
  const Sizes s = sizes_of(c);
  const int H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int nq = static_cast<int>(s.nq), nqkv = static_cast<int>(s.nqkv);
  // The pinned staging buffer is reused: the previous pass's upload must have been read.
  if (upload_pending_) SS_CUDA_CHECK(cudaEventSynchronize(upload_done_));
  int32_t* host = ids_host_.as<int32_t>();
  std::memcpy(host, tokens, sizeof(int32_t) * M);
  std::memcpy(host + kPrefillMaxTokens, positions, sizeof(int32_t) * M);
  SS_CUDA_CHECK(
      cudaMemcpyAsync(ids_.get(), host, sizeof(int32_t) * 2 * kPrefillMaxTokens, cudaMemcpyHostToDevice, stream));
  SS_CUDA_CHECK(cudaEventRecord(upload_done_, stream));
  upload_pending_ = true;
  const int* d_tokens = ids_.as<int32_t>();
  const int* d_positions = d_tokens + kPrefillMaxTokens;

  float* h32 = h32_.as<float>();
  __nv_bfloat16* h16 = h16_.as<__nv_bfloat16>();
  float* rinv = rinv_.as<float>();
  float* y = y_.as<float>();
  const size_t kv_layer = static_cast<size_t>(c.num_kv_heads) * v.slots * hd;
  auto gemm = [&](const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int N, int K, float beta) {
    gemm_large_bf16(x, w, out, out, M, N, K, beta, workspace_.get(), v.num_sms, v.device, stream);
  };

  launch_prefill_embed(v.embed, d_tokens, M, H, h32, h16, stream);
  launch_prefill_rms(h32, M, H, c.rms_norm_eps, h16, rinv, stream);
  for (int l = 0; l < c.num_layers; ++l) {
    const PrefillLayerWeights& L = v.layers[l];
    __nv_bfloat16* kc = v.kcache + kv_layer * l;
    __nv_bfloat16* vc = v.vcache + kv_layer * l;
    gemm(h16, L.qkv, y, nqkv, H, 0.f);
    PrefillQkvParams qp;
    qp.y = y;
    qp.rinv = rinv;
    qp.positions = d_positions;
    qp.bias = L.qkv_bias;
    qp.inv_freq = v.inv_freq;
    qp.rope_scale = rope_attention_scale(c);
    qp.q = q_.as<__nv_bfloat16>();
    qp.kcache = kc;
    qp.vcache = vc;
    qp.M = M;
    qp.kv_index0 = committed;
    qp.num_heads = c.num_heads;
    qp.num_kv_heads = c.num_kv_heads;
    qp.head_dim = hd;
    qp.slots = v.slots;
    qp.neox = c.rope_style == RopeStyle::NeoX ? 1 : 0;
    launch_prefill_qkv(qp, stream);
    PrefillAttnParams ap;
    ap.q = q_.as<__nv_bfloat16>();
    ap.kcache = kc;
    ap.vcache = vc;
    ap.out = attn_.as<__nv_bfloat16>();
    ap.M = M;
    ap.committed = committed;
    ap.num_heads = c.num_heads;
    ap.num_kv_heads = c.num_kv_heads;
    ap.head_dim = hd;
    ap.slots = v.slots;
    ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    launch_attention_prefill(ap, stream);
    gemm(attn_.as<__nv_bfloat16>(), L.o, h32, H, nq, 1.f);  // h32 += attn W_o^T
    launch_prefill_rms(h32, M, H, c.rms_norm_eps, h16, rinv, stream);
    gemm(h16, L.gate_up, y, 2 * I, H, 0.f);
    launch_prefill_swiglu(y, rinv, M, I, act_.as<__nv_bfloat16>(), stream);
    gemm(act_.as<__nv_bfloat16>(), L.down, h32, H, I, 1.f);  // h32 += act W_down^T
    if (l + 1 < c.num_layers) launch_prefill_rms(h32, M, H, c.rms_norm_eps, h16, rinv, stream);
  }
}

}  // namespace swiftspec::cuda
