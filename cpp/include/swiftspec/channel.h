// A message channel between worker groups (SwiftSpec, ASPLOS'26 §4.1: the
// draft group and the target group exchange "subtree to verify" and
// "verification result" messages, never shared mutable state).
//
// Channel<T> is an unbounded multi-producer / multi-consumer FIFO with close
// semantics, built on a mutex and a condition variable:
//   send(v)        enqueues v; returns false (and drops v) once closed;
//   receive()      blocks until a message or close; std::nullopt when closed
//                  (messages sent before close() are still delivered first);
//   receive_for(d) receive() that gives up after d (std::nullopt);
//   try_receive()  never blocks; std::nullopt when empty (or closed and empty);
//   close()        wakes every waiter; idempotent.
// A message is moved through the channel, so the receiver owns it (no aliasing
// between sender and receiver). Thread-safe; ThreadSanitizer-clean.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>

namespace swiftspec {

template <typename T>
class Channel {
 public:
  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Enqueues `value`. Returns false (the value is dropped) if the channel is closed.
  bool send(T value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      queue_.push_back(std::move(value));
    }
    cv_.notify_one();
    return true;
  }

  /// Blocks until a message is available (returns it) or the channel is
  /// closed and drained (returns std::nullopt).
  std::optional<T> receive() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !queue_.empty() || closed_; });
    return pop_locked();
  }

  /// Like receive(), but gives up after `timeout` (std::nullopt; check
  /// closed() to tell a timeout from a closed, drained channel).
  template <typename Rep, typename Period>
  std::optional<T> receive_for(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [this] { return !queue_.empty() || closed_; });
    return pop_locked();
  }

  /// Returns a message if one is queued, else std::nullopt; never blocks.
  std::optional<T> try_receive() {
    std::lock_guard<std::mutex> lock(mu_);
    return pop_locked();
  }

  /// Closes the channel: later sends are dropped, blocked receivers wake up.
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

  /// Number of queued messages (a snapshot).
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
  }

 private:
  std::optional<T> pop_locked() {
    if (queue_.empty()) return std::nullopt;
    std::optional<T> out(std::move(queue_.front()));
    queue_.pop_front();
    return out;
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> queue_;
  bool closed_ = false;
};

}  // namespace swiftspec
