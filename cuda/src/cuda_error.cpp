#include <string>

#include "common.h"

namespace swiftspec::cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw CudaError(std::string("CUDA error in ") + what + " at " + file + ":" + std::to_string(line) + ": " +
                  cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace swiftspec::cuda
