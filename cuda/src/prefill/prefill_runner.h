// The prefill path of the CUDA model: a chunk of up to kPrefillMaxTokens prompt tokens
// appended to the committed KV in one pass per layer of large-M GEMMs (CUTLASS,
// gemm_large.h) and causal flash attention (attention_prefill.h), instead of the decode
// step's graph replayed per 64 tokens (which re-reads every weight per 64 tokens).
//
// Its K/V and hidden states equal the decode steps' up to bf16 rounding (another GEMM and
// another attention reduction order), not bit for bit; it is deterministic, so two requests
// of one engine with the same prompt get the same bits (speculation stays equal to
// target-only decoding). It writes no logits: the model runs a prompt's last token through
// the decode step (cuda_model.cu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "device_memory.h"
#include "swiftspec/config.h"

namespace swiftspec::cuda {

/// Tokens of one prefill pass (the buffers' size; a longer append runs in passes).
constexpr int kPrefillMaxTokens = 2048;

/// One layer's device weights in the decode path's layout (weight_layout.h).
struct PrefillLayerWeights {
  const __nv_bfloat16* qkv = nullptr;      ///< [nq + 2 nkv][hidden], rows permuted, RMSNorm folded
  const float* qkv_bias = nullptr;         ///< [nq + 2 nkv] permuted, or null
  const __nv_bfloat16* o = nullptr;        ///< [hidden][nq]
  const __nv_bfloat16* gate_up = nullptr;  ///< [2 intermediate][hidden], interleaved by 8, RMSNorm folded
  const __nv_bfloat16* down = nullptr;     ///< [hidden][intermediate]
};

/// What the prefill reads and writes of a model.
struct PrefillModelView {
  const ModelConfig* cfg = nullptr;
  std::vector<PrefillLayerWeights> layers;
  const __nv_bfloat16* embed = nullptr;  ///< [vocab][hidden]
  const float* inv_freq = nullptr;       ///< [head_dim / 2]
  __nv_bfloat16* kcache = nullptr;       ///< [layers][kv_heads][slots][head_dim]
  __nv_bfloat16* vcache = nullptr;
  int slots = 0;
  int num_sms = 0;  ///< the model's SMs (its green-context partition)
  int device = 0;
};

class PrefillRunner {
 public:
  /// Allocates the pass's buffers for a model of `cfg` (device_bytes(cfg)).
  explicit PrefillRunner(const ModelConfig& cfg);

  /// Appends tokens[0, M) at cache indices committed .. committed + M - 1 with RoPE positions
  /// `positions` (host arrays), every layer's K / V written; 1 <= M <= kPrefillMaxTokens.
  /// Enqueued on `stream`; returns once the token upload has been staged (the caller
  /// synchronises as it does after a step).
  void run(const PrefillModelView& v, const int32_t* tokens, const int32_t* positions, int M, int committed,
           cudaStream_t stream);

  /// Device bytes of the buffers for a model of `cfg`.
  static size_t device_bytes(const ModelConfig& cfg);

 private:
  DeviceBuffer h32_, h16_, rinv_, y_, q_, attn_, act_, ids_, workspace_;
  PinnedBuffer ids_host_;
  cudaEvent_t upload_done_ = nullptr;
  bool upload_pending_ = false;

 public:
  ~PrefillRunner();
  PrefillRunner(const PrefillRunner&) = delete;
  PrefillRunner& operator=(const PrefillRunner&) = delete;
};

}  // namespace swiftspec::cuda
