// ForwardBatch builders (model.h): the tree batch of a whole token tree.
#include <string>
#include <vector>

#include "swiftspec/error.h"
#include "swiftspec/model.h"
#include "test_framework.h"

namespace swiftspec::test {

SWIFTSPEC_TEST(forward_batch_tree_slots_positions_and_ancestors) {
  // 0 -> {1, 2}, 1 -> 3: depths 0, 1, 1, 2 after a prefix of 10 committed tokens.
  const ForwardBatch b = ForwardBatch::tree({11, 12, 13, 14}, {-1, 0, 0, 1}, 10);
  CHECK(b.is_tree());
  CHECK((b.tokens == std::vector<int32_t>{11, 12, 13, 14}));
  CHECK((b.positions == std::vector<int32_t>{10, 11, 11, 12}));
  CHECK((b.tree_slots == std::vector<int32_t>{0, 1, 2, 3}));
  CHECK((b.attend_offsets == std::vector<int32_t>{0, 1, 3, 5, 8}));
  CHECK((b.attend_slots == std::vector<int32_t>{0, 0, 1, 0, 2, 0, 1, 3}));
  CHECK(b.logits == LogitsMode::All);

  auto fails_with = [](const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents,
                       const std::string& needle) {
    try {
      ForwardBatch::tree(tokens, parents, 0);
    } catch (const InvalidArgument& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  CHECK(fails_with({1, 2}, {-1}, "2 tokens but 1 parents"));
  CHECK(fails_with({1, 2}, {-1, 1}, "node 1 has parent 1"));
  CHECK(fails_with({1, 2}, {-1, -2}, "node 1 has parent -2"));
}

}  // namespace swiftspec::test
