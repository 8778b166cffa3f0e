// CudaModelImpl, the CUDA model (cuda_model.h), declared once for the files that define its
// parts: cuda_model.cu (the Model API), cuda_model_load.cu (device state and weights),
// cuda_model_steps.cu (layered steps, graphs, tuning), cuda_model_megakernel.cu (the decode
// megakernel) and cuda_model_debug.cu (benchmark and test hooks); and the helpers they share.
#pragma once
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "context_bands.h"
#include "device_memory.h"
#include "graph_cache.h"
#include "green_context.h"
#include "kernels/attention.h"
#include "kernels/decode_megakernel.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_skinny.h"
#include "kernels/kernels.h"
#include "prefill/prefill_runner.h"
#include "step_choice.h"
#include "step_desc.h"
#include "step_graph_keys.h"
#include "swiftspec_cuda/cuda_model.h"

namespace swiftspec::cuda {

constexpr int kRows = kMaxStepTokens;  // activation buffers hold this many token rows

inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// True when the environment variable `name` is set to "1".
inline bool env_flag(const char* name) {
  const char* e = std::getenv(name);
  return e && std::string(e) == "1";
}

inline int bucket_nt(int n) {
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

class CudaModelImpl final : public CudaModel {
 public:
  CudaModelImpl(const ModelConfig& cfg, const ModelOptions& opt, const CudaModelOptions& copt);
  ~CudaModelImpl() override;

  // cuda_model_load.cu: the weights from host tensors or random values
  void load_host(const WeightLookup& lookup, const WeightExists& exists);
  void init_random(uint64_t seed);

  // cuda_model_steps.cu: every token bucket and context band tuned when the model is made
  void tune_all_buckets();
  void upload_synthetic_step(const ForwardBatch& b);

  // cuda_model.cu: the Model API
  const ModelConfig& config() const override { return cfg_; }
  const ModelOptions& options() const override { return opt_; }
  std::string backend_name() const override { return "cuda"; }
  int committed_len() const override { return committed_; }
  /// With the prefill path a pass of kPrefillMaxTokens tokens (cancellation is checked between
  /// passes); without it, the Model default.
  int prefill_chunk_tokens() const override { return prefill_ ? kPrefillMaxTokens : Model::prefill_chunk_tokens(); }

  void run_forward(const ForwardBatch& batch, std::vector<float>& logits) override;
  void forward_argmax(const ForwardBatch& batch, std::vector<int32_t>& argmax) override;
  void forward_top_k(const ForwardBatch& batch, int k, bool with_log_normalizer, TopKLogits& out,
                     double inv_temperature = 1.0) override;
  void read_logits_row(int row, std::vector<float>& out) override;
  void commit_tree_slots(const std::vector<int32_t>& slots) override;
  void truncate_committed(int len) override;
  void read_committed_kv(int layer, std::vector<float>& k, std::vector<float>& v) const override;
  void read_tree_kv(int layer, const std::vector<int32_t>& slots, std::vector<float>& k,
                    std::vector<float>& v) const override;
  size_t weight_bytes_per_step() const override;
  int num_sms() const override { return num_sms_; }

  // cuda_model_debug.cu: benchmark, test and diagnostic hooks (cuda_model.h)
  void debug_fill_committed_random(int len, uint64_t seed) override;
  int debug_prepare(const ForwardBatch& batch, bool write_logits) override;
  double debug_replay_ms(int id, int iters) override;
  void debug_poison_buffers() override;
  void debug_read_activations(const std::string& which, int rows, std::vector<float>& out) override;
  void debug_read_weight(const std::string& which, int layer, std::vector<float>& out) override;
  int debug_megakernel_trace(std::vector<unsigned long long>& stamps) override;
  std::string debug_gemm_plans() const override;
  std::string debug_step_tuning() const override;
  std::vector<int> debug_probe_sm_ids(int ctas) override;

 private:
  struct Layer {
    DeviceBuffer qkv, qkv_bias, o, gu, down;  ///< bf16 projections (empty in an int4 model)
    Int4Matrix qkv4, o4, gu4, down4;          ///< int4 projections (int4 models; same row orders)
    /// int4 models: the input / post-attention RMSNorm weights, fp32 [hidden] (bf16 models fold them)
    DeviceBuffer norm_in, norm_post;
  };
  struct Prepared {
    std::unique_ptr<StepDesc> desc;
    int n_attend = 0;
    int committed = 0;  ///< committed_len() when prepared: its context band's graph replays
    int nt = 1;
    LogitsMode mode = LogitsMode::Last;
    bool write_logits = true;
    bool megakernel = false;  ///< a single-token step of a model with the megakernel
  };

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

  // cuda_model.cu: checks, the step descriptor and run()
  void read_kv(int layer, const std::vector<int>& idx, std::vector<float>& k, std::vector<float>& v) const;
  void check_config() const;
  void check_int4_config() const;
  PrefillModelView prefill_view() const;
  void validate(const ForwardBatch& b) const;
  int fill_desc(StepDesc& d, const ForwardBatch& b, int begin, int count) const;
  void upload_desc(const StepDesc& d, int n_attend);
  std::vector<unsigned long long> run_argmax_keys(const ForwardBatch& batch);
  static int checked_key_index(unsigned long long key);
  static float key_value(unsigned long long key);
  void forget_logits_rows();
  void run(const ForwardBatch& b, const RowSink& sink);

  // cuda_model_load.cu: allocation and uploads
  void allocate_state();
  void allocate_attention_scratch();
  DeviceBuffer upload_ints(const std::vector<int>& v);
  DeviceBuffer upload_floats(const std::vector<float>& v);
  void upload_concat(std::initializer_list<const HostWeight*> parts, const std::string& name);
  void upload_qkv_bias(Layer& L, const std::string& pre, const WeightLookup& lookup, const WeightExists& exists);
  void load_layer_int4(int l, const WeightLookup& lookup);
  Int4Matrix upload_int4(std::initializer_list<const HostWeight*> parts, const std::vector<int>& perm,
                         const std::string& name);
  void init_random_int4(uint64_t& seed);

  // cuda_model_steps.cu: the layered step, its graphs and their tuning
  void set_attention_scratch(AttnParams& p) const;
  const int* desc_field(size_t offset) const;
  const CUtensorMap& tmap(const void* base, int rows, int cols, int box_rows);
  template <class Epi>
  const GemmConfig& plan(int kind, int N, int K, int nt);
  template <class Epi>
  const std::vector<GemmConfig>& plan_variants(int kind, int N, int K, int nt);
  static std::vector<std::string> variant_names(const std::vector<GemmConfig>& v);
  template <class Epi>
  void gemm(int kind, const void* w, int N, int K, const void* x, int nt, const GemmArgs& args,
            const typename Epi::Params& ep, bool pdl, int variant, cudaStream_t s);
  // int4 models: the same with the int4 GEMM (kernels/gemm_int4.h)
  template <class Epi>
  const std::vector<Int4GemmConfig>& plan4_variants(int kind, int N, int K, int nt);
  static std::vector<std::string> variant_names(const std::vector<Int4GemmConfig>& v);
  template <class Epi>
  void gemm4(int kind, const Int4Matrix& w, const void* x, int nt, const GemmArgs& args, const typename Epi::Params& ep,
             bool pdl, int variant, cudaStream_t s);
  void record_step(cudaStream_t s, int nt, LogitsMode mode, bool write_logits, const StepChoice& choice);
  void run_step(int nt, LogitsMode mode, bool write_logits, int committed);
  int tuned_band(int band, int nt) const;
  StepChoice tuned_choice(int band, int nt) const;
  cudaGraphExec_t step_graph(int nt, LogitsMode mode, bool write_logits, int committed);
  bool needs_tuning(int band, int nt) const;
  void tune_band_bucket(int band, int nt);
  void tune_bucket_or_keep(int band, int nt, LogitsMode mode, bool write_logits);
  void tune_bucket(int band, int nt, LogitsMode mode, bool write_logits);
  StepTuning tune_first_band(int nt, LogitsMode mode, bool write_logits, cudaGraphExec_t* best);
  StepTuning tune_further_band(int nt, LogitsMode mode, bool write_logits, cudaGraphExec_t* best);
  int synthetic_tokens(int band, int nt) const;
  std::function<std::vector<uint8_t>()> tuner_outputs(int rows);

  // cuda_model_megakernel.cu: the decode megakernel (CudaModelOptions::megakernel)
  bool megakernel_takes(int keys) const;
  bool measures_megakernel_hand_over() const;
  void measure_megakernel_hand_over();
  bool megakernel_wins_band(int band);
  void plan_megakernel();
  MegaTuning megakernel_tuning(int slot_bytes) const;
  void tune_megakernel(LogitsMode mode, bool write_logits);
  void setup_megakernel();
  void upload_megakernel_layers();
  void run_megakernel_step(LogitsMode mode, bool write_logits);
  void record_megakernel_step(cudaStream_t s, LogitsMode mode, bool write_logits);

  ModelConfig cfg_;
  ModelOptions opt_;
  CudaModelOptions copt_;
  std::unique_ptr<GreenContext> green_;  ///< SM partition (null: whole GPU); outlives stream_ and events
  bool pdl_ = true;
  bool int4_ = false;  ///< int4 projections (CudaModelOptions::int4_group_size > 0)
  /// per (context band, token bucket): the tuned launch settings (autotune); a band
  /// missing here runs with the nearest lower band's (tuned_band())
  std::map<std::pair<int, int>, StepChoice> tuned_;
  std::string tuning_log_;  ///< debug_step_tuning()
  int mk_max_smem_ = 0;     ///< opt-in shared memory per CTA (the megakernel's plans)
  /// megakernel_takes()' limit: CudaModelOptions::megakernel_max_keys resolved (-1: the
  /// default, or measured when the model is made: measure_megakernel_hand_over())
  int mk_max_keys_ = 0;
  int num_sms_ = 0;
  int slots_ = 0;
  int attn_ctas_ = 0;  ///< the persistent attention grid (attention_grid_ctas)
  AttnScratchSizes attn_sizes_;
  int vocab_rows_ = 0;
  int committed_ = 0;
  cudaStream_t stream_ = nullptr;

  std::vector<Layer> layers_;
  DeviceBuffer embed_, lm_, inv_freq_;
  DeviceBuffer kcache_, vcache_;
  DeviceBuffer h32_, h16_, ssq_, q_, attn_, act_, logits_, keys_;
  DeviceBuffer attn_part_o_, attn_part_ml_, attn_counters_, desc_, commit_idx_;
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
  std::unique_ptr<PrefillRunner> prefill_;  ///< CudaModelOptions::large_prefill

  // Decode megakernel (CudaModelOptions::megakernel)
  bool mk_ = false;
  MegaShape mk_shape_;
  MegaPlan mk_plan_;
  DeviceBuffer mk_layers_, mk_part_o_, mk_part_ml_, mk_sync_, mk_trace_;

  GraphCache graphs_;
  std::map<std::tuple<const void*, int, int, int>, CUtensorMap> maps_;
  std::map<int, GemmConfig> plans_;                       ///< (kind * 16 + nt): the planner's plan
  std::map<int, std::vector<GemmConfig>> plan_variants_;  ///< (kind * 16 + nt): [0] the planner's, then variants
  /// int4 models, (kind * 16 + nt): [0] plan_gemm_int4's plan, then its other warps per CTA
  std::map<int, std::vector<Int4GemmConfig>> plans4_;
  std::vector<Prepared> prepared_;
};

}  // namespace swiftspec::cuda
