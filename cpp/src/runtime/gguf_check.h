// Bounds check of a GGUF file's header, metadata and tensor infos, before the converter hands the
// file to the `gguf` package's reader (issue 28).
//
// That reader trusts every count in the file: past the end of the file its reads return empty
// arrays of 0 bytes, so an array whose item type was changed from STRING to ARRAY (one u32 of
// the file) loops over a count read from string bytes, appending empty parts, and grew ~160 MB/s
// until the machine's memory was gone. check_gguf walks the same structure with every length and
// count checked against the bytes left, so the reader only ever sees a file whose structure lies
// inside it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace swiftspec {

/// Limits beyond the file size, sized from the largest real models (Llama-3.1-405B: 1,138 tensors;
/// Gemma 3: 262,144 vocabulary strings; Llama 3: 280,147 merges): the Python reader keeps a few
/// hundred bytes per tensor, key and string, so these also bound its memory.
inline constexpr uint64_t kMaxGgufTensors = uint64_t{1} << 16;
inline constexpr uint64_t kMaxGgufKeys = uint64_t{1} << 16;
/// Strings and nested arrays in all metadata arrays together.
inline constexpr uint64_t kMaxGgufVariableItems = uint64_t{1} << 22;
/// Arrays of arrays: the format allows them, no model uses them; a few levels suffice.
inline constexpr int kMaxGgufArrayDepth = 4;
/// GGML_MAX_DIMS.
inline constexpr uint32_t kMaxGgufDims = 4;

struct GgufSummary {
  uint32_t version = 0;
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  bool big_endian = false;
  uint64_t tensor_infos_end = 0;  ///< offset just past the last tensor info
};

/// Checks data[0, size) as a GGUF file (version 2 or 3, either byte order, as the `gguf` reader
/// reads them): the magic, the counts, every key, value type, string length and array count
/// (item type known, items inside the file), the tensor infos (name, at most 4 dimensions whose
/// product does not overflow), and general.alignment (a uint32 multiple of 8 when present).
/// Throws CheckpointError "<origin> cannot be parsed as GGUF: <key or tensor> at byte <offset>: ...".
GgufSummary check_gguf(const uint8_t* data, size_t size, const std::string& origin);

/// check_gguf over the file at `path`, memory-mapped; CheckpointError for a file that is missing
/// or not a regular file (a FIFO, a device) before anything is read.
GgufSummary check_gguf_file(const std::string& path);

}  // namespace swiftspec
