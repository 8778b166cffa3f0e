// GGUF structure check (gguf_check.h). Layout (GGUF v2/v3, llama.cpp's docs/gguf.md):
//   "GGUF" | version u32 | tensor_count u64 | kv_count u64
//   kv_count x { key: string | value_type u32 | value }
//   tensor_count x { name: string | n_dims u32 | dims u64[n_dims] | ggml_type u32 | offset u64 }
//   padding to general.alignment (32 by default) | tensor data
// where a string is a u64 length and that many bytes, and an array value is an item type u32, a
// u64 count and the items.
#include "gguf_check.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "json_read.h"
#include "swiftspec/error.h"

namespace swiftspec {
namespace {

enum : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

/// Bytes of a fixed-size value type, 0 for string, array and unknown types.
uint64_t fixed_size(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

class Walker {
 public:
  Walker(const uint8_t* data, size_t size, const std::string& origin) : p_(data), size_(size), origin_(origin) {}

  GgufSummary run() {
    GgufSummary s;
    if (size_ < 4 || std::memcmp(p_, "GGUF", 4) != 0) fail("not a GGUF file (the first 4 bytes are not \"GGUF\")");
    at_ = 4;
    uint32_t version = raw_u32("version");
    // As the gguf reader decides the byte order: a version with its low 16 bits zero was written
    // on a big-endian machine.
    if ((version & 0xFFFFu) == 0) {
      swap_ = true;
      version = __builtin_bswap32(version);
    }
    s.big_endian = swap_;
    if (version != 2 && version != 3)
      fail("unsupported GGUF version " + std::to_string(version) + " (this reader takes 2 and 3)");
    s.version = version;
    s.tensor_count = u64("tensor count");
    s.kv_count = u64("metadata key count");
    if (s.tensor_count > kMaxGgufTensors)
      fail("tensor count " + std::to_string(s.tensor_count) + " exceeds " + std::to_string(kMaxGgufTensors));
    if (s.kv_count > kMaxGgufKeys)
      fail("metadata key count " + std::to_string(s.kv_count) + " exceeds " + std::to_string(kMaxGgufKeys));
    for (uint64_t i = 0; i < s.kv_count; ++i) {
      const size_t key_at = at_;
      key_ = "#" + std::to_string(i);  // until its name is read
      key_ = string("metadata key " + std::to_string(i), 65535);
      if (key_.empty()) fail_at(key_at, "metadata key " + std::to_string(i) + " is empty");
      const uint32_t type = u32("value type");
      const size_t value_at = at_;
      value(type, 0);
      if (key_ == "general.alignment") {
        if (type != kU32) fail_at(value_at, "value must be a uint32");
        const uint32_t align = read32(value_at);
        if (align == 0 || align % 8 != 0)
          fail_at(value_at, "alignment " + std::to_string(align) + " is not a multiple of 8");
      }
    }
    key_.clear();
    for (uint64_t i = 0; i < s.tensor_count; ++i) {
      tensor_ = "#" + std::to_string(i);  // until its name is read
      tensor_ = string("tensor " + std::to_string(i) + " name", 65535);
      const uint32_t dims = u32("dimension count");
      if (dims > kMaxGgufDims)
        fail("dimension count " + std::to_string(dims) + " exceeds " + std::to_string(kMaxGgufDims));
      uint64_t elements = 1;
      for (uint32_t d = 0; d < dims; ++d) {
        const uint64_t n = u64("dimension");
        if (n != 0 && elements > (uint64_t{1} << 62) / n) fail("dimensions overflow 2^62 elements");
        elements *= n;
      }
      u32("ggml type");
      u64("data offset");
    }
    s.tensor_infos_end = at_;
    return s;
  }

 private:
  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    std::string where;
    if (!key_.empty())
      where = "metadata key " + one_line(key_, 80) + " ";
    else if (!tensor_.empty())
      where = "tensor " + one_line(tensor_, 80) + " ";
    // "cannot be parsed as GGUF": the converter's words for a file the gguf reader fails on.
    throw CheckpointError(origin_ + " cannot be parsed as GGUF: " + where + "at byte " + std::to_string(at) + ": " +
                          what);
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(at_, what); }

  void need(uint64_t n, const std::string& what) {
    if (n > size_ - at_)
      fail(what + " needs " + std::to_string(n) + " bytes, " + std::to_string(size_ - at_) + " are left in the file");
  }
  uint32_t read32(size_t at) const {
    uint32_t v;
    std::memcpy(&v, p_ + at, 4);
    return swap_ ? __builtin_bswap32(v) : v;
  }
  uint32_t raw_u32(const std::string& what) {
    need(4, what);
    uint32_t v;
    std::memcpy(&v, p_ + at_, 4);
    at_ += 4;
    return v;
  }
  uint32_t u32(const std::string& what) {
    need(4, what);
    const uint32_t v = read32(at_);
    at_ += 4;
    return v;
  }
  uint64_t u64(const std::string& what) {
    need(8, what);
    uint64_t v;
    std::memcpy(&v, p_ + at_, 8);
    at_ += 8;
    return swap_ ? __builtin_bswap64(v) : v;
  }
  std::string string(const std::string& what, uint64_t max_len) {
    const uint64_t n = u64(what + " length");
    if (n > max_len) fail(what + " length " + std::to_string(n) + " exceeds " + std::to_string(max_len));
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_ + at_), n);
    at_ += n;
    return s;
  }
  void skip_string(const std::string& what) {
    const uint64_t n = u64(what + " length");
    need(n, what);
    at_ += n;
  }

  void value(uint32_t type, int depth) {
    if (const uint64_t n = fixed_size(type)) {
      need(n, "value");
      at_ += n;
      return;
    }
    if (type == kString) {
      skip_string("string");
      return;
    }
    if (type != kArray) fail("unknown value type " + std::to_string(type));
    if (depth >= kMaxGgufArrayDepth)
      fail("arrays nested deeper than " + std::to_string(kMaxGgufArrayDepth) + " levels");
    const uint32_t item = u32("array item type");
    const uint64_t count = u64("array length");
    if (const uint64_t n = fixed_size(item)) {
      if (count > (size_ - at_) / n)
        fail("array of " + std::to_string(count) + " items of " + std::to_string(n) + (n == 1 ? " byte" : " bytes") +
             " needs more than the " + std::to_string(size_ - at_) + " bytes left in the file");
      at_ += count * n;
      return;
    }
    if (item != kString && item != kArray) fail("unknown array item type " + std::to_string(item));
    // Each string takes at least its 8-byte length, each array its 12-byte type and count.
    const uint64_t least = item == kString ? 8 : 12;
    if (count > (size_ - at_) / least)
      fail("array of " + std::to_string(count) + (item == kString ? " strings" : " arrays") + " needs more than the " +
           std::to_string(size_ - at_) + " bytes left in the file");
    variable_items_ += count;
    if (variable_items_ > kMaxGgufVariableItems)
      fail("more than " + std::to_string(kMaxGgufVariableItems) + " strings and arrays inside metadata arrays");
    for (uint64_t i = 0; i < count; ++i) value(item, depth + 1);
  }

  const uint8_t* p_;
  size_t size_;
  size_t at_ = 0;
  bool swap_ = false;
  uint64_t variable_items_ = 0;
  const std::string& origin_;
  std::string key_, tensor_;
};

}  // namespace

GgufSummary check_gguf(const uint8_t* data, size_t size, const std::string& origin) {
  return Walker(data, size, origin).run();
}

GgufSummary check_gguf_file(const std::string& path) {
  // O_NONBLOCK and fstat: a FIFO is refused instead of blocking open() (see read_regular_file).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw CheckpointError(path + ": cannot open GGUF file: " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw CheckpointError(path + ": GGUF file is not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return check_gguf(nullptr, 0, path);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw CheckpointError(path + ": cannot map GGUF file: " + std::strerror(errno));
  try {
    const GgufSummary s = check_gguf(static_cast<const uint8_t*>(map), size, path);
    ::munmap(map, size);
    return s;
  } catch (...) {
    ::munmap(map, size);
    throw;
  }
}

}  // namespace swiftspec
