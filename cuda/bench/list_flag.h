// The value of a comma-separated bench flag ("--shapes a,b", "--contexts 512,4096") as its items,
// empty items dropped.
#pragma once
#include <sstream>
#include <string>
#include <vector>

namespace swiftspec::cuda {

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace swiftspec::cuda
