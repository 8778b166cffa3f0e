// The tensor-parallel hooks of the CUDA model (row_parallel_impl.h).
#include "multigpu/row_parallel_impl.h"

#include <map>
#include <string>
#include <tuple>

#include "common.h"
#include "device_memory.h"
#include "multigpu/epi_allreduce.h"
#include "step_desc.h"
#include "tma_map.h"

namespace swiftspec::cuda {

namespace {

/// GEMM plans and TMA maps of one rank, cached by shape / buffer.
template <class Epi>
class PlanCache {
 public:
  explicit PlanCache(int num_sms) : num_sms_(num_sms) {}
  const GemmConfig& plan(int N, int K, int nt) {
    const auto k = std::make_tuple(N, K, nt);
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second;
    return plans_.emplace(k, plan_gemm<Epi>(N, K, nt, num_sms_)).first->second;
  }
  const CUtensorMap& map(const void* base, int rows, int cols, int box_rows) {
    const auto k = std::make_tuple(base, rows, cols, box_rows);
    auto it = maps_.find(k);
    if (it != maps_.end()) return it->second;
    return maps_.emplace(k, make_tma_map_bf16(base, rows, cols, cols, box_rows)).first->second;
  }

 private:
  int num_sms_;
  std::map<std::tuple<int, int, int>, GemmConfig> plans_;
  std::map<std::tuple<const void*, int, int, int>, CUtensorMap> maps_;
};

void check_device(int want, const char* who) {
  int dev = 0;
  SS_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != want)
    throw InvalidArgument(std::string(who) + ": called on device " + std::to_string(dev) + ", but the rank's GPU is " +
                          std::to_string(want));
}

class PeerRowParallel final : public RowParallel {
 public:
  PeerRowParallel(const PeerGroup& g, int rank, int num_sms, PeerRowMode mode)
      : g_(g), rank_(rank), mode_(mode), cache_(num_sms), store_cache_(num_sms) {
    if (rank < 0 || rank >= g.size())
      throw InvalidArgument("make_peer_row_parallel: rank " + std::to_string(rank) + " is outside [0, " +
                            std::to_string(g.size()) + ")");
  }
  void residual_gemm(Kind kind, const void* w, const void* x, int nt, const GemmArgs& args,
                     const EpiResidual::Params& res, bool pdl, cudaStream_t stream) override {
    check_device(g_.device(rank_), "peer row-parallel GEMM");
    const PeerChannel& ch = g_.channel(rank_, static_cast<int>(kind) % g_.channels());
    if (mode_ == PeerRowMode::TwoKernel) {
      const GemmConfig& c = store_cache_.plan(args.N, args.K, nt);
      if (static_cast<size_t>(args.m_active_max) * args.N > ch.capacity)
        throw InvalidArgument("peer row-parallel GEMM: outputs exceed the channel's capacity");
      EpiPeerStore::Params e;
      e.ch = ch;
      e.N = args.N;
      launch_gemm<EpiPeerStore>(c, store_cache_.map(w, args.N, args.K, c.BR),
                                store_cache_.map(x, kMaxStepTokens, args.K, 8 * nt), args, e, pdl, stream);
      launch_peer_allreduce_residual(ch, args.m_active_ptr, args.m_active_max, args.N, res.h32, res.h16, res.ssq, pdl,
                                     stream);
      return;
    }
    const GemmConfig& c = cache_.plan(args.N, args.K, nt);
    EpiAllReduce::Params e;
    e.ch = ch;
    e.N = args.N;
    e.out = AllReduceOut::Residual;
    e.h32 = res.h32;
    e.h16 = res.h16;
    e.ssq = res.ssq;
    launch_gemm_allreduce(c, cache_.map(w, args.N, args.K, c.BR), cache_.map(x, kMaxStepTokens, args.K, 8 * nt), args,
                          e, pdl, stream);
  }
  int size() const override { return g_.size(); }
  int rank() const override { return rank_; }
  const char* name() const override { return mode_ == PeerRowMode::Fused ? "peer-fused" : "peer-2kernel"; }

 private:
  const PeerGroup& g_;
  int rank_;
  PeerRowMode mode_;
  PlanCache<EpiAllReduce> cache_;
  PlanCache<EpiPeerStore> store_cache_;
};

#if defined(SWIFTSPEC_HAVE_NCCL)
class NcclRowParallel final : public RowParallel {
 public:
  NcclRowParallel(CudaCommunicator& comm, int hidden, int num_sms) : comm_(comm), hidden_(hidden), cache_(num_sms) {
    if (hidden <= 0 || hidden % 16 != 0)
      throw InvalidArgument("make_nccl_row_parallel: hidden " + std::to_string(hidden) +
                            " must be a positive multiple of 16");
    SS_CUDA_CHECK(cudaSetDevice(comm.device()));
    y_.allocate(sizeof(__nv_bfloat16) * kMaxStepTokens * static_cast<size_t>(hidden));
    SS_CUDA_CHECK(cudaMemset(y_.get(), 0, y_.bytes()));  // rows past m_active stay finite in the all-reduce
    SS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void residual_gemm(Kind, const void* w, const void* x, int nt, const GemmArgs& args, const EpiResidual::Params& res,
                     bool pdl, cudaStream_t stream) override {
    check_device(comm_.device(), "NCCL row-parallel GEMM");
    if (args.N != hidden_)
      throw InvalidArgument("NCCL row-parallel GEMM: N " + std::to_string(args.N) + " is not the hidden size " +
                            std::to_string(hidden_));
    const GemmConfig& c = cache_.plan(args.N, args.K, nt);
    EpiStoreBf16::Params e;
    e.out = y_.as<__nv_bfloat16>();
    e.ldo = args.N;
    launch_gemm<EpiStoreBf16>(c, cache_.map(w, args.N, args.K, c.BR), cache_.map(x, kMaxStepTokens, args.K, 8 * nt),
                              args, e, pdl, stream);
    comm_.set_stream(stream);
    comm_.all_reduce_sum_bf16(y_.get(), static_cast<size_t>(args.m_active_max) * args.N);
    launch_residual_add(y_.as<__nv_bfloat16>(), args.m_active_ptr, args.m_active_max, res.h32, res.h16, res.ssq, args.N,
                        pdl, stream);
  }
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  const char* name() const override { return "nccl"; }

 private:
  CudaCommunicator& comm_;
  int hidden_;
  DeviceBuffer y_;
  PlanCache<EpiStoreBf16> cache_;
};
#endif

}  // namespace

std::shared_ptr<RowParallel> make_peer_row_parallel(const PeerGroup& group, int rank, int num_sms, PeerRowMode mode) {
  return std::make_shared<PeerRowParallel>(group, rank, num_sms, mode);
}

#if defined(SWIFTSPEC_HAVE_NCCL)
std::shared_ptr<RowParallel> make_nccl_row_parallel(CudaCommunicator& comm, int hidden, int num_sms) {
  return std::make_shared<NcclRowParallel>(comm, hidden, num_sms);
}
#endif

}  // namespace swiftspec::cuda
