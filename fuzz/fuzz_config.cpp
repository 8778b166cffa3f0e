// config.json: ModelConfig::from_json_text (issue 28 items 1, 4, 8, 9: deep nesting, numbers past
// the double range, sizes whose products overflow, rope_scaling values).
#include <string>

#include "fuzz_common.h"
#include "swiftspec/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    swiftspec::ModelConfig::from_json_text(std::string(reinterpret_cast<const char*>(data), size), "config.json");
  } catch (const swiftspec::Error& e) {
    fuzz::check_message(e);
  }
  return 0;
}
