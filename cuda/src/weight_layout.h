// Device layouts of the weights (host-side index maps), see epilogues.h:
//  * QKV rows (q heads, then k heads, then v heads; head_dim rows each) are
//    permuted per head so that 16-row tile t of a head holds, in rows r and
//    r+8, the two dimensions that RoPE rotates together for pair index
//    i = 8*t + r: NeoX (i, i + head_dim/2), interleaved (2i, 2i+1).
//  * gate/up rows are interleaved by 8: tile t holds gate rows 8t..8t+7 and
//    up rows 8t..8t+7, so SwiGLU pairs sit in the same thread.
//  * RMSNorm weights are folded into the columns of the matrix that follows
//    the norm (QKV, gate/up, LM head).
#pragma once
#include <vector>

#include "swiftspec/config.h"
#include "swiftspec/rope.h"

namespace swiftspec::cuda {

/// dst row -> src row of the concatenated [q; k; v] projection.
std::vector<int> qkv_row_permutation(int num_heads, int num_kv_heads, int head_dim, RopeStyle style);
/// dst row -> src row of the concatenated [gate; up] projection (intermediate % 8 == 0).
std::vector<int> gate_up_row_permutation(int intermediate);
// RoPE tables: swiftspec::rope_inv_freq() and rope_attention_scale() (swiftspec/rope.h), the
// same fp32 tables as the CPU backend's.

}  // namespace swiftspec::cuda
