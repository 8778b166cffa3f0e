// A GGUF file: check_gguf, the bounds check the converter runs before the `gguf` reader trusts the
// file's counts (issue 28 item 6).
#include "fuzz_common.h"
#include "src/runtime/gguf_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const swiftspec::GgufSummary s = swiftspec::check_gguf(data, size, "model.gguf");
    if (s.tensor_infos_end > size) std::abort();  // the walk stayed inside the input
  } catch (const swiftspec::Error& e) {
    fuzz::check_message(e);
  }
  return 0;
}
