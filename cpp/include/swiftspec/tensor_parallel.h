// How a model is split over the ranks of a worker group (tensor parallelism,
// Megatron-style: Shoeybi et al. 2019, "Megatron-LM", §3; used per group in
// SwiftSpec ASPLOS'26 §4, "right-sized parallelism"; docs/async_engine.md).
//
//   column-parallel  q/k/v_proj (by attention head), gate/up_proj (by FFN row),
//                    lm_head (by vocabulary row): each rank computes a slice of
//                    the outputs with the full input;
//   row-parallel     o_proj (by the input columns of its query heads),
//                    down_proj (by its FFN rows): each rank computes a partial
//                    sum of the full output; one all-reduce completes it;
//   replicated       embed_tokens, the RMSNorm weights.
//
// Padding, so that any TP degree works (head counts, FFN size and the TP
// degree need not divide each other), and every rank has the same shapes:
//  - query heads: rank r owns the contiguous heads
//    [Hq*r/tp, Hq*(r+1)/tp) followed by padding heads up to
//    q_heads_per_rank = ceil(Hq/tp). A padding head has zero q weights and
//    zero o_proj columns, so it contributes exactly 0 to the output.
//  - KV heads: rank r holds the distinct KV heads its query heads read (GQA
//    group h / (Hq/Hkv)), in increasing order, padded with zero heads up to
//    kv_heads_per_rank = the largest such count over ranks. A KV head shared
//    by ranks is replicated (stored and computed on each).
//  - FFN: rank r owns rows [I*r/tp, I*(r+1)/tp) of gate/up (columns of down),
//    padded with zero rows up to ffn_per_rank = round_up(ceil(I/tp), ffn_align);
//    silu(0) * 0 = 0, so padding adds exactly 0. With ffn_group G > 1 (int4
//    weights: the quantization group size) the bounds fall on whole groups,
//    G * floor((I/G)*r/tp), and ffn_per_rank is the largest slice rounded up to
//    ffn_align, so down_proj's columns split between its scale groups.
//  - vocabulary: rank r owns lm_head rows [V*r/tp, V*(r+1)/tp) (no padding
//    in the weights; gathered logits are cut back to V).
// Numerics: column-parallel outputs are bit-identical to TP 1; row-parallel
// outputs are the sum over ranks, in rank order (communicator.h), of partial
// dot products — a different reduction order than TP 1, so TP-N logits
// differ from TP-1 in the last bits, while staying batch-invariant: greedy
// speculation with a TP-N target equals target-only decoding with TP-N.
#pragma once
#include <string>
#include <vector>

#include "swiftspec/config.h"

namespace swiftspec {

struct TpPlan {
  int tp = 1;                 ///< TP degree (ranks)
  int q_heads_per_rank = 0;   ///< query heads per rank, padding included
  int kv_heads_per_rank = 0;  ///< KV heads per rank, replicas and padding included
  int ffn_per_rank = 0;       ///< FFN rows per rank, padding included
  int vocab_per_rank = 0;     ///< ceil(V / tp): the largest vocabulary slice
  /// [tp][q_heads_per_rank]: the model's query head at each local slot, -1 for padding.
  std::vector<std::vector<int>> q_heads;
  /// [tp][kv_heads_per_rank]: the model's KV head at each local slot, -1 for padding.
  std::vector<std::vector<int>> kv_heads;
  /// [tp][q_heads_per_rank]: local KV slot read by each local query head, -1 for padding.
  std::vector<std::vector<int>> q_to_kv;
  /// [tp + 1]: rank r owns FFN rows [ffn_bounds[r], ffn_bounds[r+1]).
  std::vector<int> ffn_bounds;
  /// [tp + 1]: rank r owns vocabulary rows [vocab_bounds[r], vocab_bounds[r+1]).
  std::vector<int> vocab_bounds;

  /// The plan for `config` over `tp` ranks (tp >= 1; any value, even or odd).
  /// `ffn_align` (>= 1) rounds ffn_per_rank up to a multiple (kernel tiles).
  /// `ffn_group` (>= 1; 1: any row) puts the FFN bounds on multiples of it (int4
  /// weights: their group size, so no rank's down_proj columns cut a scale group).
  /// Throws InvalidArgument for tp < 1, ffn_align < 1, ffn_group < 1 or not
  /// dividing intermediate_size, or an invalid config.
  static TpPlan make(const ModelConfig& config, int tp, int ffn_align = 8, int ffn_group = 1);

  /// JSON object (the "tensor_parallel" entry of a sharded checkpoint's
  /// config.json; docs/checkpoint_format.md, "Tensor-parallel shards").
  std::string to_json() const;
  /// Parses to_json()'s format; `origin` names the source in errors. Throws
  /// CheckpointError for a missing or inconsistent field.
  static TpPlan from_json(const std::string& text, const std::string& origin);
  /// Checks the plan against `config` (every real head / row owned exactly
  /// once, local maps consistent); throws CheckpointError naming the field.
  void validate(const ModelConfig& config, const std::string& origin) const;

  bool operator==(const TpPlan& o) const = default;
};

}  // namespace swiftspec
