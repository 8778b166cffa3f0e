// The in-process communicator of the CPU backend: ranks are threads sharing
// host memory; collectives are two barriers around plain loads and stores.
#include <immintrin.h>

#include <atomic>
#include <cstring>
#include <string>

#include "swiftspec/communicator.h"

namespace swiftspec {
namespace {

// A reusable barrier: spins briefly (collectives of a decode step are a few
// microseconds apart when every rank has its own core), then sleeps on the
// generation counter (oversubscribed machines, idle groups). The last rank
// to arrive bumps the generation with release semantics; waiters acquire it,
// so every write made before the barrier by any rank is visible after it.
class Barrier {
 public:
  Barrier(int n, const std::atomic<bool>* aborted) : n_(n), aborted_(aborted) {}

  void wait() {
    check();
    const uint64_t gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      generation_.notify_all();
      return;
    }
    for (int spin = 0; spin < kSpin; ++spin) {
      if (generation_.load(std::memory_order_acquire) != gen) return check();
      _mm_pause();
    }
    uint64_t g = generation_.load(std::memory_order_acquire);
    while (g == gen) {
      generation_.wait(gen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    check();
  }

  // Wakes every waiter (they find the abort flag set and throw).
  void wake_all() {
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
  }
  void reset() { arrived_.store(0, std::memory_order_relaxed); }

 private:
  void check() const {
    if (aborted_->load(std::memory_order_acquire))
      throw CommAborted("collective aborted: another rank of the worker group failed");
  }
  static constexpr int kSpin = 4000;
  const int n_;
  const std::atomic<bool>* aborted_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
};

struct Shared {
  explicit Shared(int n) : size(n), buffers(n, nullptr), scratch(n, nullptr), counts(n, 0), barrier(n, &aborted) {}
  const int size;
  // Published per call before the first barrier, read after it.
  std::vector<const float*> buffers;
  std::vector<const float*> scratch;
  std::vector<size_t> counts;
  std::atomic<bool> aborted{false};
  Barrier barrier;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Shared> shared, int rank) : s_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return s_->size; }

  void all_reduce_sum(float* data, size_t count) override {
    const int n = s_->size;
    if (n == 1) return;
    s_->buffers[rank_] = data;
    s_->counts[rank_] = count;
    s_->barrier.wait();  // B1: buffers published; the previous call's scratch reads are over
    check_counts(count, "all_reduce_sum");
    // Reduce-scatter: this rank sums its slice, in rank order, into its scratch.
    const size_t begin = slice_begin(count, rank_), end = slice_begin(count, rank_ + 1);
    scratch_.resize(end - begin);
    float* out = scratch_.data();
    // (An empty slice, count < ranks, has no scratch: memcpy's pointers must not be null even
    // for 0 bytes; UBSan's nonnull-attribute check in tools/run_asan.sh. Here and below.)
    if (end > begin) std::memcpy(out, s_->buffers[0] + begin, (end - begin) * sizeof(float));
    for (int r = 1; r < n; ++r) {
      const float* src = s_->buffers[r] + begin;
      for (size_t i = 0; i < end - begin; ++i) out[i] += src[i];
    }
    s_->scratch[rank_] = out;
    s_->barrier.wait();  // B2: every slice reduced; nobody reads `data` buffers any more
    // All-gather of the reduced slices into this rank's buffer.
    for (int r = 0; r < n; ++r) {
      const size_t b = slice_begin(count, r), e = slice_begin(count, r + 1);
      if (e > b) std::memcpy(data + b, s_->scratch[r], (e - b) * sizeof(float));
    }
    // The next call's B1 keeps every rank's scratch alive until all have copied.
  }

  void gather(const float* send, float* recv, size_t count, int root) override {
    if (root < 0 || root >= s_->size)
      throw InvalidArgument("gather: root " + std::to_string(root) + " outside [0, " + std::to_string(s_->size) + ")");
    if (s_->size == 1) {
      if (send != recv) std::memmove(recv, send, count * sizeof(float));
      return;
    }
    s_->buffers[rank_] = send;
    s_->counts[rank_] = count;
    s_->barrier.wait();
    check_counts(count, "gather");
    if (rank_ == root)
      for (int r = 0; r < s_->size; ++r)
        if (r != rank_ || send != recv + r * count)
          std::memcpy(recv + r * count, s_->buffers[r], count * sizeof(float));
    s_->barrier.wait();  // senders may reuse their buffers after this
  }

  void barrier() override {
    if (s_->size > 1) s_->barrier.wait();
  }

  void abort() override {
    s_->aborted.store(true, std::memory_order_release);
    s_->barrier.wake_all();
  }
  void reset() override {
    s_->barrier.reset();
    s_->aborted.store(false, std::memory_order_release);
  }

 private:
  static size_t slice_begin(size_t count, int r, int n) { return count * static_cast<size_t>(r) / n; }
  size_t slice_begin(size_t count, int r) const { return slice_begin(count, r, s_->size); }
  void check_counts(size_t count, const char* op) {
    for (int r = 0; r < s_->size; ++r)
      if (s_->counts[r] != count) {
        abort();
        throw InvalidArgument(std::string(op) + ": rank " + std::to_string(rank_) + " passed " + std::to_string(count) +
                              " elements but rank " + std::to_string(r) + " passed " + std::to_string(s_->counts[r]) +
                              " (every rank must pass the same count)");
      }
  }

  std::shared_ptr<Shared> s_;
  const int rank_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size) {
  if (size < 1) throw InvalidArgument("make_in_process_group: size must be >= 1, got " + std::to_string(size));
  auto shared = std::make_shared<Shared>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<InProcessCommunicator>(shared, r));
  return out;
}

}  // namespace swiftspec
