// The CUDA model (cuda_model.h): construction, the Model API (forward passes through run(),
// commits, KV reads) and the factories. The other parts of CudaModelImpl: cuda_model_impl.h.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_model_impl.h"
#include "swiftspec_cuda/memory_plan.h"

namespace swiftspec {
namespace cuda {

namespace {

/// Appends of at least this many tokens (without every row's logits) take the prefill path.
constexpr int kPrefillMinTokens = 64;

}  // namespace

CudaModelImpl::CudaModelImpl(const ModelConfig& cfg, const ModelOptions& opt, const CudaModelOptions& copt)
    : cfg_(cfg),
      opt_(opt),
      copt_(copt),
      pdl_(copt.use_pdl),
      int4_(copt.int4_group_size > 0),
      mk_max_keys_(copt.megakernel_max_keys < 0 ? kMegakernelDefaultMaxKeys : copt.megakernel_max_keys) {
  if (const char* tune = std::getenv("SWIFTSPEC_STEP_TUNE")) {
    const std::string v(tune);
    if (v == "0")
      copt_.autotune = false;
    else if (!v.empty() && v != "1")
      throw InvalidArgument("SWIFTSPEC_STEP_TUNE must be 0 (no step tuning) or 1, got '" + v + "'");
  }
  check_config();
  check_cuda_memory(cfg_, opt_, copt_.device, copt_.int4_group_size);  // the numbers, before any buffer
  DeviceScope device_scope(copt_.device);  // the caller's thread gets its device back afterwards
  cudaDeviceProp prop;
  SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, copt_.device));
  if (prop.major < 9)
    throw CudaError("the CUDA backend needs compute capability 9.0 (Hopper); device " + std::to_string(copt_.device) +
                    " (" + prop.name + ") is " + std::to_string(prop.major) + "." + std::to_string(prop.minor));
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
  if (green_)
    stream_ = green_->create_stream(copt_.stream_priority);
  else
    SS_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, copt_.stream_priority));
  for (auto& e : desc_ev_) SS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  SS_CUDA_CHECK(cudaEventCreateWithFlags(&commit_ev_, cudaEventDisableTiming));
  allocate_state();
  if (copt_.megakernel) setup_megakernel();
}

CudaModelImpl::~CudaModelImpl() {
  ModelScope scope(copt_.device, green_.get(), std::nothrow);  // the stream and events belong to the green context
  graphs_.clear();
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& e : desc_ev_)
    if (e) cudaEventDestroy(e);
  if (commit_ev_) cudaEventDestroy(commit_ev_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaModelImpl::run_forward(const ForwardBatch& batch, std::vector<float>& logits) {
  ModelScope scope(copt_.device, green_.get());
  RowSink sink;
  sink.logits = &logits;
  run(batch, sink);
}

void CudaModelImpl::forward_argmax(const ForwardBatch& batch, std::vector<int32_t>& argmax) {
  ModelScope scope(copt_.device, green_.get());
  argmax.clear();
  for (unsigned long long key : run_argmax_keys(batch)) argmax.push_back(checked_key_index(key));
}

void CudaModelImpl::forward_top_k(const ForwardBatch& batch, int k, bool with_log_normalizer, TopKLogits& out,
                                  double inv_temperature) {
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

void CudaModelImpl::read_logits_row(int row, std::vector<float>& out) {
  // The last forward_top_k took the host path (or forgot everything): the default's rows.
  if (!device_rows_kept_) {
    Model::read_logits_row(row, out);
    return;
  }
  if (row < 0 || row >= device_rows_total_)
    throw InvalidArgument("read_logits_row: row " + std::to_string(row) +
                          " is outside [0, rows=" + std::to_string(device_rows_total_) + ") of the last forward_top_k");
  const int first = device_rows_total_ - device_rows_in_buffer_;  // rows of the pass's last piece
  if (row < first)
    throw InvalidArgument("read_logits_row: row " + std::to_string(row) +
                          " of the last forward_top_k was overwritten "
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

void CudaModelImpl::commit_tree_slots(const std::vector<int32_t>& slots) {
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
      throw InvalidArgument("commit_tree_slots: tree_slots[" + std::to_string(i) + "] = " + std::to_string(slots[i]) +
                            " is outside [0, max_tree=" + std::to_string(opt_.max_tree) + ")");
    h[i] = opt_.max_context + slots[i];
  }
  SS_CUDA_CHECK(cudaMemcpyAsync(commit_idx_.get(), h, sizeof(int) * n, cudaMemcpyHostToDevice, stream_));
  SS_CUDA_CHECK(cudaEventRecord(commit_ev_, stream_));
  launch_kv_copy(kcache_.as<__nv_bfloat16>(), vcache_.as<__nv_bfloat16>(), cfg_.num_layers, cfg_.num_kv_heads, slots_,
                 cfg_.head_dim, commit_idx_.as<int>(), n, committed_, stream_);
  committed_ += n;
}

void CudaModelImpl::truncate_committed(int len) {
  if (len < 0 || len > committed_)
    throw InvalidArgument("truncate_committed: len " + std::to_string(len) +
                          " is outside [0, committed_len=" + std::to_string(committed_) + "]");
  committed_ = len;
}

void CudaModelImpl::read_committed_kv(int layer, std::vector<float>& k, std::vector<float>& v) const {
  std::vector<int> idx(committed_);
  for (int i = 0; i < committed_; ++i) idx[i] = i;
  read_kv(layer, idx, k, v);
}

void CudaModelImpl::read_tree_kv(int layer, const std::vector<int32_t>& slots, std::vector<float>& k,
                                 std::vector<float>& v) const {
  std::vector<int> idx(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= opt_.max_tree)
      throw InvalidArgument("read_tree_kv: slots[" + std::to_string(i) + "] = " + std::to_string(slots[i]) +
                            " is outside [0, max_tree=" + std::to_string(opt_.max_tree) + ")");
    idx[i] = opt_.max_context + slots[i];
  }
  read_kv(layer, idx, k, v);
}

/// K/V of cache indices `idx` of `layer` as fp32 [idx.size(), kv_heads, head_dim].
void CudaModelImpl::read_kv(int layer, const std::vector<int>& idx, std::vector<float>& k,
                            std::vector<float>& v) const {
  if (layer < 0 || layer >= cfg_.num_layers)
    throw InvalidArgument("read_kv: layer " + std::to_string(layer) +
                          " is outside [0, num_layers=" + std::to_string(cfg_.num_layers) + ")");
  ModelScope scope(copt_.device, green_.get());
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const int KVH = cfg_.num_kv_heads, hd = cfg_.head_dim;
  const size_t kv_layer = static_cast<size_t>(KVH) * slots_ * hd;
  std::vector<uint16_t> hk(static_cast<size_t>(KVH) * slots_ * hd), hv(hk.size());
  SS_CUDA_CHECK(
      cudaMemcpy(hk.data(), kcache_.as<__nv_bfloat16>() + kv_layer * layer, hk.size() * 2, cudaMemcpyDeviceToHost));
  SS_CUDA_CHECK(
      cudaMemcpy(hv.data(), vcache_.as<__nv_bfloat16>() + kv_layer * layer, hv.size() * 2, cudaMemcpyDeviceToHost));
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

size_t CudaModelImpl::weight_bytes_per_step() const {
  size_t b = 0;
  for (const Layer& L : layers_)
    b += L.qkv.bytes() + L.qkv_bias.bytes() + L.o.bytes() + L.gu.bytes() + L.down.bytes() + L.qkv4.bytes() +
         L.o4.bytes() + L.gu4.bytes() + L.down4.bytes() + L.norm_in.bytes() + L.norm_post.bytes();
  b += lm_.bytes();
  b += static_cast<size_t>(cfg_.hidden_size) * 2;  // one embedding row
  return b;
}

void CudaModelImpl::check_config() const {
  const auto bad = [](const std::string& m) { throw InvalidArgument("CUDA backend: " + m); };
  if (cfg_.hidden_size <= 0 || cfg_.hidden_size % 16) bad("hidden_size must be a positive multiple of 16");
  if (cfg_.intermediate_size <= 0 || cfg_.intermediate_size % 8)
    bad("intermediate_size must be a positive multiple of 8");
  if (cfg_.head_dim != 64 && cfg_.head_dim != 128) bad("head_dim must be 64 or 128");
  if (cfg_.num_heads <= 0 || cfg_.num_kv_heads <= 0 || cfg_.num_heads % cfg_.num_kv_heads)
    bad("num_heads must be a positive multiple of num_kv_heads");
  if (cfg_.num_heads / cfg_.num_kv_heads > 16) bad("at most 16 query heads per KV head");
  if (cfg_.vocab_size <= 0 || cfg_.num_layers < 0) bad("vocab_size must be positive and num_layers >= 0");
  if (opt_.max_context <= 0 || opt_.max_tree <= 0) bad("max_context and max_tree must be positive");
  if (copt_.gemm_engine < -1 || copt_.gemm_engine > 1) bad("gemm_engine must be -1 (default), 0 (mma) or 1 (wgmma)");
  if (copt_.megakernel && copt_.row_parallel)
    throw InvalidArgument("decode megakernel: not available with tensor parallelism (row_parallel)");
  if (copt_.int4_group_size < 0) bad("int4_group_size must be 0 (bf16 projections) or a group size");
  if (int4_) check_int4_config();
}

/// int4 projections (CudaModelOptions::int4_group_size): the layered step only, and shapes the
/// int4 GEMM runs; refused before anything is allocated.
void CudaModelImpl::check_int4_config() const {
  const std::string g =
      "int4 weights (CudaModelOptions::int4_group_size " + std::to_string(copt_.int4_group_size) + ")";
  if (copt_.megakernel)
    throw InvalidArgument("decode megakernel: " + g +
                          " run on the layered step only; the megakernel streams bf16 weights (issue 31)");
  if (copt_.large_prefill)
    throw InvalidArgument("large_prefill: " + g +
                          " take the layered step for prompts; the prefill path's GEMMs read bf16 weights "
                          "(set CudaModelOptions::large_prefill = false)");
  if (copt_.row_parallel)
    throw InvalidArgument("row_parallel: " + g + " run on one GPU; the row-parallel GEMMs read bf16 weights");
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int nq = cfg_.num_heads * cfg_.head_dim, nkv = cfg_.num_kv_heads * cfg_.head_dim;
  const std::pair<const char*, std::pair<int, int>> shapes[] = {
      {"qkv", {nq + 2 * nkv, H}}, {"o_proj", {H, nq}}, {"gate_up", {2 * I, H}}, {"down_proj", {H, I}}};
  for (const auto& [name, nk] : shapes) {
    try {
      check_int4_shape(nk.first, nk.second, copt_.int4_group_size);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("CUDA backend: " + g + ", projection " + name + " [" + std::to_string(nk.first) + ", " +
                            std::to_string(nk.second) + "]: " + e.what());
    }
  }
}

void CudaModelImpl::validate(const ForwardBatch& b) const {
  // The rules of every backend (ForwardBatch::validate); this one runs a tree in
  // pieces of kMaxStepTokens, which its "ancestors first" rule makes safe.
  b.validate(cfg_.vocab_size, committed_, opt_.max_context, opt_.max_tree);
}

/// Fills `d` with tokens [begin, begin+count) of `b`; returns the attend-list length.
int CudaModelImpl::fill_desc(StepDesc& d, const ForwardBatch& b, int begin, int count) const {
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

void CudaModelImpl::upload_desc(const StepDesc& d, int n_attend) {
  const int i = desc_i_;
  desc_i_ ^= 1;
  SS_CUDA_CHECK(cudaEventSynchronize(desc_ev_[i]));
  const size_t bytes = kStepDescHeaderBytes + sizeof(int) * n_attend;
  std::memcpy(desc_host_[i].as<void>(), &d, bytes);
  SS_CUDA_CHECK(cudaMemcpyAsync(desc_.get(), desc_host_[i].as<void>(), bytes, cudaMemcpyHostToDevice, stream_));
  SS_CUDA_CHECK(cudaEventRecord(desc_ev_[i], stream_));
}

/// run() reading each logits row's arg-max key from the LM head's epilogue (no logits written).
std::vector<unsigned long long> CudaModelImpl::run_argmax_keys(const ForwardBatch& batch) {
  std::vector<unsigned long long> keys;
  RowSink sink;
  sink.keys = &keys;
  run(batch, sink);
  return keys;
}

/// The token id of an arg-max key; Error when the row held a NaN (argmax_key).
int CudaModelImpl::checked_key_index(unsigned long long key) {
  if (argmax_key_is_nan(key)) throw Error(kNanLogitsMessage);
  return argmax_key_index(key);
}

/// The fp32 value of an arg-max key (-0 comes back as +0: argmax_key).
float CudaModelImpl::key_value(unsigned long long key) {
  uint32_t u = static_cast<uint32_t>(key >> 32);
  u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

/// Forgets the logits rows read_logits_row() reads (both the device's and the default's).
void CudaModelImpl::forget_logits_rows() {
  forget_kept_logits();
  device_rows_kept_ = false;
  device_rows_total_ = device_rows_in_buffer_ = 0;
}

/// The weights and caches the prefill path reads and writes.
PrefillModelView CudaModelImpl::prefill_view() const {
  PrefillModelView v;
  v.cfg = &cfg_;
  for (const Layer& L : layers_) {
    PrefillLayerWeights w;
    w.qkv = L.qkv.as<__nv_bfloat16>();
    w.qkv_bias = L.qkv_bias ? L.qkv_bias.as<float>() : nullptr;
    w.o = L.o.as<__nv_bfloat16>();
    w.gate_up = L.gu.as<__nv_bfloat16>();
    w.down = L.down.as<__nv_bfloat16>();
    v.layers.push_back(w);
  }
  v.embed = embed_.as<__nv_bfloat16>();
  v.inv_freq = inv_freq_.as<float>();
  v.kcache = kcache_.as<__nv_bfloat16>();
  v.vcache = vcache_.as<__nv_bfloat16>();
  v.slots = slots_;
  v.num_sms = num_sms_;
  v.device = copt_.device;
  return v;
}

void CudaModelImpl::run(const ForwardBatch& b, const RowSink& sink) {
  validate(b);
  forget_logits_rows();  // every pass may rewrite logits_
  const int n = static_cast<int>(b.tokens.size());
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  const bool want_logits = sink.logits || sink.top;
  if (sink.logits) sink.logits->clear();
  if (sink.keys) sink.keys->clear();
  StepDesc& d = *scratch_desc_;
  // A long append without every row's logits: its tokens but the last (the one whose logits
  // are asked for, or none) through the prefill path, the rest through decode steps.
  int first = 0;
  if (prefill_ && !b.is_tree() && b.logits != LogitsMode::All) {
    const int big = b.logits == LogitsMode::None ? n : n - 1;
    if (big >= kPrefillMinTokens) {
      const PrefillModelView view = prefill_view();
      for (int at = 0; at < big; at += kPrefillMaxTokens) {
        const int cnt = std::min(kPrefillMaxTokens, big - at);
        prefill_->run(view, b.tokens.data() + at, b.positions.data() + at, cnt, committed_, stream_);
        committed_ += cnt;
      }
      first = big;
    }
  }
  for (int begin = first; begin < n; begin += kMaxStepTokens) {
    const int cnt = std::min(kMaxStepTokens, n - begin);
    const bool last_piece = begin + cnt == n;
    LogitsMode mode = LogitsMode::None;
    if (b.logits == LogitsMode::All) mode = LogitsMode::All;
    if (b.logits == LogitsMode::Last && last_piece) mode = LogitsMode::Last;
    const int na = fill_desc(d, b, begin, cnt);
    upload_desc(d, na);
    if (mk_ && cnt == 1 && megakernel_takes(committed_ + 1))
      run_megakernel_step(mode, want_logits && mode != LogitsMode::None);
    else
      run_step(bucket_nt(cnt), mode, want_logits && mode != LogitsMode::None, committed_);
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
