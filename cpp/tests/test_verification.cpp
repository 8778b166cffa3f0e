// verify_stochastic (verification.h): what its errors say. The distributions themselves are
// checked against the target's in tests/test_verification.py.
#include <cmath>
#include <string>
#include <vector>

#include "swiftspec/error.h"
#include "swiftspec/sampling.h"
#include "swiftspec/token_tree.h"
#include "swiftspec/verification.h"
#include "test_framework.h"

namespace swiftspec {
namespace {

// The message of verify_stochastic on a root with one child (token 1) drawn from a draft
// distribution that gives that draw probability `q1`.
std::string draw_message(float q1) {
  TokenTree tree;
  tree.reset(0);
  tree.add_child(0, 1, 0.0f);
  tree.set_expanded(0, {1});
  const std::vector<float> p = {0.25f, 0.25f, 0.25f, 0.25f};
  const std::vector<float> q = {0.5f, q1, 0.25f, 0.25f};
  Rng rng(1);
  try {
    verify_stochastic(tree, 4, [&](int) { return p.data(); }, [&](int) { return q.data(); }, rng);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

// A draw's draft probability is shown as it reads back: std::to_string printed -1e-30 as
// "-0.000000" (a probability that looked like 0, which the check refuses too, but is not 0) and a
// denormal negative as "-0.000000".
SWIFTSPEC_TEST(verify_stochastic_names_a_draws_probability_exactly) {
  CHECK_EQ(draw_message(-1e-30f),
           std::string("verify_stochastic: node 0 has draw 1 whose draft probability is -1e-30 (must be > 0)"));
  CHECK_EQ(draw_message(0.0f),
           std::string("verify_stochastic: node 0 has draw 1 whose draft probability is 0 (must be > 0)"));
  CHECK_EQ(draw_message(NAN),
           std::string("verify_stochastic: node 0 has draw 1 whose draft probability is nan (must be > 0)"));
  CHECK_EQ(draw_message(0.25f), std::string("no error"));
}

}  // namespace swiftspec
