// Loading the int4 projections of a format_version 3 checkpoint for the CPU backend,
// with every tensor validated against config.json and the manifest's group size.
#pragma once
#include <cstdint>
#include <string>

#include "backend/cpu/kernels.h"
#include "swiftspec/checkpoint.h"

namespace swiftspec::cpu {

/// The int4 projection `prefix` (e.g. "model.layers.0.self_attn.q_proj") of an int4
/// checkpoint, as a WeightMatrix [n, k] viewing `prefix.qweight` U8 [n, k/2],
/// `prefix.scales` F16 [n, k/G] and `prefix.zeros` U8 [n, k/G] in place (G: the manifest's
/// quantization.group_size). Throws CheckpointError naming the tensor and its file when G
/// does not divide k, a tensor is missing or has another shape (e.g. scales written for
/// another group size), `prefix.weight` is also present, a zero point is above 15 or a
/// scale is not finite.
WeightMatrix load_int4_matrix(const Checkpoint& checkpoint, const std::string& prefix, int64_t n, int64_t k);

}  // namespace swiftspec::cpu
