#include "backend/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <string>
#include <system_error>

#include "swiftspec/error.h"
#include "swiftspec/fork_count.h"

namespace swiftspec::cpu {

static void pin_current_thread(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
}

ThreadPool::ThreadPool(int num_threads, const std::vector<int>& affinity) : affinity_(affinity) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (num_threads <= 0) num_threads = 1;
  num_threads_ = num_threads;
  forks_ = forks_so_far();
  try {
    for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
  } catch (const std::system_error& e) {
    // The system refused a thread (a thread limit): stop and join the ones
    // started, or their destruction while joinable would terminate the process.
    const size_t started = workers_.size();
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& w : workers_) w.join();
    throw InvalidArgument("cannot start " + std::to_string(num_threads) + " CPU worker threads (the system refused " +
                          "one after " + std::to_string(started + 1) + ": " + e.what() +
                          "): lower num_threads / threads_per_rank");
  }
}

ThreadPool::~ThreadPool() {
  if (forks_so_far() != forks_) {
    // A fork()ed child: the workers are the parent's, not in this process (joining them throws).
    // Their handles are let go without a join (leaked: the std::thread destructor would terminate).
    new std::vector<std::thread>(std::move(workers_));
    return;
  }
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_share(int index) {
  const int begin = static_cast<int>(static_cast<long long>(task_n_) * index / num_threads_);
  const int end = static_cast<int>(static_cast<long long>(task_n_) * (index + 1) / num_threads_);
  if (begin < end) (*task_)(begin, end);
}

void pin_thread_to_core(int core) { pin_current_thread(core); }

void ThreadPool::worker_loop(int index) {
  if (!affinity_.empty()) pin_current_thread(affinity_[index % affinity_.size()]);
  uint64_t seen = 0;
  for (;;) {
    // Spin briefly (a decode step issues hundreds of small parallel regions),
    // then sleep on the generation counter.
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 20000; ++spin) g = generation_.load(std::memory_order_acquire);
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    run_share(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::parallel_for(int n, const std::function<void(int, int)>& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  if (forks_so_far() != forks_) throw forked_error("CPU worker threads");  // else: waits for ever on them
  task_ = &fn;
  task_n_ = n;
  pending_.store(num_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  run_share(0);
  int left = pending_.load(std::memory_order_acquire);
  for (int spin = 0; left != 0 && spin < 200000; ++spin) left = pending_.load(std::memory_order_acquire);
  while (left != 0) {
    pending_.wait(left, std::memory_order_acquire);
    left = pending_.load(std::memory_order_acquire);
  }
  task_ = nullptr;
}

}  // namespace swiftspec::cpu
