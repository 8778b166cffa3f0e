// A safetensors file: SafetensorsFile (the 8-byte header length, the JSON header, every tensor's
// dtype, shape and data_offsets against the file), through the same path the loader opens.
#include "fuzz_common.h"
#include "swiftspec/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file("model.safetensors");
  const std::string& path = file.write(data, size);
  try {
    swiftspec::SafetensorsFile f(path);
    // Touch every view the loader would read: an offset or size the check let through would be
    // an out-of-bounds read here, which ASan reports.
    uint64_t sum = 0;
    for (const auto& [name, view] : f.tensors()) {
      const auto* p = static_cast<const uint8_t*>(view.data);
      if (view.nbytes) sum += p[0] + p[view.nbytes - 1];
      if (static_cast<uint64_t>(view.numel()) * swiftspec::dtype_size(view.dtype) != view.nbytes) std::abort();
    }
    static volatile uint64_t sink;
    sink = sum;
  } catch (const swiftspec::Error& e) {
    fuzz::check_message(e);
  }
  return 0;
}
