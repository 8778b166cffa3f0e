#include "graph_cache.h"

#include "common.h"

namespace swiftspec::cuda {

cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void(cudaStream_t)>& record) {
  SS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    record(stream);
  } catch (...) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream, &g);  // leave capture mode whatever happened
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  SS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) throw_cuda_error(err, "cudaGraphInstantiateWithFlags", __FILE__, __LINE__);
  return exec;
}

cudaGraphExec_t GraphCache::ensure(int key, cudaStream_t stream, const std::function<void(cudaStream_t)>& record) {
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second;
  const cudaGraphExec_t exec = capture_graph(stream, record);
  graphs_[key] = exec;
  return exec;
}

void GraphCache::launch(int key, cudaStream_t stream, const std::function<void(cudaStream_t)>& record) {
  SS_CUDA_CHECK(cudaGraphLaunch(ensure(key, stream, record), stream));
}

void GraphCache::put(int key, cudaGraphExec_t exec) {
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    cudaGraphExecDestroy(it->second);
    it->second = exec;
  } else {
    graphs_[key] = exec;
  }
}

void GraphCache::clear() {
  for (auto& kv : graphs_) cudaGraphExecDestroy(kv.second);
  graphs_.clear();
}

}  // namespace swiftspec::cuda
