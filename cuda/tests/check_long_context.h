// Long-context checks of the CUDA backend (swiftspec-cuda-check, issue 27).
#pragma once

namespace swiftspec::cuda_check {

/// The split-K attention against an fp64 CPU attention at contexts up to 40000 keys, tree
/// rows bitwise == decoding their path alone across tile / split / super boundaries and
/// work modes, the prefill path against the fp32 reference and the decode steps, and the
/// megakernel's hand-over beyond megakernel_max_keys. Reports through record().
void check_long_context();

}  // namespace swiftspec::cuda_check
