// Bounded reading of the JSON a checkpoint, a model folder or a placement holds (issue 28).
//
// A fuzzing campaign crashed the loaders with inputs that are valid JSON or valid-looking files:
// a value nested 100,000 arrays deep (nlohmann's parser is iterative, but dump(), copies and
// comparisons recurse once per level: the error message that dumped it overflowed the stack), a
// number past the double range (json::out_of_range, not the json::parse_error the loaders caught),
// a FIFO (open() blocked for ever) and a symlink to /dev/zero (read until memory ran out). Every
// JSON the runtime reads goes through these functions, and the Python package reads its JSON files
// through the same rules (swiftspec_core.read_json_file / check_json).
#pragma once
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace swiftspec {

/// Containers (arrays and objects) nested deeper than this are refused. Checkpoint JSON is at
/// most 4 deep (a tensor-parallel plan's rows inside "tensor_parallel" inside the manifest); HF
/// tokenizer.json files are 5 deep. 64 leaves room for any legitimate file while keeping every
/// recursive operation on a parsed value (dump, copy, ==) far from the stack's limit.
inline constexpr int kMaxJsonDepth = 64;

/// Size caps for whole JSON files, checked before any byte is read. config.json and
/// manifest.json are a few KB; 16 MiB also fits configs that carry large label maps.
inline constexpr size_t kMaxSmallJsonBytes = size_t{16} << 20;
/// tokenizer.json holds a whole vocabulary and its merges (Qwen2.5: 7 MB, Llama 3: 9 MB, Gemma:
/// 34 MB); 256 MiB is far beyond any of them.
inline constexpr size_t kMaxTokenizerJsonBytes = size_t{256} << 20;
/// The safetensors header (JSON) length: the `safetensors` library refuses headers over 100 MB
/// (HeaderTooLarge), so no file it writes or reads is larger.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// The whole content of `path`, read only if it is a regular file of at most `max_bytes`:
/// CheckpointError "<path>: <what> ..." for a missing file, a FIFO, a device, a folder or a
/// larger file, said before anything is read (the file is opened with O_NONBLOCK, so a FIFO
/// swapped in after the check cannot block either, and checked again with fstat).
std::string read_regular_file(const std::string& path, size_t max_bytes, const std::string& what);

/// Checks that `text` is one well-formed JSON value nested at most kMaxJsonDepth deep whose
/// numbers fit a double, without building it. Returns "" if so, else the reason, one line of at
/// most ~200 characters (nlohmann's text without its "[json.exception...]" prefix, its quote of
/// the offending token cut short).
/// `limit` (if given) is set when the problem is one of the limits (depth, number range) rather
/// than the syntax.
std::string json_text_problem(std::string_view text, bool* limit = nullptr);

/// nlohmann::json::parse(text) after json_text_problem(text): a problem becomes
/// CheckpointError(prefix + reason), e.g. prefix "<path>: malformed JSON: ". No exception of
/// nlohmann's escapes.
nlohmann::json parse_json_checked(std::string_view text, const std::string& prefix);

/// read_regular_file(path, max_bytes, what) parsed by parse_json_checked with the prefix
/// "<path>: malformed JSON: ".
nlohmann::json read_json_file(const std::string& path, size_t max_bytes, const std::string& what);

/// j[key] as a string, "" where `j` is not an object or the key is absent or null; a value of
/// another type is CheckpointError "<origin>: field '<key>' must be a string, got <brief>" (where
/// nlohmann's j.value(key, "") threw its own type_error).
std::string optional_string(const nlohmann::json& j, const char* key, const std::string& origin);

/// A JSON value as an error message may quote it: a number, boolean or null as JSON, a string as
/// a JSON string cut to 80 characters, an array or object only by its kind and size ("an array of
/// 3 items"). Never serializes a container: its size and depth come from the input.
std::string json_brief(const nlohmann::json& v);

/// A message fragment cut to at most `max_chars` characters ("..." marks the cut), with control
/// characters (a newline would break the one-line error) shown as '?'.
std::string one_line(std::string_view text, size_t max_chars = 200);

}  // namespace swiftspec
