// The keys of the CUDA model's graph cache (graph_cache.h): one captured graph per kind of
// step, its data (tokens, positions, KV slots) in the step descriptor.
//
// Layout, all keys distinct:
//   layered step:  band * 256 + nt * 16 + mode * 2 + write_logits   (band < kContextBands,
//                  nt = 1 / 2 / 4 / 8 tokens per 8 rows, mode a LogitsMode): 16 ... 1413
//   megakernel:    kMegakernelGraphKeys + mode * 2 + write_logits   (a single-token step; its
//                  graph does not depend on the context: one per logits mode)
#pragma once
#include "context_bands.h"
#include "swiftspec/model.h"

namespace swiftspec::cuda {

constexpr int kBandGraphKeys = 256;            ///< keys of one band's layered steps
constexpr int kMegakernelGraphKeys = 1 << 16;  ///< the first megakernel key, past every layered one

static_assert(kContextBands * kBandGraphKeys <= kMegakernelGraphKeys, "layered and megakernel keys overlap");

/// The graph of a layered step of bucket `nt` (at most 8) tuned for context band `band`.
inline int step_graph_key(int band, int nt, LogitsMode mode, bool write_logits) {
  return band * kBandGraphKeys + nt * 16 + static_cast<int>(mode) * 2 + (write_logits ? 1 : 0);
}

/// The graph of a megakernel step.
inline int megakernel_graph_key(LogitsMode mode, bool write_logits) {
  return kMegakernelGraphKeys + static_cast<int>(mode) * 2 + (write_logits ? 1 : 0);
}

}  // namespace swiftspec::cuda
