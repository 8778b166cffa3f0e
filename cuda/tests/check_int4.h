// int4-weight GEMM checks of the CUDA backend (swiftspec-cuda-check --int4-only, issue 31).
#pragma once

namespace swiftspec::cuda_check {

/// The int4 skinny GEMM (kernels/gemm_int4.h) against an fp64 product of the same int4
/// values (q - z) * s at the 0.5B / 1.5B / Llama-3-8B projection shapes and M in
/// {1, 2, 16, 33, 64}, outputs poisoned first; batch invariance bitwise (rows of every M and
/// a single token at any X row against the M = 64 batch, and across row-block sizes); group
/// sizes 32 / 64 / 256, a K tail, a partial row block, a row permutation; refused inputs.
/// Reports through record().
void check_int4();

}  // namespace swiftspec::cuda_check
