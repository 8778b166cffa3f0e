// Chunked prefill: a prompt appended to the committed region in several
// forward passes, with a cancellation check between them.
#include <algorithm>
#include <string>

#include "swiftspec/error.h"
#include "swiftspec/model.h"

namespace swiftspec {

bool prefill(Model& model, const std::vector<int32_t>& tokens, LogitsMode mode, std::vector<float>& logits,
             const PrefillControl& control) {
  if (control.chunk < 0)
    throw InvalidArgument("prefill chunk must be >= 0 (0: the model's), got " + std::to_string(control.chunk));
  const int chunk = std::max(1, control.chunk > 0 ? control.chunk : model.prefill_chunk_tokens());
  const size_t n = tokens.size();
  logits.clear();
  if (n == 0) {  // the model's own error for an empty batch
    model.forward(ForwardBatch::append(tokens, model.committed_len(), mode), logits);
    return true;
  }
  // What one pass would refuse is refused before the first chunk, as one pass did: not after the
  // chunks that fit were computed (up to a whole context of work) and committed.
  const int vocab = model.config().vocab_size;
  for (size_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw InvalidArgument("prefill: token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                            " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  const long long committed = model.committed_len();
  if (committed + static_cast<long long>(n) > model.options().max_context)
    throw InvalidArgument("prefill: " + std::to_string(committed) + " committed + " + std::to_string(n) +
                          " new tokens exceed the context of " + std::to_string(model.options().max_context) +
                          " tokens (max_context)");
  std::vector<float> part;
  for (size_t begin = 0; begin < n; begin += chunk) {
    if (control.cancelled && control.cancelled()) {
      logits.clear();
      return false;
    }
    const size_t end = std::min(n, begin + static_cast<size_t>(chunk));
    const bool last = end == n;
    const LogitsMode m = mode == LogitsMode::All ? LogitsMode::All : (last ? mode : LogitsMode::None);
    const std::vector<int32_t> piece(tokens.begin() + begin, tokens.begin() + end);
    if (begin == 0 && last) {  // a single pass
      model.forward(ForwardBatch::append(piece, model.committed_len(), m), logits);
      return true;
    }
    model.forward(ForwardBatch::append(piece, model.committed_len(), m), part);
    if (mode == LogitsMode::All)
      logits.insert(logits.end(), part.begin(), part.end());
    else if (last)
      logits.swap(part);
  }
  return true;
}

}  // namespace swiftspec
