// ZeroPages: a float array that reads as zeros and costs memory only where it is written.
//
// The CPU backend's KV caches are sized for a whole context (ModelOptions::max_context: 32768
// tokens by default for the reference models, ~1.8 GiB for the 1.5B) but a request writes only
// the slots it fills. A std::vector zero-fills every page when it is made: that cost the time of
// writing the whole cache at load and made all of it resident. Anonymous private memory from
// mmap is zero-filled by the kernel on first touch instead: an untouched page costs nothing (a
// read maps the shared zero page), so loading is as cheap at 32768 tokens as at 4096 and the
// resident size follows the context actually used. Slots never written read as 0.0f, as they
// did with the zero-filled vector.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <utility>

namespace swiftspec::cpu {

class ZeroPages {
 public:
  ZeroPages() = default;
  /// `count` floats, all 0.0f. Throws std::bad_alloc (Python: MemoryError) when the address
  /// space cannot be reserved.
  explicit ZeroPages(size_t count) : count_(count) {
    if (count_ == 0) return;
    void* p = mmap(nullptr, count_ * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<float*>(p);
  }
  ~ZeroPages() { release(); }
  ZeroPages(ZeroPages&& o) noexcept : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  ZeroPages& operator=(ZeroPages&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  ZeroPages(const ZeroPages&) = delete;
  ZeroPages& operator=(const ZeroPages&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return count_; }

 private:
  void release() {
    if (data_ != nullptr) munmap(data_, count_ * sizeof(float));
    data_ = nullptr;
    count_ = 0;
  }
  float* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace swiftspec::cpu
