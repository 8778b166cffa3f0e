// CUDA graphs of the step, one per bucket key (SwiftSpec ASPLOS'26 §5.3:
// every decode / verify step replays a captured graph; no host sync inside).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <map>

namespace swiftspec::cuda {

/// Captures record(stream) into an executable graph (relaxed mode: other
/// threads, e.g. the other ranks of a group, keep calling the runtime
/// meanwhile). Throws CudaError; a failed capture leaves the stream out of
/// capture mode and no graph behind. The caller owns the result
/// (cudaGraphExecDestroy).
cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void(cudaStream_t)>& record);

class GraphCache {
 public:
  GraphCache() = default;
  ~GraphCache() { clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  /// Launches the graph of `key` on `stream`, capturing `record(stream)` first
  /// if it does not exist yet. Throws CudaError; a failed capture leaves no
  /// graph behind and the stream usable.
  void launch(int key, cudaStream_t stream, const std::function<void(cudaStream_t)>& record);
  /// Captures (if needed) without launching; returns the graph (the cache keeps owning it).
  cudaGraphExec_t ensure(int key, cudaStream_t stream, const std::function<void(cudaStream_t)>& record);
  /// Stores an executable graph made elsewhere (e.g. chosen by
  /// tune_step) under `key`, taking ownership; replaces any graph there.
  void put(int key, cudaGraphExec_t exec);
  void clear();
  size_t size() const { return graphs_.size(); }

 private:
  std::map<int, cudaGraphExec_t> graphs_;
};

}  // namespace swiftspec::cuda
