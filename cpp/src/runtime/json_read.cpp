// Bounded reading of JSON files and text (json_read.h).
#include "json_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "json_error.h"
#include "swiftspec/error.h"

namespace swiftspec {
namespace {

using json = nlohmann::json;

std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// Walks the text as nlohmann's parser does (same grammar, same number rules) without building
/// anything, counting the depth and keeping the keys of the objects it is inside, so that a
/// problem can name its field; stops at the first error or at kMaxJsonDepth + 1 levels.
struct Checker final : json::json_sax_t {
  std::vector<std::string> keys;  // one per open container ("" for an array)
  std::string problem;
  bool limit = false;  // the problem is a limit (depth, number range), not the syntax

  /// "field 'a.b': " for the keys of the enclosing objects, "" at the top level.
  std::string field() const {
    std::string path;
    for (const std::string& k : keys)
      if (!k.empty()) path += (path.empty() ? "" : ".") + one_line(k, 64);
    return path.empty() ? "" : "field '" + path + "': ";
  }
  bool open() {
    if (keys.size() < static_cast<size_t>(kMaxJsonDepth)) {
      keys.emplace_back();
      return true;
    }
    problem = field() + "arrays and objects nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    limit = true;
    return false;
  }
  bool close() {
    keys.pop_back();
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t& k) override {
    keys.back() = k.empty() ? "\"\"" : k;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) override {
    // A syntax error keeps nlohmann's text (it gives the line and column); a number past the
    // double range (out_of_range.406, which the loaders did not catch) also names its field.
    problem = (e.id == 406 ? field() : "") + one_line(json_error_text(e));
    limit = e.id == 406;
    return false;
  }
};

}  // namespace

std::string one_line(std::string_view text, size_t max_chars) {
  std::string out;
  const bool cut = text.size() > max_chars;
  const std::string_view kept = cut ? text.substr(0, max_chars) : text;
  out.reserve(kept.size() + 3);
  for (char ch : kept) out.push_back(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f ? '?' : ch);
  if (cut) out += "...";
  return out;
}

std::string read_regular_file(const std::string& path, size_t max_bytes, const std::string& what) {
  auto fail = [&](const std::string& why) -> void { throw CheckpointError(path + ": " + why); };
  // stat() first: open() of a FIFO blocks until a writer comes, and a device (a symlink to
  // /dev/zero) is endless.
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) fail("missing " + what);
    fail("cannot read " + what + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) fail(what + " is " + file_kind(st.st_mode) + ", not a regular file");
  auto too_large = [&](uint64_t size) {
    fail(what + " is " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) +
         " bytes such a file may have");
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) too_large(static_cast<uint64_t>(st.st_size));
  // O_NONBLOCK: if a FIFO replaced the file since stat(), open() returns at once and fstat() says so.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("cannot open " + what + ": " + std::strerror(errno));
  std::string text;
  try {
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail(what + " is not a regular file");
    if (static_cast<uint64_t>(st.st_size) > max_bytes) too_large(static_cast<uint64_t>(st.st_size));
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    // Reads what fstat promised, and on to the cap if the file grew meanwhile.
    while (true) {
      if (got == text.size()) {
        if (text.size() > max_bytes) too_large(text.size());
        text.resize(std::min(text.size() + 65536, max_bytes + 1));
      }
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("cannot read " + what + ": " + std::strerror(errno));
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    text.resize(got);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return text;
}

std::string json_text_problem(std::string_view text, bool* limit) {
  Checker checker;
  // sax_parse reads the whole input as one value (trailing non-whitespace is a syntax error) and
  // skips a leading UTF-8 byte order mark, as json::parse does.
  const bool ok = json::sax_parse(text.begin(), text.end(), &checker);
  if (limit) *limit = !ok && checker.limit;
  if (ok) return "";
  return checker.problem.empty() ? "malformed JSON" : checker.problem;
}

nlohmann::json parse_json_checked(std::string_view text, const std::string& prefix) {
  const std::string problem = json_text_problem(text);
  if (!problem.empty()) throw CheckpointError(prefix + problem);
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // not expected once the check passed; never escapes raw
    throw CheckpointError(prefix + one_line(json_error_text(e)));
  }
}

nlohmann::json read_json_file(const std::string& path, size_t max_bytes, const std::string& what) {
  return parse_json_checked(read_regular_file(path, max_bytes, what), path + ": malformed JSON: ");
}

std::string optional_string(const nlohmann::json& j, const char* key, const std::string& origin) {
  if (!j.is_object()) return "";
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_string())
    throw CheckpointError(origin + ": field '" + key + "' must be a string, got " + json_brief(*it));
  return it->get<std::string>();
}

std::string json_brief(const nlohmann::json& v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + (v.size() == 1 ? " item" : " items");
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + (v.size() == 1 ? " key" : " keys");
  if (v.is_binary()) return "binary data";
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    // Cut on a UTF-8 boundary (dump() refuses a string cut inside a character).
    size_t n = s.size() <= 80 ? s.size() : 80;
    while (n < s.size() && n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    return json(s.substr(0, n)).dump() + (n < s.size() ? "..." : "");
  }
  return v.dump();  // a number, boolean or null: a few characters
}

}  // namespace swiftspec
