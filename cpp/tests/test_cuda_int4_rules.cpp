// The rules of int4 checkpoints on the CUDA backend (issue 31) that need no GPU:
//  - cuda_projection_bytes (swiftspec/memory_plan.h), by which the CUDA memory plan counts every
//    projection: 2 n k for bf16, n k / 2 + 4 n k / G in the int4 GEMM's layout, at the real
//    models' projection shapes; a group size not dividing K refused;
//  - int4_backend_problem (swiftspec/model.h), which every loader asks before loading an int4
//    checkpoint: the cuda backend refuses the decode megakernel and tensor parallelism, naming
//    the field first; the cpu backend refuses nothing.
// (Test names end in "for_int4": the filter "int4_" of tests/test_int4_checkpoint.py selects the
// CPU kernel units only.)
#include <cstdint>
#include <string>

#include "swiftspec/error.h"
#include "swiftspec/memory_plan.h"
#include "swiftspec/model.h"
#include "test_framework.h"

namespace swiftspec::test {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

SWIFTSPEC_TEST(cuda_projection_bytes_for_int4) {
  // bf16: two bytes a weight (Qwen2.5-1.5B's down projection, 1536 x 8960)
  CHECK_EQ(cuda_projection_bytes(1536, 8960, 0), uint64_t(27525120));
  // int4, G = 128: 1536 * 8960 / 2 packed bytes + 4 bytes for each of 1536 * 70 groups
  CHECK_EQ(cuda_projection_bytes(1536, 8960, 128), uint64_t(6881280 + 430080));
  // int4, G = 32 (the GGUF route's group size): the 1.5B fused QKV (2048 x 1536) and gate/up (17920 x 1536)
  CHECK_EQ(cuda_projection_bytes(2048, 1536, 32), uint64_t(1572864 + 393216));
  CHECK_EQ(cuda_projection_bytes(17920, 1536, 32), uint64_t(13762560 + 3440640));
  // the 0.5B o_proj (896 x 896) at G = 128: K / G = 7 groups a row
  CHECK_EQ(cuda_projection_bytes(896, 896, 128), uint64_t(401408 + 25088));
  // int4 at G = 32: (1/2 + 4/32) / 2 = 5/16 of bf16's bytes
  CHECK_EQ(cuda_projection_bytes(4096, 4096, 32) * 16, cuda_projection_bytes(4096, 4096, 0) * 5);
  bool refused = false;
  try {
    cuda_projection_bytes(896, 896, 256);
  } catch (const InvalidArgument& e) {
    refused = std::string(e.what()).find("group size 256 does not divide K = 896") != std::string::npos;
  }
  CHECK(refused);
}

SWIFTSPEC_TEST(backend_problems_for_int4) {
  CHECK_EQ(int4_backend_problem("cpu", true, 4), std::string());
  CHECK_EQ(int4_backend_problem("cuda", false, 1), std::string());
  const std::string mk = int4_backend_problem("cuda", true, 1);
  CHECK(starts_with(mk,
                    "megakernel: int4 weights run on the cuda backend's layered step; the decode megakernel "
                    "streams bf16 weights (issue 31): drop megakernel, or use bfloat16 weights"));
  // the megakernel is named first when both are asked for (the loaders refuse one field at a time)
  CHECK(starts_with(int4_backend_problem("cuda", true, 2), "megakernel: "));
  const std::string tp = int4_backend_problem("cuda", false, 2);
  CHECK(starts_with(tp,
                    "tp 2: int4 weights run on one GPU on the cuda backend; the tensor-parallel GEMMs read bf16 "
                    "weights (issue 31): use tp 1, bfloat16 weights, or the cpu backend"));
}

}  // namespace swiftspec::test
