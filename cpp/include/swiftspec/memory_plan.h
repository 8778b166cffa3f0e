// The context a model gets, bounded by the memory free for it.
//
// A model's committed KV cache is allocated for its whole context (ModelOptions::max_context)
// when it loads. The default context is what the model was trained for
// (config.json max_position_embeddings), unless the weights, KV cache and workspaces of the
// models that share a device (the CPU's RAM, or one GPU) would not fit in the memory free
// there: then it is capped to what fits. An explicit max_context that does not fit is refused
// before anything large is allocated, with the numbers. plan_contexts() is that rule, the only
// copy of it: every loader calls it (load_model, load_group_model, load_model_pair), and Python
// reaches it through the binding.
//
// What a model needs is a MemoryNeed, which its backend computes (cpu_memory_need in
// backend/cpu/cpu_model.h, cuda_memory_need in swiftspec_cuda/memory_plan.h); what is free
// is a FreeMemory (cpu_free_memory here, cuda_free_memory for a GPU).
//
// Test hook: the environment variable SWIFTSPEC_TEST_FREE_BYTES (a decimal byte count), when
// set, replaces the free byte count that cpu_free_memory() and cuda_free_memory() measure, so
// that tests can simulate a machine with little memory. Not meant for anything else.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace swiftspec {

/// The context a model gets by default when its config.json gives no max_position_embeddings.
constexpr int kFallbackMaxContext = 4096;

/// The share of the free memory a *default* context may plan for; the rest stays free for what
/// no estimate counts (the rest of the process, the OS page cache of other files, other
/// programs). An explicit max_context may use all of the free memory.
constexpr double kDefaultContextMemoryShare = 0.9;

/// A default context capped by memory is never made smaller than this (the models need room
/// for a prompt and an answer): below it, loading is refused instead.
constexpr int kMinDefaultContext = 256;

/// Bytes a model needs on one device, by what they grow with. All fields in bytes.
struct MemoryNeed {
  uint64_t weight_bytes = 0;               ///< weights as the backend holds them
  uint64_t kv_bytes_per_token = 0;         ///< committed KV cache (K and V, every layer) per context token
  uint64_t kv_fixed_bytes = 0;             ///< KV cache that does not grow with the context (tree slots)
  uint64_t workspace_bytes = 0;            ///< activations, logits, load-time scratch, runtime overhead
  uint64_t workspace_bytes_per_token = 0;  ///< workspaces that grow linearly with the context
  /// Workspaces that grow with the context in steps (the CUDA attention partials: one per key
  /// split), bytes for a context of `context` tokens; must not decrease as the context grows.
  /// Empty: none.
  std::function<uint64_t(int64_t context)> workspace_of_context;

  /// KV cache bytes for a context of `context` tokens (tree slots included).
  uint64_t kv_bytes(int64_t context) const;
  /// Workspace bytes for a context of `context` tokens.
  uint64_t workspace(int64_t context) const;
  /// Everything: weights + kv_bytes(context) + workspace(context).
  uint64_t bytes(int64_t context) const;
};

/// Memory free on one device, as measured when a model is about to load.
struct FreeMemory {
  uint64_t bytes = 0;
  /// Where, as messages say it after "N GiB free": "in RAM (MemAvailable)", "on cuda:0",
  /// "in RAM (SWIFTSPEC_TEST_FREE_BYTES, a test hook)".
  std::string where;
  /// False when it could not be measured (no /proc/meminfo): nothing is bounded then.
  bool known = true;
};

/// MemAvailable of /proc/meminfo (RAM the kernel can give without swapping), or the test hook
/// SWIFTSPEC_TEST_FREE_BYTES. Unreadable: known = false. Throws InvalidArgument when the test
/// hook is set to something other than a decimal byte count.
FreeMemory cpu_free_memory();

/// `measured` unless the test hook SWIFTSPEC_TEST_FREE_BYTES is set, in which case its value
/// replaces the byte count (`device` names the device in `where`: "RAM", "cuda:0"). Throws
/// InvalidArgument when the variable is not a decimal byte count.
FreeMemory apply_free_memory_test_hook(FreeMemory measured, const std::string& device);

/// One model of a plan.
struct ContextRequest {
  std::string name;    ///< how messages name the model (its checkpoint folder's name)
  std::string origin;  ///< its config.json path (named when max_context exceeds what it was trained for)
  int requested = 0;   ///< ModelOptions::max_context: 0 = the default, > 0 = explicit
  int trained = 0;     ///< ModelConfig::context_limit(): max_position_embeddings, longer with YaRN (0: not said)
  /// What the model needs on each device it uses: pairs (index into plan_contexts' `devices`,
  /// need there). A model on one device has one entry; a tensor-parallel one, one per GPU.
  std::vector<std::pair<int, MemoryNeed>> needs;
};

/// What plan_contexts decided.
struct ContextPlan {
  std::vector<int> contexts;  ///< [models.size()] the resolved max_context of each model, tokens
  /// One line when a default context was capped by memory: what was chosen and why (the CLI
  /// prints it on stderr); empty when every model got what it asked for or was trained for.
  std::string note;
};

/// The rule. Each model's context: its explicit `requested` value, or by default its `trained`
/// length (kFallbackMaxContext when that is not given). Then, on every device, the models'
/// MemoryNeed::bytes(context) must add up to at most its free bytes (defaults: to at most
/// kDefaultContextMemoryShare of them). Default contexts that do not fit are capped together to
/// the largest common value C that fits (each default model gets min(its length, C)), rounded
/// down to a multiple of 1024 tokens (256 below 4096), and `note` says so.
/// Throws InvalidArgument, before anything is allocated:
///  - requested < 0, or requested above trained ("max_context 129 exceeds the model's
///    max_position_embeddings 128 (<origin>): ...");
///  - explicit contexts that do not fit: "max_context 131072 needs 14.2 GiB of KV cache for
///    <name> (17.6 GiB with its weights and workspaces), 9.8 GiB free on cuda:0; at most 90112
///    fits" (every model on that device named);
///  - defaults that fit only below kMinDefaultContext tokens, or not even with 1 token.
/// Devices whose FreeMemory is not known bound nothing.
ContextPlan plan_contexts(const std::vector<ContextRequest>& models, const std::vector<FreeMemory>& devices);

/// Bytes of a linear projection of `n` output and `k` input features as the CUDA backend holds
/// it in GPU memory (swiftspec_cuda/memory_plan.h counts every projection through it): bf16
/// (`int4_group_size` 0), 2 n k; int4 with `int4_group_size` = G > 0, the int4 GEMM's device
/// layout (cuda/src/kernels/gemm_int4.h): n k / 2 bytes of packed 4-bit values and one 32-bit
/// word (fp16 scale, zero point) per group of G, n k / 2 + 4 n k / G. Throws InvalidArgument
/// when G does not divide k.
uint64_t cuda_projection_bytes(uint64_t n, uint64_t k, int int4_group_size);

/// A byte count as messages show it: "14.2 GiB", "310 MiB", "12 KiB", "100 bytes".
std::string format_bytes(uint64_t bytes);

/// The name messages give a model: the last component of its checkpoint folder `dir`.
std::string model_name_of(const std::string& dir);

}  // namespace swiftspec
