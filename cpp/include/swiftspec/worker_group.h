// A worker group: the ranks that run one model together (SwiftSpec ASPLOS'26
// §4.1: a draft group and a target group, each on its own devices; here a
// device is a set of CPU cores). One thread per rank:
//
//   rank 0        the thread that calls run() — the group's leader, which
//                 also drives the group's part of the speculation loop, so a
//                 TP-1 group has no thread hand-off on its critical path;
//   ranks 1..N-1  threads owned by the group, parked (sleeping on a
//                 condition variable) between calls.
//
// run(fn) executes fn(rank) on every rank at once (SPMD) and returns when all
// are done; inside fn the ranks synchronise through the group's
// Communicator. If a rank throws, the group aborts its communicator (ranks
// blocked in a collective throw CommAborted), waits for every rank, resets
// the communicator and rethrows the exception of the lowest failing rank
// that did not merely see the abort — so a failed step leaves the group
// usable. Destruction wakes and joins every thread (no leak).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "swiftspec/communicator.h"

namespace swiftspec {

class WorkerGroup {
 public:
  /// A group of `size` ranks (>= 1). `rank_cores[r]`, when given and
  /// non-empty, is the set of cores rank r runs on: its thread pins itself to
  /// rank_cores[r][0] at start (rank 0 is the caller's thread: pinning it is
  /// the caller's job, see pin_current_thread). `comms`, when given, must hold
  /// `size` communicators of one group (index = rank); otherwise an in-process
  /// group is made. `name` appears in thread names and error messages.
  /// Throws InvalidArgument for size < 1 or mismatched vectors.
  WorkerGroup(int size, std::vector<std::vector<int>> rank_cores = {},
              std::vector<std::unique_ptr<Communicator>> comms = {}, std::string name = "group");
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& cores(int rank) const;
  /// The communicator of `rank` (use it only from that rank's fn call).
  Communicator& comm(int rank) { return *comms_.at(rank); }

  /// Runs fn(rank) on all ranks concurrently (rank 0 on the calling thread)
  /// and returns when all have returned. Rethrows as described above. Not
  /// re-entrant; one caller at a time.
  void run(const std::function<void(int rank)>& fn);

 private:
  void thread_main(int rank);

  const int size_;
  std::string name_;
  std::vector<std::vector<int>> rank_cores_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::thread> threads_;

  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                         // guarded by mu_
  int running_ = 0;                                 // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  uint64_t forks_ = 0;                              // forks_so_far() when the rank threads started (fork_count.h)
  std::vector<std::exception_ptr> errors_;          // per rank; written by the rank, read after done
};

/// Pins the calling thread to `cores` (all of them; best effort, ignored where
/// the OS refuses). No-op for an empty list.
void pin_current_thread(const std::vector<int>& cores);

}  // namespace swiftspec
