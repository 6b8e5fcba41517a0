// edgespec.BlockInt8MatMul: MatMulNBits' arithmetic at 8 bits, symmetric, blocks of 32, accuracy level 4, in a
// form where the rows of a call share each weight load.
//
// The arithmetic: weights w in blocks of 32 along K, one float scale per block and output column; each activation
// row quantized per block of 32 to int8 (scale max|x| / 127, round to nearest even); per block an exact integer
// dot product, then, blocks in ascending order, acc = fma(float(dot), row scale · column scale, acc).
//
// Why: MatMulNBits takes each row through the weights on its own, and its single-row path is slower than this one
// on an AVX2 CPU (one layer's products 0.86× its time at one row, docs/kernels.md).
// Weights are packed at export, 16 columns × 4 k per 64 bytes; a row's 4 activations are broadcast against a vector
// of them (an outer product), so the columns' integer sums accumulate in one register with no horizontal sums, and
// the rows of a tile (kTileRows: 2 to 8 by the registers) use each weight vector while it is in a register. Per
// row and vector that is 4 instructions on AVX2 (vpsignb, vpmaddubsw, vpmaddwd, vpaddd, 8 columns) and 1 where the
// CPU has VNNI's dot product (vpdpbusd: 8 columns with AVX-VNNI, all 16 with AVX512-VNNI): a verify batch's extra
// rows cost what the CPU's integer units compute, the weights being read once per tile and in order. (The 16
// columns are packed side by side because a 512-bit loop over two 8-column groups packed apart read memory more
// slowly, one row 1.5× as long on the AVX-512 EPYC: measured with a scratch program, not kept.)
//
// Exactness: a block's integer sum is exact whatever the order, and every (row, column) then runs the same float
// operations in the same order, whatever the call's row count, tile or thread: a row has the same bits alone or
// in a verify batch, and the portable path below gives the same bits as the AVX2 and VNNI ones.
//
// Inputs: A float [..., K]; B int8 [N/16, K/4, 64] (columns n0..n0+15 × k..k+3 per 64 bytes, k fastest);
// scales float [K/32, N]. Output: float [..., N].

#include "ops.h"  // onnxruntime's C++ API
#include "block_products.h"  // quantize_rows, kTileRows, for_each_tile, ProductCall, add_product

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define EDGESPEC_VNNI(sum, u, s) _mm256_dpbusd_epi32(sum, u, s)
#elif defined(__AVXVNNI__)
#define EDGESPEC_VNNI(sum, u, s) _mm256_dpbusd_avx_epi32(sum, u, s)
#endif
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

using edgespec_blocks::kBlock;
using edgespec_blocks::kColumns;
constexpr int64_t kDepth = 4;  // k per packed column

// Activation rows quantized per block: the codes, and one scale per row and block.
struct Rows {
  const uint8_t* codes;  // [M][K]: each int8 code's bits, the top one flipped where VNNI reads them (kCodeFlip)
  const float* scales;  // [M][K/32]
};

struct Call {
  Rows rows;
  const int8_t* weights;
  const float* scales;  // [K/32][N]
  float* out;
  int64_t m, k, n;
};

// VNNI's dot product takes one side unsigned: there the codes are stored as code + 128 (the top bit flipped), so
// the loop broadcasts them from memory as they are (flipping them in the loop cost a third of its time).
#ifdef EDGESPEC_VNNI
constexpr uint8_t kCodeFlip = 0x80;
#else
constexpr uint8_t kCodeFlip = 0;
#endif

// Where column n's weights start in B (k = 0): its packed group's start, then its place in each 64 bytes.
const int8_t* packed_column(const int8_t* weights, int64_t n, int64_t k_all) {
  return weights + n / kColumns * kColumns * k_all + n % kColumns * kDepth;
}

#if defined(__AVX2__) && defined(__FMA__)
// A weight vector loaded once into a register for every row of the tile: left to itself the compiler folds the load
// into each row's vpdpbusd (against the kernel with neither this nor prefetch_ahead, weights in cache: tiles of 1
// and 2 rows 1.07–1.38× faster; benchmarks/products_kernel.py).
template <class T>
T in_register(T v) {
  asm("" : "+v"(v));
  return v;
}

// The weights 8 KB ahead, asked for into L2: while a tile computes, the hardware prefetcher alone let the memory
// stream stall, and a call cost the weights' read time plus its products' time instead of the longer of the two
// (benchmarks/products_kernel.py against the kernel without this and in_register, AVX-512 EPYC, weights from
// memory: 8 rows 1.21–1.53× faster, 4 rows up to 1.59×).
// From the row count the lanes ask for (kPrefetchFromRows). The 512-bit loop's one and two rows are faster without:
// their loop is short, and the prefetches compete with the hardware's for the memory stream. Against prefetching
// from two rows, one thread, weights from memory, two rows: SmolLM2's head (576×49152) 1.44× and gate|up 1.37× as
// fast, the down projection (1536×576) 0.86×. Products with K = 1536 need it from three rows (0.66–0.86× without at 3–4 rows, also at 1536×3072),
// those with K = 576 gain without it up to three (scratch builds; why K decides is not known). In the model, two
// threads: a two-row pass 1.26× a one-row pass instead of 1.33× at 300 tokens of context
// (benchmarks/kernels_in_model.py), 1.4–3.3 points less in six other runs at 100–1000 tokens. The 256-bit pairs'
// lone row is much slower without (benchmarks/products_kernel.py --march x86-64-v3 shows either with the constant
// changed).
constexpr int64_t kPrefetchBytes = 8192;
template <class V, int R>
void prefetch_ahead(const int8_t* p) {
  if constexpr (R >= V::kPrefetchFromRows)
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T1);
}

// A vector of output columns and the operations the tile loop needs on it: 8 columns (half a packed group) in 256
// bits, and with AVX512-VNNI all 16 in 512: one broadcast of a row's four codes then feeds 16 columns' dot products
// (against the 8-column kernel on the AVX-512 EPYC, weights in cache: 1.3–2.1× faster at 1–8 rows; from memory
// 1.4–2.5× at 4–8 rows, 0.88–1.19× at one; benchmarks/products_kernel.py).
struct Lanes8 : edgespec_blocks::FloatLanes8 {
  static Int weights(const int8_t* packed) {  // k … k + 3 of the vector's columns, in a register (in_register)
    return in_register(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed)));
  }
  static Int zero() { return _mm256_setzero_si256(); }
  static Int sub(Int a, Int b) { return _mm256_sub_epi32(a, b); }
#ifdef EDGESPEC_VNNI
  static Int dot(Int sum, Int u, Int s) { return EDGESPEC_VNNI(sum, u, s); }
  static Int bytes(uint8_t v) { return _mm256_set1_epi8(static_cast<char>(v)); }
#else
  static Int magnitude(Int w) { return _mm256_abs_epi8(w); }
  // sum + the four-byte dot products of a and w, lane by lane, with AVX2's byte products (block_sums)
  static Int signed_dot(Int sum, Int a, Int w, Int magnitude) {
    const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(a, w));
    return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
#endif
  static Float load(const float* p) { return _mm256_loadu_ps(p); }
};

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
struct Lanes16 : edgespec_blocks::FloatLanes16 {
  static constexpr int kPrefetchFromRows = 3;
  static Int weights(const int8_t* packed) { return in_register(_mm512_loadu_si512(packed)); }
  static Int zero() { return _mm512_setzero_si512(); }
  static Int sub(Int a, Int b) { return _mm512_sub_epi32(a, b); }
  static Int dot(Int sum, Int u, Int s) { return _mm512_dpbusd_epi32(sum, u, s); }
  static Int bytes(uint8_t v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static Float load(const float* p) { return _mm512_loadu_ps(p); }
};
using GroupLanes = Lanes16;
#else
// Two 8-column vectors side by side: the whole 16-column group in one pass where vectors are 256 bits, each
// 64-byte line of weights read once and in order. Taking the group in two 8-column passes instead made a lone
// row's products slower than with the 8-column packing (benchmarks/products_kernel.py --march x86-64-v3, AVX2
// without VNNI, on the AVX-512 EPYC).
template <class V>
struct Pair {
  struct Int {
    typename V::Int lo, hi;
  };
  struct Float {
    typename V::Float lo, hi;
  };
  static constexpr int64_t kWidth = 2 * V::kWidth;
  static constexpr int kPrefetchFromRows = 1;
  static Int weights(const int8_t* packed) { return {V::weights(packed), V::weights(packed + 4 * V::kWidth)}; }
  static Int broadcast(const uint8_t* codes) {
    const typename V::Int a = V::broadcast(codes);
    return {a, a};
  }
  static Int zero() { return {V::zero(), V::zero()}; }
  static Int sub(Int a, Int b) { return {V::sub(a.lo, b.lo), V::sub(a.hi, b.hi)}; }
#ifdef EDGESPEC_VNNI
  static Int dot(Int sum, Int u, Int s) { return {V::dot(sum.lo, u.lo, s.lo), V::dot(sum.hi, u.hi, s.hi)}; }
  static Int bytes(uint8_t v) { return {V::bytes(v), V::bytes(v)}; }
#else
  static Int magnitude(Int w) { return {V::magnitude(w.lo), V::magnitude(w.hi)}; }
  static Int signed_dot(Int sum, Int a, Int w, Int m) {
    return {V::signed_dot(sum.lo, a.lo, w.lo, m.lo), V::signed_dot(sum.hi, a.hi, w.hi, m.hi)};
  }
#endif
  static Float zero_float() { return {V::zero_float(), V::zero_float()}; }
  static Float load(const float* p) { return {V::load(p), V::load(p + V::kWidth)}; }
  static void store(float* p, Float v) {
    V::store(p, v.lo);
    V::store(p + V::kWidth, v.hi);
  }
  static Float step(Float acc, Int sum, float row_scale, Float column_scales) {
    return {V::step(acc.lo, sum.lo, row_scale, column_scales.lo), V::step(acc.hi, sum.hi, row_scale, column_scales.hi)};
  }
};
using GroupLanes = Pair<Lanes8>;
#endif

#ifdef EDGESPEC_VNNI
// One block's integer sums for R rows against the tile's columns (lane j: column n0 + j). vpdpbusd multiplies
// unsigned by signed bytes, four per lane, into int32 without saturating: the unsigned side is each activation
// plus 128 (the codes as quantize_row stores them for this loop), the signed side the weights, and the 128 · Σ w
// that this adds is taken off once per block, the same for every row (|sum| ≤ 32 · 255 · 128, inside int32).
template <class V, int R>
void block_sums(const int8_t* packed, const uint8_t* codes, int64_t k_all, typename V::Int (&sum)[R]) {
  const typename V::Int offset = V::bytes(0x80);
  typename V::Int bias = V::zero();
  for (int r = 0; r < R; ++r) sum[r] = V::zero();
  for (int64_t k = 0; k < kBlock; k += kDepth) {
    prefetch_ahead<V, R>(packed + k * kColumns);
    const typename V::Int w = V::weights(packed + k * kColumns);
    bias = V::dot(bias, offset, w);
    for (int r = 0; r < R; ++r) sum[r] = V::dot(sum[r], V::broadcast(codes + r * k_all + k), w);
  }
  for (int r = 0; r < R; ++r) sum[r] = V::sub(sum[r], bias);
}
#else
// The same sums with AVX2's byte products: vpmaddubsw multiplies unsigned by signed bytes into saturating int16
// pairs, so the unsigned side is |w| (≤ 128: a weight of −128 is 128 as unsigned), the signed side the activation
// with w's sign (|a| ≤ 127): a pair's sum is at most 2 · 128 · 127, inside int16.
template <class V, int R>
void block_sums(const int8_t* packed, const uint8_t* codes, int64_t k_all, typename V::Int (&sum)[R]) {
  for (int r = 0; r < R; ++r) sum[r] = V::zero();
  for (int64_t k = 0; k < kBlock; k += kDepth) {
    prefetch_ahead<V, R>(packed + k * kColumns);
    const typename V::Int w = V::weights(packed + k * kColumns), magnitude = V::magnitude(w);
    for (int r = 0; r < R; ++r) sum[r] = V::signed_dot(sum[r], V::broadcast(codes + r * k_all + k), w, magnitude);
  }
}
#endif

// Rows m0 … m0 + R − 1 against columns n0 … n0 + V::kWidth − 1: each block's exact integer sums, then the float
// steps.
template <class V, int R>
void panel(const Call& c, int64_t m0, int64_t n0) {
  const int64_t blocks = c.k / kBlock;
  const int8_t* packed = packed_column(c.weights, n0, c.k);
  typename V::Float acc[R];
  for (int r = 0; r < R; ++r) acc[r] = V::zero_float();
  for (int64_t b = 0; b < blocks; ++b) {
    typename V::Int sum[R];
    block_sums<V, R>(packed + b * kBlock * kColumns, c.rows.codes + m0 * c.k + b * kBlock, c.k, sum);
    const typename V::Float column_scales = V::load(c.scales + b * c.n + n0);
    for (int r = 0; r < R; ++r) acc[r] = V::step(acc[r], sum[r], c.rows.scales[(m0 + r) * blocks + b], column_scales);
  }
  for (int r = 0; r < R; ++r) V::store(c.out + (m0 + r) * c.n + n0, acc[r]);
}

using edgespec_blocks::kTileRows;

using Panel = void (*)(const Call&, int64_t, int64_t);

// panel<GroupLanes, 1> … panel<GroupLanes, kTileRows>: a tile of r rows runs kPanels[r − 1].
template <size_t... I>
constexpr std::array<Panel, sizeof...(I)> panel_table(std::index_sequence<I...>) {
  return {panel<GroupLanes, static_cast<int>(I) + 1>...};
}
constexpr auto kPanels = panel_table(std::make_index_sequence<kTileRows>());
static_assert(GroupLanes::kWidth == kColumns, "a tile covers one packed group");

// Columns n0 … n0 + 15 (one packed group) for every row, tile by tile.
void columns(const Call& c, int64_t n0) {
  edgespec_blocks::for_each_tile(c.m, [&](int64_t m0, int64_t rows) {
    kPanels[static_cast<size_t>(rows - 1)](c, m0, n0);
  });
}
#else
// The same sums, one (row, column) at a time: integer block sums are exact, and the float steps are the SIMD
// paths' (the product of the two scales rounded, then one fused multiply-add per block).
void columns(const Call& c, int64_t n0) {
  const int64_t blocks = c.k / kBlock;
  for (int64_t m = 0; m < c.m; ++m)
    for (int64_t j = 0; j < kColumns; ++j) {
      const int8_t* packed = packed_column(c.weights, n0 + j, c.k);
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t dot = 0;
        for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k)
          dot += int32_t(packed[k / kDepth * kColumns * kDepth + k % kDepth]) *
                 int32_t(static_cast<int8_t>(c.rows.codes[m * c.k + k]));
        const float scale = c.rows.scales[m * blocks + b] * c.scales[b * c.n + n0 + j];
        acc = std::fma(static_cast<float>(dot), scale, acc);
      }
      c.out[m * c.n + n0 + j] = acc;
    }
}
#endif

struct BlockInt8MatMulKernel {
  static constexpr const char* kName = "BlockInt8MatMul";
  static constexpr ONNXTensorElementDataType kWeights = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
  static constexpr ONNXTensorElementDataType kScales = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;

  void Compute(OrtKernelContext* context) {
    edgespec_blocks::ProductCall p(context, kName);
    const std::vector<int64_t>& b_shape = p.b_shape;
    const std::vector<int64_t>& s_shape = p.s_shape;
    if (p.a_shape.empty() || b_shape.size() != 3 || b_shape[2] != kColumns * kDepth || s_shape.size() != 2)
      p.fail("A must be [..., K], B [N/16, K/4, 64], scales [K/32, N] (an export by an older edgespec packed B "
             "otherwise: export it again)");
    const int64_t k = p.a_shape.back(), n = b_shape[0] * kColumns;
    if (k % kBlock != 0 || b_shape[1] * kDepth != k || s_shape[0] != k / kBlock || s_shape[1] != n)
      p.fail("K must be a multiple of 32 and A, B and scales must agree on K and N");
    float* out = p.output(n);
    if (p.m == 0) return;
    const edgespec_blocks::QuantizedRows q = edgespec_blocks::quantize_rows(p, kCodeFlip, false, false);
    Call call{{q.codes, q.scales}, p.b.GetTensorData<int8_t>(), p.s.GetTensorData<float>(), out, p.m, k, n};
    p.for_each_group<Call, columns>(call, n / kColumns);
  }
};

}  // namespace

void add_block_int8_matmul(Ort::CustomOpDomain& domain) { edgespec_blocks::add_product<BlockInt8MatMulKernel>(domain); }
