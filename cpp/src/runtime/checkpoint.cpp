// Memory-mapped safetensors files and checkpoint folders, validated field by field.
#include "swiftspec/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "swiftspec/error.h"
#include "json_error.h"
#include "json_int.h"
#include "json_read.h"

namespace swiftspec {

namespace fs = std::filesystem;
using json = nlohmann::json;

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::I8:
    case DType::U8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I8:
      return "I8";
    case DType::U8:
      return "U8";
  }
  return "?";
}

static bool parse_dtype(const std::string& s, DType& out) {
  static const std::pair<const char*, DType> table[] = {{"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16},
                                                        {"I32", DType::I32}, {"I8", DType::I8},     {"U8", DType::U8}};
  for (const auto& [name, dt] : table)
    if (s == name) {
      out = dt;
      return true;
    }
  return false;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

static std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// A header's shape for a message: as written when it is a few integers, else by its size only.
static std::string shape_text(const json& shape) {
  if (shape.size() <= 8 && std::all_of(shape.begin(), shape.end(), [](const json& d) { return d.is_number_integer(); }))
    return shape.dump();  // flat: dump() does not recurse
  return json_brief(shape);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) -> void { throw CheckpointError(path + ": " + what); };

  // O_NONBLOCK: open() of a FIFO would block until a writer came (Engine hung for ever on a
  // model.safetensors FIFO); with it, open() returns and fstat() refuses anything not a regular
  // file (a FIFO, a device such as /dev/zero behind a symlink, a folder).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(std::string("cannot open safetensors file: ") + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("not a regular file");
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    fail("truncated: " + std::to_string(map_size_) + " bytes, shorter than the 8-byte header length");
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(std::string("mmap failed: ") + std::strerror(errno));
  }

  // From here on a throw must unmap: do the parsing in a lambda and clean up on error.
  try {
    const auto* base = static_cast<const uint8_t*>(map_);
    uint64_t header_len = 0;
    std::memcpy(&header_len, base, 8);  // little-endian on every platform we build for
    if (header_len > map_size_ - 8)
      fail("truncated or corrupt header: header length " + std::to_string(header_len) + " exceeds the file size " +
           std::to_string(map_size_));
    if (header_len > kMaxSafetensorsHeaderBytes)
      fail("corrupt header: header length " + std::to_string(header_len) + " exceeds the " +
           std::to_string(kMaxSafetensorsHeaderBytes) + " bytes the safetensors format allows");
    const size_t data_start = 8 + header_len;
    const size_t data_size = map_size_ - data_start;

    const json header = parse_json_checked(std::string_view(reinterpret_cast<const char*>(base + 8), header_len),
                                           path + ": corrupt safetensors header (malformed JSON): ");
    if (!header.is_object()) fail("corrupt safetensors header: not a JSON object");

    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      if (name == "__metadata__") {
        if (!it->is_object()) fail("__metadata__ must be an object");
        for (auto m = it->begin(); m != it->end(); ++m)
          if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
        continue;
      }
      const json& t = *it;
      // The name comes from the file: a control character (a JSON "\n") would split the message.
      const std::string where = "tensor '" + one_line(name) + "': ";
      if (!t.is_object()) fail(where + "entry is not an object");
      if (!t.contains("dtype") || !t["dtype"].is_string()) fail(where + "missing field 'dtype'");
      if (!t.contains("shape") || !t["shape"].is_array()) fail(where + "missing field 'shape'");
      if (!t.contains("data_offsets") || !t["data_offsets"].is_array() || t["data_offsets"].size() != 2)
        fail(where + "field 'data_offsets' must be [begin, end]");

      TensorView v;
      v.name = name;
      std::string dt = t["dtype"].get<std::string>();
      if (!parse_dtype(dt, v.dtype)) fail(where + "unsupported dtype '" + one_line(dt, 80) + "'");
      // The element count must not overflow: shape [2^62, 4] of F32 made 2^64 bytes, wrapped to 0, and
      // passed the byte-size check below with empty data_offsets.
      uint64_t elements = 1;
      for (const auto& d : t["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(where + "shape entries must be integers >= 0");
        const uint64_t n = static_cast<uint64_t>(d.get<int64_t>());
        if (n != 0 && elements > (uint64_t{1} << 62) / n)
          fail(where + "shape " + shape_text(t["shape"]) + " is too large");
        elements *= n;
        v.shape.push_back(d.get<int64_t>());
      }
      const auto& off = t["data_offsets"];
      if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        fail(where + "data_offsets must be non-negative integers");
      uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
      if (begin > end) fail(where + "data_offsets begin > end");
      if (end > data_size)
        fail(where + "data_offsets end " + std::to_string(end) + " lies past the data section (" +
             std::to_string(data_size) + " bytes): file truncated?");
      const uint64_t expected = static_cast<uint64_t>(v.numel()) * dtype_size(v.dtype);
      if (end - begin != expected)
        fail(where + "byte size " + std::to_string(end - begin) + " does not match shape " + shape_str(v.shape) +
             " x " + dt + " = " + std::to_string(expected) + " bytes");
      v.data = base + data_start + begin;
      v.nbytes = end - begin;
      ranges.emplace_back(begin, end);
      tensors_.emplace(name, std::move(v));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second) fail("corrupt header: tensor data ranges overlap");
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

// The dtype every tensor of an int4 checkpoint must have, by the suffix of its name
// (docs/checkpoint_format.md, "int4 weights"): packed values and zero points are U8,
// scales F16, every other tensor (embedding, norms, biases, LM head) BF16.
static DType int4_format_dtype(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  if (ends_with(".qweight") || ends_with(".zeros")) return DType::U8;
  if (ends_with(".scales")) return DType::F16;
  return DType::BF16;
}

// manifest["quantization"] of a format_version 3 folder: {"bits": 4, "group_size": G, ...}.
static WeightQuantization parse_quantization(const json& manifest, const std::string& path) {
  if (!manifest.contains("quantization") || !manifest["quantization"].is_object())
    throw CheckpointError(path + ": an int4 checkpoint (format_version 3) needs the object 'quantization'");
  const json& q = manifest["quantization"];
  auto integer = [&](const char* key) {
    if (!q.contains(key) || !q[key].is_number_integer())
      throw CheckpointError(path + ": missing integer field 'quantization." + key + "'");
    const int64_t v = q[key].get<int64_t>();
    if (v < 0 || v > (1 << 20))
      throw CheckpointError(path + ": field 'quantization." + key + "' is " + std::to_string(v) + ", out of range");
    return static_cast<int>(v);
  };
  WeightQuantization out;
  out.bits = integer("bits");
  if (out.bits != 4)
    throw CheckpointError(path + ": field 'quantization.bits' is " + std::to_string(out.bits) +
                          "; this build reads 4-bit weights only");
  out.group_size = integer("group_size");
  if (out.group_size < 8 || out.group_size % 8 != 0)
    throw CheckpointError(path + ": field 'quantization.group_size' is " + std::to_string(out.group_size) +
                          "; it must be a positive multiple of 8");
  if (manifest.contains("tp_degree") &&
      !(manifest["tp_degree"].is_number_integer() && manifest["tp_degree"].get<int64_t>() == 1))
    throw CheckpointError(path + ": field 'tp_degree' must be 1 in an int4 checkpoint (int4 folders are not sharded)");
  return out;
}

std::shared_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  if (!fs::exists(dir)) throw CheckpointError(dir + ": checkpoint folder does not exist");
  if (!fs::is_directory(dir))
    throw CheckpointError(dir +
                          ": not a checkpoint folder (convert a GGUF or HF model first: "
                          "tools/convert_weights.py)");
  auto ckpt = std::shared_ptr<Checkpoint>(new Checkpoint());
  ckpt->dir_ = dir;

  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  const json manifest = read_json_file(manifest_path, kMaxSmallJsonBytes, "manifest");
  if (!manifest.is_object() || optional_string(manifest, "format", manifest_path) != "swiftspec-checkpoint")
    throw CheckpointError(manifest_path + ": field 'format' must be \"swiftspec-checkpoint\"");
  if (!manifest.contains("format_version") || !manifest["format_version"].is_number_integer())
    throw CheckpointError(manifest_path + ": missing integer field 'format_version'");
  // read_int32, not get<int>(): format_version 2^32 + 1 was read as 1 and the folder loaded.
  if (read_int32(manifest["format_version"], ckpt->format_version_) != JsonInt::Ok)
    throw CheckpointError(manifest_path + ": unsupported format_version " + json_brief(manifest["format_version"]) +
                          " (this build reads 1, 2 and 3)");
  if (ckpt->format_version_ == 2)
    throw CheckpointError(manifest_path +
                          ": format_version 2 is a tensor-parallel folder; load it with a placement "
                          "whose group has \"tp\" equal to its tp_degree");
  if (ckpt->format_version_ != 1 && ckpt->format_version_ != 3)
    throw CheckpointError(manifest_path + ": unsupported format_version " + std::to_string(ckpt->format_version_) +
                          " (this build reads 1, 2 and 3)");
  const std::string dtype = optional_string(manifest, "dtype", manifest_path);
  if (ckpt->format_version_ == 3) {
    if (dtype != "int4")
      throw CheckpointError(manifest_path +
                            ": format_version 3 is the int4 format; field 'dtype' must be \"int4\", got " +
                            json_brief(dtype));
    ckpt->dtype_ = DType::BF16;
    ckpt->quantization_ = parse_quantization(manifest, manifest_path);
  } else if (dtype == "float32") {
    ckpt->dtype_ = DType::F32;
  } else if (dtype == "bfloat16") {
    ckpt->dtype_ = DType::BF16;
  } else if (dtype == "int4") {
    throw CheckpointError(manifest_path +
                          ": field 'dtype' is \"int4\" but format_version is 1; int4 checkpoints have "
                          "format_version 3");
  } else {
    throw CheckpointError(manifest_path + ": field 'dtype' must be \"float32\" or \"bfloat16\", got " +
                          json_brief(dtype));
  }
  if (!manifest.contains("files") || !manifest["files"].is_array() || manifest["files"].empty())
    throw CheckpointError(manifest_path + ": field 'files' must list the safetensors files");

  ckpt->config_ = ModelConfig::from_json_file((fs::path(dir) / "config.json").string());

  for (const auto& f : manifest["files"]) {
    if (!f.is_string()) throw CheckpointError(manifest_path + ": field 'files' must hold file names");
    const std::string file = f.get<std::string>();
    // A control character in the name (a JSON "\n") would also split every message naming the
    // file's path in two.
    const bool control = std::any_of(file.begin(), file.end(),
                                     [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; });
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos || control)
      throw CheckpointError(manifest_path + ": file name " + json_brief(file) +
                            " must be a plain name inside the folder");
    ckpt->files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / file).string()));
    for (const auto& [name, view] : ckpt->files_.back()->tensors()) {
      if (ckpt->index_.count(name))
        throw CheckpointError(dir + ": tensor '" + one_line(name) + "' appears in more than one file");
      const DType want = ckpt->quantization_.int4() ? int4_format_dtype(name) : ckpt->dtype_;
      if (view.dtype != want)
        throw CheckpointError(ckpt->files_.back()->path() + ": tensor '" + one_line(name) + "' has dtype " +
                              dtype_name(view.dtype) + " but the manifest (dtype \"" + dtype + "\") says " +
                              dtype_name(want));
      ckpt->index_[name] = &view;
      ckpt->file_index_[name] = ckpt->files_.back().get();
    }
  }
  // Tensors of layers the config does not have: a config with fewer layers
  // than the weights would run a truncated model, silently wrong.
  static const std::string kLayers = "model.layers.";
  for (const auto& [name, view] : ckpt->index_) {
    if (name.compare(0, kLayers.size(), kLayers) != 0) continue;
    const size_t dot = name.find('.', kLayers.size());
    const std::string num =
        name.substr(kLayers.size(), dot == std::string::npos ? std::string::npos : dot - kLayers.size());
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos || num.size() > 9) continue;
    if (std::stoi(num) >= ckpt->config_.num_layers)
      throw CheckpointError(dir + ": tensor '" + one_line(name) + "' belongs to layer " + num +
                            ", but config.json says " + "num_hidden_layers = " +
                            std::to_string(ckpt->config_.num_layers) + " (the config does not match the weights)");
  }
  check_sizes_against_tensors(*ckpt);
  return ckpt;
}

void check_sizes_against_tensors(const Checkpoint& ckpt) {
  const ModelConfig& c = ckpt.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const int64_t q_rows = int64_t{c.num_heads} * c.head_dim, kv_rows = int64_t{c.num_kv_heads} * c.head_dim;
  auto expect = [&](const std::string& name, const std::vector<int64_t>& shape, const std::string& fields) {
    if (!ckpt.has(name)) throw CheckpointError(ckpt.dir() + ": missing tensor '" + name + "'" + fields);
    const TensorView& t = ckpt.tensor(name);
    if (t.shape != shape)
      throw CheckpointError(ckpt.file_of(name) + ": tensor '" + name + "' has shape " + shape_str(t.shape) +
                            ", expected " + shape_str(shape) + " from config.json" + fields);
  };
  expect("model.embed_tokens.weight", {V, H}, " (vocab_size, hidden_size)");
  // A projection's rows and input columns, as float weights or as int4's packed ones.
  auto projection = [&](const std::string& prefix, int64_t n, int64_t k, const char* fields) {
    if (ckpt.quantization().int4() && ckpt.has(prefix + ".qweight"))
      expect(prefix + ".qweight", {n, k / 2}, std::string(" (") + fields + ", hidden_size / 2)");
    else
      expect(prefix + ".weight", {n, k}, std::string(" (") + fields + ", hidden_size)");
  };
  projection("model.layers.0.self_attn.q_proj", q_rows, H, "num_attention_heads * head_dim");
  projection("model.layers.0.self_attn.k_proj", kv_rows, H, "num_key_value_heads * head_dim");
  projection("model.layers.0.mlp.gate_proj", I, H, "intermediate_size");
  expect("model.layers." + std::to_string(c.num_layers - 1) + ".input_layernorm.weight", {H},
         " (config.json says num_hidden_layers = " + std::to_string(c.num_layers) + ")");
}

bool Checkpoint::has(const std::string& name) const { return index_.count(name) != 0; }

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = file_index_.find(name);
  return it == file_index_.end() ? dir_ : it->second->path();
}

const TensorView& Checkpoint::tensor(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw CheckpointError(dir_ + ": missing tensor '" + name + "'");
  const TensorView& v = *it->second;
  if (!expected_shape.empty() && v.shape != expected_shape)
    throw CheckpointError(dir_ + ": tensor '" + name + "' has shape " + shape_str(v.shape) + ", expected " +
                          shape_str(expected_shape) + " from config.json");
  return v;
}

}  // namespace swiftspec
