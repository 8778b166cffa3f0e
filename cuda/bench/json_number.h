// Numbers in the benches' JSON and tables: %.6g (six significant digits, no locale).
#pragma once
#include <cstdio>
#include <string>

namespace swiftspec::cuda {

inline std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

}  // namespace swiftspec::cuda
