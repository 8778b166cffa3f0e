// Checkpoint loading: a swiftspec checkpoint folder holds
//   manifest.json      {"format": "swiftspec-checkpoint", "format_version": 1 (float weights) or 3
//                       (int4 projections), "dtype": ..., "files": [...]}
//   config.json        model configuration (see config.h)
//   tokenizer.json     HF tokenizers file (used by Python only)
//   *.safetensors      weights, HF tensor names (model.layers.N.self_attn.q_proj.weight, ...)
// Safetensors files are memory-mapped; every header field is validated
// against the file (dtype, shape, offsets, sizes) before any tensor is used.
// Layout reference: docs/checkpoint_format.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "swiftspec/config.h"

namespace swiftspec {

enum class DType { F32, BF16, F16, I32, I8, U8 };

/// Bytes per element of `dt`.
size_t dtype_size(DType dt);
/// The safetensors name of `dt` ("F32", "BF16", ...).
const char* dtype_name(DType dt);

/// A read-only view of one tensor inside a mapped file. Row-major, contiguous.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  ///< points into the mapping; not necessarily aligned
  size_t nbytes = 0;

  int64_t numel() const;
};

/// One memory-mapped .safetensors file with a validated header.
class SafetensorsFile {
 public:
  /// Maps `path` and validates the header. Throws CheckpointError naming the
  /// file and, where it applies, the tensor and field (missing file, file
  /// shorter than its header says, malformed JSON, unknown dtype, shape whose
  /// byte size disagrees with its offsets, overlapping or out-of-range offsets).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// How a checkpoint's linear projections are quantized (format_version 3,
/// docs/checkpoint_format.md "int4 weights"). bits == 0: not quantized.
struct WeightQuantization {
  int bits = 0;        ///< 4 for int4 (AWQ-style W4A16), 0 for float weights
  int group_size = 0;  ///< input features (K) per scale / zero point; a multiple of 8
  bool int4() const { return bits == 4; }
};

/// A checkpoint folder: config + manifest + one or more safetensors files.
class Checkpoint {
 public:
  /// Opens the folder `dir`. Throws CheckpointError naming the folder/file/field.
  static std::shared_ptr<Checkpoint> open(const std::string& dir);
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  /// Float weight dtype stored in the files ("float32" or "bfloat16" in the manifest).
  /// For an int4 checkpoint (manifest dtype "int4") this is BF16, the dtype of every
  /// tensor that is not quantized (embedding, norms, biases, LM head); quantization()
  /// says how the projections are stored.
  DType dtype() const { return dtype_; }
  /// Int4 projections (format_version 3) or none (bits == 0).
  const WeightQuantization& quantization() const { return quantization_; }
  int format_version() const { return format_version_; }

  bool has(const std::string& name) const;
  /// The tensor `name`; throws CheckpointError if it is missing, or if its
  /// shape differs from `expected_shape` (when given), naming both shapes.
  const TensorView& tensor(const std::string& name, const std::vector<int64_t>& expected_shape = {}) const;
  /// Path of the safetensors file holding tensor `name` (the folder if it is missing),
  /// for error messages.
  std::string file_of(const std::string& name) const;

 private:
  Checkpoint() = default;
  std::string dir_;
  ModelConfig config_;
  DType dtype_ = DType::F32;
  WeightQuantization quantization_;
  int format_version_ = 0;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
  std::map<std::string, const SafetensorsFile*> file_index_;
};

/// Checks the sizes of `ckpt`'s config.json against its tensors (the embedding [vocab_size,
/// hidden_size], layer 0's query, key and gate projections, the last layer's input norm), so that
/// a config whose head_dim or num_hidden_layers the weights do not have is refused before a model
/// allocates anything by them (a 2 GB RoPE table for head_dim 2^30, 924 MB of layers for
/// num_hidden_layers 2,000,000). CheckpointError "<dir>: ... tensor '<name>' ..." naming the
/// tensor and the config field. Checkpoint::open calls it.
void check_sizes_against_tensors(const Checkpoint& ckpt);

}  // namespace swiftspec
