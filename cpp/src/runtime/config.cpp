// Parsing and validation of config.json (HF key names + a "swiftspec" object).
#include "swiftspec/config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "json_int.h"
#include "json_error.h"
#include "json_read.h"
#include "swiftspec/error.h"
#include "swiftspec/rope.h"

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
    case JsonInt::NotInteger:
      fail(origin, std::string("field '") + key + "' must be an integer, got " + json_brief(v));
    case JsonInt::OutOfRange:
      fail(origin, std::string("field '") + key + "' is out of range: " + json_brief(v));
    case JsonInt::Ok:
      break;
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
      fail(origin, std::string("unsupported ") + key + " " + json_brief(*it) + " (supported: \"silu\")");
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
  if (!v.is_number()) fail(origin, std::string("field '") + key + "' must be a number, got " + json_brief(v));
  return v.get<double>();
}

/// An optional boolean or string field (absent or null: `fallback`).
template <typename T>
T get_or(const json& j, const char* key, T fallback, const std::string& origin) {
  static_assert(std::is_same_v<T, bool> || std::is_same_v<T, std::string>, "integers: get_int_or (range-checked)");
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean())
      fail(origin, std::string("field '") + key + "' must be true or false, got " + json_brief(*it));
  } else {
    if (!it->is_string()) fail(origin, std::string("field '") + key + "' must be a string, got " + json_brief(*it));
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

std::string number_text(double v) {  // shortest form: -1, 0, 1e-06 (std::to_string: -1.000000)
  std::ostringstream o;
  o << v;
  return o.str();
}

/// A number field of rope_scaling, `fallback` where absent or null (if given; else required).
/// Finiteness is checked with the rest by check_rope_scaling.
double get_number_or(const json& rs, const char* key, const std::optional<double>& fallback, const std::string& where) {
  auto it = rs.find(key);
  if ((it == rs.end() || it->is_null()) && fallback) return *fallback;
  return get_number(rs, key, where);
}

/// Reads a "rope_scaling" (or transformers 5 "rope_parameters") object into c.rope_scaling with
/// HF transformers 5's defaults (modeling_rope_utils.py): original_max_position_embeddings
/// absent means max_position_embeddings; YaRN's beta_fast / beta_slow null or 0 mean 32 / 1
/// (HF: `get(key) or 32`), mscale and mscale_all_dim count only when both are non-zero, and a
/// null truncate means false (HF's `get("truncate", True)` is then None, falsy).
void parse_rope_scaling(const json& rs, const std::string& key, ModelConfig& c, const std::string& origin) {
  if (!rs.is_object()) fail(origin, "field '" + key + "' must be an object or null");
  const std::string where = origin + " " + key;
  const std::string type = get_or<std::string>(rs, "rope_type", get_or<std::string>(rs, "type", "", origin), origin);
  RopeScaling& s = c.rope_scaling;
  if (type == "default" || type.empty()) return;
  if (type == "llama3")
    s.type = RopeScalingType::Llama3;
  else if (type == "yarn")
    s.type = RopeScalingType::Yarn;
  else
    fail(origin, "unsupported " + key + " type '" + type + "' (supported: llama3, yarn, default)");

  s.factor = get_number_or(rs, "factor", std::nullopt, where);
  if (rs.contains("original_max_position_embeddings") && !rs["original_max_position_embeddings"].is_null())
    s.original_max_position_embeddings = get_int(rs, "original_max_position_embeddings", where);
  else if (c.max_position_embeddings > 0)
    s.original_max_position_embeddings = c.max_position_embeddings;
  else
    fail(where, "missing field 'original_max_position_embeddings' (and no max_position_embeddings to default to)");

  if (s.type == RopeScalingType::Llama3) {
    s.low_freq_factor = get_number_or(rs, "low_freq_factor", std::nullopt, where);
    s.high_freq_factor = get_number_or(rs, "high_freq_factor", std::nullopt, where);
    return;
  }
  const auto or_default = [](double v, double d) { return v == 0.0 ? d : v; };  // HF: `get(key) or d`
  s.beta_fast = or_default(get_number_or(rs, "beta_fast", 0.0, where), 32.0);
  s.beta_slow = or_default(get_number_or(rs, "beta_slow", 0.0, where), 1.0);
  s.mscale = get_number_or(rs, "mscale", 0.0, where);
  s.mscale_all_dim = get_number_or(rs, "mscale_all_dim", 0.0, where);
  if (rs.contains("attention_factor") && !rs["attention_factor"].is_null())
    s.attention_factor = get_number_or(rs, "attention_factor", std::nullopt, where);
  auto t = rs.find("truncate");
  if (t == rs.end())
    s.truncate = true;
  else if (t->is_null())
    s.truncate = false;
  else if (t->is_boolean())
    s.truncate = t->get<bool>();
  else
    fail(where, "field 'truncate' must be true or false, got " + json_brief(*t));
}

/// Refuses RoPE scaling parameters that make the tables of swiftspec/rope.h meaningless:
/// CheckpointError "<origin>: field '<key>.<name>' ...".
void check_rope_scaling(const RopeScaling& s, const std::string& origin, const std::string& key) {
  if (s.type == RopeScalingType::None) return;
  const auto bad = [&](const char* field, const std::string& why) {
    fail(origin, "field '" + key + "." + field + "' " + why);
  };
  const auto finite = [&](const char* field, double v) {
    if (!std::isfinite(v)) bad(field, "is " + number_text(v) + ", expected a finite number");
  };
  finite("factor", s.factor);
  // Scaling extends the context; HF documents factor >= 1 (below 1 it would shorten wavelengths).
  if (!(s.factor >= 1.0)) bad("factor", "must be >= 1, got " + number_text(s.factor));
  if (s.original_max_position_embeddings <= 0)
    bad("original_max_position_embeddings", "must be > 0, got " + std::to_string(s.original_max_position_embeddings));
  if (s.type == RopeScalingType::Llama3) {
    finite("low_freq_factor", s.low_freq_factor);
    finite("high_freq_factor", s.high_freq_factor);
    // Both divide the original context into wavelength bounds, and their difference divides the
    // smoothing term.
    if (!(s.low_freq_factor > 0)) bad("low_freq_factor", "must be > 0, got " + number_text(s.low_freq_factor));
    if (!(s.high_freq_factor > s.low_freq_factor))
      bad("high_freq_factor", "must be greater than low_freq_factor (" + number_text(s.low_freq_factor) + "), got " +
                                  number_text(s.high_freq_factor));
    return;
  }
  finite("beta_fast", s.beta_fast);
  finite("beta_slow", s.beta_slow);
  finite("mscale", s.mscale);
  finite("mscale_all_dim", s.mscale_all_dim);
  if (s.attention_factor) finite("attention_factor", *s.attention_factor);
  // Rotation counts: each is the argument of a logarithm (the dimension turning that many times).
  if (!(s.beta_slow > 0)) bad("beta_slow", "must be > 0, got " + number_text(s.beta_slow));
  if (!(s.beta_fast >= s.beta_slow))
    bad("beta_fast", "must be >= beta_slow (" + number_text(s.beta_slow) + "), got " + number_text(s.beta_fast));
  const double a = rope_attention_factor(s);
  if (!std::isfinite(a) || !(a > 0)) {
    if (s.attention_factor) bad("attention_factor", "must be > 0, got " + number_text(a));
    fail(origin,
         "fields '" + key + ".mscale' (" + number_text(s.mscale) + ") and '" + key + ".mscale_all_dim' (" +
             number_text(s.mscale_all_dim) + ") give the attention factor " + number_text(a) +
             " ((0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1)), expected a finite number > 0");
  }
}

}  // namespace

/// The configuration in the parsed config.json `j`; every field is type-checked before it is read.
static ModelConfig config_from_json(const json& j, const std::string& origin) {
  ModelConfig c;
  const json& mt = require(j, "model_type", origin);
  if (!mt.is_string()) fail(origin, "field 'model_type' must be a string");
  c.architecture = mt.get<std::string>();
  if (c.architecture != "qwen2" && c.architecture != "llama")
    fail(origin, "unknown architecture model_type='" + c.architecture + "' (supported: qwen2, llama)");

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
        case JsonInt::NotInteger:
          fail(origin, "field 'eos_token_id' must hold integers, got " + json_brief(x));
        case JsonInt::OutOfRange:
          fail(origin, "eos_token_id " + json_brief(x) + " is outside the vocabulary [0, " +
                           std::to_string(c.vocab_size) + ")");
        case JsonInt::Ok:
          break;
      }
      c.eos_token_ids.push_back(id);
    };
    if (e.is_number_integer())
      add(e);
    else if (e.is_array())
      for (const auto& x : e) add(x);
    else
      fail(origin, "field 'eos_token_id' must be an integer or a list, got " + json_brief(e));
  }

  const json* scaling = nullptr;
  std::string scaling_key = "rope_scaling";
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    scaling = &j["rope_scaling"];
  } else if (rope_params) {
    scaling = rope_params;
    scaling_key = "rope_parameters";
  }
  // HF rotates only the first partial_rotary_factor * head_dim dimensions of a head; this
  // runtime rotates all of them.
  for (const json* o : {static_cast<const json*>(&j), scaling})
    if (o && o->is_object() && o->contains("partial_rotary_factor") && !(*o)["partial_rotary_factor"].is_null() &&
        !((*o)["partial_rotary_factor"].is_number() && (*o)["partial_rotary_factor"].get<double>() == 1.0))
      fail(origin, "unsupported partial_rotary_factor " + json_brief((*o)["partial_rotary_factor"]) +
                       " (this runtime rotates whole heads: 1.0)");
  if (scaling) {
    parse_rope_scaling(*scaling, scaling_key, c, origin);
    check_rope_scaling(c.rope_scaling, origin, scaling_key);
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

int ModelConfig::context_limit() const {
  if (rope_scaling.type != RopeScalingType::Yarn) return max_position_embeddings;
  const double scaled = std::floor(rope_scaling.factor * rope_scaling.original_max_position_embeddings);
  if (!(scaled > max_position_embeddings)) return max_position_embeddings;
  return scaled >= std::numeric_limits<int>::max() ? std::numeric_limits<int>::max() : static_cast<int>(scaled);
}

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  return from_json_text(read_regular_file(path, kMaxSmallJsonBytes, "config file"), path);
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& origin) {
  const json j = parse_json_checked(text, origin + ": malformed JSON: ");
  if (!j.is_object()) fail(origin, "top level must be a JSON object");
  try {
    return config_from_json(j, origin);
  } catch (const json::exception& e) {
    // Every field is type-checked before it is read; this is the net under a check missed: a
    // CheckpointError naming the file, never nlohmann's own exception.
    fail(origin, "unexpected value: " + one_line(json_error_text(e)));
  }
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
    fail(origin, "num_attention_heads (" + std::to_string(num_heads) + ") must be a multiple of num_key_value_heads (" +
                     std::to_string(num_kv_heads) + ")");
  if (head_dim % 2 != 0) fail(origin, "head_dim must be even for RoPE, got " + std::to_string(head_dim));
  // The runtime sizes a token's query and KV rows as int products; a config whose products
  // overflow int is refused here, by name (the shapes are checked against the tensors when a
  // checkpoint opens, before anything is allocated by them).
  for (const auto& [heads, name] :
       {std::pair{num_heads, "num_attention_heads"}, std::pair{num_kv_heads, "num_key_value_heads"}})
    if (int64_t{heads} * head_dim > INT32_MAX)
      fail(origin, std::string("fields '") + name + "' (" + std::to_string(heads) + ") times 'head_dim' (" +
                       std::to_string(head_dim) + ") exceed " + std::to_string(INT32_MAX));
  const auto number = number_text;
  if (!(rms_norm_eps > 0)) fail(origin, "field 'rms_norm_eps' must be > 0, got " + number(rms_norm_eps));
  if (!(rope_theta > 0)) fail(origin, "field 'rope_theta' must be > 0, got " + number(rope_theta));
  check_rope_scaling(rope_scaling, origin, "rope_scaling");
  for (int e : eos_token_ids)
    if (e < 0 || e >= vocab_size)
      fail(origin,
           "eos_token_id " + std::to_string(e) + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
}

}  // namespace swiftspec
