#include "backend/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/int4.h"

namespace swiftspec::cpu {
namespace {

// ---------------------------------------------------------------------------
// A 16-lane fp32 vector: one AVX-512 register, two AVX2 registers, or scalars.
// Each lane's arithmetic is an explicit fused multiply-add, so the compiler
// cannot contract or reorder differently in different call sites.
// ---------------------------------------------------------------------------
#if defined(__AVX512F__)
struct V16 {
  __m512 v;
};
inline V16 zero() { return {_mm512_setzero_ps()}; }
inline V16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V16 load(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 add(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline float hsum(V16 a) { return _mm512_reduce_add_ps(a.v); }
#elif defined(__AVX2__) && defined(__FMA__)
struct V16 {
  __m256 lo, hi;
};
inline V16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline V16 load(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 add(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline float hsum(V16 a) {
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(a.lo, a.hi));
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
#else
struct V16 {
  float f[16];
};
inline V16 zero() { return {}; }
inline V16 load(const float* p) {
  V16 r;
  std::memcpy(r.f, p, sizeof r.f);
  return r;
}
inline V16 load(const uint16_t* p) {
  V16 r;
  for (int i = 0; i < 16; ++i) {
    uint32_t u = static_cast<uint32_t>(p[i]) << 16;
    std::memcpy(&r.f[i], &u, 4);
  }
  return r;
}
inline V16 fma(V16 a, V16 b, V16 c) {
  for (int i = 0; i < 16; ++i) c.f[i] = std::fma(a.f[i], b.f[i], c.f[i]);
  return c;
}
inline V16 add(V16 a, V16 b) {
  for (int i = 0; i < 16; ++i) a.f[i] += b.f[i];
  return a;
}
inline float hsum(V16 a) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += a.f[i];
  return s;
}
#endif

inline float scalar(const float* p) { return *p; }
inline float scalar(const uint16_t* p) {
  uint32_t u = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// R rows of X against one weight row W (length k). Every row runs the same
// operations as it would alone: two accumulators over 32-wide steps, a 16-wide
// step, a scalar tail, then a fixed reduction.
template <int R, typename W>
inline void dot_rows(const float* const* x, const W* w, int k, float* out) {
  V16 acc0[R], acc1[R];
  float tail[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = zero();
    acc1[r] = zero();
    tail[r] = 0.0f;
  }
  int i = 0;
  for (; i + 32 <= k; i += 32) {
    V16 w0 = load(w + i), w1 = load(w + i + 16);
    for (int r = 0; r < R; ++r) {
      acc0[r] = fma(load(x[r] + i), w0, acc0[r]);
      acc1[r] = fma(load(x[r] + i + 16), w1, acc1[r]);
    }
  }
  if (i + 16 <= k) {
    V16 w0 = load(w + i);
    for (int r = 0; r < R; ++r) acc0[r] = fma(load(x[r] + i), w0, acc0[r]);
    i += 16;
  }
  for (; i < k; ++i) {
    float wi = scalar(w + i);
    for (int r = 0; r < R; ++r) tail[r] = std::fma(x[r][i], wi, tail[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(add(acc0[r], acc1[r])) + tail[r];
}

// Outputs of columns [nb, ne) for every row, in tiles of 4 rows then single rows;
// dot(std::integral_constant<int, R>, xr, n, out) reduces R rows against weight row n.
// Each (row, column) output is one such reduction, in the same order for any `rows` and
// any column block: that is what batch invariance rests on.
template <typename Dot>
void tile_rows(const float* x, int rows, int k, const float* bias, float* y, int n_total, int nb, int ne, Dot dot) {
  int m = 0;
  for (; m + 4 <= rows; m += 4) {
    const float* xr[4] = {x + (size_t)m * k, x + (size_t)(m + 1) * k, x + (size_t)(m + 2) * k, x + (size_t)(m + 3) * k};
    for (int n = nb; n < ne; ++n) {
      float out[4];
      dot(std::integral_constant<int, 4>{}, xr, n, out);
      const float b = bias ? bias[n] : 0.0f;
      for (int r = 0; r < 4; ++r) y[(size_t)(m + r) * n_total + n] = bias ? out[r] + b : out[r];
    }
  }
  for (; m < rows; ++m) {
    const float* xr[1] = {x + (size_t)m * k};
    for (int n = nb; n < ne; ++n) {
      float out[1];
      dot(std::integral_constant<int, 1>{}, xr, n, out);
      y[(size_t)m * n_total + n] = bias ? out[0] + bias[n] : out[0];
    }
  }
}

// The same with weight row n at row_of(n), F32 or BF16 (W).
template <typename W, typename RowOf>
void linear_block(const float* x, int rows, RowOf row_of, int k, const float* bias, float* y, int n_total, int nb,
                  int ne) {
  tile_rows(x, rows, k, bias, y, n_total, nb, ne, [&](auto r, const float* const* xr, int n, float* out) {
    dot_rows<decltype(r)::value>(xr, static_cast<const W*>(row_of(n)), k, out);
  });
}

constexpr int kColBlock = 8;  // weight rows kept hot while row tiles stream past

template <typename W>
void linear_columns(const float* x, int rows, const W* w, int k, const float* bias, float* y, int n_total, int n_begin,
                    int n_end) {
  for (int nb = n_begin; nb < n_end; nb += kColBlock) {
    const int ne = std::min(nb + kColBlock, n_end);
    linear_block<W>(x, rows, [&](int n) { return w + (size_t)n * k; }, k, bias, y, n_total, nb, ne);
  }
}

#if defined(__AVX512F__)
// dot_rows over an int4 weight row in block order (int4.h; the group size a multiple of 32)
// against activations already in block order, with the weights dequantized in registers:
// per group a 16-entry table t[q] = (q - z) * s (the formula of int4.h, same bits), per 32
// elements one lookup of the 16 low nibbles (the even elements) and one of the 16 high ones
// (the odd elements). The FMAs and the final reduction are those of dot_rows over the
// block-order F32 row (32-wide steps, two accumulators, no tail; "+ 0.0f" is dot_rows' empty
// tail), so the result has the bits of the buffered path.
template <int R>
inline void dot_rows_int4(const float* const* x, const WeightMatrix& w, int n, float* out) {
  const int k = w.k, g = w.group_size, groups = k / g;
  const uint8_t* q = static_cast<const uint8_t*>(w.data) + size_t(n) * (k / 2);
  const uint16_t* sc = w.scales + size_t(n) * groups;
  const uint8_t* zr = w.zeros + size_t(n) * groups;
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i low4 = _mm512_set1_epi32(15);
  V16 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = zero();
    acc1[r] = zero();
  }
  for (int gi = 0; gi < groups; ++gi) {
    const __m512 table = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(iota, _mm512_set1_epi32(zr[gi]))),
                                       _mm512_set1_ps(fp16_to_float_fast(sc[gi])));
    const uint8_t* qg = q + size_t(gi) * (g / 2);
    for (int i = gi * g; i < (gi + 1) * g; i += 32, qg += 16) {
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qg)));
      const V16 w0{_mm512_permutexvar_ps(_mm512_and_si512(bytes, low4), table)};
      const V16 w1{_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table)};
      for (int r = 0; r < R; ++r) {
        acc0[r] = fma(load(x[r] + i), w0, acc0[r]);
        acc1[r] = fma(load(x[r] + i + 16), w1, acc1[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(add(acc0[r], acc1[r])) + 0.0f;
}
#endif

// Int4 (x already in block order when int4_block_order(w)). Decode-sized batches (at most
// 4 rows: one row tile) in an AVX-512 build dequantize in registers (dot_rows_int4); larger
// batches, or other builds, dequantize each block of kColBlock weight rows once into fp32,
// reused by every row tile, and reduce it as an F32 matrix. Both give the bits of `linear`
// over the dequantized F32 matrix with K in the same order, so which one runs cannot change
// a result.
void linear_columns_int4(const float* x, int rows, const WeightMatrix& w, const float* bias, float* y, int n_begin,
                         int n_end) {
  const bool block_order = int4_block_order(w);
#if defined(__AVX512F__)
  if (block_order && rows <= 4) {
    tile_rows(x, rows, w.k, bias, y, w.n, n_begin, n_end, [&](auto r, const float* const* xr, int n, float* out) {
      dot_rows_int4<decltype(r)::value>(xr, w, n, out);
    });
    return;
  }
#endif
  thread_local std::vector<float> block;
  block.resize(size_t(kColBlock) * w.k);
  for (int nb = n_begin; nb < n_end; nb += kColBlock) {
    const int ne = std::min(nb + kColBlock, n_end);
    if (block_order)
      dequantize_int4_rows_block_order(w, nb, ne, block.data());
    else
      dequantize_int4_rows(w, nb, ne, block.data());
    const float* rows_fp32 = block.data();
    linear_block<float>(x, rows, [&](int n) { return rows_fp32 + (size_t)(n - nb) * w.k; }, w.k, bias, y, w.n, nb, ne);
  }
}

}  // namespace

void linear(const float* x, int rows, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  // Split N into chunks of 8 columns so every worker gets whole column blocks.
  const int blocks = (w.n + 7) / 8;
  const float* xi = x;
  if (int4_block_order(w)) {  // the activations in the int4 kernels' K order (int4.h)
    thread_local std::vector<float> reordered;
    reordered.resize(size_t(rows) * w.k);
    block_order_rows(x, rows, w.k, reordered.data());
    xi = reordered.data();
  }
  pool.parallel_for(blocks, [&](int b0, int b1) {
    const int n0 = b0 * 8, n1 = std::min(b1 * 8, w.n);
    if (w.is_int4())
      linear_columns_int4(xi, rows, w, bias, y, n0, n1);
    else if (w.dtype == DType::BF16)
      linear_columns(x, rows, static_cast<const uint16_t*>(w.data), w.k, bias, y, w.n, n0, n1);
    else
      linear_columns(x, rows, static_cast<const float*>(w.data), w.k, bias, y, w.n, n0, n1);
  });
}

float dot(const float* a, const float* b, int n) {
  const float* xr[1] = {a};
  float out[1];
  dot_rows<1>(xr, b, n, out);
  return out[0];
}

void axpy(float a, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

AttendedKeys row_keys(const ForwardBatch& b, int i, int committed_before, const ModelOptions& options,
                      const float* k_committed, const float* v_committed, const float* k_tree, const float* v_tree,
                      int kv_head, int head_dim, size_t stride) {
  const bool tree = b.is_tree();
  const int n_committed = tree ? committed_before : committed_before + i + 1;
  const int n_tree = tree ? b.attend_offsets[i + 1] - b.attend_offsets[i] : 0;
  const KeyWindow w = key_window(options, n_committed + n_tree);
  const size_t head = size_t(kv_head) * head_dim;
  return {k_committed + head,
          v_committed + head,
          n_committed,
          k_tree + head,
          v_tree + head,
          tree ? b.attend_slots.data() + b.attend_offsets[i] : nullptr,
          n_tree,
          w.sink_end,
          w.recent_begin,
          stride};
}

void attend_row(const float* q, int hd, float scale, const AttendedKeys& a, std::vector<float>& scores, float* out) {
  const int total = a.n_committed + a.n_tree;
  const int n_sink = a.sink_end, n = a.sink_end + (total - a.recent_begin);
  scores.resize(n);
  // Attended key i is key x of the row's sequence: the sinks, then the recent keys.
  const auto row_of = [&](int i, const float* committed, const float* tree) {
    const int x = i < n_sink ? i : a.recent_begin + (i - n_sink);
    return x < a.n_committed ? committed + size_t(x) * a.stride
                             : tree + size_t(a.tree_slots[x - a.n_committed]) * a.stride;
  };
  float m = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) {
    scores[i] = dot(q, row_of(i, a.k_committed, a.k_tree), hd) * scale;
    m = std::max(m, scores[i]);
  }
  float sum = 0.0f;
  for (float& s : scores) {
    s = std::exp(s - m);
    sum += s;
  }
  const float inv = 1.0f / sum;
  std::fill(out, out + hd, 0.0f);
  for (int i = 0; i < n; ++i) axpy(scores[i] * inv, row_of(i, a.v_committed, a.v_tree), out, hd);
}

void rms_norm(const float* x, const float* weight, int rows, int dim, float eps, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + (size_t)r * dim;
    float* o = out + (size_t)r * dim;
    const float ss = dot(xr, xr, dim);
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int i = 0; i < dim; ++i) o[i] = weight[i] * (xr[i] * scale);
  }
}

void to_float(const void* src, DType dtype, int64_t n, float* dst) {
  if (dtype == DType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = scalar(s + i);
}

}  // namespace swiftspec::cpu
