// The CUDA model's benchmark, test and diagnostic hooks (CudaModel::debug_*, cuda_model.h):
// prepared steps replayed for timing, buffers poisoned or read back, plans and tuning described.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_model_impl.h"

namespace swiftspec::cuda {

void CudaModelImpl::debug_fill_committed_random(int len, uint64_t seed) {
  if (len < 0 || len > opt_.max_context)
    throw InvalidArgument("debug_fill_committed_random: len " + std::to_string(len) + " is outside [0, max_context]");
  ModelScope scope(copt_.device, green_.get());
  launch_kv_fill_random(kcache_.as<__nv_bfloat16>(), vcache_.as<__nv_bfloat16>(), cfg_.num_layers, cfg_.num_kv_heads,
                        slots_, cfg_.head_dim, len, seed, stream_);
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  committed_ = len;
}

int CudaModelImpl::debug_prepare(const ForwardBatch& batch, bool write_logits) {
  validate(batch);
  const int n = static_cast<int>(batch.tokens.size());
  if (n > kMaxStepTokens) throw InvalidArgument("debug_prepare: at most " + std::to_string(kMaxStepTokens) + " tokens");
  Prepared p;
  p.desc = std::make_unique<StepDesc>();
  p.n_attend = fill_desc(*p.desc, batch, 0, n);
  p.committed = committed_;
  p.nt = bucket_nt(n);
  p.mode = batch.logits;
  p.write_logits = write_logits && batch.logits != LogitsMode::None;
  p.megakernel = mk_ && n == 1 && megakernel_takes(committed_ + 1);
  prepared_.push_back(std::move(p));
  return static_cast<int>(prepared_.size()) - 1;
}

double CudaModelImpl::debug_replay_ms(int id, int iters) {
  if (id < 0 || id >= static_cast<int>(prepared_.size())) throw InvalidArgument("debug_replay_ms: bad step id");
  const Prepared& p = prepared_[id];
  ModelScope scope(copt_.device, green_.get());
  forget_logits_rows();  // the replayed steps rewrite logits_
  upload_desc(*p.desc, p.n_attend);
  auto step = [&] {
    if (p.megakernel)
      run_megakernel_step(p.mode, p.write_logits);
    else
      run_step(p.nt, p.mode, p.write_logits, p.committed);
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

void CudaModelImpl::debug_poison_buffers() {
  ModelScope scope(copt_.device, green_.get());
  forget_logits_rows();
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto* b :
       {&h32_, &h16_, &ssq_, &q_, &attn_, &act_, &logits_, &attn_part_o_, &attn_part_ml_, &mk_part_o_, &mk_part_ml_})
    if (b->bytes() > 0) SS_CUDA_CHECK(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), stream_));
  const size_t row = sizeof(__nv_bfloat16) * static_cast<size_t>(cfg_.head_dim);
  const size_t pitch = row * slots_;
  const size_t height = static_cast<size_t>(cfg_.num_layers) * cfg_.num_kv_heads;
  for (auto* b : {&kcache_, &vcache_})
    if (height > 0)
      SS_CUDA_CHECK(cudaMemset2DAsync(b->as<unsigned char>() + row * committed_, pitch, 0xFF,
                                      row * (slots_ - committed_), height, stream_));
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaModelImpl::debug_read_activations(const std::string& which, int rows, std::vector<float>& out) {
  if (rows < 1 || rows > kRows) throw InvalidArgument("debug_read_activations: rows must be 1..64");
  ModelScope scope(copt_.device, green_.get());
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const int H = cfg_.hidden_size, nq = cfg_.num_heads * cfg_.head_dim, I = cfg_.intermediate_size;
  const DeviceBuffer* b = nullptr;
  int cols = 0;
  bool is_bf16 = true;
  if (which == "h32") {
    b = &h32_;
    cols = H;
    is_bf16 = false;
  } else if (which == "ssq") {
    b = &ssq_;
    cols = H / 16;
    is_bf16 = false;
  } else if (which == "q") {
    b = &q_;
    cols = nq;
  } else if (which == "attn") {
    b = &attn_;
    cols = nq;
  } else if (which == "act") {
    b = &act_;
    cols = I;
  } else
    throw InvalidArgument("debug_read_activations: unknown buffer '" + which + "'");
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

void CudaModelImpl::debug_read_weight(const std::string& which, int layer, std::vector<float>& out) {
  ModelScope scope(copt_.device, green_.get());
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const DeviceBuffer* b = nullptr;
  if (which == "embed")
    b = &embed_;
  else if (which == "lm")
    b = &lm_;
  else {
    if (layer < 0 || layer >= cfg_.num_layers) throw InvalidArgument("debug_read_weight: bad layer");
    if (int4_)
      throw InvalidArgument("debug_read_weight: '" + which +
                            "' of an int4 model is int4 in the int4 GEMM's layout (kernels/gemm_int4.h), not bf16");
    const Layer& L = layers_[layer];
    if (which == "qkv")
      b = &L.qkv;
    else if (which == "o")
      b = &L.o;
    else if (which == "gate_up")
      b = &L.gu;
    else if (which == "down")
      b = &L.down;
    else
      throw InvalidArgument("debug_read_weight: unknown weight '" + which + "'");
  }
  std::vector<uint16_t> tmp(b->bytes() / 2);
  SS_CUDA_CHECK(cudaMemcpy(tmp.data(), b->get(), b->bytes(), cudaMemcpyDeviceToHost));
  out.resize(tmp.size());
  for (size_t i = 0; i < tmp.size(); ++i) out[i] = bf16_bits_to_float(tmp[i]);
}

int CudaModelImpl::debug_megakernel_trace(std::vector<unsigned long long>& stamps) {
  if (!mk_trace_) throw InvalidArgument("debug_megakernel_trace: the model was made without megakernel_trace");
  ModelScope scope(copt_.device, green_.get());
  SS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  stamps.resize(mk_trace_.bytes() / sizeof(unsigned long long));
  SS_CUDA_CHECK(cudaMemcpy(stamps.data(), mk_trace_.get(), mk_trace_.bytes(), cudaMemcpyDeviceToHost));
  return mk_plan_.ctas;
}

std::string CudaModelImpl::debug_step_tuning() const { return tuning_log_; }

std::string CudaModelImpl::debug_gemm_plans() const {
  std::string out;
  for (const auto& [key, c] : plans_) {
    const int kind = key / 16;
    out += std::string(kind >= 0 && kind < kStepKernels ? step_kernel_name(kind) : "?") +
           " nt=" + std::to_string(key % 16) + " S=" + std::to_string(c.S) + " BR=" + std::to_string(c.BR) +
           " stages=" + std::to_string(c.stages) + " grid=" + std::to_string(c.grid_x) + "x" + std::to_string(c.S) +
           " ctas=" + std::to_string(c.grid_x * c.S) + "\n";
  }
  for (const auto& [key, v] : plans4_) {
    const int kind = key / 16;
    const Int4GemmConfig& c = v[0];
    out += std::string(kind >= 0 && kind < kStepKernels ? step_kernel_name(kind) : "?") +
           " nt=" + std::to_string(key % 16) + " int4 S=" + std::to_string(c.S) + " BR=" + std::to_string(c.BR) +
           " stages=" + std::to_string(c.stages) + " grid=" + std::to_string(c.grid_x) + "x" + std::to_string(c.S) +
           " ctas=" + std::to_string(c.grid_x * c.S) + "\n";
  }
  if (mk_)
    out += "megakernel ctas=" + std::to_string(mk_plan_.ctas) + " slots=" + std::to_string(mk_plan_.num_slots) + "x" +
           std::to_string(mk_plan_.slot_bytes) + " smem=" + std::to_string(mk_plan_.smem_bytes) +
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

std::vector<int> CudaModelImpl::debug_probe_sm_ids(int ctas) {
  ModelScope scope(copt_.device, green_.get());
  return probe_sm_ids(stream_, ctas);
}

}  // namespace swiftspec::cuda
