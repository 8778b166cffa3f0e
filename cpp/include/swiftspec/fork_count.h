// fork() and the runtime's worker threads. A fork()ed child has only the thread that called
// fork(): the worker threads of every model loaded before the fork (a CPU ThreadPool's, a
// WorkerGroup's parked ranks) are not in it. A model used there would wait for ever for workers
// that do not exist, and freeing it would join threads that are not its own (std::system_error
// from a destructor: the process aborted). So each owner of worker threads notes forks_so_far()
// when it starts them: used after a fork it throws InvalidArgument (forked_error), and destroyed
// after a fork it leaves the parent's threads alone.
#pragma once
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "swiftspec/error.h"

namespace swiftspec {

namespace detail {
inline std::atomic<uint64_t> g_forks{0};
inline void count_fork_in_child() { g_forks.fetch_add(1, std::memory_order_relaxed); }
}  // namespace detail

/// How many fork()s led to this process since the first call (in the child, one more than the
/// parent had when it forked).
inline uint64_t forks_so_far() {
  static const bool registered = pthread_atfork(nullptr, nullptr, &detail::count_fork_in_child) == 0;
  (void)registered;
  return detail::g_forks.load(std::memory_order_relaxed);
}

/// The error for worker threads (`what`) started before a fork and used after it.
inline InvalidArgument forked_error(const std::string& what) {
  return InvalidArgument("this model was loaded before this process was fork()ed from its parent: its " + what +
                         " did not survive the fork, so it cannot run here; load the model in this process "
                         "(multiprocessing: the 'spawn' or 'forkserver' start method, or make the engine in each "
                         "worker)");
}

}  // namespace swiftspec
