// Weights of one tensor-parallel rank for the CPU backend (TpPlan in
// tensor_parallel.h says which heads / rows each rank owns and how they are
// padded). Two sources:
//  - a TP-1 checkpoint folder, sharded at load time (the rank's slices are
//    copied into memory it owns, padding as zeros; embed_tokens and
//    lm_head are viewed in place in the mapped file);
//  - a pre-sharded folder written by `tools/convert_weights.py --tp N`
//    (docs/checkpoint_format.md, "Tensor-parallel shards"): every tensor is
//    viewed in place in its mapped rank file.
// Either way the rank's matrices have the plan's padded shapes:
//   q_proj [q_heads_per_rank*head_dim, hidden]   k/v_proj [kv_heads_per_rank*head_dim, hidden]
//   o_proj [hidden, q_heads_per_rank*head_dim]   gate/up_proj [ffn_per_rank, hidden]
//   down_proj [hidden, ffn_per_rank]              lm_head [its vocabulary slice, hidden]
// and dtype F32 or BF16 (the checkpoint's), or int4 (int4.h) for the projections of
// an int4 checkpoint sharded at load time: rows keep the group size G; the
// row-parallel o_proj / down_proj keep it when the rank's columns start and end on
// multiples of G (down_proj: the plan's ffn_group), else take the largest divisor of
// G that they do (o_proj with 64-column heads: 64), repeating each scale and zero
// point. Pre-sharded int4 folders do not exist.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "swiftspec/checkpoint.h"
#include "swiftspec/tensor_parallel.h"

namespace swiftspec::cpu {

struct TpLayerShard {
  WeightMatrix q, k, v, o, gate, up, down;
  std::vector<float> q_bias, k_bias, v_bias;           ///< fp32, padded; empty without attention bias
  std::vector<float> input_norm, post_attention_norm;  ///< fp32 [hidden], replicated
};

struct TpRankShard {
  int rank = 0;
  WeightMatrix embed;             ///< [vocab, hidden], replicated
  WeightMatrix lm_head;           ///< [vocab_bounds[r+1] - vocab_bounds[r], hidden]
  std::vector<float> final_norm;  ///< fp32 [hidden]
  std::vector<TpLayerShard> layers;
  std::vector<std::vector<uint8_t>> owned;              ///< copies the views above point into
  std::vector<std::shared_ptr<const void>> keep_alive;  ///< mapped files the views point into
};

/// Rank `rank`'s weights cut from a TP-1 checkpoint (F32, BF16 or int4) by
/// `plan` (for int4, made with ffn_group = the group size). Throws
/// CheckpointError naming a missing or mis-shaped tensor, a float dtype other
/// than F32/BF16, or an int4 projection whose rank slice would not start and
/// end on a multiple of 8 columns (the int4 kernels' unit).
TpRankShard shard_checkpoint(std::shared_ptr<const Checkpoint> checkpoint, const TpPlan& plan, int rank);

/// A pre-sharded checkpoint folder (format_version 2, tp_degree > 1).
class ShardedCheckpoint {
 public:
  /// True when `dir/manifest.json` declares a tensor-parallel folder
  /// (tp_degree > 1). False for a TP-1 folder or no manifest.
  static bool is_sharded(const std::string& dir);
  /// Opens and validates the folder: manifest fields, config.json, the plan
  /// (TpPlan::validate), every file's tensors, shapes and dtype. Throws
  /// CheckpointError naming the file and field.
  static std::shared_ptr<ShardedCheckpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const TpPlan& plan() const { return plan_; }
  DType dtype() const { return dtype_; }

  /// Rank `rank`'s weights, viewed in place (the folder stays mapped while
  /// the shard lives).
  static TpRankShard load_rank(std::shared_ptr<const ShardedCheckpoint> ckpt, int rank);

 private:
  ShardedCheckpoint() = default;
  const TensorView& tensor(const SafetensorsFile& f, const std::string& name, const std::vector<int64_t>& shape) const;
  std::string dir_;
  ModelConfig config_;
  TpPlan plan_;
  DType dtype_ = DType::BF16;
  std::unique_ptr<SafetensorsFile> shared_;
  std::vector<std::unique_ptr<SafetensorsFile>> ranks_;
};

}  // namespace swiftspec::cpu
