// manifest.json: Checkpoint::open of a tiny checkpoint folder whose manifest is the input (issue
// 28 items 3, 4, 7: non-string fields, numbers past the double range), and the input as a
// tensor-parallel plan (TpPlan::from_json + validate, the "tensor_parallel" object of a TP
// folder's manifest; item 2: deep nesting there).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "swiftspec/checkpoint.h"
#include "swiftspec/tensor_parallel.h"

namespace {

using json = nlohmann::json;

const char* kConfig =
    R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 128,
        "tie_word_embeddings": true, "eos_token_id": 2})";

std::string g_dir;
swiftspec::ModelConfig g_config;

/// The tiny model's tensors (float32 zeros) as one safetensors file.
std::string tiny_safetensors() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t = {{"model.embed_tokens.weight", {64, 32}},
                                                                 {"model.norm.weight", {32}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (auto [name, rows, cols] : std::vector<std::tuple<const char*, int, int>>{{"self_attn.q_proj.weight", 32, 32},
                                                                                  {"self_attn.k_proj.weight", 16, 32},
                                                                                  {"self_attn.v_proj.weight", 16, 32},
                                                                                  {"self_attn.o_proj.weight", 32, 32},
                                                                                  {"mlp.gate_proj.weight", 64, 32},
                                                                                  {"mlp.up_proj.weight", 64, 32},
                                                                                  {"mlp.down_proj.weight", 32, 64}})
      t.push_back({p + name, {rows, cols}});
    t.push_back({p + "input_layernorm.weight", {32}});
    t.push_back({p + "post_attention_layernorm.weight", {32}});
  }
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, shape] : t) {
    uint64_t bytes = 4;
    for (int64_t d : shape) bytes *= static_cast<uint64_t>(d);
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  const std::string h = header.dump();
  const uint64_t n = h.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + h + std::string(offset, '\0');
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // tmpfs: a file write per input costs microseconds. One folder per process (libFuzzer's -jobs /
  // -fork run several).
  const char* base = std::getenv("SWIFTSPEC_FUZZ_TMP");
  g_dir = std::string(base ? base : "/dev/shm") + "/swiftspec-fuzz-manifest-" + std::to_string(getpid());
  std::system(("mkdir -p '" + g_dir + "'").c_str());
  write_file(g_dir + "/config.json", kConfig);
  write_file(g_dir + "/model.safetensors", tiny_safetensors());
  g_config = swiftspec::ModelConfig::from_json_text(kConfig, "config.json");
  // The folder must load with a valid manifest, or the target would test nothing past the manifest.
  write_file(
      g_dir + "/manifest.json",
      R"({"format": "swiftspec-checkpoint", "format_version": 1, "dtype": "float32", "files": ["model.safetensors"]})");
  swiftspec::Checkpoint::open(g_dir);
  std::atexit([] { std::system(("rm -rf '" + g_dir + "'").c_str()); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  write_file(g_dir + "/manifest.json", text);
  try {
    swiftspec::Checkpoint::open(g_dir);
  } catch (const swiftspec::Error& e) {
    fuzz::check_message(e);
  }
  try {
    swiftspec::TpPlan::from_json(text, "manifest.json").validate(g_config, "manifest.json");
  } catch (const swiftspec::Error& e) {
    fuzz::check_message(e);
  }
  return 0;
}
