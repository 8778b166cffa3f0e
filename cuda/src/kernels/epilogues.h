// Epilogues of the skinny GEMM (gemm_skinny.h). Each one receives, for a
// 16-row weight tile `tile` (global index), the pair of output rows
// (16*tile + r, 16*tile + r + 8), r = 0..7, of token m, already summed over
// all K slices: `lo` and `hi` (fp32). All 32 lanes of a warp call apply()
// together (lanes 8q..8q+7 hold r = 0..7 of the same tile and token), so an
// epilogue may reduce over r with shuffles.
//
// Norm-fused GEMMs fold the RMSNorm weight into the weight matrix at load
// time (W'[n][k] = W[n][k] * g[k]) and receive rinv = 1/rms(x_m), so
// rinv * (W' x) = W (g * x / rms(x)) — RMSNorm fused into the GEMM (SwiftSpec
// ASPLOS'26 §5.1) without a separate pass over the activations. With int4
// weights g is applied to the activations by the kernel that writes them
// (EpiResidualNormed, the embedding) and the same epilogues apply rinv.
#pragma once
#include <cuda_bf16.h>

#include "common.h"
#include "step_desc.h"

namespace swiftspec::cuda {

/// Plain fp32 output out[m * ldo + row] (tests and GEMM benchmarks).
struct EpiPlain {
  struct Params {
    float* out = nullptr;
    int ldo = 0;
  };
  static constexpr bool kNeedsRms = false;
  static constexpr int kSmemBytes = 0;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void*, int, int) {}
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi, float,
                               int m_active) {
    if (!valid || m >= m_active) return;
    const int row = tile * 16 + r;
    p.out[static_cast<size_t>(m) * p.ldo + row] = lo;
    p.out[static_cast<size_t>(m) * p.ldo + row + 8] = hi;
  }
  __device__ static void cta_finish(const Params&, void*, int, int, int) {}
#endif
};

/// Plain fp32 output scaled by 1/rms of the token (tests of the fused-norm path):
/// out[m * ldo + row] = rinv_m * y.
struct EpiPlainRms {
  struct Params {
    float* out = nullptr;
    int ldo = 0;
  };
  static constexpr bool kNeedsRms = true;
  static constexpr int kSmemBytes = 0;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void*, int, int) {}
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi,
                               float rinv, int m_active) {
    if (!valid || m >= m_active) return;
    const int row = tile * 16 + r;
    p.out[static_cast<size_t>(m) * p.ldo + row] = lo * rinv;
    p.out[static_cast<size_t>(m) * p.ldo + row + 8] = hi * rinv;
  }
  __device__ static void cta_finish(const Params&, void*, int, int, int) {}
#endif
};

/// QKV projection: rinv scaling (fused RMSNorm), bias, RoPE, then Q to the
/// query buffer and K/V straight into the KV cache at desc->kv_index[m].
/// Weight rows are permuted so that tile t of head h holds the rotation pairs
/// (i, partner(i)) for pair index i = 8*(t mod head_dim/16) + r in (lo, hi):
/// NeoX: partner(i) = i + head_dim/2; interleaved: (2i, 2i+1).
struct EpiQKV {
  struct Params {
    const float* bias = nullptr;      ///< [N] fp32 in permuted row order, or null
    __nv_bfloat16* q = nullptr;       ///< [64][num_heads*head_dim]
    __nv_bfloat16* kcache = nullptr;  ///< this layer: [kv_heads][slots][head_dim]
    __nv_bfloat16* vcache = nullptr;
    const StepDesc* desc = nullptr;
    const float* inv_freq = nullptr;  ///< [head_dim/2] RoPE inverse frequencies
    /// cos/sin multiplier, rope_attention_scale() (swiftspec/rope.h): YaRN's attention factor,
    /// 1.0f for every other model (then not applied, so their bits do not change).
    float rope_scale = 1.0f;
    int num_heads = 0, num_kv_heads = 0, head_dim = 0, slots = 0;
    int neox = 1;
  };
  static constexpr bool kNeedsRms = true;
  static constexpr int kSmemBytes = 0;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void*, int, int) {}
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi,
                               float rinv, int m_active) {
    if (!valid || m >= m_active) return;
    float sn = 0.f, cs = 1.f;
    if (tile / (p.head_dim >> 4) < p.num_heads + p.num_kv_heads) {  // q and k rotate, v does not
      sincosf(static_cast<float>(p.desc->positions[m]) * p.inv_freq[pair_index(p, tile, r)], &sn, &cs);
      if (p.rope_scale != 1.0f) {
        cs *= p.rope_scale;
        sn *= p.rope_scale;
      }
    }
    store(p, tile, r, m, p.desc->kv_index[m], lo, hi, rinv, cs, sn);
  }
  /// RoPE pair index of row pair r of tile `tile` (0 .. head_dim/2).
  __device__ static int pair_index(const Params& p, int tile, int r) {
    const int tph = p.head_dim >> 4;
    return (tile % tph) * 8 + r;
  }
  /// The rest of apply() with the rotation's (cos, sin) given (the decode
  /// megakernel reads them from a table): scale, bias, rotate q and k, store
  /// token m's values (q row m, or K/V cache slot kv_index).
  __device__ static void store(const Params& p, int tile, int r, int m, int kv_index, float lo, float hi, float rinv,
                               float cs, float sn) {
    const int tph = p.head_dim >> 4;
    const int hh = tile / tph;
    const int i = (tile - hh * tph) * 8 + r;
    const int dlo = p.neox ? i : 2 * i;
    const int dhi = p.neox ? i + (p.head_dim >> 1) : 2 * i + 1;
    float vlo = lo * rinv, vhi = hi * rinv;
    if (p.bias) {
      vlo += p.bias[tile * 16 + r];
      vhi += p.bias[tile * 16 + 8 + r];
    }
    if (hh < p.num_heads + p.num_kv_heads) {
      const float a = vlo * cs - vhi * sn;
      const float b = vhi * cs + vlo * sn;
      vlo = a;
      vhi = b;
    }
    __nv_bfloat16* dst;
    if (hh < p.num_heads) {
      dst = p.q + static_cast<size_t>(m) * p.num_heads * p.head_dim + static_cast<size_t>(hh) * p.head_dim;
    } else {
      const int kvh = hh < p.num_heads + p.num_kv_heads ? hh - p.num_heads : hh - p.num_heads - p.num_kv_heads;
      __nv_bfloat16* base = hh < p.num_heads + p.num_kv_heads ? p.kcache : p.vcache;
      dst = base + (static_cast<size_t>(kvh) * p.slots + kv_index) * p.head_dim;
    }
    dst[dlo] = __float2bfloat16_rn(vlo);
    dst[dhi] = __float2bfloat16_rn(vhi);
  }
  __device__ static void cta_finish(const Params&, void*, int, int, int) {}
#endif
};

/// Residual add (O and down projections): h32 += y, h16 = bf16(h32), and the
/// RMSNorm statistics of the new residual: ssq[m][tile] = sum of squares of
/// its 16 rows (fixed reduction order), read by the next norm-fused GEMM.
struct EpiResidual {
  struct Params {
    float* h32 = nullptr;          ///< [64][hidden]
    __nv_bfloat16* h16 = nullptr;  ///< [64][hidden]
    float* ssq = nullptr;          ///< [64][hidden/16]
    int hidden = 0;
    /// EpiResidualNormed only: the weight [hidden] (fp32) of the RMSNorm that reads h16 next,
    /// or null (h16 then read by the LM head, whose norm is folded).
    const float* gamma = nullptr;
  };
  static constexpr bool kNeedsRms = false;
  static constexpr int kSmemBytes = 0;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void*, int, int) {}
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi, float,
                               int m_active) {
    add<false>(p, valid, tile, r, m, lo, hi, m_active);
  }
  /// apply()'s work; with kNormed, h16 = bf16(h32 * gamma[row]) (EpiResidualNormed).
  template <bool kNormed>
  __device__ static void add(const Params& p, bool valid, int tile, int r, int m, float lo, float hi, int m_active) {
    const bool act = valid && m < m_active;
    float v = 0.f;
    if (act) {
      const int row = tile * 16 + r;
      float* hp = p.h32 + static_cast<size_t>(m) * p.hidden;
      const float a = hp[row] + lo;
      const float b = hp[row + 8] + hi;
      hp[row] = a;
      hp[row + 8] = b;
      __nv_bfloat16* hb = p.h16 + static_cast<size_t>(m) * p.hidden;
      if constexpr (kNormed) {
        hb[row] = __float2bfloat16_rn(p.gamma ? a * p.gamma[row] : a);
        hb[row + 8] = __float2bfloat16_rn(p.gamma ? b * p.gamma[row + 8] : b);
      } else {
        hb[row] = __float2bfloat16_rn(a);
        hb[row + 8] = __float2bfloat16_rn(b);
      }
      v = a * a + b * b;
    }
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    if (act && r == 0) p.ssq[static_cast<size_t>(m) * (p.hidden >> 4) + tile] = v;
  }
  __device__ static void cta_finish(const Params&, void*, int, int, int) {}
#endif
};

/// EpiResidual of models with int4 projections (CudaModelOptions::int4_group_size): the
/// RMSNorm weight g cannot be folded into int4 weights (W * g is not int4), so the bf16 copy
/// the next norm-fused GEMM reads carries it instead, h16 = bf16(h32 * g) with g =
/// Params::gamma (h32 and the statistics stay unscaled; rinv still applies in that GEMM's
/// epilogue). Params::gamma null: h16 = bf16(h32), as EpiResidual.
struct EpiResidualNormed : EpiResidual {
#if defined(__CUDACC__)
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi, float,
                               int m_active) {
    add<true>(p, valid, tile, r, m, lo, hi, m_active);
  }
#endif
};

/// Gate/up projection with SwiGLU: rows are interleaved so that tile t holds
/// gate rows 8t..8t+7 in lo and the matching up rows in hi;
/// act[m][8t + r] = bf16(silu(gate) * up).
struct EpiSwiGLU {
  struct Params {
    __nv_bfloat16* act = nullptr;  ///< [64][intermediate]
    int intermediate = 0;
  };
  static constexpr bool kNeedsRms = true;
  static constexpr int kSmemBytes = 0;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void*, int, int) {}
  __device__ static void apply(const Params& p, void*, bool valid, int tile, int r, int m, float lo, float hi,
                               float rinv, int m_active) {
    if (!valid || m >= m_active) return;
    const float g = lo * rinv;
    const float u = hi * rinv;
    const float s = g / (1.0f + expf(-g));
    p.act[static_cast<size_t>(m) * p.intermediate + tile * 8 + r] = __float2bfloat16_rn(s * u);
  }
  __device__ static void cta_finish(const Params&, void*, int, int, int) {}
#endif
};

/// LM head: logits (fp32, optional) and a deterministic arg-max per token
/// (atomicMax of (value, -index) keys; ties -> smallest index).
struct EpiLMHead {
  struct Params {
    float* logits = nullptr;             ///< [rows][vocab] or null
    int vocab = 0;                       ///< real vocabulary size (logits row length)
    unsigned long long* keys = nullptr;  ///< [64] arg-max keys (zeroed by the embedding kernel)
  };
  static constexpr bool kNeedsRms = true;
  static constexpr int kSmemBytes = 64 * 8;
#if defined(__CUDACC__)
  __device__ static void cta_init(const Params&, void* esm, int tid, int nth) {
    unsigned long long* k = static_cast<unsigned long long*>(esm);
    for (int i = tid; i < 64; i += nth) k[i] = 0ull;
  }
  __device__ static void apply(const Params& p, void* esm, bool valid, int tile, int r, int m, float lo, float hi,
                               float rinv, int m_active) {
    unsigned long long key = 0ull;
    const bool act = valid && m < m_active;
    if (act) {
      const int row = tile * 16 + r;
      const float a = lo * rinv;
      const float b = hi * rinv;
      // Rows >= vocab are padding (the weight rows are padded to 16).
      if (row < p.vocab) {
        if (p.logits) p.logits[static_cast<size_t>(m) * p.vocab + row] = a;
        key = argmax_key(a, row);
      }
      if (row + 8 < p.vocab) {
        if (p.logits) p.logits[static_cast<size_t>(m) * p.vocab + row + 8] = b;
        const unsigned long long kb = argmax_key(b, row + 8);
        key = kb > key ? kb : key;
      }
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      const unsigned long long other = __shfl_xor_sync(0xffffffffu, key, o);
      key = other > key ? other : key;
    }
    if (act && r == 0) atomicMax(static_cast<unsigned long long*>(esm) + m, key);
  }
  __device__ static void cta_finish(const Params& p, void* esm, int tid, int nth, int m_active) {
    __syncthreads();
    const unsigned long long* k = static_cast<const unsigned long long*>(esm);
    for (int i = tid; i < m_active; i += nth)
      if (k[i] != 0ull) atomicMax(p.keys + i, k[i]);
  }
#endif
};

}  // namespace swiftspec::cuda
