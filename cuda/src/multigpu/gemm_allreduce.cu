// Instantiation of the skinny GEMM with the fused all-reduce epilogue
// (epi_allreduce.h), and its checked launcher.
#include <cstdint>
#include <string>

#include "kernels/gemm_skinny.cuh"
#include "multigpu/epi_allreduce.h"

namespace swiftspec::cuda {

SS_INSTANTIATE_GEMM(EpiAllReduce)

void launch_gemm_allreduce(const GemmConfig& cfg, const CUtensorMap& wmap, const CUtensorMap& xmap,
                           const GemmArgs& args, EpiAllReduce::Params ep, bool pdl, cudaStream_t stream) {
  if (ep.N != args.N || ep.N % 16 != 0)
    throw InvalidArgument("gemm+all-reduce: epilogue N " + std::to_string(ep.N) + " must equal GEMM N " +
                          std::to_string(args.N) + " and be a multiple of 16");
  const size_t need = static_cast<size_t>(args.m_active_max) * static_cast<size_t>(ep.N);
  if (need > ep.ch.capacity)
    throw InvalidArgument("gemm+all-reduce: " + std::to_string(args.m_active_max) + " x " + std::to_string(ep.N) +
                          " outputs exceed the peer channel's capacity of " + std::to_string(ep.ch.capacity) +
                          " elements");
  if (static_cast<long>(cfg.grid_x) * cfg.S > kMaxPeerCtas)
    throw InvalidArgument("gemm+all-reduce: grid of " + std::to_string(cfg.grid_x * cfg.S) + " CTAs exceeds the " +
                          std::to_string(kMaxPeerCtas) + " flag slots of a peer channel");
  if (32 * cfg.WR < ep.ch.size)
    throw InvalidArgument("gemm+all-reduce: CTAs of " + std::to_string(32 * cfg.WR) + " threads cannot signal " +
                          std::to_string(ep.ch.size) + " ranks");
  if (ep.out == AllReduceOut::Residual && (!ep.h32 || !ep.h16 || !ep.ssq))
    throw InvalidArgument("gemm+all-reduce: residual output needs h32, h16 and ssq");
  if (ep.out == AllReduceOut::F32 && !ep.out32) throw InvalidArgument("gemm+all-reduce: out32 is null");
  if (ep.out == AllReduceOut::Bf16 && !ep.out16) throw InvalidArgument("gemm+all-reduce: out16 is null");
  const auto misaligned = [](const void* p) { return p && reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (misaligned(ep.out32) || misaligned(ep.out16) || misaligned(ep.h32) || misaligned(ep.h16))
    throw InvalidArgument("gemm+all-reduce: output buffers must be 16-byte aligned");
  if (ep.out != AllReduceOut::Residual && (ep.ldo < ep.N || ep.ldo % 8 != 0))
    throw InvalidArgument("gemm+all-reduce: ldo " + std::to_string(ep.ldo) + " must be >= N and a multiple of 8");
  ep.br = cfg.BR;
  launch_gemm<EpiAllReduce>(cfg, wmap, xmap, args, ep, pdl, stream);
}

}  // namespace swiftspec::cuda
