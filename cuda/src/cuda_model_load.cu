// The CUDA model's device state: weights, KV cache and workspaces allocated, and the weights
// filled from host tensors (converted to bf16 in the device layout, weight_layout.h; int4
// projections re-laid for the int4 GEMM, kernels/gemm_int4.h) or random.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_model_impl.h"
#include "weight_layout.h"

namespace swiftspec::cuda {

namespace {

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
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    default:
      return 0;
  }
}

SrcType src_type(DType dt, const std::string& name) {
  switch (dt) {
    case DType::F32:
      return SrcType::F32;
    case DType::BF16:
      return SrcType::BF16;
    case DType::F16:
      return SrcType::F16;
    default:
      throw CheckpointError("tensor " + name + ": dtype must be F32, BF16 or F16 for the CUDA backend");
  }
}

std::vector<float> host_to_float(const HostWeight& w, const std::string& name) {
  size_t n = 1;
  for (int64_t d : w.shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  const unsigned char* p = static_cast<const unsigned char*>(w.data);
  for (size_t i = 0; i < n; ++i) {
    switch (w.dtype) {
      case DType::F32:
        std::memcpy(&out[i], p + 4 * i, 4);
        break;
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
      default:
        throw CheckpointError("tensor " + name + ": dtype must be F32, BF16 or F16 for the CUDA backend");
    }
  }
  return out;
}

}  // namespace

void CudaModelImpl::allocate_state() {
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
  vocab_rows_ = (cfg_.vocab_size + 15) / 16 * 16;
  layers_.resize(cfg_.num_layers);
  // int4 projections (and their norm weights) are allocated by their upload (load_layer_int4)
  // or init_random_int4.
  for (Layer& L : layers_) {
    if (int4_) {
      if (cfg_.attention_bias) L.qkv_bias.allocate(sizeof(float) * (nq + 2 * nkv));
      continue;
    }
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
  allocate_attention_scratch();
  desc_.allocate(sizeof(StepDesc));
  commit_idx_.allocate(sizeof(int) * opt_.max_tree);
  for (auto* b : {&h32_, &h16_, &ssq_, &q_, &attn_, &act_, &logits_, &keys_, &attn_counters_, &desc_})
    SS_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
  inv_freq_ = upload_floats(rope_inv_freq(cfg_));
  for (auto& d : desc_host_) d.allocate(sizeof(StepDesc));
  logits_host_.allocate(sizeof(float) * kRows * static_cast<size_t>(cfg_.vocab_size));
  keys_host_.allocate(sizeof(unsigned long long) * kRows);
  commit_host_.allocate(sizeof(int) * opt_.max_tree);
  // Tensor-parallel ranks keep the decode steps (their row-parallel GEMMs all-reduce).
  if (copt_.large_prefill && !copt_.row_parallel) prefill_ = std::make_unique<PrefillRunner>(cfg_);
  SS_CUDA_CHECK(cudaDeviceSynchronize());
}

/// The attention's partial states and counters (attention.h), one buffer each for O and
/// (max, sum), cut into the split / super / boundary / tail arrays.
void CudaModelImpl::allocate_attention_scratch() {
  attn_sizes_ = attention_scratch_sizes(cfg_.num_heads, cfg_.num_kv_heads, opt_.max_context, opt_.max_tree);
  const size_t entries =
      attn_sizes_.split_entries + attn_sizes_.super_entries + attn_sizes_.boundary_entries + attn_sizes_.tail_entries;
  attn_part_o_.allocate(sizeof(float) * entries * cfg_.head_dim);
  attn_part_ml_.allocate(sizeof(float2) * entries);
  attn_counters_.allocate(sizeof(int) * attn_sizes_.super_counters);
  attn_ctas_ = attention_grid_ctas(cfg_.head_dim, num_sms_);
}

void CudaModelImpl::load_host(const WeightLookup& lookup, const WeightExists& exists) {
  ModelScope scope(copt_.device, green_.get());
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
  const int64_t V = cfg_.vocab_size;
  DeviceBuffer perm_qkv = upload_ints(qkv_row_permutation(cfg_.num_heads, cfg_.num_kv_heads, hd, cfg_.rope_style));
  DeviceBuffer perm_gu = upload_ints(gate_up_row_permutation(I));

  for (int l = 0; l < cfg_.num_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    Layer& L = layers_[l];
    if (int4_) {
      load_layer_int4(l, lookup);
      upload_qkv_bias(L, pre, lookup, exists);
      continue;
    }
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
      upload_qkv_bias(L, pre, lookup, exists);
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
      launch_weight_transform(scratch_.get(), src_type(gt.dtype, pre + "gate_proj"), L.gu.as<__nv_bfloat16>(), 2 * I, H,
                              perm_gu.as<int>(), gamma.as<float>(), stream_);
      SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    {
      const HostWeight d = lookup(pre + "mlp.down_proj.weight", {H, I});
      upload_concat({&d}, pre + "mlp.down_proj.weight");
      launch_weight_transform(scratch_.get(), src_type(d.dtype, pre + "down_proj"), L.down.as<__nv_bfloat16>(), H, I,
                              nullptr, nullptr, stream_);
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
  launch_weight_transform(scratch_.get(), src_type(head.dtype, "lm_head"), lm_.as<__nv_bfloat16>(), static_cast<int>(V),
                          H, nullptr, gamma.as<float>(), stream_);
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  scratch_.release();
  upload_megakernel_layers();
}

/// The fp32 bias of the fused QKV rows (q, k, v biases in the QKV row order), when the model
/// has one.
void CudaModelImpl::upload_qkv_bias(Layer& L, const std::string& pre, const WeightLookup& lookup,
                                    const WeightExists& exists) {
  if (!cfg_.attention_bias && !exists(pre + "self_attn.q_proj.bias")) return;
  const int hd = cfg_.head_dim, nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
  std::vector<float> cat;
  for (const char* nm : {"q", "k", "v"}) {
    const std::string name = pre + "self_attn." + nm + "_proj.bias";
    const HostWeight b = lookup(name, {std::string(nm) == "q" ? nq : nkv});
    const std::vector<float> f = host_to_float(b, name);
    cat.insert(cat.end(), f.begin(), f.end());
  }
  const std::vector<int> rows = qkv_row_permutation(cfg_.num_heads, cfg_.num_kv_heads, hd, cfg_.rope_style);
  std::vector<float> perm(cat.size());
  for (size_t r = 0; r < perm.size(); ++r) perm[r] = cat[rows[r]];
  L.qkv_bias = upload_floats(perm);
}

/// Layer `l` of an int4 model: its projections re-laid for the int4 GEMM in the bf16 path's row
/// orders (QKV rows permuted for RoPE pairs, gate/up interleaved by 8: weight_layout.h), and its
/// two RMSNorm weights in fp32, which the kernels writing the GEMMs' activations apply
/// (EpiResidualNormed, the embedding): W * g is not int4, so they cannot be folded.
void CudaModelImpl::load_layer_int4(int l, const WeightLookup& lookup) {
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
  const std::string pre = "model.layers." + std::to_string(l) + ".";
  Layer& L = layers_[l];
  {
    const HostWeight q = lookup(pre + "self_attn.q_proj.weight", {nq, H});
    const HostWeight k = lookup(pre + "self_attn.k_proj.weight", {nkv, H});
    const HostWeight v = lookup(pre + "self_attn.v_proj.weight", {nkv, H});
    L.qkv4 = upload_int4({&q, &k, &v}, qkv_row_permutation(cfg_.num_heads, cfg_.num_kv_heads, hd, cfg_.rope_style),
                         pre + "self_attn.{q,k,v}_proj");
    const std::string gn = pre + "input_layernorm.weight";
    L.norm_in = upload_floats(host_to_float(lookup(gn, {H}), gn));
  }
  {
    const HostWeight o = lookup(pre + "self_attn.o_proj.weight", {H, nq});
    L.o4 = upload_int4({&o}, {}, pre + "self_attn.o_proj");
  }
  {
    const HostWeight gt = lookup(pre + "mlp.gate_proj.weight", {I, H});
    const HostWeight up = lookup(pre + "mlp.up_proj.weight", {I, H});
    L.gu4 = upload_int4({&gt, &up}, gate_up_row_permutation(I), pre + "mlp.{gate,up}_proj");
    const std::string gn = pre + "post_attention_layernorm.weight";
    L.norm_post = upload_floats(host_to_float(lookup(gn, {H}), gn));
  }
  {
    const HostWeight d = lookup(pre + "mlp.down_proj.weight", {H, I});
    L.down4 = upload_int4({&d}, {}, pre + "mlp.down_proj");
  }
}

/// The int4 projections `parts` (rows concatenated in order, then row n of the device matrix
/// is row perm[n] of the concatenation; `perm` empty: no permutation) through
/// upload_int4_matrix. CheckpointError, naming `name`, for a part that is not int4 of the
/// model's group size or whose values upload_int4_matrix refuses.
Int4Matrix CudaModelImpl::upload_int4(std::initializer_list<const HostWeight*> parts, const std::vector<int>& perm,
                                      const std::string& name) {
  const int G = copt_.int4_group_size;
  const int64_t K = (*parts.begin())->shape.size() == 2 ? (*parts.begin())->shape[1] : 0;
  int64_t N = 0;
  for (const HostWeight* p : parts) {
    if (!p->is_int4() || p->dtype != DType::U8 || p->group_size != G || p->shape.size() != 2 || p->shape[1] != K ||
        !p->data || !p->scales || !p->zeros)
      throw CheckpointError("tensor " + name + ": int4 projections of group size " + std::to_string(G) +
                            " expected (CudaModelOptions::int4_group_size), got " +
                            (p->is_int4() ? "group size " + std::to_string(p->group_size) : "a float tensor"));
    N += p->shape[0];
  }
  const size_t qrow = static_cast<size_t>(K) / 2, grow = static_cast<size_t>(K / G);
  std::vector<uint8_t> q, z;
  std::vector<uint16_t> sc;
  const uint8_t* qp = static_cast<const uint8_t*>((*parts.begin())->data);
  const uint16_t* sp = (*parts.begin())->scales;
  const uint8_t* zp = (*parts.begin())->zeros;
  if (parts.size() > 1) {  // one host copy of the concatenation (the device staging takes it as one tensor)
    for (const HostWeight* p : parts) {
      const size_t rows = static_cast<size_t>(p->shape[0]);
      const uint8_t* pq = static_cast<const uint8_t*>(p->data);
      q.insert(q.end(), pq, pq + rows * qrow);
      sc.insert(sc.end(), p->scales, p->scales + rows * grow);
      z.insert(z.end(), p->zeros, p->zeros + rows * grow);
    }
    qp = q.data();
    sp = sc.data();
    zp = z.data();
  }
  try {
    return upload_int4_matrix(qp, sp, zp, perm.empty() ? nullptr : perm.data(), static_cast<int>(N),
                              static_cast<int>(K), G, stream_);
  } catch (const InvalidArgument& e) {
    throw CheckpointError("tensor " + name + ": " + e.what());
  }
}

void CudaModelImpl::init_random(uint64_t seed) {
  ModelScope scope(copt_.device, green_.get());
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, hd = cfg_.head_dim;
  const int nq = cfg_.num_heads * hd, nkv = cfg_.num_kv_heads * hd;
  uint64_t s = seed * 1000003ull + 17;
  auto fill = [&](DeviceBuffer& b, size_t count, int K) {
    launch_fill_random_bf16(b.as<__nv_bfloat16>(), count, 1.0f / std::sqrt(static_cast<float>(K)), s++, stream_);
  };
  if (int4_) init_random_int4(s);
  for (Layer& L : layers_) {
    if (int4_) {
      if (L.qkv_bias) launch_fill_random_f32(L.qkv_bias.as<float>(), nq + 2 * nkv, 0.1f, s++, stream_);
      continue;
    }
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

/// init_random's int4 projections: valid random contents (launch_fill_random_int4) and norm
/// weights of 1.
void CudaModelImpl::init_random_int4(uint64_t& seed) {
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, G = copt_.int4_group_size;
  const int nq = cfg_.num_heads * cfg_.head_dim, nkv = cfg_.num_kv_heads * cfg_.head_dim;
  const std::vector<float> ones(H, 1.0f);
  auto make = [&](Int4Matrix& m, int N, int K) {
    m.N = N;
    m.K = K;
    m.G = G;
    m.qw.allocate(static_cast<size_t>(N) * K / 2);
    m.meta.allocate(static_cast<size_t>(N) * (K / G) * 4);
    launch_fill_random_int4(m.view(), seed++, stream_);
  };
  for (Layer& L : layers_) {
    make(L.qkv4, nq + 2 * nkv, H);
    make(L.o4, H, nq);
    make(L.gu4, 2 * I, H);
    make(L.down4, H, I);
    L.norm_in = upload_floats(ones);
    L.norm_post = upload_floats(ones);
  }
}

// Uploads go through stream_ (and wait for it): a plain cudaMemcpy from
// pageable memory may return before its DMA has landed, and kernels on the
// non-blocking stream_ do not order after the legacy stream — a race that
// once corrupted weights here.
DeviceBuffer CudaModelImpl::upload_ints(const std::vector<int>& v) {
  DeviceBuffer b(sizeof(int) * v.size());
  SS_CUDA_CHECK(cudaMemcpyAsync(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice, stream_));
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return b;
}

DeviceBuffer CudaModelImpl::upload_floats(const std::vector<float>& v) {
  DeviceBuffer b(sizeof(float) * v.size());
  SS_CUDA_CHECK(cudaMemcpyAsync(b.get(), v.data(), b.bytes(), cudaMemcpyHostToDevice, stream_));
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return b;
}

/// Copies the raw bytes of `parts` (same dtype) one after the other into scratch_.
void CudaModelImpl::upload_concat(std::initializer_list<const HostWeight*> parts, const std::string& name) {
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

}  // namespace swiftspec::cuda
