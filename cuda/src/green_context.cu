// Green contexts: one split of each device's SMs, partitions built from it,
// and diagnostics (green_context.h).
#include "green_context.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common.h"

namespace swiftspec::cuda {

namespace {

// Driver entry points (resolved once). decltype of the prototypes in cuda.h
// gives the ABI of the versioned symbol the name maps to.
struct Driver {
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetDevResource) get_dev_resource = nullptr;
  decltype(&::cuDevSmResourceSplitByCount) split_by_count = nullptr;
  decltype(&::cuDevResourceGenerateDesc) generate_desc = nullptr;
  decltype(&::cuGreenCtxCreate) green_create = nullptr;
  decltype(&::cuGreenCtxDestroy) green_destroy = nullptr;
  decltype(&::cuCtxFromGreenCtx) ctx_from_green = nullptr;
  decltype(&::cuGreenCtxStreamCreate) green_stream_create = nullptr;
  decltype(&::cuGreenCtxGetDevResource) green_get_resource = nullptr;
  decltype(&::cuCtxPushCurrent) push = nullptr;
  decltype(&::cuCtxPopCurrent) pop = nullptr;
};

template <class Fn>
void resolve(Fn& fn, const char* name, int version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q);
  if (err != cudaSuccess) throw_cuda_error(err, "cudaGetDriverEntryPointByVersion", __FILE__, __LINE__);
  if (q != cudaDriverEntryPointSuccess || !p)
    throw CudaError(std::string("the CUDA driver has no ") + name +
                    " (green contexts need a driver for CUDA 12.5 or newer); run without sm_partition");
  fn = reinterpret_cast<Fn>(p);
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    resolve(d.get_error_string, "cuGetErrorString", 6000);
    resolve(d.device_get, "cuDeviceGet", 2000);
    resolve(d.get_dev_resource, "cuDeviceGetDevResource", 12040);
    resolve(d.split_by_count, "cuDevSmResourceSplitByCount", 12040);
    resolve(d.generate_desc, "cuDevResourceGenerateDesc", 12040);
    resolve(d.green_create, "cuGreenCtxCreate", 12040);
    resolve(d.green_destroy, "cuGreenCtxDestroy", 12040);
    resolve(d.ctx_from_green, "cuCtxFromGreenCtx", 12040);
    resolve(d.green_stream_create, "cuGreenCtxStreamCreate", 12050);
    resolve(d.green_get_resource, "cuGreenCtxGetDevResource", 12040);
    resolve(d.push, "cuCtxPushCurrent", 4000);
    resolve(d.pop, "cuCtxPopCurrent", 4000);
  });
  return d;
}

void check_cu(CUresult r, const char* what, const char* file, int line) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  if (driver().get_error_string) driver().get_error_string(r, &s);
  throw CudaError(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
                  (s ? s : "unknown error") + " (CUresult " + std::to_string(static_cast<int>(r)) + ")");
}
#define SS_CU_CHECK(call) check_cu((call), #call, __FILE__, __LINE__)

// The split of one device, kept for the process (resources are plain structs).
struct DeviceSplit {
  SmSplitInfo info;
  CUdevice dev = 0;
  std::vector<CUdevResource> groups;  // remainder last when info.has_remainder
};

std::mutex g_split_mu;
std::map<int, std::unique_ptr<DeviceSplit>>& splits() {
  static std::map<int, std::unique_ptr<DeviceSplit>> m;
  return m;
}

DeviceSplit& device_split(int device) {
  std::lock_guard<std::mutex> lock(g_split_mu);
  auto& m = splits();
  auto it = m.find(device);
  if (it != m.end()) return *it->second;
  const Driver& d = driver();
  SS_CUDA_CHECK(cudaSetDevice(device));
  SS_CUDA_CHECK(cudaFree(nullptr));  // primary context up before green contexts (cuda.h advice)
  auto s = std::make_unique<DeviceSplit>();
  SS_CU_CHECK(d.device_get(&s->dev, device));
  CUdevResource full;
  SS_CU_CHECK(d.get_dev_resource(s->dev, &full, CU_DEV_RESOURCE_TYPE_SM));
  SmSplitInfo& info = s->info;
  info.device = device;
  info.device_sms = static_cast<int>(full.sm.smCount);
  info.min_partition = static_cast<int>(full.sm.minSmPartitionSize);
  info.coscheduled_alignment = static_cast<int>(full.sm.smCoscheduledAlignment);
  const unsigned unit = std::max(1u, full.sm.minSmPartitionSize);
  unsigned n = 0;
  SS_CU_CHECK(d.split_by_count(nullptr, &n, &full, nullptr, 0, unit));
  s->groups.resize(n);
  CUdevResource rem{};
  if (n > 0) SS_CU_CHECK(d.split_by_count(s->groups.data(), &n, &full, &rem, 0, unit));
  s->groups.resize(n);
  if (rem.type == CU_DEV_RESOURCE_TYPE_SM && rem.sm.smCount > 0) {
    s->groups.push_back(rem);
    info.has_remainder = true;
  }
  int at = 0;
  info.boundaries.push_back(0);
  for (const CUdevResource& g : s->groups) {
    info.group_sms.push_back(static_cast<int>(g.sm.smCount));
    at += static_cast<int>(g.sm.smCount);
    info.boundaries.push_back(at);
  }
  info.device_sms = at;  // = full.sm.smCount unless the driver keeps SMs out of every group
  return *m.emplace(device, std::move(s)).first->second;
}

__global__ void cluster_probe_kernel() {}

__global__ void smid_probe_kernel(int* out, long long spin_cycles) {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  const long long t0 = clock64();
  while (clock64() - t0 < spin_cycles) {
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int>(smid);
}

}  // namespace

const SmSplitInfo& sm_split_info(int device) { return device_split(device).info; }

GreenContext::GreenContext(int device, int first, int count) : device_(device) {
  DeviceSplit& s = device_split(device);
  const Driver& d = driver();
  range_ = resolve_sm_partition(first, count, s.info.device_sms, s.info.boundaries, "sm_partition");
  std::vector<CUdevResource> picked;
  for (size_t i = 0; i < s.groups.size(); ++i)
    if (s.info.boundaries[i] >= range_.first && s.info.boundaries[i + 1] <= range_.end()) picked.push_back(s.groups[i]);
  CUdevResourceDesc desc = nullptr;
  SS_CU_CHECK(d.generate_desc(&desc, picked.data(), static_cast<unsigned>(picked.size())));
  SS_CU_CHECK(d.green_create(&green_, desc, s.dev, CU_GREEN_CTX_DEFAULT_STREAM));
  SS_CU_CHECK(d.ctx_from_green(&ctx_, green_));
  CUdevResource mine;
  SS_CU_CHECK(d.green_get_resource(green_, &mine, CU_DEV_RESOURCE_TYPE_SM));
  sm_count_ = static_cast<int>(mine.sm.smCount);

  // The GEMM kernels launch clusters of up to 8 CTAs (K slices): check that
  // the partition holds one with one CTA per SM (more than half an SM's
  // shared memory per CTA), in this context.
  cudaDeviceProp prop;
  SS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const int smem = static_cast<int>(prop.sharedMemPerBlockOptin / 2 + 1024);
  push();
  try {
    SS_CUDA_CHECK(cudaFuncSetAttribute(cluster_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(8, 1, 1);
    lc.blockDim = dim3(128, 1, 1);
    lc.dynamicSmemBytes = static_cast<size_t>(smem);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 8;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    lc.attrs = attr;
    lc.numAttrs = 1;
    SS_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters8_, cluster_probe_kernel, &lc));
  } catch (...) {
    try_pop();
    d.green_destroy(green_);
    throw;
  }
  pop();
  if (clusters8_ < 1) {
    d.green_destroy(green_);
    throw InvalidArgument("sm_partition [" + std::to_string(first) + ", " + std::to_string(count) + "] (" +
                          std::to_string(sm_count_) +
                          " SMs) cannot hold a cluster of 8 CTAs on 8 SMs, which the GEMM kernels launch; "
                          "give the group more SMs");
  }
}

GreenContext::~GreenContext() {
  if (green_) driver().green_destroy(green_);
}

cudaStream_t GreenContext::create_stream(int priority) {
  CUstream s = nullptr;
  SS_CU_CHECK(driver().green_stream_create(&s, green_, CU_STREAM_NON_BLOCKING, priority));
  return reinterpret_cast<cudaStream_t>(s);
}

void GreenContext::push() const { SS_CU_CHECK(driver().push(ctx_)); }

void GreenContext::pop() const {
  CUcontext popped = nullptr;
  SS_CU_CHECK(driver().pop(&popped));
}

bool GreenContext::try_push() const noexcept { return driver().push(ctx_) == CUDA_SUCCESS; }

bool GreenContext::try_pop() const noexcept {
  CUcontext popped = nullptr;
  return driver().pop(&popped) == CUDA_SUCCESS;
}

std::vector<int> probe_sm_ids(cudaStream_t stream, int ctas, int spin_us) {
  if (ctas < 1) throw InvalidArgument("probe_sm_ids: ctas must be >= 1");
  int* dev = nullptr;
  SS_CUDA_CHECK(cudaMalloc(&dev, sizeof(int) * ctas));
  std::vector<int> host(ctas, -1);
  try {
    SS_CUDA_CHECK(cudaMemsetAsync(dev, 0xFF, sizeof(int) * ctas, stream));
    smid_probe_kernel<<<ctas, 32, 0, stream>>>(dev, static_cast<long long>(spin_us) * 2000);
    SS_CUDA_CHECK(cudaGetLastError());
    SS_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev, sizeof(int) * ctas, cudaMemcpyDeviceToHost, stream));
    SS_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaFree(dev);
    throw;
  }
  SS_CUDA_CHECK(cudaFree(dev));
  std::set<int> ids(host.begin(), host.end());
  return std::vector<int>(ids.begin(), ids.end());
}

}  // namespace swiftspec::cuda
