// Shared by the libFuzzer targets (fuzz/README.md). Each target feeds its input to one of the
// runtime's parsers and accepts exactly one outcome besides success: swiftspec::Error (a
// CheckpointError or InvalidArgument naming the file and field). Any other exception escapes and
// libFuzzer reports it as a crash (deadly signal), as it does ASan / UBSan findings, a timeout
// (-timeout) or memory beyond -rss_limit_mb / -malloc_limit_mb.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "swiftspec/error.h"

namespace fuzz {

/// The message must be one line: the runtime's errors are printed as such by the CLI.
inline void check_message(const swiftspec::Error& e) {
  const std::string m = e.what();
  if (m.empty() || m.find('\n') != std::string::npos) {
    std::fprintf(stderr, "error message is empty or spans lines: %s\n", m.c_str());
    std::abort();
  }
}

/// An anonymous in-memory regular file holding `data`, as "/proc/self/fd/N": the loaders take
/// paths, and this gives them one without touching the disk. Reused across inputs.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(memfd_create(name, MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace fuzz
