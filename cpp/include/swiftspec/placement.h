// Device placement of the two worker groups, as configuration (SwiftSpec
// ASPLOS'26: the draft group and the target group are disaggregated — each on
// its own devices, each with its own TP degree; docs/async_engine.md).
//
// JSON form (Python: Engine(..., placement={...}) or a path / JSON string):
//   {"draft":  {"tp": 1, "cores": [[0]]},
//    "target": {"tp": 2, "cores": [[1], [2]], "threads_per_rank": 1}}
// Fields of a group (all optional):
//   tp                TP degree (ranks), >= 1 (default 1)
//   cores             CPU backend: the cores of each rank, as one list per rank,
//                     or one flat list split evenly over the ranks (a flat
//                     list shorter than tp gives rank r core cores[r % len]).
//                     Empty: threads are not pinned.
//   threads_per_rank  CPU threads per rank; 0 (default): the rank's core count
//                     (unpinned: 1 for tp > 1, all cores for tp 1)
//   devices           CUDA backend: the GPU of each rank (default 0..tp-1)
//   sm_partition      CUDA backend, both groups on one GPU: [first SM, SM count]
//                     of this group's partition, run through a CUDA green
//                     context; count 0: up to the last SM; [0, 0] (default):
//                     all SMs, plain stream. SM numbers are logical and bounds
//                     fall on the driver's partition granularity (8 SMs on an
//                     H100/H200): sm_partition.h. Example, one H200 (132 SMs):
//                     {"draft": {"sm_partition": [0, 16]},
//                      "target": {"sm_partition": [16, 0]}}
//   stream_priority   CUDA backend: priority of the group's streams (lower is
//                     higher, clamped to the device's range, e.g. [-5, 0] on an
//                     H200; default 0). A target above the draft gets SMs first
//                     when both have kernels waiting (no preemption, no partition).
//   gemm_engine       CUDA backend: "wgmma" or "mma" for the GEMMs of the
//                     group's model (ModelOptions::gemm_engine; default: wgmma;
//                     with tp > 1 the row-parallel ones keep the default).
//                     E.g. {"draft": {"gemm_engine": "mma"}}: mma.sync is the
//                     faster engine for single-token decode steps.
//   megakernel        CUDA backend, tp 1: true runs the group's single-token
//                     steps as one persistent kernel (ModelOptions::megakernel;
//                     default false). A decode step is then not bitwise equal
//                     to a row of a tree step: meant for the draft (on the
//                     target, greedy output can differ from target-only at
//                     near-ties). E.g. {"draft": {"megakernel": true}}.
//   kv_window         the draft group only: [sinks, recent], an attention window
//                     (ModelOptions::kv_window_sinks / kv_window_recent): each
//                     row attends the first `sinks` of its keys and the last
//                     `recent` (its own key among them), so the draft's step cost stays
//                     flat at long contexts; the target verifies with its full
//                     KV, so outputs stay the target's. cpu backend for now
//                     (GroupPlacement::backend_problem).
//                     E.g. {"draft": {"kv_window": [4, 1024]}}.
// Errors name the group and field: the placement checks the form and that the
// two groups' partitions do not overlap on a shared GPU; loading a model checks
// the bounds against the device, and the cpu backend rejects sm_partition,
// devices, stream_priority, gemm_engine and megakernel (they are CUDA settings).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "swiftspec/model.h"
#include "swiftspec/sm_partition.h"

namespace swiftspec {

struct GroupPlacement {
  int tp = 1;
  std::vector<std::vector<int>> cores;  ///< [tp] core lists after normalisation (or empty)
  int threads_per_rank = 0;
  std::vector<int> devices;        ///< CUDA: [tp] GPU indices (or empty)
  int sm_first = 0, sm_count = 0;  ///< CUDA: SM partition (0 SMs: the whole GPU)
  int stream_priority = 0;         ///< CUDA: stream priority (lower is higher)
  std::string gemm_engine;         ///< CUDA: "", "wgmma" or "mma" (ModelOptions::gemm_engine)
  bool megakernel = false;         ///< CUDA: decode megakernel (ModelOptions::megakernel)
  int kv_window_sinks = 0;         ///< draft: attention sinks (ModelOptions::kv_window_sinks)
  int kv_window_recent = 0;        ///< draft: recent window, 0: full attention (ModelOptions::kv_window_recent)

  /// Threads of each rank's CPU thread pool for a model whose unpinned
  /// default is `default_threads` (ModelOptions::num_threads semantics).
  int resolved_threads(int default_threads) const;

  /// The fields set here that only the cuda backend understands, in the order of kCudaOnlyFields:
  /// what loading the group on the cpu backend refuses (load_group_model), and what the CLI
  /// refuses before loading (swiftspec_core.placement_cuda_only_fields).
  std::vector<std::string> cuda_only_fields() const;
  /// Whether the group sets kv_window (either number non-zero).
  bool has_kv_window() const { return kv_window_sinks != 0 || kv_window_recent != 0; }
  /// What the group asks for that `backend` does not implement ("<field>: <why>"; empty when
  /// nothing): a kv_window on the cuda backend (kv_window_backend_problem, model.h).
  std::string backend_problem(const std::string& backend) const;
  /// Whether the group places nothing: TP 1, no cores, no threads_per_rank, no CUDA-only field,
  /// no kv_window.
  bool places_nothing() const;
};

/// The group fields only the cuda backend understands.
inline constexpr const char* kCudaOnlyFields[] = {"devices", "sm_partition", "stream_priority", "gemm_engine",
                                                  "megakernel"};

struct Placement {
  GroupPlacement draft, target;

  /// Parses the JSON form above. Throws InvalidArgument naming the group and
  /// field (unknown fields included, so typos do not pass silently).
  static Placement from_json(const std::string& text);
  /// The JSON form (cores as one list per rank).
  std::string to_json() const;
  /// A sensible split of `num_cores` cores (0: all cores of this machine):
  /// the draft group gets max(draft_tp, num_cores / 4) cores, the target
  /// group the rest (on 2 cores: draft core 0, target core 1); each group's
  /// cores are split evenly over its ranks; with fewer cores than ranks,
  /// ranks share cores.
  static Placement automatic(int num_cores = 0, int target_tp = 1, int draft_tp = 1);
  /// Checks both groups (tp >= 1, core ids in [0, cores of this machine),
  /// list sizes, sm_partition non-negative) and that the groups' SM partitions
  /// do not overlap on a GPU they share; throws InvalidArgument.
  void validate() const;
};

/// Loads the model of one group: `checkpoint_dir` is a TP-1 folder (sharded
/// at load time when group.tp > 1) or a pre-sharded folder (tp_degree must
/// equal group.tp). `base` gives max_context / max_tree (and num_threads for
/// an unpinned TP-1 group); the CPU thread count and affinity come from the
/// placement. `backend` is "cpu" or "cuda" (CUDA: tp 1 only until the NCCL
/// communicator lands; the rank's device and sm_partition go to
/// ModelOptions::device / sm_first / sm_count). `where` names the group in
/// errors ("placement.draft"). Throws InvalidArgument / CheckpointError;
/// InvalidArgument for sm_partition or devices on the cpu backend, or a
/// partition outside the device's SMs or off its granularity (CUDA).
std::unique_ptr<Model> load_group_model(const std::string& checkpoint_dir, const GroupPlacement& group,
                                        const ModelOptions& base, const std::string& backend = "cpu",
                                        const std::string& where = "placement");

/// What the model of group `group` over `checkpoint_dir` needs on each device it uses when
/// load_group_model loads it with `base` (ModelMemory, model.h): in RAM on the cpu backend
/// (tensor-parallel ranks counted together), on each rank's GPU on the cuda backend.
/// max_context is not read. Throws InvalidArgument / CheckpointError as loading would.
ModelMemory group_model_memory(const std::string& checkpoint_dir, const GroupPlacement& group, const ModelOptions& base,
                               const std::string& backend = "cpu");

/// An engine's models, loaded by load_model_pair.
struct LoadedModels {
  std::unique_ptr<Model> target;
  std::unique_ptr<Model> draft;  ///< null without a draft
  /// One line when memory capped the default context (plan_contexts' note): what context the
  /// models got and why; empty otherwise. The CLI prints it on stderr.
  std::string context_note;
};

/// Loads an engine's target (and draft, unless `draft_dir` is empty) where `placement` says,
/// with their contexts planned together before either allocates: both models' weights, KV
/// caches and workspaces must fit in the memory free on the devices they share (the RAM on the
/// cpu backend, a GPU both use on the cuda backend); plan_model_contexts with base.max_context
/// asked of both (0: each model's default, capped together when memory is short). Then each
/// loads through load_group_model with its planned max_context. Throws what plan_contexts and
/// load_group_model throw; a refusal of the plan comes before anything is allocated.
LoadedModels load_model_pair(const std::string& target_dir, const std::string& draft_dir, const Placement& placement,
                             const ModelOptions& base, const std::string& backend = "cpu");

}  // namespace swiftspec
