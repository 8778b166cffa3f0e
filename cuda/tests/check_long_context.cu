// Long-context checks of the CUDA backend (issue 27): the split-K attention against an fp64
// CPU attention over the model's own Q / K / V at contexts that cross tiles, splits, supers
// and the split / super work modes; tree rows bit-identical to decoding the same path alone
// at those contexts; the prefill path (YaRN too) against the fp32 reference model and the decode
// steps; the megakernel's hand-over to the layered step beyond megakernel_max_keys; the
// attention's other layouts (decode steps in super mode, 128-row main items) under their switches.
#include "check_long_context.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check_harness.h"
#include "reference_model.h"

namespace swiftspec::cuda_check {

namespace {

int argmax_index(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

/// Attention output rows of `rows` query rows [n][heads * hd] over their key lists, in fp64:
/// keys_of(t) returns token t's K and V rows ([len][kv_heads * hd] fp32).
template <class KeysOf>
std::vector<float> cpu_attention(const ModelConfig& c, const std::vector<float>& q, int n, KeysOf keys_of) {
  const int H = c.num_heads, hd = c.head_dim, G = c.num_heads / c.num_kv_heads, kvw = c.num_kv_heads * hd;
  std::vector<float> out(static_cast<size_t>(n) * H * hd);
  parallel_for(n, [&](int t) {
    std::vector<float> K, V;
    keys_of(t, K, V);
    const int len = static_cast<int>(K.size() / kvw);
    for (int h = 0; h < H; ++h) {
      const int kvh = h / G;
      const float* qh = q.data() + (static_cast<size_t>(t) * H + h) * hd;
      std::vector<double> s(len);
      double mx = -1e300;
      for (int j = 0; j < len; ++j) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(qh[i]) * K[static_cast<size_t>(j) * kvw + kvh * hd + i];
        s[j] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      for (int j = 0; j < len; ++j) l += (s[j] = std::exp(s[j] - mx));
      for (int i = 0; i < hd; ++i) {
        double o = 0;
        for (int j = 0; j < len; ++j) o += s[j] * V[static_cast<size_t>(j) * kvw + kvh * hd + i];
        out[(static_cast<size_t>(t) * H + h) * hd + i] = static_cast<float>(o / l);
      }
    }
  });
  return out;
}

/// A tree of n nodes at `committed` whose first `chain` nodes form one chain (node i's parent
/// i - 1), the rest hanging off random earlier nodes: its deepest path crosses tiles.
Tree chain_tree(int n, int chain, int committed, int vocab, int max_tree, Rng& rng) {
  Tree t;
  std::vector<int> perm(max_tree);
  for (int i = 0; i < max_tree; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng.g);
  ForwardBatch& b = t.batch;
  b.attend_offsets.push_back(0);
  for (int i = 0; i < n; ++i) {
    const int p = i == 0 ? -1 : (i < chain ? i - 1 : rng.below(i));
    t.parent.push_back(p);
    t.depth.push_back(p < 0 ? 0 : t.depth[p] + 1);
    t.token.push_back(rng.below(vocab));
    t.slot.push_back(perm[i]);
    b.tokens.push_back(t.token[i]);
    b.positions.push_back(committed + t.depth[i]);
    b.tree_slots.push_back(t.slot[i]);
    std::vector<int> slots;
    for (int j = i; j >= 0; j = t.parent[j]) slots.push_back(t.slot[j]);
    std::reverse(slots.begin(), slots.end());
    b.attend_slots.insert(b.attend_slots.end(), slots.begin(), slots.end());
    b.attend_offsets.push_back(static_cast<int>(b.attend_slots.size()));
  }
  b.logits = LogitsMode::All;
  return t;
}

/// The attention of a decode step and of a tree at committed length C (random committed K/V)
/// against the fp64 CPU attention over the model's own Q / K / V (last layer).
void check_attention_at(const std::string& tag, ModelConfig cfg, int C, int nodes, uint64_t seed) {
  cfg.num_layers = 1;
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = C + 200;
  opt.max_tree = 128;
  auto m = tiny_model(cfg, tw, opt, CudaModelOptions{});
  const int V = cfg.vocab_size, H = cfg.num_heads, hd = cfg.head_dim;
  char name[200], det[200];
  m->debug_fill_committed_random(C, seed + 1);
  std::vector<float> ck, cv;
  m->read_committed_kv(0, ck, cv);  // [C][kv_heads * hd]
  const int kvw = cfg.num_kv_heads * hd;
  // decode one token at C: its own K / V land at slot C
  std::vector<float> lg;
  m->debug_poison_buffers();
  m->forward(append_batch({rng.below(V)}, C, LogitsMode::Last), lg);
  std::vector<float> q, attn;
  m->debug_read_activations("q", 1, q);
  m->debug_read_activations("attn", 1, attn);
  q.resize(static_cast<size_t>(H) * hd);
  attn.resize(static_cast<size_t>(H) * hd);
  std::vector<float> ck1, cv1;
  m->read_committed_kv(0, ck1, cv1);
  const std::vector<float> ref = cpu_attention(cfg, q, 1, [&](int, std::vector<float>& K, std::vector<float>& Vv) {
    K = ck1;
    Vv = cv1;
  });
  size_t bad = 0;
  double err = rel_err(attn, ref, &bad);
  std::snprintf(name, sizeof name, "long[%s] decode attention at %d keys vs fp64", tag.c_str(), C + 1);
  std::snprintf(det, sizeof det, "(nonfinite=%zu)", bad);
  record(name, err, 1e-2, err < 1e-2 && bad == 0, det);

  // a tree of `nodes` at C: each row against its committed prefix + chain
  m->truncate_committed(C);
  Tree t = chain_tree(nodes, std::min(nodes, 40), C, V, opt.max_tree, rng);
  m->debug_poison_buffers();
  m->forward(t.batch, lg);
  m->debug_read_activations("q", nodes, q);
  m->debug_read_activations("attn", nodes, attn);
  const std::vector<float> tref =
      cpu_attention(cfg, q, nodes, [&](int i, std::vector<float>& K, std::vector<float>& Vv) {
        std::vector<int32_t> chain;
        for (int j = i; j >= 0; j = t.parent[j]) chain.push_back(t.slot[j]);
        std::reverse(chain.begin(), chain.end());
        std::vector<float> tk, tv;
        m->read_tree_kv(0, chain, tk, tv);
        K.assign(ck.begin(), ck.begin() + static_cast<size_t>(C) * kvw);
        Vv.assign(cv.begin(), cv.begin() + static_cast<size_t>(C) * kvw);
        K.insert(K.end(), tk.begin(), tk.end());
        Vv.insert(Vv.end(), tv.begin(), tv.end());
      });
  err = rel_err(attn, tref, &bad);
  std::snprintf(name, sizeof name, "long[%s] tree-%d attention at %d committed vs fp64", tag.c_str(), nodes, C);
  std::snprintf(det, sizeof det, "(nonfinite=%zu)", bad);
  record(name, err, 1e-2, err < 1e-2 && bad == 0, det);
}

/// The exactness contract at committed length C: a tree whose deepest path crosses tile /
/// split / super boundaries, its path's logits bitwise those of decoding the path alone.
void check_tree_bits_at(const std::string& tag, const ModelConfig& cfg, int C, int nodes, int chain, uint64_t seed) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = C + 200;
  opt.max_tree = 128;
  auto m = tiny_model(cfg, tw, opt, CudaModelOptions{});
  const int V = cfg.vocab_size;
  m->debug_fill_committed_random(C, seed + 1);
  Tree t = chain_tree(nodes, chain, C, V, opt.max_tree, rng);
  std::vector<float> tl;
  m->forward(t.batch, tl);
  int mism = 0;
  for (int a = 0; a < chain; ++a) {
    std::vector<float> one;
    m->forward(append_batch({t.token[a]}, C + a, LogitsMode::Last), one);
    if (std::memcmp(one.data(), tl.data() + static_cast<size_t>(a) * V, sizeof(float) * V) != 0) ++mism;
  }
  char name[200], det[120];
  std::snprintf(name, sizeof name, "long[%s] tree-%d at %d: path of %d bitwise == decode alone", tag.c_str(), nodes, C,
                chain);
  std::snprintf(det, sizeof det, "(%d of %d path nodes differ)", mism, chain);
  record(name, mism, 0, mism == 0, det);
}

/// The prefill path: a prompt through it against the fp32 reference; a long prompt against the
/// decode steps (large_prefill off); a prompt in two calls against one.
void check_prefill_path(const std::string& tag, const ModelConfig& cfg, int short_len, int long_len, uint64_t seed) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = long_len + 64;
  opt.max_tree = 64;
  auto fast = tiny_model(cfg, tw, opt, CudaModelOptions{});
  CudaModelOptions steps_opt;
  steps_opt.large_prefill = false;
  auto steps = tiny_model(cfg, tw, opt, steps_opt);
  const int V = cfg.vocab_size;
  char name[200], det[200];
  std::vector<int> prompt(long_len);
  for (auto& x : prompt) x = rng.below(V);

  // (a) short_len tokens against the reference (the last token's logits)
  {
    cuda_check::RefModel ref(cfg, tw.f);
    cuda_check::RefState st = ref.empty_state();
    std::vector<float> r;
    for (int i = 0; i < short_len; ++i) r = ref.step(st, prompt[i], i);
    std::vector<float> lg;
    fast->debug_poison_buffers();
    fast->forward(append_batch(std::vector<int>(prompt.begin(), prompt.begin() + short_len), 0, LogitsMode::Last), lg);
    size_t bad = 0;
    const double err = rel_err(lg, r, &bad);
    std::snprintf(name, sizeof name, "prefill[%s] %d tokens, last logits vs fp32 reference", tag.c_str(), short_len);
    std::snprintf(det, sizeof det, "(nonfinite=%zu)", bad);
    record(name, err, 1e-2, err < 1e-2 && bad == 0 && fast->committed_len() == short_len, det);
  }
  // (b) long_len tokens (several passes) against the decode steps: logits and the last layer's K/V
  std::vector<float> lf, ls;
  fast->truncate_committed(0);
  fast->debug_poison_buffers();
  const int chunk = fast->prefill_chunk_tokens();
  for (int at = 0; at < long_len; at += chunk) {
    const int end = std::min(long_len, at + chunk);
    fast->forward(append_batch(std::vector<int>(prompt.begin() + at, prompt.begin() + end), at,
                               end == long_len ? LogitsMode::Last : LogitsMode::None),
                  lf);
  }
  steps->forward(append_batch(prompt, 0, LogitsMode::Last), ls);
  size_t bad = 0;
  double err = rel_err(lf, ls, &bad);
  const bool same_top = argmax_index(lf) == argmax_index(ls);
  std::snprintf(name, sizeof name, "prefill[%s] %d tokens in passes of %d vs decode steps, logits", tag.c_str(),
                long_len, chunk);
  std::snprintf(det, sizeof det, "(nonfinite=%zu, same top-1 %d)", bad, same_top ? 1 : 0);
  record(name, err, 2e-2, err < 2e-2 && bad == 0, det);
  std::vector<float> kf, vf, kd, vd;
  fast->read_committed_kv(cfg.num_layers - 1, kf, vf);
  steps->read_committed_kv(cfg.num_layers - 1, kd, vd);
  kf.insert(kf.end(), vf.begin(), vf.end());
  kd.insert(kd.end(), vd.begin(), vd.end());
  err = rel_err(kf, kd, &bad);
  std::snprintf(name, sizeof name, "prefill[%s] %d tokens vs decode steps, last layer K/V", tag.c_str(), long_len);
  std::snprintf(det, sizeof det, "(nonfinite=%zu)", bad);
  record(name, err, 1e-2, err < 1e-2 && bad == 0 && kf.size() == kd.size(), det);

  // (c) the same prompt in two calls (a committed prefix, then the rest) against one
  const int half = long_len / 2 + 37;
  std::vector<float> l2;
  fast->truncate_committed(0);
  fast->forward(append_batch(std::vector<int>(prompt.begin(), prompt.begin() + half), 0, LogitsMode::None), l2);
  fast->forward(append_batch(std::vector<int>(prompt.begin() + half, prompt.end()), half, LogitsMode::Last), l2);
  err = rel_err(l2, ls, &bad);
  std::snprintf(name, sizeof name, "prefill[%s] %d + %d tokens (prefix, then the rest) vs decode steps", tag.c_str(),
                half, long_len - half);
  std::snprintf(det, sizeof det, "(nonfinite=%zu)", bad);
  record(name, err, 2e-2, err < 2e-2 && bad == 0 && fast->committed_len() == long_len, det);
}

/// With megakernel_max_keys, a decode step over more keys takes the layered step: bitwise the
/// layered model's logits.
void check_megakernel_hand_over(const ModelConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  TinyWeights tw = make_weights(cfg, rng);
  ModelOptions opt;
  opt.max_context = 400;
  opt.max_tree = 32;
  CudaModelOptions mko;
  mko.megakernel = true;
  mko.megakernel_max_keys = 100;
  auto mk = tiny_model(cfg, tw, opt, mko);
  auto layered = tiny_model(cfg, tw, opt, CudaModelOptions{});
  std::vector<int> prompt(150);
  for (auto& x : prompt) x = rng.below(cfg.vocab_size);
  std::vector<float> a, b;
  mk->forward(append_batch(prompt, 0, LogitsMode::None), a);
  layered->forward(append_batch(prompt, 0, LogitsMode::None), b);
  const int tok = rng.below(cfg.vocab_size);
  mk->forward(append_batch({tok}, 150, LogitsMode::Last), a);
  layered->forward(append_batch({tok}, 150, LogitsMode::Last), b);
  const bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
  record("megakernel max_keys 100: a step over 151 keys == the layered step (bitwise)", same ? 0 : 1, 0, same);
}

/// Sets an environment variable for a scope (the attention's A/B switches are read at each launch,
/// so a model made inside the scope records its steps under the setting), then restores it.
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const char* value) : name(n) {
    const char* e = std::getenv(n);
    had = e != nullptr;
    if (had) old = e;
    setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

}  // namespace

void check_long_context() {
  // GQA groups of 4 (head_dim 64, llama-like) and 6 (head_dim 128, the Qwen2.5-1.5B group)
  const ModelConfig g4 = tiny_config("llama", 256, 512, 8, 2, 64, 1000, false, false, RopeStyle::NeoX, true);
  const ModelConfig g6 = tiny_config("qwen2", 768, 1024, 12, 2, 128, 1536, true, true, RopeStyle::NeoX, false);
  // contexts: inside the first super (split mode), across tiles / splits (5000: 78 full tiles),
  // past several supers (17000), and where a 40-node tree takes super mode (40000)
  for (int C : {1000, 5000, 17000}) check_attention_at("g4 hd64", g4, C, 40, 100 + C);
  for (int C : {2045, 40000}) check_attention_at("g6 hd128", g6, C, 40, 200 + C);
  // deepest paths across a split (256 keys), a super (2048) and, with 64 nodes at 40000, the
  // super-mode tree against split-mode single steps
  check_tree_bits_at("g4", g4, 256 * 9 - 17, 48, 40, 300);
  check_tree_bits_at("g4", g4, 2048 - 21, 64, 60, 301);
  check_tree_bits_at("g6", g6, 2048 * 8 - 5, 24, 20, 302);
  check_tree_bits_at("g6", g6, 40000, 64, 50, 303);
  // The attention's other layouts, the same bits: decode steps in super mode (a grid of 8 CTAs:
  // their narrow items fold whole supers) and main items of 128 rows (one warp per m16 tile)
  {
    ScopedEnv few("SWIFTSPEC_ATTN_CTAS", "8");
    check_attention_at("g6 hd128, 8 ctas", g6, 17000, 40, 500);
    check_tree_bits_at("g6, 8 ctas", g6, 2048 * 8 - 5, 24, 20, 501);
  }
  {
    ScopedEnv rows("SWIFTSPEC_ATTN_ROWS", "128");
    check_attention_at("g4 hd64, 128 rows", g4, 5000, 64, 502);
    check_attention_at("g6 hd128, 128 rows", g6, 40000, 40, 503);
    check_tree_bits_at("g4, 128 rows", g4, 2048 - 21, 64, 60, 504);
    check_tree_bits_at("g6, 128 rows", g6, 40000, 64, 50, 505);
  }
  check_prefill_path("g4", g4, 300, 5000, 400);
  check_prefill_path("g6", g6, 129, 4500, 401);
  // YaRN (factor 4 past 64 positions): the prefill path's RoPE carries the attention factor as the
  // decode steps' EpiQKV does
  ModelConfig yarn = tiny_config("qwen2", 448, 1216, 7, 1, 64, 1536, true, true, RopeStyle::NeoX, false);
  yarn.rope_scaling.type = RopeScalingType::Yarn;
  yarn.rope_scaling.factor = 4.0;
  yarn.rope_scaling.original_max_position_embeddings = 64;
  check_prefill_path("yarn hd64", yarn, 300, 4500, 402);
  check_megakernel_hand_over(tiny_config("qwen2", 448, 1216, 7, 1, 64, 1536, true, true, RopeStyle::NeoX, false), 500);
}

}  // namespace swiftspec::cuda_check
