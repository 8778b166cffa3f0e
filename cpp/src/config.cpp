// Parsing and validation of config.json (HF key names + a "swiftspec" object).
#include "swiftspec/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <type_traits>

#include "json_int.h"
#include "json_error.h"
#include "swiftspec/error.h"

namespace swiftspec {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw CheckpointError(origin + ": " + what);
}

const json& require(const json& j, const char* key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) fail(origin, std::string("missing field '") + key + "'");
  return *it;
}

int get_int(const json& j, const char* key, const std::string& origin) {
  const json& v = require(j, key, origin);
  int out = 0;
  switch (read_int32(v, out)) {
    case JsonInt::NotInteger: fail(origin, std::string("field '") + key + "' must be an integer, got " + v.dump());
    case JsonInt::OutOfRange: fail(origin, std::string("field '") + key + "' is out of range: " + v.dump());
    case JsonInt::Ok: break;
  }
  return out;
}

/// Settings of HF configs that change the computation in ways this runtime
/// does not implement: refused by name rather than ignored (a silently
/// different model).
void refuse_unsupported(const json& j, const std::string& origin) {
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null() && !(it->is_string() && it->get<std::string>() == "silu"))
      fail(origin, std::string("unsupported ") + key + " " + it->dump() + " (supported: \"silu\")");
  }
  for (const char* key : {"mlp_bias", "use_sliding_window"}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_boolean() && it->get<bool>())
      fail(origin, std::string("unsupported ") + key + " = true (this runtime implements " +
                       (std::string(key) == "mlp_bias" ? "MLPs without biases)" : "full attention over the context)"));
  }
}

double get_number(const json& j, const char* key, const std::string& origin) {
  const json& v = require(j, key, origin);
  if (!v.is_number()) fail(origin, std::string("field '") + key + "' must be a number, got " + v.dump());
  return v.get<double>();
}

/// An optional boolean or string field (absent or null: `fallback`).
template <typename T>
T get_or(const json& j, const char* key, T fallback, const std::string& origin) {
  static_assert(std::is_same_v<T, bool> || std::is_same_v<T, std::string>, "integers: get_int_or (range-checked)");
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) fail(origin, std::string("field '") + key + "' must be true or false, got " + it->dump());
  } else {
    if (!it->is_string()) fail(origin, std::string("field '") + key + "' must be a string, got " + it->dump());
  }
  return it->get<T>();
}

/// An optional integer field (absent or null: `fallback`), read as get_int does: a value past
/// int32 is refused, not wrapped (get<int>() read 2^32 + 2 as 2).
int get_int_or(const json& j, const char* key, int fallback, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return get_int(j, key, origin);
}

}  // namespace

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError(path + ": cannot open config file (missing or unreadable)");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(origin, "malformed JSON: " + json_error_text(e));
  }
  if (!j.is_object()) fail(origin, "top level must be a JSON object");

  ModelConfig c;
  const json& mt = require(j, "model_type", origin);
  if (!mt.is_string()) fail(origin, "field 'model_type' must be a string");
  c.architecture = mt.get<std::string>();
  if (c.architecture != "qwen2" && c.architecture != "llama")
    fail(origin, "unknown architecture model_type='" + c.architecture +
                     "' (supported: qwen2, llama)");

  refuse_unsupported(j, origin);
  c.vocab_size = get_int(j, "vocab_size", origin);
  c.hidden_size = get_int(j, "hidden_size", origin);
  c.intermediate_size = get_int(j, "intermediate_size", origin);
  c.num_layers = get_int(j, "num_hidden_layers", origin);
  c.num_heads = get_int(j, "num_attention_heads", origin);
  c.num_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                       ? get_int(j, "num_key_value_heads", origin)
                       : c.num_heads;
  if (j.contains("head_dim") && !j["head_dim"].is_null())
    c.head_dim = get_int(j, "head_dim", origin);
  else if (c.num_heads > 0)
    c.head_dim = c.hidden_size / c.num_heads;
  c.rms_norm_eps = static_cast<float>(get_number(j, "rms_norm_eps", origin));
  // transformers >= 5 nests RoPE settings under "rope_parameters"; older
  // configs use top-level "rope_theta" and "rope_scaling".
  const json* rope_params = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rope_params = &j["rope_parameters"];
  if (j.contains("rope_theta") && !j["rope_theta"].is_null())
    c.rope_theta = get_number(j, "rope_theta", origin);
  else if (rope_params && rope_params->contains("rope_theta"))
    c.rope_theta = get_number(*rope_params, "rope_theta", origin + " rope_parameters");
  else
    fail(origin, "missing field 'rope_theta' (or rope_parameters.rope_theta)");
  if (j.contains("max_position_embeddings") && !j["max_position_embeddings"].is_null()) {
    c.max_position_embeddings = get_int(j, "max_position_embeddings", origin);
    if (c.max_position_embeddings <= 0)
      fail(origin, "field 'max_position_embeddings' must be > 0, got " + std::to_string(c.max_position_embeddings));
  }
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, origin);
  c.attention_bias = get_or<bool>(j, "attention_bias", c.architecture == "qwen2", origin);
  c.bos_token_id = get_int_or(j, "bos_token_id", -1, origin);

  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& e = j["eos_token_id"];
    // read_int32, not get<int>(): 2^32 + 2 would become the id 2 and pass the vocabulary check.
    auto add = [&](const json& x) {
      int id = 0;
      switch (read_int32(x, id)) {
        case JsonInt::NotInteger: fail(origin, "field 'eos_token_id' must hold integers, got " + e.dump());
        case JsonInt::OutOfRange:
          fail(origin, "eos_token_id " + x.dump() + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                           ")");
        case JsonInt::Ok: break;
      }
      c.eos_token_ids.push_back(id);
    };
    if (e.is_number_integer())
      add(e);
    else if (e.is_array())
      for (const auto& x : e) add(x);
    else
      fail(origin, "field 'eos_token_id' must be an integer or a list, got " + e.dump());
  }

  const json* scaling = nullptr;
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) scaling = &j["rope_scaling"];
  else if (rope_params) scaling = rope_params;
  if (scaling) {
    const json& rs = *scaling;
    if (!rs.is_object()) fail(origin, "field 'rope_scaling' must be an object or null");
    std::string type = get_or<std::string>(rs, "rope_type", get_or<std::string>(rs, "type", "", origin), origin);
    if (type == "llama3") {
      c.rope_scaling.enabled = true;
      c.rope_scaling.factor = get_number(rs, "factor", origin + " rope_scaling");
      c.rope_scaling.low_freq_factor = get_number(rs, "low_freq_factor", origin + " rope_scaling");
      c.rope_scaling.high_freq_factor = get_number(rs, "high_freq_factor", origin + " rope_scaling");
      c.rope_scaling.original_max_position_embeddings =
          get_int(rs, "original_max_position_embeddings", origin + " rope_scaling");
    } else if (type != "default" && !type.empty()) {
      fail(origin, "unsupported rope_scaling type '" + type + "' (supported: llama3, default)");
    }
  }

  if (j.contains("swiftspec")) {
    const json& s = j["swiftspec"];
    if (!s.is_object()) fail(origin, "field 'swiftspec' must be an object");
    std::string style = get_or<std::string>(s, "rope_style", "neox", origin);
    if (style == "neox")
      c.rope_style = RopeStyle::NeoX;
    else if (style == "interleaved")
      c.rope_style = RopeStyle::Interleaved;
    else
      fail(origin, "unknown swiftspec.rope_style '" + style + "' (supported: neox, interleaved)");
    c.attention_bias = get_or<bool>(s, "attention_bias", c.attention_bias, origin);
  }

  c.validate(origin);
  return c;
}

void ModelConfig::validate(const std::string& origin) const {
  auto positive = [&](int v, const char* name) {
    if (v <= 0) fail(origin, std::string("field '") + name + "' must be > 0, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_layers, "num_hidden_layers");
  positive(num_heads, "num_attention_heads");
  positive(num_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  if (num_heads % num_kv_heads != 0)
    fail(origin, "num_attention_heads (" + std::to_string(num_heads) +
                     ") must be a multiple of num_key_value_heads (" + std::to_string(num_kv_heads) + ")");
  if (head_dim % 2 != 0) fail(origin, "head_dim must be even for RoPE, got " + std::to_string(head_dim));
  const auto number = [](double v) {  // shortest form: -1, 0, 1e-06 (std::to_string: -1.000000)
    std::ostringstream o;
    o << v;
    return o.str();
  };
  if (!(rms_norm_eps > 0)) fail(origin, "field 'rms_norm_eps' must be > 0, got " + number(rms_norm_eps));
  if (!(rope_theta > 0)) fail(origin, "field 'rope_theta' must be > 0, got " + number(rope_theta));
  for (int e : eos_token_ids)
    if (e < 0 || e >= vocab_size)
      fail(origin, "eos_token_id " + std::to_string(e) + " is outside the vocabulary [0, " +
                       std::to_string(vocab_size) + ")");
}

}  // namespace swiftspec
