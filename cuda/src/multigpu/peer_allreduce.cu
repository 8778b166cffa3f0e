// PeerGroup (peer_allreduce.h): peer access, symmetric buffers, and the
// standalone one-shot all-reduce kernel.
#include "multigpu/peer_allreduce.h"

#include <algorithm>
#include <string>

#include "common.h"

namespace swiftspec::cuda {

namespace {

constexpr int kArThreads = 256;

/// One CTA owns elements [blockIdx.x * chunk, +chunk) (chunk % 8 == 0):
/// copy-in, exchange, rank-order sum (peer_channel.h, steps 1-5).
template <int NR>
__global__ void __launch_bounds__(kArThreads) peer_allreduce_kernel(const PeerChannel ch, const __nv_bfloat16* in,
                                                                    __nv_bfloat16* out, size_t count, size_t chunk) {
  griddep_wait();
  const uint32_t e = peer_epoch(ch);
  const size_t half = (e & 1u) * ch.capacity;
  const size_t b0 = static_cast<size_t>(blockIdx.x) * chunk;
  const size_t b1 = b0 < count ? min(count, b0 + chunk) : b0;
  const size_t nvec = (b1 - b0) / 8;
  const size_t tail0 = b0 + nvec * 8;
  __nv_bfloat16* mine = ch.data[ch.rank] + half;
  for (size_t v = threadIdx.x; v < nvec; v += kArThreads)
    *reinterpret_cast<uint4*>(mine + b0 + 8 * v) = *reinterpret_cast<const uint4*>(in + b0 + 8 * v);
  for (size_t i = tail0 + threadIdx.x; i < b1; i += kArThreads) mine[i] = in[i];

  peer_exchange(ch, static_cast<int>(blockIdx.x), e);

  for (size_t v = threadIdx.x; v < nvec; v += kArThreads) {
    float acc[8];
    peer_sum8<NR>(ch, half, b0 + 8 * v, acc);
    uint4 o;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    *reinterpret_cast<uint4*>(out + b0 + 8 * v) = o;
  }
  for (size_t i = tail0 + threadIdx.x; i < b1; i += kArThreads) {
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < NR; ++r) s += __bfloat162float(peer_ld_volatile_bf16(ch.data[r] + half + i));
    out[i] = __float2bfloat16_rn(s);
  }
  peer_finish_launch(ch);
}

template <int NR>
void launch_ar(const PeerChannel& ch, const __nv_bfloat16* in, __nv_bfloat16* out, size_t count, size_t chunk, int ctas,
               bool pdl, cudaStream_t st) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(ctas), 1, 1);
  lc.blockDim = dim3(kArThreads, 1, 1);
  lc.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, &peer_allreduce_kernel<NR>, ch, in, out, count, chunk));
}

/// One thread per (token row, 16-column tile) item; items of rows past
/// m_active are skipped, but every CTA takes part in the exchange.
template <int NR>
__global__ void __launch_bounds__(kArThreads)
    peer_allreduce_residual_kernel(const PeerChannel ch, const int* m_active_ptr, int m_max, int N, float* h32,
                                   __nv_bfloat16* h16, float* ssq) {
  griddep_wait();
  const uint32_t e = peer_epoch(ch);
  const size_t half = (e & 1u) * ch.capacity;
  int m_active = m_max;
  if (m_active_ptr) m_active = min(m_active, *m_active_ptr);
  peer_exchange(ch, static_cast<int>(blockIdx.x), e);
  const int tiles = N >> 4;
  const int item = static_cast<int>(blockIdx.x) * kArThreads + static_cast<int>(threadIdx.x);
  const int m = item / tiles;
  const int t = item - m * tiles;
  if (m < m_active) {
    const size_t off = static_cast<size_t>(m) * N + 16 * t;
    float lo[8], hi[8];
    peer_sum8<NR>(ch, half, off, lo);
    peer_sum8<NR>(ch, half, off + 8, hi);
    float4* hp = reinterpret_cast<float4*>(h32 + off);
    float4 hv[4] = {hp[0], hp[1], hp[2], hp[3]};
    float* a = reinterpret_cast<float*>(hv);
    float s_lo = 0.f, s_hi = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      a[i] += lo[i];
      s_lo += a[i] * a[i];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      a[8 + i] += hi[i];
      s_hi += a[8 + i] * a[8 + i];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) hp[i] = hv[i];
    uint4 o[2];
    __nv_bfloat162* ob = reinterpret_cast<__nv_bfloat162*>(o);
#pragma unroll
    for (int i = 0; i < 8; ++i) ob[i] = __floats2bfloat162_rn(a[2 * i], a[2 * i + 1]);
    reinterpret_cast<uint4*>(h16 + off)[0] = o[0];
    reinterpret_cast<uint4*>(h16 + off)[1] = o[1];
    ssq[static_cast<size_t>(m) * tiles + t] = s_lo + s_hi;
  }
  peer_finish_launch(ch);
}

template <int NR>
void launch_arr(const PeerChannel& ch, const int* m_active_ptr, int m_max, int N, float* h32, __nv_bfloat16* h16,
                float* ssq, int ctas, bool pdl, cudaStream_t st) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(ctas), 1, 1);
  lc.blockDim = dim3(kArThreads, 1, 1);
  lc.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  SS_CUDA_CHECK(
      cudaLaunchKernelEx(&lc, &peer_allreduce_residual_kernel<NR>, ch, m_active_ptr, m_max, N, h32, h16, ssq));
}

/// Restores the current device on scope exit.
struct DeviceGuard {
  int prev = 0;
  DeviceGuard() { SS_CUDA_CHECK(cudaGetDevice(&prev)); }
  ~DeviceGuard() { cudaSetDevice(prev); }
};

}  // namespace

PeerGroup::PeerGroup(const std::vector<int>& devices, size_t capacity, int channels)
    : devices_(devices), capacity_(capacity), channels_(channels) {
  const int n = static_cast<int>(devices.size());
  if (n < 1 || n > kMaxPeerRanks)
    throw InvalidArgument("PeerGroup: " + std::to_string(n) + " devices; 1.." + std::to_string(kMaxPeerRanks) +
                          " supported");
  if (capacity == 0 || capacity % 8 != 0)
    throw InvalidArgument("PeerGroup: capacity " + std::to_string(capacity) +
                          " must be a positive multiple of 8 elements");
  if (channels < 1) throw InvalidArgument("PeerGroup: channels must be >= 1, got " + std::to_string(channels));
  int count = 0;
  SS_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int r = 0; r < n; ++r)
    if (devices[r] < 0 || devices[r] >= count)
      throw InvalidArgument("PeerGroup: devices[" + std::to_string(r) + "] = " + std::to_string(devices[r]) +
                            " is outside [0, " + std::to_string(count) + ")");
  DeviceGuard guard;
  // Peer access between every pair of distinct GPUs (both directions).
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const int a = devices[i], b = devices[j];
      if (a == b) continue;
      int can = 0;
      SS_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can)
        throw CudaError("PeerGroup: GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) +
                        " (no peer access: the peer all-reduce needs NVLink / P2P between every pair)");
      SS_CUDA_CHECK(cudaSetDevice(a));
      const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clear the (non-sticky) "already enabled" error state
      } else if (err != cudaSuccess) {
        throw_cuda_error(err, "cudaDeviceEnablePeerAccess", __FILE__, __LINE__);
      }
    }
  bytes_per_alloc_ = kPeerDataOffset + sizeof(__nv_bfloat16) * 2 * capacity;
  allocs_.assign(static_cast<size_t>(n) * channels, nullptr);
  try {
    for (int r = 0; r < n; ++r) {
      SS_CUDA_CHECK(cudaSetDevice(devices[r]));
      for (int c = 0; c < channels; ++c) {
        void*& p = allocs_[static_cast<size_t>(r) * channels + c];
        SS_CUDA_CHECK(cudaMalloc(&p, bytes_per_alloc_));
        SS_CUDA_CHECK(cudaMemset(p, 0, bytes_per_alloc_));
      }
      SS_CUDA_CHECK(cudaDeviceSynchronize());
    }
  } catch (...) {
    for (size_t i = 0; i < allocs_.size(); ++i)
      if (allocs_[i]) {
        cudaSetDevice(devices[i / channels]);
        cudaFree(allocs_[i]);
      }
    throw;
  }
  views_.resize(allocs_.size());
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < channels; ++c) {
      PeerChannel& v = views_[static_cast<size_t>(r) * channels + c];
      v.rank = r;
      v.size = n;
      v.capacity = capacity;
      for (int q = 0; q < n; ++q) {
        unsigned char* base = static_cast<unsigned char*>(allocs_[static_cast<size_t>(q) * channels + c]);
        v.flags[q] = reinterpret_cast<uint32_t*>(base);
        v.data[q] = reinterpret_cast<__nv_bfloat16*>(base + kPeerDataOffset);
      }
      unsigned char* own = static_cast<unsigned char*>(allocs_[static_cast<size_t>(r) * channels + c]);
      v.epoch = reinterpret_cast<uint32_t*>(own + kPeerCountersOffset);
      v.done = v.epoch + 1;
    }
}

PeerGroup::~PeerGroup() {
  int prev = 0;
  cudaGetDevice(&prev);
  for (size_t i = 0; i < allocs_.size(); ++i) {
    if (!allocs_[i]) continue;
    cudaSetDevice(devices_[i / channels_]);
    cudaDeviceSynchronize();
    cudaFree(allocs_[i]);
  }
  cudaSetDevice(prev);
}

const PeerChannel& PeerGroup::channel(int rank, int ch) const {
  if (rank < 0 || rank >= size() || ch < 0 || ch >= channels_)
    throw InvalidArgument("PeerGroup::channel: rank " + std::to_string(rank) + " / channel " + std::to_string(ch) +
                          " is outside [0, " + std::to_string(size()) + ") x [0, " + std::to_string(channels_) + ")");
  return views_[static_cast<size_t>(rank) * channels_ + ch];
}

void PeerGroup::all_reduce_bf16(int rank, const __nv_bfloat16* in, __nv_bfloat16* out, size_t count,
                                cudaStream_t stream, int ch, bool pdl, int max_ctas) const {
  const PeerChannel& v = channel(rank, ch);
  if (count == 0) return;
  if (count > capacity_)
    throw InvalidArgument("peer all-reduce: count " + std::to_string(count) + " exceeds the capacity " +
                          std::to_string(capacity_) + " of the group's buffers");
  if ((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) % 16 != 0)
    throw InvalidArgument("peer all-reduce: in and out must be 16-byte aligned");
  if (max_ctas < 0 || max_ctas > kMaxPeerCtas)
    throw InvalidArgument("peer all-reduce: max_ctas " + std::to_string(max_ctas) + " is outside [0, " +
                          std::to_string(kMaxPeerCtas) + "]");
  // Default: one CTA per 2048 elements (256 threads x one 16-byte vector
  // each), at most 128 CTAs: small messages are latency-bound (few CTAs, one
  // handshake each), large ones want many loads in flight.
  const size_t want = (count + 2047) / 2048;
  const int cap = max_ctas > 0 ? max_ctas : 128;
  const int ctas = static_cast<int>(std::max<size_t>(1, std::min<size_t>(want, static_cast<size_t>(cap))));
  const size_t chunk = ((count + ctas - 1) / ctas + 7) / 8 * 8;
  const int used = static_cast<int>((count + chunk - 1) / chunk);  // every launched CTA owns elements
  switch (v.size) {
    case 1:
      launch_ar<1>(v, in, out, count, chunk, used, pdl, stream);
      break;
    case 2:
      launch_ar<2>(v, in, out, count, chunk, used, pdl, stream);
      break;
    case 3:
      launch_ar<3>(v, in, out, count, chunk, used, pdl, stream);
      break;
    case 4:
      launch_ar<4>(v, in, out, count, chunk, used, pdl, stream);
      break;
    case 5:
      launch_ar<5>(v, in, out, count, chunk, used, pdl, stream);
      break;
    case 6:
      launch_ar<6>(v, in, out, count, chunk, used, pdl, stream);
      break;
    case 7:
      launch_ar<7>(v, in, out, count, chunk, used, pdl, stream);
      break;
    case 8:
      launch_ar<8>(v, in, out, count, chunk, used, pdl, stream);
      break;
    default:
      throw InvalidArgument("peer all-reduce: group size " + std::to_string(v.size) + " unsupported");
  }
}

void PeerGroup::reset_state() {
  DeviceGuard guard;
  for (size_t i = 0; i < allocs_.size(); ++i) {
    SS_CUDA_CHECK(cudaSetDevice(devices_[i / channels_]));
    SS_CUDA_CHECK(cudaDeviceSynchronize());
    SS_CUDA_CHECK(cudaMemset(allocs_[i], 0, kPeerDataOffset));
  }
  for (size_t i = 0; i < allocs_.size(); ++i) {
    SS_CUDA_CHECK(cudaSetDevice(devices_[i / channels_]));
    SS_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void launch_peer_allreduce_residual(const PeerChannel& ch, const int* m_active_ptr, int m_max, int N, float* h32,
                                    __nv_bfloat16* h16, float* ssq, bool pdl, cudaStream_t stream) {
  if (m_max <= 0) return;
  if (N <= 0 || N % 16 != 0)
    throw InvalidArgument("peer all-reduce + residual: N " + std::to_string(N) + " must be a positive multiple of 16");
  if (static_cast<size_t>(m_max) * N > ch.capacity)
    throw InvalidArgument("peer all-reduce + residual: " + std::to_string(m_max) + " x " + std::to_string(N) +
                          " exceeds the channel's capacity of " + std::to_string(ch.capacity) + " elements");
  if (!h32 || !h16 || !ssq || (reinterpret_cast<uintptr_t>(h32) | reinterpret_cast<uintptr_t>(h16)) % 16 != 0)
    throw InvalidArgument("peer all-reduce + residual: h32 / h16 / ssq must be non-null, h32 and h16 16-byte aligned");
  const int items = m_max * (N / 16);
  const int ctas = (items + kArThreads - 1) / kArThreads;
  if (ctas > kMaxPeerCtas)
    throw InvalidArgument("peer all-reduce + residual: " + std::to_string(ctas) + " CTAs exceed the channel's " +
                          std::to_string(kMaxPeerCtas) + " flag slots");
  switch (ch.size) {
    case 1:
      launch_arr<1>(ch, m_active_ptr, m_max, N, h32, h16, ssq, ctas, pdl, stream);
      break;
    case 2:
      launch_arr<2>(ch, m_active_ptr, m_max, N, h32, h16, ssq, ctas, pdl, stream);
      break;
    case 3:
      launch_arr<3>(ch, m_active_ptr, m_max, N, h32, h16, ssq, ctas, pdl, stream);
      break;
    case 4:
      launch_arr<4>(ch, m_active_ptr, m_max, N, h32, h16, ssq, ctas, pdl, stream);
      break;
    case 5:
      launch_arr<5>(ch, m_active_ptr, m_max, N, h32, h16, ssq, ctas, pdl, stream);
      break;
    case 6:
      launch_arr<6>(ch, m_active_ptr, m_max, N, h32, h16, ssq, ctas, pdl, stream);
      break;
    case 7:
      launch_arr<7>(ch, m_active_ptr, m_max, N, h32, h16, ssq, ctas, pdl, stream);
      break;
    case 8:
      launch_arr<8>(ch, m_active_ptr, m_max, N, h32, h16, ssq, ctas, pdl, stream);
      break;
    default:
      throw InvalidArgument("peer all-reduce + residual: group size " + std::to_string(ch.size) + " unsupported");
  }
}

}  // namespace swiftspec::cuda
