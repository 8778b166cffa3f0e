// SM partitions of one GPU: the draft group and the target group of SwiftSpec
// (ASPLOS'26, §4: the draft is disaggregated from the target; on one GPU the
// two groups get disjoint sets of SMs, so the draft cannot slow the target).
//
// A partition is written [first SM, SM count] (placement.h, "sm_partition").
// SM numbers are logical: CUDA green contexts do not let a program pick
// physical SMs, so the CUDA backend splits the device's SMs once into the
// smallest groups the driver allows (on compute capability 9.0: 8 SMs, some
// left over) and numbers them in split order; a partition is a run of whole
// groups. Its bounds must therefore fall on group boundaries, which the CUDA
// backend reads from the device (cuda/src/green_context.h).
//
// Header-only, so that the runtime (placement checks), the CUDA backend and
// the CPU tests share one set of rules.
#pragma once
#include <string>
#include <vector>

#include "swiftspec/error.h"

namespace swiftspec {

/// A resolved SM partition: logical SMs [first, first + count).
struct SmRange {
  int first = 0;
  int count = 0;
  int end() const { return first + count; }
};

/// True if [first, count] asks for a partition at all ([0, 0] is the whole GPU).
inline bool has_sm_partition(int first, int count) { return first != 0 || count != 0; }

/// Checks the placement form of a partition without a device: both values
/// non-negative. Throws InvalidArgument naming `field` (e.g. "placement.draft.sm_partition").
inline void check_sm_partition_form(int first, int count, const std::string& field) {
  if (first < 0 || count < 0)
    throw InvalidArgument(field + " must be [first SM, SM count] with non-negative values, got [" +
                          std::to_string(first) + ", " + std::to_string(count) + "]");
}

/// Resolves [first, count] on a GPU of `device_sms` SMs (count 0: up to the
/// last SM). `boundaries`: the logical SM indices where a partition may start
/// or end, ascending, from 0 to device_sms (empty: any SM). Returns the range.
/// Throws InvalidArgument naming `field` (e.g. "placement.draft.sm_partition"),
/// the values and the device:
///   - a negative value, or [0, 0] (the whole GPU is no partition),
///   - a range outside [0, device_sms),
///   - a bound that is not a group boundary (the message lists them).
inline SmRange resolve_sm_partition(int first, int count, int device_sms, const std::vector<int>& boundaries,
                                    const std::string& field) {
  check_sm_partition_form(first, count, field);
  std::string shown = "[";  // built stepwise: GCC 12 warns (-Wrestrict) on "[" + std::to_string(...)
  shown += std::to_string(first);
  shown += ", ";
  shown += std::to_string(count);
  shown += "]";
  if (!has_sm_partition(first, count)) throw InvalidArgument(field + " [0, 0] is the whole GPU, not a partition");
  const int end = count == 0 ? device_sms : first + count;
  if (first >= device_sms || end > device_sms)
    throw InvalidArgument(field + " " + shown + " is outside the " + std::to_string(device_sms) +
                          " SMs of this GPU (SMs 0.." + std::to_string(device_sms - 1) + ")");
  if (!boundaries.empty()) {
    auto on = [&](int v) {
      for (int b : boundaries)
        if (b == v) return true;
      return false;
    };
    if (!on(first) || !on(end)) {
      std::string list;
      for (size_t i = 0; i < boundaries.size(); ++i) list += (i ? ", " : "") + std::to_string(boundaries[i]);
      throw InvalidArgument(field + " " + shown + " (SMs " + std::to_string(first) + ".." + std::to_string(end - 1) +
                            "): green-context partitions of this GPU start and end at SM " + list);
    }
  }
  return SmRange{first, end - first};
}

/// True if two partitions given in placement form overlap (count 0: up to the
/// end of the GPU, whatever its size). [0, 0] (the whole GPU, no partition)
/// overlaps nothing: such a group simply shares the GPU.
inline bool sm_partitions_overlap(int first_a, int count_a, int first_b, int count_b) {
  if (!has_sm_partition(first_a, count_a) || !has_sm_partition(first_b, count_b)) return false;
  const long long inf = 1LL << 40;
  const long long end_a = count_a == 0 ? inf : static_cast<long long>(first_a) + count_a;
  const long long end_b = count_b == 0 ? inf : static_cast<long long>(first_b) + count_b;
  return first_a < end_b && first_b < end_a;
}

}  // namespace swiftspec
