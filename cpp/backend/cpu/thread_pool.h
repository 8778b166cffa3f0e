// A fixed pool of worker threads for the CPU backend.
//
// Each model owns one pool, so a draft group and a target group can run on
// disjoint cores at the same time (disaggregation on a CPU). Work is split
// statically (worker t of T gets [t*n/T, (t+1)*n/T)), which keeps every
// output element's arithmetic independent of timing.
#pragma once
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace swiftspec::cpu {

/// Pins the calling thread to `core` (best effort; ignored where not allowed).
void pin_thread_to_core(int core);

class ThreadPool {
 public:
  /// `num_threads` workers including the calling thread (0: hardware concurrency).
  /// `affinity`, when non-empty, pins worker t (t >= 1) to core affinity[t % size];
  /// the calling thread (worker 0) is pinned by whoever owns it.
  explicit ThreadPool(int num_threads, const std::vector<int>& affinity = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  /// Calls fn(begin, end) on disjoint ranges covering [0, n), one range per
  /// worker, and returns when all are done. Not re-entrant.
  void parallel_for(int n, const std::function<void(int, int)>& fn);

 private:
  void worker_loop(int index);
  void run_share(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* task_ = nullptr;
  int task_n_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::vector<int> affinity_;
  uint64_t forks_ = 0;  // forks_so_far() when the workers started (fork_count.h)
};

}  // namespace swiftspec::cpu
