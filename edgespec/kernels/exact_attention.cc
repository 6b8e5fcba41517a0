// edgespec.ExactAttention: GroupQueryAttention's contract (packed or separate q|k|v, rotary embedding, the KV
// buffer written in place, causal mask, sliding window, soft-capping) computed so that a row's result never
// depends on the other rows of the call, the thread count or the call's length.
//
// Why: onnxruntime's GroupQueryAttention takes another GEMM path for one new token than for several, so a lone
// token rounds differently from the same position in a verify batch, and the graphs had to pad single-token
// calls to two rows (docs/exact-numerics.md). Here every (row, head) is computed by one thread with one fixed
// order of operations: each score is a dot product with a fixed lane/tree order, the softmax and the weighted
// sum of values run over the keys in ascending order. No padding, and a verify batch reads the keys once.
//
// Inputs (GroupQueryAttention's order): query [1, S, (H + 2·KV)·D] packed, or query [1, S, H·D] with key and
// value [1, S, KV·D]; past_key, past_value [1, KV, L, D]; seqlens_k int32 [1] (total − 1); total_sequence_length
// int32 []; cos_cache, sin_cache [≥ total, D/2]. Outputs: [1, S, H·D]; present_key, present_value (the past
// buffers: bound to the same memory they are updated in place, otherwise copied first).
// Token trees (optional input 9, tree_parents int32 [S], or empty for a chain): row r's parent row in the call, −1
// for a root (it follows the cached positions). A row sits at position first + its depth, its K/V at cell first + r,
// and it attends to the cached cells and its own ancestors only, in the order of their positions: the same keys in
// the same order as a chain of its path has, so every row is the same bits as a one-token pass of its path.
// The KV buffers are float32 or float16 (two registrations of the op). Half KV: the new keys (rotated) and values
// are rounded to half once, to nearest even, when written; every read widens them to float exactly, so all the
// arithmetic is float32 as with float32 KV. Why: reading the keys and values is most of the attention's time
// (46 KB a token of SmolLM2 in float32), and llama.cpp's default KV is half too.
// Attributes: num_heads, kv_num_heads, scale (0: 1/√D), local_window_size (−1: none), softcap (0: none).

#include "ops.h"  // onnxruntime's C++ API
#include "vector_math.h"  // Vec, load / store, exp_nonpositive

#include <algorithm>
#include <cmath>
#if defined(__FMA__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace edgespec_vec;  // NOLINT: the vectors every function here computes with
using edgespec_vec::load;  // beside the half-precision load below, one overload set

// float32 → binary16, rounded to nearest, ties to even (as F16C's vcvtps2ph with _MM_FROUND_TO_NEAREST_INT, and as
// NumPy's astype(float16)): past 65504 an infinity; below 2⁻¹⁴ a subnormal; a NaN stays a quiet NaN.
inline Half narrow(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<Half>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  if (magnitude >= 0x477ff000u) return static_cast<Half>(sign | 0x7c00u);  // ≥ 65520 (and ∞): ∞
  if (magnitude >= 0x38800000u) {  // a normal half: rebias the exponent, round off 13 mantissa bits
    const uint32_t rebiased = magnitude - (112u << 23);
    return static_cast<Half>(sign | (rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13);
  }
  const uint32_t exponent = magnitude >> 23;  // a subnormal half (or zero): round m·2^(e−150) to units of 2⁻²⁴
  if (exponent < 102) return static_cast<Half>(sign);  // below 2⁻²⁵ (float subnormals too): rounds to zero
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u, shift = 126 - exponent;  // 14 … 24
  uint32_t units = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1), half_unit = 1u << (shift - 1);
  if (rest > half_unit || (rest == half_unit && (units & 1u))) ++units;  // may carry into the smallest normal
  return static_cast<Half>(sign | units);
}

// Eight halves as floats (exactly), and n floats (a multiple of 8) written as halves.
inline Vec load(const Half* p) {
#if defined(__F16C__)
  return reinterpret_cast<Vec>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  return Vec{widen(p[0]), widen(p[1]), widen(p[2]), widen(p[3]), widen(p[4]), widen(p[5]), widen(p[6]), widen(p[7])};
#endif
}

inline void put(Half* out, const float* x, int64_t n) {
#if defined(__F16C__)
  for (int64_t i = 0; i < n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  for (int64_t i = 0; i < n; ++i) out[i] = narrow(x[i]);
#endif
}

inline void put(float* out, const float* x, int64_t n) { std::memcpy(out, x, sizeof(float) * n); }

// a·b + c: one fused multiply-add where the build targets it (x86 FMA), written out, so every place that sums a
// value does it the same way; elsewhere a product and a sum.
inline Vec fmadd(Vec a, Vec b, Vec c) {
#if defined(__FMA__)
  return reinterpret_cast<Vec>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                               reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}

// Pairwise sums of neighbouring lanes of a and of b: [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7].
inline Vec pair_sums(Vec a, Vec b) {
  return __builtin_shuffle(a, b, Ints{0, 2, 8, 10, 4, 6, 12, 14}) +
         __builtin_shuffle(a, b, Ints{1, 3, 9, 11, 5, 7, 13, 15});
}

// A vector's lanes summed as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) …
inline float fold(Vec v) {
  const Vec t = pair_sums(pair_sums(v, v), v);  // lane 0: (l0 + l1) + (l2 + l3); lane 4: (l4 + l5) + (l6 + l7)
  return t[0] + t[4];
}

// … and eight vectors' lanes summed by the same tree at once: lane s of the result is fold(v[s]).
inline Vec fold8(const Vec* v) {
  const Vec low = pair_sums(pair_sums(v[0], v[1]), pair_sums(v[2], v[3]));  // halves: keys 0-3, lanes 0-3 | 4-7
  const Vec high = pair_sums(pair_sums(v[4], v[5]), pair_sums(v[6], v[7]));
  return __builtin_shuffle(low, high, Ints{0, 1, 2, 3, 8, 9, 10, 11}) +
         __builtin_shuffle(low, high, Ints{4, 5, 6, 7, 12, 13, 14, 15});
}

// q·k: lane l sums q[d]·k[d] over d ≡ l (mod 8) in ascending d, then the lanes fold.
template <typename KV>
inline Vec products(const float* q, const KV* k, int64_t dim) {
  Vec acc = load(q) * load(k);
  for (int64_t d = kLanes; d < dim; d += kLanes) acc = fmadd(load(q + d), load(k + d), acc);
  return acc;
}

// scores[v][j] = q[v]·keys[j] for j < n and V query vectors that read the same keys: eight keys at a time, their
// sums interleaved (independent chains) and folded together, each key's sum still in the order ``products`` takes.
// Each key's chunk is widened from half once for all V (the widening, not the products, bounded the loop); V·8
// accumulators: V ≤ 3 stays within AVX-512's 32 vector registers.
template <int V, typename KV>
inline void dot_keys(const float* const* q, const KV* keys, int64_t dim, int64_t n, float scale,
                     float* const* scores) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const KV* k = keys + j * dim;
    Vec acc[V][kLanes];
    Vec qd[V];
    for (int v = 0; v < V; ++v) qd[v] = load(q[v]);
    for (int64_t s = 0; s < kLanes; ++s) {
      const Vec ks = load(k + s * dim);
      for (int v = 0; v < V; ++v) acc[v][s] = qd[v] * ks;
    }
    for (int64_t d = kLanes; d < dim; d += kLanes) {
      for (int v = 0; v < V; ++v) qd[v] = load(q[v] + d);
      for (int64_t s = 0; s < kLanes; ++s) {
        const Vec ks = load(k + s * dim + d);
        for (int v = 0; v < V; ++v) acc[v][s] = fmadd(qd[v], ks, acc[v][s]);
      }
    }
    for (int v = 0; v < V; ++v) store(scores[v] + j, fold8(acc[v]) * scale);
  }
  for (; j < n; ++j)
    for (int v = 0; v < V; ++v) scores[v][j] = fold(products(q[v], keys + j * dim, dim)) * scale;
}

// Non-interleaved rotary embedding (a head's first and second halves rotate together) at one position.
inline void rotate(const float* x, const float* cos, const float* sin, int64_t dim, float* out) {
  const int64_t half = dim / 2;
  for (int64_t d = 0; d < half; ++d) {
    out[d] = x[d] * cos[d] - x[d + half] * sin[d];
    out[d + half] = x[d + half] * cos[d] + x[d] * sin[d];
  }
}

template <typename KV>  // float or Half
struct Call {
  const float* queries;  // [S, H, D], rotated
  const KV* keys;        // [KV, L, D]
  const KV* values;      // [KV, L, D]
  float* out;            // [S, H·D]
  int64_t rows, heads, kv_heads, dim, length, first;  // first: the cell (and, in a chain, the position) of row 0
  const int64_t* depth;  // a tree's (row → depth), or null for a chain (depth = row)
  const int32_t* path;   // a tree's ancestors: path[row · rows + d] is the row at depth d on row's path
  float scale, softcap;
  int64_t window;        // > 0: a row at p sees keys p − window + 1 … p
  int64_t vectors;       // query vectors per KV head: rows · (H / KV)
  int64_t block;         // of them per task (``block_size``); a call runs KV · ceil(vectors / block) tasks
};

// A task: one KV head and a block of the query vectors that read it ((row, query head) pairs, row-major): about
// kTasksPerHead blocks per KV head, so a long prefill chunk reads each key a few times per layer, not once per few
// vectors, and a short call still gives every thread work; each block a whole number of kShared-vector runs (a
// block of four split into runs of three and one, the lone one widening every key for itself), at most kMaxBlock.
// The block changes which vectors share the reads, never a vector's arithmetic.
constexpr int64_t kMaxBlock = 32, kTasksPerHead = 4;
constexpr int64_t kMaxDim = 256;
constexpr int64_t kTile = 64;  // keys whose keys and values stay in L1 while every vector of the task reads them
constexpr int64_t kShared = 3;  // vectors that share each key's widening (their sums in registers)
static_assert(kShared == 3, "with_run_length dispatches runs of one to three vectors");

// acc[v][d … d + 8W) += Σ_{k < n} w[v][k] · values[k·dim + d …] for V vectors, keys in ascending order; each value
// chunk widened once for all V; V·W independent sums in registers (compile-time widths: runtime ones leave them in
// memory).
template <int V, int W, typename KV>
inline void add_weighted(const float* const* w, const KV* values, int64_t dim, int64_t n, float* const* acc,
                         int64_t d) {
  Vec a[V][W];
  for (int v = 0; v < V; ++v)
    for (int s = 0; s < W; ++s) a[v][s] = load(acc[v] + d + s * kLanes);
  for (int64_t k = 0; k < n; ++k) {
    Vec x[W];
    for (int s = 0; s < W; ++s) x[s] = load(values + k * dim + d + s * kLanes);
    for (int v = 0; v < V; ++v) {
      const Vec wk = splat(w[v][k]);
      for (int s = 0; s < W; ++s) a[v][s] = fmadd(wk, x[s], a[v][s]);
    }
  }
  for (int v = 0; v < V; ++v)
    for (int s = 0; s < W; ++s) store(acc[v] + d + s * kLanes, a[v][s]);
}

// acc[v][0 … dim) += Σ_{k < n} w[v][k] · values[k·dim …]: every dimension's sum in key order, however wide its
// chunk. One vector takes 64 dimensions at a time (8 sums, 8 values); several take 32 (V·4 sums, 4 values), within
// the registers. D is a multiple of 16.
template <int V, typename KV>
inline void add_weighted_keys(const float* const* w, const KV* values, int64_t dim, int64_t n, float* const* acc) {
  int64_t d = 0;
  if constexpr (V == 1)
    for (; d + 8 * kLanes <= dim; d += 8 * kLanes) add_weighted<1, 8>(w, values, dim, n, acc, d);
  for (; d + 4 * kLanes <= dim; d += 4 * kLanes) add_weighted<V, 4>(w, values, dim, n, acc, d);
  for (; d < dim; d += 2 * kLanes) add_weighted<V, 2>(w, values, dim, n, acc, d);
}

// f(std::integral_constant<int, m>{}) for a run of m = 1 … kShared vectors: the kernels take V at compile time.
template <typename F>
inline void with_run_length(int64_t m, const F& f) {
  if (m == 3) f(std::integral_constant<int, 3>{});
  else if (m == 2) f(std::integral_constant<int, 2>{});
  else f(std::integral_constant<int, 1>{});
}

// Query vectors v0 … v0 + count − 1 of one KV head. Each (row at position p, head) attends to the keys of positions
// lo(p) … p: its scores, their softmax and the weighted sum of values are each computed in an order fixed by its
// own position, so the result is the same bits alone or in any call; the vectors of a task only share the reads.
// In a chain position j is cell j; in a tree the positions from ``first`` on are the row's ancestors' cells.
template <typename KV>
void attend(const Call<KV>& c, int64_t kv, int64_t v0, int64_t count, float* scores, int64_t span) {
  const int64_t group = c.heads / c.kv_heads;
  const KV* keys = c.keys + kv * c.length * c.dim;
  const KV* values = c.values + kv * c.length * c.dim;
  int64_t lo[kMaxBlock], hi[kMaxBlock], shared[kMaxBlock];  // positions lo … hi; lo … shared in cells lo … shared
  int64_t rows[kMaxBlock];
  const float* queries[kMaxBlock];
  float* outs[kMaxBlock];
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = (v0 + i) / group, head = kv * group + (v0 + i) % group;
    rows[i] = row;
    hi[i] = c.first + (c.depth ? c.depth[row] : row);
    lo[i] = c.window > 0 ? std::max<int64_t>(0, hi[i] - c.window + 1) : 0;
    shared[i] = c.depth ? std::min(hi[i], c.first - 1) : hi[i];
    queries[i] = c.queries + (row * c.heads + head) * c.dim;
    outs[i] = c.out + (row * c.heads + head) * c.dim;
  }
  // The cell of a tree row's key at position p ≥ first (an ancestor's, or its own).
  const auto tree_cell = [&c, &rows](int64_t i, int64_t p) { return c.first + c.path[rows[i] * c.rows + p - c.first]; };
  const int64_t first_key = *std::min_element(lo, lo + count), last_key = *std::max_element(shared, shared + count);
  // Runs of up to kShared consecutive vectors that read the same keys of tile t (a row's query heads of this KV
  // head): ``run(i, m, j0, j1)`` for vectors i … i + m − 1 and keys j0 … j1.
  const auto runs = [&](int64_t t, const auto& run) {
    for (int64_t i = 0; i < count;) {
      const int64_t j0 = std::max(t, lo[i]), j1 = std::min(t + kTile - 1, shared[i]);
      int64_t m = 1;
      while (m < kShared && i + m < count && std::max(t, lo[i + m]) == j0 &&
             std::min(t + kTile - 1, shared[i + m]) == j1)
        ++m;
      if (j0 <= j1) run(i, m, j0, j1);
      i += m;
    }
  };
  // Scores, a tile of keys at a time for every vector (scores[i·span + j − lo_i]).
  for (int64_t t = first_key; t <= last_key; t += kTile) {
    runs(t, [&](int64_t i, int64_t m, int64_t j0, int64_t j1) {
      float* out[kShared];
      for (int64_t r = 0; r < m; ++r) out[r] = scores + (i + r) * span + j0 - lo[i + r];
      with_run_length(m, [&](auto v) {
        dot_keys<decltype(v)::value>(queries + i, keys + j0 * c.dim, c.dim, j1 + 1 - j0, c.scale, out);
      });
    });
  }
  for (int64_t i = 0; i < count; ++i)  // a tree row's path, key by key (one key's sum: as in any group of keys)
    for (int64_t p = std::max(lo[i], shared[i] + 1); p <= hi[i]; ++p) {
      float* out = scores + i * span + p - lo[i];
      dot_keys<1>(queries + i, keys + tree_cell(i, p) * c.dim, c.dim, 1, c.scale, &out);
    }
  float inverse[kMaxBlock];
  for (int64_t i = 0; i < count; ++i) {
    float* row = scores + i * span;
    const int64_t n = hi[i] + 1 - lo[i], padded = (n + kLanes - 1) / kLanes * kLanes;
    if (c.softcap > 0.0f)
      for (int64_t j = 0; j < n; ++j) row[j] = c.softcap * std::tanh(row[j] / c.softcap);
    for (int64_t j = n; j < padded; ++j) row[j] = -INFINITY;  // e^−∞ = 0: the last vector adds nothing
    Vec top = load(row);  // the maximum: any order gives the same
    for (int64_t j = kLanes; j < padded; j += kLanes) top = top > load(row + j) ? top : load(row + j);
    const float highest = std::max({top[0], top[1], top[2], top[3], top[4], top[5], top[6], top[7]});
    Vec sum{};
    for (int64_t j = 0; j < padded; j += kLanes) {
      const Vec e = exp_nonpositive(load(row + j) - highest);
      store(row + j, e);
      sum += e;
    }
    inverse[i] = 1.0f / fold(sum);
  }
  // Σ_j p_j·v_j, keys in ascending order: per tile of keys, up to 64 dimensions at a time.
  alignas(64) float acc[kMaxBlock][kMaxDim];  // only the task's vectors' dimensions are zeroed (not all 32 KB)
  for (int64_t i = 0; i < count; ++i) std::fill(acc[i], acc[i] + c.dim, 0.0f);
  for (int64_t t = first_key; t <= last_key; t += kTile) {
    runs(t, [&](int64_t i, int64_t m, int64_t j0, int64_t j1) {
      const float* w[kShared];
      float* sums[kShared];
      for (int64_t r = 0; r < m; ++r) w[r] = scores + (i + r) * span + j0 - lo[i + r], sums[r] = acc[i + r];
      with_run_length(m, [&](auto v) {
        add_weighted_keys<decltype(v)::value>(w, values + j0 * c.dim, c.dim, j1 + 1 - j0, sums);
      });
    });
  }
  for (int64_t i = 0; i < count; ++i)  // a tree row's path after the cached keys, in the order of positions
    for (int64_t p = std::max(lo[i], shared[i] + 1); p <= hi[i]; ++p) {
      const float* w = scores + i * span + p - lo[i];
      float* sums = acc[i];
      add_weighted_keys<1>(&w, values + tree_cell(i, p) * c.dim, c.dim, 1, &sums);
    }
  for (int64_t i = 0; i < count; ++i)
    for (int64_t d = 0; d < c.dim; d += kLanes) store(outs[i] + d, load(acc[i] + d) * inverse[i]);
}

// Query vectors per task for a call of ``vectors`` per KV head: a multiple of kShared (SmolLM2, three query heads
// per KV head: a task per row for calls of up to four rows).
int64_t block_size(int64_t vectors) {
  const int64_t block = (vectors + kTasksPerHead - 1) / kTasksPerHead;
  return std::min((block + kShared - 1) / kShared * kShared, kMaxBlock / kShared * kShared);
}

template <typename KV>
int64_t blocks(const Call<KV>& c) { return (c.vectors + c.block - 1) / c.block; }

template <typename KV>
void attend_task(void* data, size_t task) {
  const Call<KV>& c = *static_cast<const Call<KV>*>(data);
  const int64_t kv = static_cast<int64_t>(task) / blocks(c), v0 = static_cast<int64_t>(task) % blocks(c) * c.block;
  const int64_t span = (c.first + c.rows + kLanes) / kLanes * kLanes;
  thread_local std::vector<float> scores;  // every score attend reads, it writes first
  attend(c, kv, v0, std::min(c.block, c.vectors - v0), scratch(scores, c.block * span), span);
}

template <typename KV>
struct ExactAttentionKernel {
  int64_t heads, kv_heads, window;
  float scale, softcap;

  ExactAttentionKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo ki(info);
    heads = ki.GetAttribute<int64_t>("num_heads");
    kv_heads = ki.GetAttribute<int64_t>("kv_num_heads");
    window = ki.GetAttribute<int64_t>("local_window_size");
    scale = ki.GetAttribute<float>("scale");
    softcap = ki.GetAttribute<float>("softcap");
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const Ort::ConstValue query = ctx.GetInput(0), key_in = ctx.GetInput(1), value_in = ctx.GetInput(2);
    const Ort::ConstValue past_key = ctx.GetInput(3), past_value = ctx.GetInput(4);
    const Ort::ConstValue total_in = ctx.GetInput(6), cos_in = ctx.GetInput(7), sin_in = ctx.GetInput(8);
    const std::vector<int64_t> kv_shape = past_key.GetTensorTypeAndShapeInfo().GetShape();
    const std::vector<int64_t> q_shape = query.GetTensorTypeAndShapeInfo().GetShape();
    const std::vector<int64_t> cos_shape = cos_in.GetTensorTypeAndShapeInfo().GetShape();
    const auto fail = [](const char* why) {
      ORT_CXX_API_THROW(std::string("ExactAttention: ") + why, ORT_INVALID_ARGUMENT);
    };
    // A graph that does not match the contract (a corrupt or hand-edited export) is an error, not a stray read.
    if (kv_shape.size() != 4 || q_shape.size() != 3 || cos_shape.size() != 2 || kv_shape[0] != 1 ||
        kv_shape[1] != kv_heads || past_value.GetTensorTypeAndShapeInfo().GetShape() != kv_shape)
      fail("past_key/past_value must be [1, kv_num_heads, L, head_dim] alike, query [1, S, ·], caches [L, ·]");
    if (kv_heads <= 0 || heads % kv_heads != 0) fail("num_heads must be a multiple of kv_num_heads");
    const int64_t rows = q_shape[1], length = kv_shape[2], dim = kv_shape[3];
    const int64_t total = *total_in.GetTensorData<int32_t>(), first = total - rows;
    const int64_t half = dim / 2;
    if (dim % (2 * kLanes) != 0 || dim > kMaxDim) fail("head_dim must be a multiple of 16, at most 256");
    const bool packed = !key_in;  // q|k|v in one row per token
    if (q_shape[2] != (packed ? heads + 2 * kv_heads : heads) * dim) fail("query width does not match the heads");
    const std::vector<int64_t> kv_rows{1, rows, kv_heads * dim};
    if (!packed && (!value_in || key_in.GetTensorTypeAndShapeInfo().GetShape() != kv_rows ||
                    value_in.GetTensorTypeAndShapeInfo().GetShape() != kv_rows))
      fail("key and value must both be [1, S, kv_num_heads·head_dim]");
    if (first < 0 || total > length) fail("positions outside the KV buffer");
    // A tree: each row's depth and path (rows ascend from parents to children).
    const bool tree = ctx.GetInputCount() > 9 && ctx.GetInput(9) &&
                      ctx.GetInput(9).GetTensorTypeAndShapeInfo().GetElementCount() > 0;
    thread_local std::vector<int64_t> depths;
    thread_local std::vector<int32_t> paths;
    if (tree) {
      const Ort::ConstValue parents_in = ctx.GetInput(9);
      if (parents_in.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(rows))
        fail("tree_parents must hold one parent per row (or nothing: a chain)");
      const int32_t* parents = parents_in.GetTensorData<int32_t>();
      int64_t* depth = scratch(depths, rows);
      int32_t* path = scratch(paths, rows * rows);
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t parent = parents[r];
        if (parent < -1 || parent >= r) fail("tree_parents: a row's parent must be an earlier row, or -1");
        depth[r] = parent < 0 ? 0 : depth[parent] + 1;
        if (parent >= 0) std::memcpy(path + r * rows, path + parent * rows, sizeof(int32_t) * (depth[parent] + 1));
        path[r * rows + depth[r]] = static_cast<int32_t>(r);
      }
    }
    const int64_t* depth = tree ? depths.data() : nullptr;
    if (cos_shape[0] < total || cos_shape[1] != half ||
        sin_in.GetTensorTypeAndShapeInfo().GetShape() != cos_shape)
      fail("rotary caches must be [≥ positions, head_dim/2] alike");

    Ort::UnownedValue out = ctx.GetOutput(0, {1, rows, heads * dim});
    Ort::UnownedValue present_key = ctx.GetOutput(1, kv_shape), present_value = ctx.GetOutput(2, kv_shape);
    KV* keys = present_key.GetTensorMutableData<KV>();
    KV* values = present_value.GetTensorMutableData<KV>();
    const size_t kv_bytes = sizeof(KV) * static_cast<size_t>(kv_heads * length * dim);
    if (keys != past_key.GetTensorData<KV>()) std::memcpy(keys, past_key.GetTensorData<KV>(), kv_bytes);
    if (values != past_value.GetTensorData<KV>()) std::memcpy(values, past_value.GetTensorData<KV>(), kv_bytes);

    // Where each row's q, k and v start (packed: one [H + 2·KV, D] row per token).
    const float* q_src = query.GetTensorData<float>();
    const float* k_src = packed ? q_src + heads * dim : key_in.GetTensorData<float>();
    const float* v_src = packed ? q_src + (heads + kv_heads) * dim : value_in.GetTensorData<float>();
    const int64_t q_stride = packed ? (heads + 2 * kv_heads) * dim : heads * dim;
    const int64_t kv_stride = packed ? q_stride : kv_heads * dim;
    const float* cos = cos_in.GetTensorData<float>();
    const float* sin = sin_in.GetTensorData<float>();

    // The rotated queries; another buffer than the tasks' scores (this thread runs tasks of the ParallelFor too).
    thread_local std::vector<float> rotated;
    float* queries = scratch(rotated, rows * heads * dim);
    float key[kMaxDim];
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = first + (depth ? depth[r] : r), cell = first + r;  // rotated by position, kept by cell
      const float *c = cos + pos * half, *s = sin + pos * half;
      for (int64_t h = 0; h < heads; ++h)
        rotate(q_src + r * q_stride + h * dim, c, s, dim, queries + (r * heads + h) * dim);
      for (int64_t h = 0; h < kv_heads; ++h) {
        rotate(k_src + r * kv_stride + h * dim, c, s, dim, key);
        put(keys + (h * length + cell) * dim, key, dim);
        put(values + (h * length + cell) * dim, v_src + r * kv_stride + h * dim, dim);
      }
    }
    const int64_t vectors = rows * (heads / kv_heads);
    Call<KV> call{queries, keys, values, out.GetTensorMutableData<float>(), rows, heads, kv_heads, dim,
              length, first, depth, tree ? paths.data() : nullptr, scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(dim)), softcap,
              window, vectors, block_size(vectors)};
    // A batch per task: the pool's threads take the next task as they finish one (a fixed split of nine tasks over
    // two threads gave one of them five; one row's three, two).
    const size_t tasks = static_cast<size_t>(kv_heads * blocks(call));
    ctx.ParallelFor(attend_task<KV>, tasks, tasks, &call);
  }
};

// One registration per KV type (onnxruntime picks the kernel by the graph's types); the other tensors are float32.
template <typename KV, ONNXTensorElementDataType kKV>
struct ExactAttentionOp : Ort::CustomOpBase<ExactAttentionOp<KV, kKV>, ExactAttentionKernel<KV>> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const {
    return new ExactAttentionKernel<KV>(api, info);
  }
  const char* GetName() const { return "ExactAttention"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 10; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    if (index == 3 || index == 4) return kKV;
    return index == 5 || index == 6 || index == 9 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
                                                  : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 1 || index == 2 || index == 9 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                                    : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t index) const {
    return index == 1 || index == 2 ? kKV : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
};

}  // namespace

void add_exact_attention(Ort::CustomOpDomain& domain) {
  static ExactAttentionOp<float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> single;
  static ExactAttentionOp<Half, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16> half;
  domain.Add(&single);
  domain.Add(&half);
}
