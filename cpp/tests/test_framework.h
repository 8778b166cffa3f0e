// A minimal test harness for the C++ test executable `swiftspec-cpp-tests`
// (built from cpp/tests/*.cpp; pytest runs it, tools/run_tsan.sh runs it
// under ThreadSanitizer).
//
//   SWIFTSPEC_TEST(name) { CHECK(cond); CHECK_EQ(a, b); }
//
// Usage: swiftspec-cpp-tests [--list] [SUBSTRING ...] runs the tests whose
// name contains any SUBSTRING (all tests without one). Tests that need the
// real models read their checkpoint folders from environment variables
// (see test_models.h) and fail — not skip — when they are missing, unless
// the test is not selected. Exit code: 0 if every selected test passed.
#pragma once
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace swiftspec::test {

struct TestCase {
  std::string name;
  std::function<void()> fn;
};

std::vector<TestCase>& registry();

struct Register {
  Register(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename A, typename B>
void check_eq(const A& a, const B& b, const char* ea, const char* eb, const char* file, int line) {
  if (!(a == b)) {
    std::ostringstream os;
    os << file << ":" << line << ": CHECK_EQ(" << ea << ", " << eb << ") failed";
    if constexpr (requires(std::ostream& o) {
                    o << a;
                    o << b;
                  })
      os << ": " << a << " vs " << b;
    throw Failure(os.str());
  }
}

}  // namespace swiftspec::test

#define SWIFTSPEC_TEST_CAT2(a, b) a##b
#define SWIFTSPEC_TEST_CAT(a, b) SWIFTSPEC_TEST_CAT2(a, b)
#define SWIFTSPEC_TEST(name)                                                           \
  static void name();                                                                  \
  static ::swiftspec::test::Register SWIFTSPEC_TEST_CAT(register_, name)(#name, name); \
  static void name()

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw ::swiftspec::test::Failure(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                       ": CHECK(" #cond ") failed");                            \
  } while (0)

#define CHECK_EQ(a, b) ::swiftspec::test::check_eq((a), (b), #a, #b, __FILE__, __LINE__)

#define CHECK_THROWS(expr, type)                                                                \
  do {                                                                                          \
    bool thrown_ = false;                                                                       \
    try {                                                                                       \
      expr;                                                                                     \
    } catch (const type&) {                                                                     \
      thrown_ = true;                                                                           \
    }                                                                                           \
    if (!thrown_)                                                                               \
      throw ::swiftspec::test::Failure(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                       ": " #expr " did not throw " #type);                     \
  } while (0)
