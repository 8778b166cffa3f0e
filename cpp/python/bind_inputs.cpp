#include "python/bind_inputs.h"

#include <nanobind/stl/string.h>

#include <string>
#include <string_view>

#include "src/runtime/gguf_check.h"
#include "src/runtime/json_read.h"
#include "swiftspec/error.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace swiftspec::python {

void bind_inputs(nb::module_& m) {
  nb::dict limits;
  limits["max_depth"] = kMaxJsonDepth;
  limits["max_small_json_bytes"] = kMaxSmallJsonBytes;
  limits["max_tokenizer_json_bytes"] = kMaxTokenizerJsonBytes;
  limits["max_safetensors_header_bytes"] = kMaxSafetensorsHeaderBytes;
  m.attr("JSON_LIMITS") = limits;

  m.def(
      "read_file_bytes",
      [](const std::string& path, size_t max_bytes, const std::string& what) {
        std::string data;
        {
          nb::gil_scoped_release release;
          data = read_regular_file(path, max_bytes, what);
        }
        return nb::bytes(data.data(), data.size());
      },
      "path"_a, "max_bytes"_a, "what"_a,
      "The bytes of `path`, read as the runtime reads its own files (json_read.h): CheckpointError\n"
      "'<path>: ...' for a missing file, one that is not a regular file (a FIFO, a device, a folder) or\n"
      "one over max_bytes, each said before anything is read.");

  m.def(
      "json_text_problem",
      [](nb::bytes text) {
        std::string_view view(static_cast<const char*>(text.data()), text.size());
        bool limit = false;
        std::string problem;
        {
          nb::gil_scoped_release release;
          problem = json_text_problem(view, &limit);
        }
        // The reason may quote bytes of the text that are not UTF-8 (nlohmann's "last read: ..."):
        // escaped, as the runtime's error messages are, never a UnicodeDecodeError.
        nb::object reason = nb::steal(
            PyUnicode_DecodeUTF8(problem.data(), static_cast<Py_ssize_t>(problem.size()), "backslashreplace"));
        if (!reason.is_valid()) throw nb::python_error();
        return nb::make_tuple(reason, limit);
      },
      "text"_a,
      "('', False) if the UTF-8 bytes `text` are one well-formed JSON value within the runtime's\n"
      "limits, else (the reason in one line, whether it is a limit: nesting deeper than\n"
      "JSON_LIMITS['max_depth'] or a number past the double range, rather than the syntax).");

  m.def(
      "check_gguf_file",
      [](const std::string& path) {
        GgufSummary s;
        {
          nb::gil_scoped_release release;
          s = check_gguf_file(path);
        }
        nb::dict d;
        d["version"] = s.version;
        d["tensor_count"] = s.tensor_count;
        d["kv_count"] = s.kv_count;
        d["big_endian"] = s.big_endian;
        return d;
      },
      "path"_a,
      "Checks the GGUF file `path` before a reader trusts its counts (gguf_check.h): every string\n"
      "length, array count and item type, and the tensor infos, lie inside the file and within the\n"
      "limits; CheckpointError '<path> cannot be parsed as GGUF: <key or tensor> at byte N: ...'.\n"
      "Returns {'version', 'tensor_count', 'kv_count', 'big_endian'}.");
}

}  // namespace swiftspec::python
