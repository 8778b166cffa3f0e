// Attention of a decode / verification step over the committed KV plus the
// tree KV with the tree mask (SwiftSpec ASPLOS'26 §4.2 tree-aware KV cache,
// §5.2 fused kernels).
//
// Logical key order of token t: committed slots [0, prefix_len_t), then its
// tree ancestors by depth (the attend list, itself last). A tree key at depth
// a sits at logical position committed + a for every token that attends it,
// so a chunk of kAttnChunk logical positions is the same set of keys for all
// tokens of a step; the union of the chunk's keys over a block of tokens is
// loaded once and masked per token.
//
// Grid: (kv head, token block of T tokens, kAttnSplits). Per chunk a CTA
//   1. builds the chunk's key list in logical order with a per-token mask,
//   2. S = Q K^T with mma.sync (one dot product per element: its value does
//      not depend on where the key sits in the tile),
//   3. per query head: max, p = exp(s - max), and sum_j p_j and sum_j p_j v_j
//      sequentially in logical order over the attended keys only (keys of
//      the block's union that a token does not attend add exact zeros),
//   4. writes (max, sum, o) of the chunk.
// The last CTA of a (kv head, token block) — an atomic counter, reset by that
// CTA — combines the chunks in chunk order. The arithmetic seen by a token is
// therefore the same whether it is decoded alone or verified inside a tree,
// and whatever the step's batch size.
#include <atomic>
#include <cmath>

#include "common.h"
#include "kernels/kernels.h"

namespace swiftspec::cuda {

namespace {

constexpr int kAttnThreads = 256;
constexpr int kMaxTokPerBlock = 8;
constexpr int kUMax = kAttnChunk * kMaxTokPerBlock;

template <int HD>
constexpr size_t attn_smem_bytes() {
  constexpr int LD = HD + 8;
  return size_t(16 + 64 + 64) * LD * 2 + size_t(16) * kUMax * 4 + size_t(kUMax) * 4 + kUMax;
}

template <int HD>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(const AttnParams p) {
  constexpr int LD = HD + 8;
  constexpr int CH = HD / 8;    // 16-byte chunks per row
  constexpr int DPT = HD / 16;  // dims per thread in the PV loop
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [16][LD]
  __nv_bfloat16* Ks = Qs + 16 * LD;                                // [64][LD]
  __nv_bfloat16* Vs = Ks + 64 * LD;                                // [64][LD]
  float* Ss = reinterpret_cast<float*>(Vs + 64 * LD);              // [16][kUMax]
  int* keys = reinterpret_cast<int*>(Ss + 16 * kUMax);             // [kUMax]
  unsigned char* kmask = reinterpret_cast<unsigned char*>(keys + kUMax);  // [kUMax]
  __shared__ int s_U;
  __shared__ int s_last;
  __shared__ float s_m[16];

  // Benchmark trace (AttnParams::trace): thread 0 stamps the phases.
  unsigned long long* tr =
      p.trace == nullptr
          ? nullptr
          : p.trace + ((static_cast<size_t>(blockIdx.x) * kMaxStepTokens + blockIdx.y) * kAttnSplits + blockIdx.z) *
                          kAttnTraceStamps;
  const auto stamp = [&](int i) {
    if (tr != nullptr && threadIdx.x == 0) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      tr[i] = t;
    }
  };
  stamp(0);
  griddep_launch_dependents();
  griddep_wait();
  stamp(1);

  const StepDesc* d = p.desc;
  const int kvh = blockIdx.x;
  const int blk = blockIdx.y;
  const int split = blockIdx.z;
  const int T = p.tokens_per_block;
  const int G = p.group;
  const int n = d->n;
  const int tok0 = blk * T;
  if (tok0 >= n) return;
  const int tact = min(T, n - tok0);
  const int C = d->committed;
  const bool tree = d->is_tree != 0;
  int maxP = 0, maxlen = 0, nch = 0;
  for (int t = 0; t < tact; ++t) {
    const int tk = tok0 + t;
    const int P = d->prefix_len[tk];
    const int len = tree ? d->attend_off[tk + 1] - d->attend_off[tk] : 0;
    maxP = max(maxP, P);
    maxlen = max(maxlen, len);
    nch = max(nch, (P + len + kAttnChunk - 1) / kAttnChunk);
  }
  if (split >= nch) return;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int RH = T * G;  // query rows of the block (<= 16)
  const int H = p.num_heads;

  for (int i = tid; i < 16 * CH; i += kAttnThreads) {
    const int rh = i / CH;
    const int ch = i - rh * CH;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (rh < RH && rh / G < tact) {
      const int tk = tok0 + rh / G;
      const int head = kvh * G + rh % G;
      v = *reinterpret_cast<const uint4*>(p.q + (static_cast<size_t>(tk) * H + head) * HD + ch * 8);
    }
    *reinterpret_cast<uint4*>(Qs + rh * LD + ch * 8) = v;
  }

  // Role in the PV loop and the combine: query row prh, dims pd0..pd0+DPT-1.
  const int prh = tid >> 4;
  const int pd0 = (tid & 15) * DPT;
  const int pt = prh / G;
  const bool pact = prh < RH && pt < tact;
  int p_nch = 0, p_tk = 0, p_head = 0;
  if (pact) {
    p_tk = tok0 + pt;
    p_head = kvh * G + prh % G;
    const int len = tree ? d->attend_off[p_tk + 1] - d->attend_off[p_tk] : 0;
    p_nch = (d->prefix_len[p_tk] + len + kAttnChunk - 1) / kAttnChunk;
  }

  int my_cnt = 0;
  for (int c = split; c < nch; c += kAttnSplits) {
    ++my_cnt;
    if (my_cnt == 1) stamp(2);
    const int q0 = c * kAttnChunk;
    // ---- 1. key list of the chunk, logical order, per-token masks ----
    const int n1 = max(0, min(q0 + kAttnChunk, maxP) - q0);
    for (int j = tid; j < n1; j += kAttnThreads) {
      const int key = q0 + j;
      unsigned mk = 0;
      for (int t = 0; t < tact; ++t)
        if (key < d->prefix_len[tok0 + t]) mk |= 1u << t;
      keys[j] = key;
      kmask[j] = static_cast<unsigned char>(mk);
    }
    if (warp == 0) {
      int U = n1;
      if (tree) {
        const int qlo = max(q0, C);
        const int qhi = min(q0 + kAttnChunk, C + maxlen);
        int off = 0, len = 0;
        if (lane < tact) {
          off = d->attend_off[tok0 + lane];
          len = d->attend_off[tok0 + lane + 1] - off;
        }
        for (int q = qlo; q < qhi; ++q) {
          const int a = q - C;
          const int slot = (lane < tact && a < len) ? d->attend_slots[off + a] : -1;
          unsigned same = 0;
          for (int u = 0; u < tact; ++u)
            if (__shfl_sync(0xffffffffu, slot, u) == slot) same |= 1u << u;
          const bool leader = slot >= 0 && (__ffs(same) - 1) == lane;
          const unsigned lb = __ballot_sync(0xffffffffu, leader);
          if (leader) {
            const int pos = U + __popc(lb & ((1u << lane) - 1u));
            keys[pos] = p.max_context + slot;
            kmask[pos] = static_cast<unsigned char>(same);
          }
          U += __popc(lb);
        }
      }
      if (lane == 0) s_U = U;
    }
    __syncthreads();
    if (my_cnt == 1) stamp(3);
    const int U = s_U;
    const bool single = U <= 64;

    // ---- 2. scores S = scale * Q K^T ----
    for (int ub = 0; ub < U; ub += 64) {
      const int nb = min(64, U - ub);
      for (int i = tid; i < nb * CH; i += kAttnThreads) {
        const int u = i / CH;
        const int ch = i - u * CH;
        const size_t row = static_cast<size_t>(kvh) * p.slots + keys[ub + u];
        cp_async_16(Ks + u * LD + ch * 8, p.kcache + row * HD + ch * 8);
        if (single) cp_async_16(Vs + u * LD + ch * 8, p.vcache + row * HD + ch * 8);
      }
      cp_async_commit_wait_all();
      __syncthreads();
      if (warp * 8 < nb) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
          uint32_t a[4];
          ldmatrix_x4(a, smem_u32(Qs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 + (lane >> 4) * 8));
          uint32_t b[2];
          ldmatrix_x2(b, smem_u32(Ks + (warp * 8 + (lane & 7)) * LD + ks * 16 + ((lane >> 3) & 1) * 8));
          mma_bf16_16816(acc, a, b[0], b[1]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int rh = (lane >> 2) + (j >= 2 ? 8 : 0);
          const int u = ub + warp * 8 + (lane & 3) * 2 + (j & 1);
          if (u < U) {
            const bool att = rh < RH && ((kmask[u] >> (rh / G)) & 1u);
            Ss[rh * kUMax + u] = att ? acc[j] * p.scale : -INFINITY;
          }
        }
      }
      __syncthreads();
    }

    if (my_cnt == 1) stamp(4);
    // ---- 3a. per query row: max and p = exp(s - max) ----
    for (int rh = warp; rh < 16; rh += kAttnThreads / 32) {
      float mx = -INFINITY;
      for (int u = lane; u < U; u += 32) mx = fmaxf(mx, Ss[rh * kUMax + u]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      for (int u = lane; u < U; u += 32) {
        const float s = Ss[rh * kUMax + u];
        Ss[rh * kUMax + u] = (mx == -INFINITY || s == -INFINITY) ? 0.f : expf(s - mx);
      }
      if (lane == 0) s_m[rh] = mx;
    }
    __syncthreads();

    // ---- 3b. sum p and p*v in logical order over attended keys ----
    float o[DPT];
#pragma unroll
    for (int j = 0; j < DPT; ++j) o[j] = 0.f;
    float l = 0.f;
    for (int ub = 0; ub < U; ub += 64) {
      const int nb = min(64, U - ub);
      if (!single) {
        for (int i = tid; i < nb * CH; i += kAttnThreads) {
          const int u = i / CH;
          const int ch = i - u * CH;
          const size_t row = static_cast<size_t>(kvh) * p.slots + keys[ub + u];
          cp_async_16(Vs + u * LD + ch * 8, p.vcache + row * HD + ch * 8);
        }
        cp_async_commit_wait_all();
        __syncthreads();
      }
      if (pact) {
        // Branch-free over all keys of the block: a key of the union that this
        // token does not attend has p = 0 exactly (its score is -inf), and
        // adding it changes neither l nor o bitwise (both start at +0 and
        // never become -0: x + (+-0) == x, and +0 + -0 == +0). So the sums
        // equal those over the attended keys alone, in the same order, and
        // the loop pipelines its shared-memory loads.
        const float* srow = Ss + prh * kUMax + ub;
#pragma unroll 4
        for (int u = 0; u < nb; ++u) {
          {
            const float pr = srow[u];
            l += pr;
            const __nv_bfloat16* vr = Vs + u * LD + pd0;
            float vf[DPT];
            if constexpr (DPT == 8) {
              const uint4 raw = *reinterpret_cast<const uint4*>(vr);
              const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                const float2 f = __bfloat1622float2(h2[j]);
                vf[2 * j] = f.x;
                vf[2 * j + 1] = f.y;
              }
            } else {
              const uint2 raw = *reinterpret_cast<const uint2*>(vr);
              const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                const float2 f = __bfloat1622float2(h2[j]);
                vf[2 * j] = f.x;
                vf[2 * j + 1] = f.y;
              }
            }
#pragma unroll
            for (int j = 0; j < DPT; ++j) o[j] = fmaf(pr, vf[j], o[j]);
          }
        }
      }
      if (!single) __syncthreads();
    }

    // ---- 4. chunk partial ----
    if (pact && c < p_nch) {
      float* po = p.part_o + ((static_cast<size_t>(p_tk) * H + p_head) * p.max_chunks + c) * HD + pd0;
#pragma unroll
      for (int j = 0; j < DPT; ++j) po[j] = o[j];
      if ((tid & 15) == 0)
        p.part_ml[(static_cast<size_t>(p_tk) * H + p_head) * p.max_chunks + c] = make_float2(s_m[prh], l);
    }
    __syncthreads();
    if (my_cnt == 1) stamp(5);
  }

  // ---- arrival; the last CTA of the (kv head, token block) combines ----
  if (tid == 0) {
    __threadfence();
    const int prev = atomicAdd(&p.counters[kvh * kMaxStepTokens + blk], my_cnt);
    s_last = (prev + my_cnt == nch) ? 1 : 0;
  }
  __syncthreads();
  stamp(6);
  if (!s_last) return;
  __threadfence();
  if (pact) {
    // Combine in chunk order. The loads of a batch of chunks are all issued
    // before its adds (one L2 round trip per batch instead of per chunk); the
    // arithmetic is the same sequence as chunk by chunk.
    constexpr int kB = 4;
    const float2* ml = p.part_ml + (static_cast<size_t>(p_tk) * H + p_head) * p.max_chunks;
    const float* pob = p.part_o + (static_cast<size_t>(p_tk) * H + p_head) * p.max_chunks * HD + pd0;
    float M = -INFINITY;
#pragma unroll 4
    for (int c = 0; c < p_nch; ++c) M = fmaxf(M, __ldcg(&ml[c]).x);
    float o[DPT];
#pragma unroll
    for (int j = 0; j < DPT; ++j) o[j] = 0.f;
    float lsum = 0.f;
    for (int c0 = 0; c0 < p_nch; c0 += kB) {
      float2 v[kB];
      float pv[kB][DPT];
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        if (c0 + i < p_nch) {
          v[i] = __ldcg(&ml[c0 + i]);
#pragma unroll
          for (int j = 0; j < DPT; j += 4) {
            const float4 f = __ldcg(reinterpret_cast<const float4*>(pob + static_cast<size_t>(c0 + i) * HD + j));
            pv[i][j] = f.x;
            pv[i][j + 1] = f.y;
            pv[i][j + 2] = f.z;
            pv[i][j + 3] = f.w;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        if (c0 + i < p_nch) {
          const float w = expf(v[i].x - M);
          lsum = fmaf(w, v[i].y, lsum);
#pragma unroll
          for (int j = 0; j < DPT; ++j) o[j] = fmaf(w, pv[i][j], o[j]);
        }
      }
    }
    const float inv = 1.0f / lsum;
    __nv_bfloat16* out = p.out + (static_cast<size_t>(p_tk) * H + p_head) * HD + pd0;
#pragma unroll
    for (int j = 0; j < DPT; ++j) out[j] = __float2bfloat16_rn(o[j] * inv);
  }
  __syncthreads();
  stamp(7);
  if (tid == 0) p.counters[kvh * kMaxStepTokens + blk] = 0;
}

template <int HD>
void launch_attention_hd(const AttnParams& p, int rows, bool pdl, cudaStream_t stream) {
  static std::atomic<uint64_t> attr_done{0};  // per device (current_device_bit)
  constexpr size_t smem = attn_smem_bytes<HD>();
  const uint64_t bit = current_device_bit();
  if (!bit || !(attr_done.load(std::memory_order_acquire) & bit)) {
    SS_CUDA_CHECK(cudaFuncSetAttribute(&attention_kernel<HD>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    attr_done.fetch_or(bit, std::memory_order_acq_rel);
  }
  cudaLaunchConfig_t lc = {};
  const int blocks = (rows + p.tokens_per_block - 1) / p.tokens_per_block;
  lc.gridDim = dim3(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(blocks), kAttnSplits);
  lc.blockDim = dim3(kAttnThreads, 1, 1);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = pdl ? 1 : 0;
  SS_CUDA_CHECK(cudaLaunchKernelEx(&lc, &attention_kernel<HD>, p));
}

}  // namespace

int attn_tokens_per_block(int group) {
  int t = 16 / group;
  if (t < 1) t = 1;
  if (t > kMaxTokPerBlock) t = kMaxTokPerBlock;
  return t;
}

void launch_attention(const AttnParams& p, int rows, bool pdl, cudaStream_t stream) {
  if (p.group > 16 || p.group < 1)
    throw InvalidArgument("attention: query heads per KV head must be 1..16 (got " +
                          std::to_string(p.group) + ")");
  if (p.head_dim == 128) {
    launch_attention_hd<128>(p, rows, pdl, stream);
  } else if (p.head_dim == 64) {
    launch_attention_hd<64>(p, rows, pdl, stream);
  } else {
    throw InvalidArgument("attention: head_dim must be 64 or 128 (got " +
                          std::to_string(p.head_dim) + ")");
  }
}

}  // namespace swiftspec::cuda
