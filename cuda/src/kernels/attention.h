// Attention of a decode / verification step over the committed KV plus the
// tree KV with the tree mask (SwiftSpec ASPLOS'26 §4.2 tree-aware KV cache,
// §5.2 kernels), split along the key length so that every SM streams keys at
// any context length (flash-decoding: Dao et al. 2023, "Flash-Decoding for
// long-context inference"), and batch-invariant (model.h "Exactness").
//
// The reduction of one query row over its L keys is a fixed function of L:
//   tile    kAttnTile (64) logical positions: max m, P = bf16(2^(s - m)),
//           l = sum of P in a fixed order, O = P V (mma.sync, k in order);
//   split   kAttnTilesPerSplit tiles folded in order (online softmax merge);
//   super   kAttnSplitsPerSuper splits folded in order;
//   final   supers folded in order, O / l.
// Tiles below floor(C / 64) (C = the step's committed length) hold the same
// keys for every token of the step and are computed once per group of up to
// 64 (or 128) query rows ("main" work items: one split or one super each); the tiles
// from there on (the committed tail and the tree ancestors of each token) are
// gathered per token ("tail" items); a second kernel folds each token's pieces.
// Whichever CTA computes a tile or a fold,
// it runs the same code on the same values, so a token verified inside a tree
// gets the bits it gets when decoded alone (checked by swiftspec-cuda-check).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "step_desc.h"

namespace swiftspec::cuda {

constexpr int kAttnTile = 64;           ///< logical positions per tile
constexpr int kAttnTilesPerSplit = 4;   ///< tiles per split (256 keys)
constexpr int kAttnSplitsPerSuper = 8;  ///< splits per super (2048 keys)
constexpr int kAttnSplitKeys = kAttnTile * kAttnTilesPerSplit;
constexpr int kAttnSuperKeys = kAttnSplitKeys * kAttnSplitsPerSuper;

/// Partial softmax states of query rows: o [entries][head_dim] fp32 (unnormalised), ml [entries]
/// (running max in log2 units, sum of P).
struct AttnPartials {
  float* o = nullptr;
  float2* ml = nullptr;
};

struct AttnParams {
  const __nv_bfloat16* q = nullptr;       ///< [64][num_heads*head_dim], RoPE applied
  const __nv_bfloat16* kcache = nullptr;  ///< layer: [kv_heads][slots][head_dim]
  const __nv_bfloat16* vcache = nullptr;
  __nv_bfloat16* out = nullptr;  ///< [64][num_heads*head_dim]
  const StepDesc* desc = nullptr;
  /// Scratch, entries (index * n + token) * num_heads + head (n = the step's tokens):
  AttnPartials split;             ///< per split; index < splits, n * splits <= split_capacity
  AttnPartials super;             ///< per super (a boundary super: its full splits); index < max_supers
  AttnPartials boundary;          ///< the split holding floor(C / 64): its tiles below it; index 0
  AttnPartials tail;              ///< per tail tile; index < tail_tiles
  int* super_counters = nullptr;  ///< [kv_heads][kMaxStepTokens][max_supers], zero, self-resetting
  int split_capacity = 0;
  int max_supers = 0;
  int tail_tiles = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int group = 0;                    ///< num_heads / num_kv_heads (1..16)
  int slots = 0;                    ///< max_context + max_tree
  int max_context = 0;              ///< the tree region starts here
  float scale = 0.f;                ///< 1/sqrt(head_dim)
  int max_tokens = kMaxStepTokens;  ///< the step's tokens at most (its graph bucket): the fold grid covers them
  int ctas = 0;                     ///< the attention grid's CTAs (set by launch_attention)
  int narrow = 2;       ///< decode steps' narrow main items: 0 none, 1 one-split items, 2 all (launch_attention)
  int max_rows = 64;    ///< query rows of a main item: 64 or 128 (the step tuner's choice; launch_attention checks)
  int debug_empty = 0;  ///< timing aid: bit 0 the attention kernel, bit 1 the fold kernel return at once
};

/// Scratch sizes of AttnParams for a model (entries of each AttnPartials, counters).
struct AttnScratchSizes {
  int split_capacity = 0, max_supers = 0, tail_tiles = 0;
  size_t split_entries = 0, super_entries = 0, boundary_entries = 0, tail_entries = 0;
  size_t super_counters = 0;
  /// Device bytes of all of it (head_dim floats + a float2 per entry, the counters).
  size_t bytes(int head_dim) const;
};
/// The scratch a model of these sizes needs: every split of a decode step up to max_context
/// (and of a 64-token step up to 64 splits), every super of 64 tokens, the tail tiles of a
/// tree token whose attend list holds up to max(64, max_tree) slots.
AttnScratchSizes attention_scratch_sizes(int num_heads, int num_kv_heads, int max_context, int max_tree);

/// CTAs of the persistent attention grid on `num_sms` SMs (as many as fit at once).
int attention_grid_ctas(int head_dim, int num_sms);

/// Launches the attention of the step `p.desc` on a persistent grid of `ctas` CTAs, then the
/// kernel of its final folds (one CTA per kv head and token). `pdl`: the first launch has a
/// programmatic edge to the previous kernel (the QKV GEMM); `pdl_fold`: the second to the
/// first (without, it starts after the first's end). Throws InvalidArgument for head_dim
/// other than 64 / 128, a group outside 1..16 or max_tokens outside 1..kMaxStepTokens.
void launch_attention(const AttnParams& p, int ctas, bool pdl, bool pdl_fold, cudaStream_t stream);

}  // namespace swiftspec::cuda
