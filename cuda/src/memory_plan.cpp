// cuda_memory_need / cuda_free_memory / check_cuda_memory (swiftspec_cuda/memory_plan.h).
#include "swiftspec_cuda/memory_plan.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "common.h"
#include "kernels/attention.h"
#include "kernels/decode_megakernel.h"
#include "kernels/kernels.h"
#include "prefill/prefill_runner.h"
#include "step_desc.h"

namespace swiftspec {

namespace {
/// CUDA graphs (one per token bucket, mode and tuned context band), their launch resources and
/// the step tuner's candidates: not buffers of the model, so not sized from its shapes. An
/// allowance.
constexpr uint64_t kRuntimeAllowanceBytes = uint64_t(128) << 20;
/// The megakernel's partial buffers hold num_heads * (num_sms / num_kv_heads) splits; sized
/// here for a GPU of at most this many SMs (an H100 / H200 has 132).
constexpr uint64_t kMaxSms = 160;
}  // namespace

MemoryNeed cuda_memory_need(const ModelConfig& c, const ModelOptions& o, int weight_dtype_bytes, int int4_group_size) {
  const uint64_t bf16 = 2, f32 = 4, R = cuda::kMaxStepTokens;  // step buffers hold up to 64 rows
  const uint64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, L = c.num_layers;
  const uint64_t hd = c.head_dim, nh = c.num_heads, kvh = c.num_kv_heads;
  const uint64_t nq = nh * hd, nkv = kvh * hd, vocab_rows = (V + 15) / 16 * 16;
  const uint64_t tree = static_cast<uint64_t>(std::max(o.max_tree, 0));
  MemoryNeed n;
  // Weights (allocate_state / load_host): fused QKV (+ fp32 bias), O, fused gate/up, down
  // (bf16, or int4 with the two RMSNorm weights of the layer in fp32: they scale the
  // activations instead of being folded); the embedding; the LM head; RoPE's inverse
  // frequencies.
  const int G = int4_group_size;
  const uint64_t per_layer = cuda_projection_bytes(nq + 2 * nkv, H, G) + (c.attention_bias ? (nq + 2 * nkv) * f32 : 0) +
                             cuda_projection_bytes(H, nq, G) + cuda_projection_bytes(2 * I, H, G) +
                             cuda_projection_bytes(H, I, G) + (G > 0 ? 2 * H * f32 : 0);
  n.weight_bytes = L * per_layer + V * H * bf16 + vocab_rows * H * bf16 + hd / 2 * f32;
  // KV cache (allocate_state): K and V, bf16, one slot per committed token and tree node.
  const uint64_t kv_slot = 2 * L * kvh * hd * bf16;
  n.kv_bytes_per_token = kv_slot;
  n.kv_fixed_bytes = kv_slot * tree;
  // The attention's partials and counters (allocate_attention_scratch): one per key split, so
  // they grow with the context in steps; the kernels' own sizing, for exactly these buffers.
  n.workspace_of_context = [heads = c.num_heads, kv_heads = c.num_kv_heads, max_tree = o.max_tree,
                            head_dim = c.head_dim](int64_t context) {
    const int ctx = static_cast<int>(std::min<int64_t>(context, std::numeric_limits<int>::max()));
    return static_cast<uint64_t>(cuda::attention_scratch_sizes(heads, kv_heads, ctx, max_tree).bytes(head_dim));
  };
  // Step activations, logits, top-k scratch, arg-max keys, the step descriptor, commit indices.
  uint64_t ws = R * H * f32 + R * H * bf16 + R * (H / 16) * f32 + 2 * R * nq * bf16 + R * I * bf16 + R * V * f32;
  ws += R * sizeof(unsigned long long) + R * cuda::kTopKSegments * cuda::kTopKMax * sizeof(unsigned long long) +
        R * cuda::kTopKSegments * (2 * sizeof(double) + sizeof(int)) + R * sizeof(cuda::TopKRow);
  ws += sizeof(cuda::StepDesc) + tree * sizeof(int);
  // The prefill path's buffers (CudaModelOptions::large_prefill, on by default; tensor-parallel
  // ranks go without: counted anyway; int4 models always go without: make_cuda_model turns it
  // off for them).
  if (G == 0) ws += cuda::PrefillRunner::device_bytes(c);
  if (o.megakernel) {  // setup_megakernel: per-layer table, partials of num_sms / num_kv_heads splits per head
    const uint64_t splits = std::max<uint64_t>(1, kMaxSms / std::max<uint64_t>(kvh, 1));
    ws += L * sizeof(cuda::MegaLayer) + nh * splits * (hd * f32 + 2 * f32) + (uint64_t(1) << 20);
  }
  // Load-time staging (upload_concat): the largest tensor group uploaded at once, in the
  // checkpoint's dtype; freed after loading, but allocated next to everything above. An int4
  // projection is staged in the checkpoint layout (upload_int4_matrix: packed values, fp16
  // scales, zero points, the row permutation), one at a time.
  const uint64_t src = static_cast<uint64_t>(std::max(weight_dtype_bytes, 1));
  if (G > 0) {
    const uint64_t g = static_cast<uint64_t>(G);
    const auto stage4 = [g](uint64_t rows, uint64_t k) { return rows * k / 2 + 3 * rows * (k / g) + 4 * rows; };
    ws += std::max({stage4(nq + 2 * nkv, H), stage4(H, nq), stage4(2 * I, H), stage4(H, I), V * H * src});
  } else {
    ws += std::max({(nq + 2 * nkv) * H, 2 * I * H, V * H}) * src;
  }
  n.workspace_bytes = ws + kRuntimeAllowanceBytes;
  return n;
}

FreeMemory cuda_free_memory(int device) {
  int count = 0;
  SS_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    throw InvalidArgument("device " + std::to_string(device) + " does not exist (this machine has " +
                          std::to_string(count) + " GPUs)");
  FreeMemory m;
  {
    cuda::DeviceScope scope(device);
    size_t free_bytes = 0, total_bytes = 0;
    SS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    m.bytes = free_bytes;
  }
  m.where = "on cuda:" + std::to_string(device);
  return apply_free_memory_test_hook(m, "cuda:" + std::to_string(device));
}

void check_cuda_memory(const ModelConfig& config, const ModelOptions& options, int device, int int4_group_size) {
  ContextRequest r;
  r.name = "the model";
  r.requested = options.max_context;
  r.needs.push_back({0, cuda_memory_need(config, options, 2, int4_group_size)});
  plan_contexts({r}, {cuda_free_memory(device)});
}

}  // namespace swiftspec
