// Entry point of swiftspec-cpp-tests (see test_framework.h).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>

#include "test_framework.h"

namespace swiftspec::test {
std::vector<TestCase>& registry() {
  static std::vector<TestCase> r;
  return r;
}
}  // namespace swiftspec::test

int main(int argc, char** argv) {
  using swiftspec::test::registry;
  std::vector<std::string> filters;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0)
      list = true;
    else
      filters.emplace_back(argv[i]);
  }
  int run = 0, failed = 0;
  for (const auto& t : registry()) {
    bool selected = filters.empty();
    for (const auto& f : filters) selected = selected || t.name.find(f) != std::string::npos;
    if (!selected) continue;
    if (list) {
      std::printf("%s\n", t.name.c_str());
      continue;
    }
    ++run;
    std::printf("[ RUN  ] %s\n", t.name.c_str());
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      t.fn();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("[  OK  ] %s (%.2f s)\n", t.name.c_str(), s);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("[ FAIL ] %s: %s\n", t.name.c_str(), e.what());
    }
    std::fflush(stdout);
  }
  if (!list) std::printf("%d tests, %d failed\n", run, failed);
  return failed == 0 && (run > 0 || list) ? 0 : 1;
}
