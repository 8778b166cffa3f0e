// Error types of the swiftspec runtime.
//
// Every error names what was wrong (a file, a field, a value). The Python
// module maps them to Python exceptions:
//   CheckpointError  -> swiftspec.CheckpointError (a ValueError)
//   InvalidArgument  -> swiftspec.InvalidRequestError (a ValueError)
// Cancellation is not an error: a request cancelled through
// GenerationConfig::cancel_requested or an on_token callback returning false
// ends with finish_reason "cancelled" (generation.h); the Python bindings turn
// a pending SIGINT into KeyboardInterrupt.
#pragma once
#include <charconv>
#include <stdexcept>
#include <string>

namespace swiftspec {

/// Base class of every error the runtime throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The Error every decode path (host arg-max and top-k, the CUDA backend's GPU selection)
/// throws for NaN logits: not the request's fault, and never a silently wrong token.
inline constexpr const char* kNanLogitsMessage =
    "the model produced NaN logits: its weights (or inputs) hold non-finite values; check the checkpoint "
    "(e.g. convert it again)";

/// A number as messages show it: the shortest text that reads back as the same value ("1.0000001",
/// "-1e-300", "nan"), where std::to_string's six decimals showed 1.0000001f as "1.000000" (inside
/// the range the message said it was outside) and -1e-300 as "-0.000000".
template <typename T>
std::string show_number(T x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

/// A checkpoint, config or manifest on disk is missing, truncated or inconsistent.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A request or parameter is out of range (sampling parameters, prompt length, tree budget...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

}  // namespace swiftspec
