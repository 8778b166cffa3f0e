#include "backend/cpu/int4_weights.h"

#include <vector>

#include "swiftspec/error.h"

namespace swiftspec::cpu {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

const TensorView& expect(const Checkpoint& c, const std::string& name, const std::vector<int64_t>& shape,
                         const std::string& why) {
  if (!c.has(name))
    throw CheckpointError(c.dir() + ": missing tensor '" + name +
                          "' (an int4 checkpoint stores every projection as "
                          ".qweight, .scales and .zeros)");
  const TensorView& t = c.tensor(name);
  if (t.shape != shape)
    throw CheckpointError(c.file_of(name) + ": tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " +
                          shape_str(shape) + " (" + why + ")");
  return t;
}

}  // namespace

WeightMatrix load_int4_matrix(const Checkpoint& c, const std::string& prefix, int64_t n, int64_t k) {
  const int g = c.quantization().group_size;
  const std::string manifest = c.dir() + "/manifest.json";
  if (!c.quantization().int4() || g <= 0)
    throw CheckpointError(manifest + ": not an int4 checkpoint, cannot load '" + prefix + "' as int4");
  if (k % g != 0)
    throw CheckpointError(manifest + ": quantization.group_size " + std::to_string(g) + " does not divide the " +
                          std::to_string(k) + " input features of '" + prefix + "'");
  if (c.has(prefix + ".weight"))
    throw CheckpointError(c.file_of(prefix + ".weight") + ": tensor '" + prefix +
                          ".weight' is present next to the "
                          "int4 '" +
                          prefix + ".qweight'; a projection is stored one way only");
  const std::string gs = "group_size " + std::to_string(g) + " from manifest.json, K = " + std::to_string(k) +
                         " and N = " + std::to_string(n) + " from config.json";
  const TensorView& q = expect(
      c, prefix + ".qweight", {n, k / 2},
      "two 4-bit values per byte, K = " + std::to_string(k) + " and N = " + std::to_string(n) + " from config.json");
  const TensorView& s = expect(c, prefix + ".scales", {n, k / g}, gs);
  const TensorView& z = expect(c, prefix + ".zeros", {n, k / g}, gs);

  // A corrupted zero point or scale would dequantize to silently wrong weights (or NaN
  // logits far from their cause): check every one (1/64 of the weight bytes at G = 128).
  const auto* zeros = static_cast<const uint8_t*>(z.data);
  const auto* scales = static_cast<const uint16_t*>(s.data);
  const int64_t count = n * (k / g);
  for (int64_t i = 0; i < count; ++i) {
    if (zeros[i] > 15)
      throw CheckpointError(c.file_of(z.name) + ": tensor '" + z.name + "' holds " + std::to_string(zeros[i]) +
                            " at [" + std::to_string(i / (k / g)) + ", " + std::to_string(i % (k / g)) +
                            "]; 4-bit zero points are 0..15");
    if ((scales[i] & 0x7C00u) == 0x7C00u)
      throw CheckpointError(c.file_of(s.name) + ": tensor '" + s.name + "' holds a non-finite scale at [" +
                            std::to_string(i / (k / g)) + ", " + std::to_string(i % (k / g)) + "]");
  }
  WeightMatrix w;
  w.data = q.data;
  w.dtype = DType::U8;
  w.n = static_cast<int>(n);
  w.k = static_cast<int>(k);
  w.scales = scales;
  w.zeros = zeros;
  w.group_size = g;
  return w;
}

}  // namespace swiftspec::cpu
