// nlohmann::json's exception texts as users read them: without the library's
// "[json.exception.parse_error.101] " prefix, which names its internal error
// kind and number. The rest is kept ("parse error at line 1, column 54: ...").
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace swiftspec {

/// e.what() without the leading "[json.exception.<kind>.<id>] "; the position (line, column)
/// and the reason stay.
inline std::string json_error_text(const nlohmann::json::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const auto end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  return text;
}

}  // namespace swiftspec
