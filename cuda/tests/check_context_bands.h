// Checks of tuning at the context in use (swiftspec-cuda-check, issue 27).
#pragma once

namespace swiftspec::cuda_check {

/// The step tuner's context bands (cuda/src/context_bands.h) on tiny models of 40000 keys:
/// the bands the context reaches are tuned (autotune_verify) and logged, the others not;
/// decode steps and trees of every token bucket in each band give bitwise the untuned
/// model's logits and commit nothing; the megakernel's measured hand-over (its log and the
/// path a decode step takes on either side of the limit), an explicit megakernel_max_keys
/// kept as given, and the default without autotune. Reports through record().
void check_context_bands();

}  // namespace swiftspec::cuda_check
