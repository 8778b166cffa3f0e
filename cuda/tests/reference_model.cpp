#include "reference_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace swiftspec::cuda_check {

namespace {

void matvec(const std::vector<float>& W, int N, int K, const float* x, float* y) {
  for (int n = 0; n < N; ++n) {
    const float* r = W.data() + static_cast<size_t>(n) * K;
    double s = 0;
    for (int k = 0; k < K; ++k) s += static_cast<double>(r[k]) * x[k];
    y[n] = static_cast<float>(s);
  }
}

std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& g, float eps) {
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double r = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i] * r * g[i]);
  return y;
}

}  // namespace

RefModel::RefModel(const ModelConfig& cfg, const std::map<std::string, std::vector<float>>& w) : cfg_(cfg), w_(w) {
  // RoPE in double, written from the sources (not from swiftspec/rope.h, which the model under
  // test uses): Llama 3.1 scaling (Meta's apply_scaling) and YaRN (Peng et al. 2023, sections
  // 3.2 and 3.4, with HF transformers' defaults: ramp ends floored / ceiled).
  const int half = cfg.head_dim / 2;
  const auto& s = cfg.rope_scaling;
  const double orig = s.original_max_position_embeddings;
  double ramp_lo = 0, ramp_hi = 1;
  if (s.type == RopeScalingType::Yarn) {
    const auto dim_turning = [&](double turns) {  // the dimension whose pair turns `turns` times
      return cfg.head_dim * std::log(orig / (2 * M_PI * turns)) / (2 * std::log(cfg.rope_theta));
    };
    ramp_lo = dim_turning(s.beta_fast);
    ramp_hi = dim_turning(s.beta_slow);
    if (s.truncate) ramp_lo = std::floor(ramp_lo), ramp_hi = std::ceil(ramp_hi);
    ramp_lo = std::max(ramp_lo, 0.0);
    ramp_hi = std::min(ramp_hi, cfg.head_dim - 1.0);
    if (ramp_hi == ramp_lo) ramp_hi += 0.001;
    const auto m = [&](double k) { return s.factor <= 1 ? 1.0 : 0.1 * k * std::log(s.factor) + 1.0; };
    rope_scale_ = s.attention_factor                         ? *s.attention_factor
                  : (s.mscale != 0 && s.mscale_all_dim != 0) ? m(s.mscale) / m(s.mscale_all_dim)
                                                             : m(1.0);
  }
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(cfg.rope_theta, 2.0 * i / cfg.head_dim);
    if (s.type == RopeScalingType::Llama3) {
      const double low_wl = orig / s.low_freq_factor;
      const double high_wl = orig / s.high_freq_factor;
      const double wl = 2 * M_PI / f;
      if (wl > low_wl) {
        f = f / s.factor;
      } else if (wl >= high_wl) {
        const double sm = (orig / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - sm) * f / s.factor + sm * f;
      }
    } else if (s.type == RopeScalingType::Yarn) {
      const double interpolated = std::clamp((i - ramp_lo) / (ramp_hi - ramp_lo), 0.0, 1.0);
      f = interpolated * f / s.factor + (1 - interpolated) * f;
    }
    inv_freq_[i] = f;
  }
}

const std::vector<float>& RefModel::w(const std::string& name) const {
  auto it = w_.find(name);
  if (it == w_.end()) throw std::runtime_error("reference: missing weight " + name);
  return it->second;
}

RefState RefModel::empty_state() const {
  RefState s;
  s.k.resize(cfg_.num_layers);
  s.v.resize(cfg_.num_layers);
  return s;
}

std::vector<float> RefModel::step(RefState& st, int token, int position, RefTrace* trace) const {
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, G = nh / nkv;
  const auto& emb = w("model.embed_tokens.weight");
  std::vector<float> x(emb.begin() + static_cast<size_t>(token) * H, emb.begin() + static_cast<size_t>(token + 1) * H);
  auto rope = [&](float* v) {
    for (int i = 0; i < hd / 2; ++i) {
      const double a = position * inv_freq_[i];
      const double c = rope_scale_ * std::cos(a), s = rope_scale_ * std::sin(a);
      const int lo = cfg_.rope_style == RopeStyle::NeoX ? i : 2 * i;
      const int hi = cfg_.rope_style == RopeStyle::NeoX ? i + hd / 2 : 2 * i + 1;
      const double x0 = v[lo], x1 = v[hi];
      v[lo] = static_cast<float>(x0 * c - x1 * s);
      v[hi] = static_cast<float>(x1 * c + x0 * s);
    }
  };
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<float> xn = rmsnorm(x, w(p + "input_layernorm.weight"), cfg_.rms_norm_eps);
    std::vector<float> q(nh * hd), k(nkv * hd), v(nkv * hd);
    matvec(w(p + "self_attn.q_proj.weight"), nh * hd, H, xn.data(), q.data());
    matvec(w(p + "self_attn.k_proj.weight"), nkv * hd, H, xn.data(), k.data());
    matvec(w(p + "self_attn.v_proj.weight"), nkv * hd, H, xn.data(), v.data());
    if (cfg_.attention_bias) {
      const auto& bq = w(p + "self_attn.q_proj.bias");
      const auto& bk = w(p + "self_attn.k_proj.bias");
      const auto& bv = w(p + "self_attn.v_proj.bias");
      for (size_t i = 0; i < q.size(); ++i) q[i] += bq[i];
      for (size_t i = 0; i < k.size(); ++i) k[i] += bk[i];
      for (size_t i = 0; i < v.size(); ++i) v[i] += bv[i];
    }
    for (int h = 0; h < nh; ++h) rope(q.data() + h * hd);
    for (int h = 0; h < nkv; ++h) rope(k.data() + h * hd);
    st.k[l].insert(st.k[l].end(), k.begin(), k.end());
    st.v[l].insert(st.v[l].end(), v.begin(), v.end());
    const int L = st.len + 1;
    std::vector<float> o(nh * hd, 0.f);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int h = 0; h < nh; ++h) {
      const int kh = h / G;
      std::vector<double> s(L);
      double mx = -1e300;
      for (int j = 0; j < L; ++j) {
        const float* kj = st.k[l].data() + static_cast<size_t>(j) * nkv * hd + kh * hd;
        double d = 0;
        for (int e = 0; e < hd; ++e) d += static_cast<double>(q[h * hd + e]) * kj[e];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = 0; j < L; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int e = 0; e < hd; ++e) {
        double acc = 0;
        for (int j = 0; j < L; ++j) acc += s[j] * st.v[l][static_cast<size_t>(j) * nkv * hd + kh * hd + e];
        o[h * hd + e] = static_cast<float>(acc / sum);
      }
    }
    if (trace) {
      trace->q.push_back(q);
      trace->attn.push_back(o);
    }
    std::vector<float> ao(H);
    matvec(w(p + "self_attn.o_proj.weight"), H, nh * hd, o.data(), ao.data());
    for (int i = 0; i < H; ++i) x[i] += ao[i];
    std::vector<float> xn2 = rmsnorm(x, w(p + "post_attention_layernorm.weight"), cfg_.rms_norm_eps);
    std::vector<float> g(I), u(I), a(I), dn(H);
    matvec(w(p + "mlp.gate_proj.weight"), I, H, xn2.data(), g.data());
    matvec(w(p + "mlp.up_proj.weight"), I, H, xn2.data(), u.data());
    for (int i = 0; i < I; ++i) a[i] = static_cast<float>(g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i]);
    if (trace) trace->act.push_back(a);
    matvec(w(p + "mlp.down_proj.weight"), H, I, a.data(), dn.data());
    for (int i = 0; i < H; ++i) x[i] += dn[i];
  }
  st.len += 1;
  if (trace) trace->h_final = x;
  std::vector<float> xf = rmsnorm(x, w("model.norm.weight"), cfg_.rms_norm_eps);
  const auto& head = cfg_.tie_word_embeddings ? w("model.embed_tokens.weight") : w("lm_head.weight");
  std::vector<float> logits(cfg_.vocab_size);
  matvec(head, cfg_.vocab_size, H, xf.data(), logits.data());
  return logits;
}

}  // namespace swiftspec::cuda_check
