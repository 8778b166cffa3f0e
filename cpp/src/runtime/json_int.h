// Reading a JSON number as an int32 without the conversions nlohmann's
// get<int>() would make silently: 1.5 -> 1, true -> 1, 2^32 + 5 -> 5. The
// callers (config.json, placements) raise their own error kinds.
#pragma once
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

namespace swiftspec {

enum class JsonInt { Ok, NotInteger, OutOfRange };

/// `out` = v if v is an integer within int32; else the reason, `out` untouched. An integral
/// number too large for 64 bits (which the parser keeps as a double: 2^64, 10^30) is out of
/// range, like any other integer beyond int32; other doubles (1.5, 64.0) are not integers.
inline JsonInt read_int32(const nlohmann::json& v, int& out) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) && std::fabs(d) >= 9.2e18 && std::floor(d) == d ? JsonInt::OutOfRange : JsonInt::NotInteger;
  }
  if (!v.is_number_integer()) return JsonInt::NotInteger;
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)
                             : (v.get<int64_t>() > INT32_MAX || v.get<int64_t>() < INT32_MIN))
    return JsonInt::OutOfRange;
  out = v.get<int>();
  return JsonInt::Ok;
}

}  // namespace swiftspec
