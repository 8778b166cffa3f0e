// WorkerGroup: parked rank threads running SPMD steps.
#include "swiftspec/worker_group.h"

#include <pthread.h>
#include <sched.h>

#include <string>

#include "swiftspec/error.h"
#include "swiftspec/fork_count.h"

namespace swiftspec {

void pin_current_thread(const std::vector<int>& cores) {
  if (cores.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cores)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
}

WorkerGroup::WorkerGroup(int size, std::vector<std::vector<int>> rank_cores,
                         std::vector<std::unique_ptr<Communicator>> comms, std::string name)
    : size_(size), name_(std::move(name)), rank_cores_(std::move(rank_cores)), comms_(std::move(comms)) {
  if (size_ < 1) throw InvalidArgument("WorkerGroup '" + name_ + "': size must be >= 1, got " + std::to_string(size_));
  if (rank_cores_.empty()) rank_cores_.resize(size_);
  if (static_cast<int>(rank_cores_.size()) != size_)
    throw InvalidArgument("WorkerGroup '" + name_ + "': " + std::to_string(rank_cores_.size()) + " core lists for " +
                          std::to_string(size_) + " ranks");
  if (comms_.empty()) comms_ = make_in_process_group(size_);
  if (static_cast<int>(comms_.size()) != size_)
    throw InvalidArgument("WorkerGroup '" + name_ + "': " + std::to_string(comms_.size()) + " communicators for " +
                          std::to_string(size_) + " ranks");
  for (int r = 0; r < size_; ++r)
    if (comms_[r]->rank() != r || comms_[r]->size() != size_)
      throw InvalidArgument("WorkerGroup '" + name_ + "': communicator " + std::to_string(r) + " is rank " +
                            std::to_string(comms_[r]->rank()) + " of " + std::to_string(comms_[r]->size()));
  errors_.resize(size_);
  forks_ = forks_so_far();
  for (int r = 1; r < size_; ++r) threads_.emplace_back([this, r] { thread_main(r); });
}

WorkerGroup::~WorkerGroup() {
  if (forks_so_far() != forks_) {
    // A fork()ed child: the rank threads are the parent's, not in this process (joining them
    // throws; mu_ may have been held by one of them at the fork). Let go without a join (leaked).
    new std::vector<std::thread>(std::move(threads_));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

const std::vector<int>& WorkerGroup::cores(int rank) const { return rank_cores_.at(rank); }

void WorkerGroup::thread_main(int rank) {
  if (!rank_cores_[rank].empty()) pin_current_thread({rank_cores_[rank][0]});
  const std::string tname = (name_ + "-r" + std::to_string(rank)).substr(0, 15);
  pthread_setname_np(pthread_self(), tname.c_str());
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    try {
      (*task)(rank);
    } catch (...) {
      errors_[rank] = std::current_exception();
      comms_[rank]->abort();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--running_ == 0) done_cv_.notify_one();
    }
  }
}

void WorkerGroup::run(const std::function<void(int)>& fn) {
  if (size_ > 1 && forks_so_far() != forks_) throw forked_error("'" + name_ + "' group's rank threads");
  for (auto& e : errors_) e = nullptr;
  if (size_ > 1) {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    running_ = size_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  try {
    fn(0);
  } catch (...) {
    errors_[0] = std::current_exception();
    comms_[0]->abort();
  }
  if (size_ > 1) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return running_ == 0; });
    task_ = nullptr;
  }
  // Report the root cause: a rank's own error before the CommAborted it caused elsewhere.
  std::exception_ptr first, first_abort;
  for (auto& e : errors_) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommAborted&) {
      if (!first_abort) first_abort = e;
    } catch (...) {
      if (!first) first = e;
    }
  }
  if (first || first_abort) {
    comms_[0]->reset();
    std::rethrow_exception(first ? first : first_abort);
  }
}

}  // namespace swiftspec
