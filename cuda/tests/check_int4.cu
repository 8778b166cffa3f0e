// int4-weight GEMM checks (issue 31): kernels/gemm_int4.h against an fp64 host product of
// the same int4 values, at the benchmark models' projection shapes; batch invariance bitwise.
//
// Inputs: random int4 tensors in the checkpoint format (docs/checkpoint_format.md, "int4
// weights": qweight [N][K/2], fp16 scales and uint8 zero points [N][K/G]) with q != z, so
// that no weight is zero (the harness's rule: a kernel that skips a term cannot pass), and
// random bf16 activations without zeros; they go through upload_int4_matrix (the load-time
// re-layout on the GPU), so the layout is checked with the kernel. Outputs are poisoned
// (0xFF bytes, NaN) before each run; rows >= M must keep the poison.
//
// Tolerances. The weights are exact: (q - z) * s is exact in fp32 and q - z exact in bf16,
// and the kernel's products x * (q - z) are exact in the tensor cores; what differs from
// the fp64 reference is only the fp32 summation: within a group the tensor cores add G / 16
// mma steps (a few alignments / roundings each, truncating: relative 2^-23 each), then one
// fmaf per group and slice (K_slice / G, round to nearest), then S partials in slice order.
// The first-order bound of a sum evaluated with n roundings is n * u * sum |terms|, so per
// output element
//     |y - ref| <= (2 G / 16 + K / G + S + 2) * 2^-21 * sum_k |x_k w_k|
// (2^-21: a factor 4 over u = 2^-23 for the tensor cores' undocumented internal order);
// e.g. 8B down (K = 14336, G = 128, S = 8): 44 * 2^-21 = 2.1e-5 of sum |x w|, while a single
// wrong weight moves y by about sum |x w| / K = 7e-5 of it. And the Frobenius relative error
// ||y - ref|| / ||ref|| <= 1e-4 (a wrong nibble slot, scale or zero point gives >= 1e-2).
// Batch invariance is bitwise: every row of every M, and a single token taken from any X
// row (x_row0), against the same row of the M = 64 batch; and across row-block sizes.
#include "check_int4.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "check_harness.h"
#include "common.h"
#include "device_memory.h"
#include "kernels/epilogues.h"
#include "kernels/gemm_int4.h"
#include "model_shapes.h"
#include "step_desc.h"
#include "tma_map.h"

namespace swiftspec::cuda_check {

using namespace swiftspec::cuda;

namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
  const int e = (h >> 10) & 31;
  const uint32_t man = h & 0x3FF;
  float f;
  if (e == 0) {
    f = std::ldexp(static_cast<float>(man), -24);  // subnormal (or zero)
    return sign ? -f : f;
  }
  if (e == 31) {
    const uint32_t u = sign | 0x7F800000u | (man << 13);
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint32_t u = sign | (static_cast<uint32_t>(e - 15 + 127) << 23) | (man << 13);
  std::memcpy(&f, &u, 4);
  return f;
}

/// An int4 matrix in the checkpoint format.
struct HostInt4 {
  int N = 0, K = 0, G = 0;
  std::vector<uint8_t> q;   // [N][K/2]
  std::vector<uint16_t> s;  // [N][K/G]
  std::vector<uint8_t> z;   // [N][K/G]
  int nib(int n, int k) const {
    const uint8_t b = q[static_cast<size_t>(n) * (K / 2) + k / 2];
    return (k & 1) ? (b >> 4) : (b & 15);
  }
  /// The CPU backend's dequantized weight: (q - z) * s in fp32 (exact).
  float w(int n, int k) const {
    const size_t gi = static_cast<size_t>(n) * (K / G) + k / G;
    return static_cast<float>(nib(n, k) - static_cast<int>(z[gi])) * half_to_float(s[gi]);
  }
};

HostInt4 random_int4(int N, int K, int G, Rng& rng) {
  HostInt4 h;
  h.N = N;
  h.K = K;
  h.G = G;
  const int ng = K / G;
  h.s.resize(static_cast<size_t>(N) * ng);
  h.z.resize(h.s.size());
  for (size_t i = 0; i < h.s.size(); ++i) {
    const uint64_t r = rng.g();
    // +-[2^-9, 2^-8): exponent 6, random mantissa and sign
    h.s[i] = static_cast<uint16_t>(((r & 1) << 15) | (6u << 10) | ((r >> 8) & 0x3FF));
    h.z[i] = static_cast<uint8_t>((r >> 20) & 15);
  }
  h.q.resize(static_cast<size_t>(N) * K / 2);
  uint64_t bits = 0;
  int left = 0;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; k += 2) {
      uint8_t b = 0;
      for (int e = 0; e < 2; ++e) {
        if (left == 0) {
          bits = rng.g();
          left = 16;
        }
        int v = static_cast<int>(bits & 15);
        bits >>= 4;
        --left;
        const int z = h.z[static_cast<size_t>(n) * ng + (k + e) / G];
        if (v == z) v = (v + 1 + static_cast<int>(rng.g() % 15)) & 15;  // q != z: no zero weight
        b |= static_cast<uint8_t>(v << (4 * e));
      }
      h.q[static_cast<size_t>(n) * (K / 2) + k / 2] = b;
    }
  return h;
}

/// fp64 reference rows [0, R) of Y = X W^T (device row n = checkpoint row perm[n]) and the
/// per-element sums of |x w|.
void reference(const HostInt4& h, const std::vector<uint16_t>& x, int R, const std::vector<int>& perm,
               std::vector<double>& ref, std::vector<double>& mag) {
  const int N = h.N, K = h.K;
  ref.assign(static_cast<size_t>(R) * N, 0.0);
  mag.assign(ref.size(), 0.0);
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf2f(x[i]);
  parallel_for(N, [&](int n) {
    const int sn = perm.empty() ? n : perm[n];
    std::vector<double> wr(K);
    for (int k = 0; k < K; ++k) wr[k] = h.w(sn, k);
    for (int m = 0; m < R; ++m) {
      const float* xm = xf.data() + static_cast<size_t>(m) * K;
      double s = 0, a = 0;
      for (int k = 0; k < K; ++k) {
        const double p = wr[k] * xm[k];
        s += p;
        a += std::fabs(p);
      }
      ref[static_cast<size_t>(m) * N + n] = s;
      mag[static_cast<size_t>(m) * N + n] = a;
    }
  });
}

int bucket_nt(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

std::string plan_desc(const Int4GemmConfig& c) {
  char b[128];
  std::snprintf(b, sizeof b, "S=%d BR=%d warps=%d stages=%d grid=%dx%d", c.S, c.BR, c.WR, c.stages, c.grid_x, c.S);
  return b;
}

struct Int4Case {
  std::string name;
  int N, K, G;
  std::vector<int> Ms;
  bool perm = false;
  std::vector<int> warps;  // extra plans (row-block sizes) whose rows must equal the planner's bitwise
};

void check_case(const Int4Case& cs, Rng& rng, int sms, cudaStream_t st) {
  constexpr int R = kMaxStepTokens;
  const int N = cs.N, K = cs.K, G = cs.G;
  const HostInt4 h = random_int4(N, K, G, rng);
  std::vector<int> perm;
  if (cs.perm) {
    perm.resize(N);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.g);
  }
  std::vector<uint16_t> x(static_cast<size_t>(R) * K);
  for (auto& v : x) v = f2bf(rng.sym(1.0f));
  std::vector<double> ref, mag;
  reference(h, x, R, perm, ref, mag);

  Int4Matrix wm =
      upload_int4_matrix(h.q.data(), h.s.data(), h.z.data(), perm.empty() ? nullptr : perm.data(), N, K, G, st);
  DeviceBuffer dx(x.size() * 2), dout(sizeof(float) * R * N), drow(sizeof(int));
  SS_CUDA_CHECK(cudaMemcpyAsync(dx.get(), x.data(), dx.bytes(), cudaMemcpyHostToDevice, st));
  std::vector<float> out(static_cast<size_t>(R) * N);

  // Runs M tokens from X row x_row0 (-1: no pointer) with plan c; out <- the whole buffer.
  auto run = [&](int M, const Int4GemmConfig& c, int x_row0) {
    const CUtensorMap xm = make_tma_map_bf16(dx.get(), R, K, K, 8 * c.NT);
    GemmArgs a;
    a.N = N;
    a.K = K;
    a.m_active_max = M;
    if (x_row0 >= 0) {
      SS_CUDA_CHECK(cudaMemcpyAsync(drow.get(), &x_row0, sizeof(int), cudaMemcpyHostToDevice, st));
      a.x_row0_ptr = drow.as<int>();
    }
    EpiPlain::Params e;
    e.out = dout.as<float>();
    e.ldo = N;
    SS_CUDA_CHECK(cudaMemsetAsync(dout.get(), 0xFF, dout.bytes(), st));
    launch_gemm_int4<EpiPlain>(c, wm.view(), xm, a, e, false, st);
    SS_CUDA_CHECK(cudaStreamSynchronize(st));
    SS_CUDA_CHECK(cudaMemcpy(out.data(), dout.get(), dout.bytes(), cudaMemcpyDeviceToHost));
  };

  std::vector<float> base;  // rows of the M = 64 (largest M) run
  std::vector<int> Ms = cs.Ms;
  std::sort(Ms.begin(), Ms.end(), [](int a, int b) { return a > b; });  // largest first: the baseline
  for (int M : Ms) {
    const Int4GemmConfig c = plan_gemm_int4<EpiPlain>(N, K, G, bucket_nt(M), sms);
    run(M, c, -1);
    double num = 0, den = 0, worst = 0;
    size_t bad = 0, touched = 0;
    const double nr = 2.0 * G / 16 + static_cast<double>(K) / G + c.S + 2;
    for (size_t i = 0; i < static_cast<size_t>(M) * N; ++i) {
      if (!std::isfinite(out[i])) {
        ++bad;
        continue;
      }
      const double d = out[i] - ref[i];
      num += d * d;
      den += ref[i] * ref[i];
      worst = std::max(worst, std::fabs(d) / (nr * std::ldexp(1.0, -21) * mag[i]));
    }
    for (size_t i = static_cast<size_t>(M) * N; i < out.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &out[i], 4);
      if (u != 0xFFFFFFFFu) ++touched;
    }
    const double err = std::sqrt(num / std::max(den, 1e-300));
    char name[160], det[240];
    std::snprintf(name, sizeof name, "int4 gemm %s N=%d K=%d G=%d M=%d", cs.name.c_str(), N, K, G, M);
    std::snprintf(det, sizeof det, "(%s; max err/bound %.3f, nonfinite=%zu rows>=M written=%zu)", plan_desc(c).c_str(),
                  worst, bad, touched);
    record(name, err, 1e-4, err <= 1e-4 && worst <= 1.0 && bad == 0 && touched == 0, det);
    if (base.empty()) {
      base = out;
      continue;
    }
    const bool same = std::memcmp(out.data(), base.data(), sizeof(float) * M * N) == 0;
    std::snprintf(name, sizeof name, "int4 gemm %s M=%d rows bitwise == M=%d", cs.name.c_str(), M, Ms[0]);
    record(name, same ? 0.0 : 1.0, 0.0, same);
  }
  // One token taken from X row r: the bits of row r of the batch.
  {
    const Int4GemmConfig c1 = plan_gemm_int4<EpiPlain>(N, K, G, 1, sms);
    int diff = 0;
    std::string rows;
    for (int r : {1, 31, Ms[0] - 1}) {
      if (r >= Ms[0] || r < 0) continue;
      run(1, c1, r);
      if (std::memcmp(out.data(), base.data() + static_cast<size_t>(r) * N, sizeof(float) * N) != 0) ++diff;
      if (!rows.empty()) rows += ',';
      rows += std::to_string(r);
    }
    char name[160];
    std::snprintf(name, sizeof name, "int4 gemm %s M=1 at x rows %s bitwise == batch rows", cs.name.c_str(),
                  rows.c_str());
    record(name, diff, 0.0, diff == 0);
  }
  // Other row-block sizes (the planner's choice varies with M and the GPU): the same bits.
  for (int wr : cs.warps) {
    Int4PlanHint hint;
    hint.warps = wr;
    const int M = Ms[0];
    const Int4GemmConfig c = plan_gemm_int4<EpiPlain>(N, K, G, bucket_nt(M), sms, hint);
    run(M, c, -1);
    const bool same = std::memcmp(out.data(), base.data(), sizeof(float) * M * N) == 0;
    char name[160];
    std::snprintf(name, sizeof name, "int4 gemm %s M=%d %d warps (%s) bitwise == planner's", cs.name.c_str(), M, wr,
                  plan_desc(c).c_str());
    record(name, same ? 0.0 : 1.0, 0.0, same);
  }
}

/// Shapes and values the kernel must refuse, before any launch.
void check_refusals(cudaStream_t st) {
  auto expect_refusal = [](const std::string& what, auto&& f) {
    std::string msg;
    try {
      f();
    } catch (const InvalidArgument& e) {
      msg = e.what();
    } catch (const std::exception& e) {
      msg = std::string("wrong exception: ") + e.what();
    }
    const bool ok = !msg.empty() && msg.rfind("wrong exception", 0) != 0;
    std::string detail = "(";
    detail += msg.empty() ? std::string("accepted") : msg;
    detail += ")";
    record("int4 refuses " + what, ok ? 0.0 : 1.0, 0.0, ok, detail);
  };
  expect_refusal("G=48", [] { check_int4_shape(256, 384, 48); });
  expect_refusal("G not dividing K", [] { check_int4_shape(256, 320, 128); });
  expect_refusal("K % 64 != 0", [] { check_int4_shape(256, 96, 32); });
  expect_refusal("N % 16 != 0", [] { check_int4_shape(40, 256, 128); });
  expect_refusal("NT=3", [] { plan_gemm_int4<EpiPlain>(256, 256, 128, 3, 132); });
  const int N = 32, K = 256, G = 128;
  std::vector<uint8_t> q(N * K / 2, 0x21), z(N * K / G, 3);
  std::vector<uint16_t> s(N * K / G, 0x3C00);
  z[5] = 16;
  expect_refusal("a zero point of 16", [&] { upload_int4_matrix(q.data(), s.data(), z.data(), nullptr, N, K, G, st); });
  z[5] = 3;
  s[7] = 0x7C00;
  expect_refusal("an infinite scale", [&] { upload_int4_matrix(q.data(), s.data(), z.data(), nullptr, N, K, G, st); });
  s[7] = 0x3C00;
  std::vector<int> perm(N, 0);
  expect_refusal("a perm that is not a permutation",
                 [&] { upload_int4_matrix(q.data(), s.data(), z.data(), perm.data(), N, K, G, st); });
}

}  // namespace

void check_int4() {
  try {
    int dev = 0;
    SS_CUDA_CHECK(cudaGetDevice(&dev));
    int sms = 0;
    SS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaStream_t st;
    SS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Rng rng(20260531);
    check_refusals(st);
    const std::vector<int> Ms = {1, 2, 16, 33, 64};
    std::vector<Int4Case> cases;
    // Small cases first: the layout's corners.
    cases.push_back({"perm", 256, 512, 64, {1, 9, 64}, true, {}});
    cases.push_back({"G=32", 512, 1536, 32, {1, 16, 64}, false, {}});
    cases.push_back({"G=256", 512, 1536, 256, {1, 33, 64}, false, {}});
    cases.push_back({"K tail, partial row block", 272, 960, 64, {1, 17, 64}, false, {2, 4, 8}});
    for (const char* sh : {"qwen2.5-0.5b", "qwen2.5-1.5b", "llama3-8b"}) {
      const ModelConfig c = shape_config(sh);
      const int H = c.hidden_size, I = c.intermediate_size;
      const int nq = c.num_heads * c.head_dim, nkv = c.num_kv_heads * c.head_dim;
      const std::string s = sh;
      cases.push_back({s + " qkv", nq + 2 * nkv, H, 128, Ms, false, {}});
      cases.push_back({s + " o", H, nq, 128, Ms, false, {}});
      cases.push_back({s + " gate_up", 2 * I, H, 128, Ms, false, {}});
      cases.push_back(
          {s + " down", H, I, 128, Ms, false, s == "qwen2.5-1.5b" ? std::vector<int>{2, 4, 8} : std::vector<int>{}});
    }
    for (const auto& cs : cases) check_case(cs, rng, sms, st);
    cudaStreamDestroy(st);
  } catch (const std::exception& e) {
    record("int4 checks (aborted)", NAN, 0.0, false, std::string("exception: ") + e.what());
  }
}

}  // namespace swiftspec::cuda_check
