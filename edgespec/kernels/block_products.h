// What edgespec's block products share (block_int8_matmul.cc, block_q4_matmul.cc): activation rows quantized per
// block of 32 to int8, a call's rows split into tiles, and the op around the loop (its inputs read and checked, its
// output made, its rows quantized once for every column task; the op class onnxruntime asks about).
#pragma once

#include "ops.h"  // onnxruntime's C++ API, scratch, for_each_row

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace edgespec_blocks {

constexpr int64_t kBlock = 32;  // weights and activations share their blocks along K
constexpr int64_t kColumns = 16;  // output columns per packed group of weights, and per task

// A row of k floats as int8 codes per block of 32: scale max|x| / 127, codes rounded to nearest even; each code's
// bits xor'ed with `flip` (the INT8 kernel's VNNI loop reads them unsigned, as code + 128), and where `sums` is
// given, each block's exact sum of codes (the 4-bit products' zero points and minima multiply it).
inline void quantize_row(const float* x, int64_t k, uint8_t* codes, float* scales, uint8_t flip, int32_t* sums) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* v = x + b * kBlock;
#if defined(__AVX512F__) && defined(__FMA__)
    // The codes and scales of the loop below, bit for bit, in 512-bit vectors: the maximum is exact in any order,
    // the product is one rounding either way, and vcvtps2dq rounds to nearest even as nearbyint does in the default
    // rounding mode (a scratch program compared every code and scale on 200 000 blocks). A row's quantization runs on
    // the calling thread while the other waits; the loop below took ~0.3 / 0.8 µs a row of 576 / 1536, this a third.
    static_assert(kBlock == 32, "a block is two 16-float vectors");
    const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, magnitude), _mm512_and_ps(hi, magnitude)));
    const float scale = amax / 127.0f, inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    scales[b] = scale;
    const __m512 by = _mm512_set1_ps(inverse);
    const __m128i flips = _mm_set1_epi8(static_cast<char>(flip));
    const __m512i low = _mm512_cvtps_epi32(_mm512_mul_ps(lo, by)), high = _mm512_cvtps_epi32(_mm512_mul_ps(hi, by));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * kBlock), _mm_xor_si128(_mm512_cvtepi32_epi8(low), flips));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * kBlock + 16),
                     _mm_xor_si128(_mm512_cvtepi32_epi8(high), flips));
    if (sums) sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(low, high));
#else
    float amax = 0.0f;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float scale = amax / 127.0f, inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    scales[b] = scale;
    int32_t sum = 0;
    for (int64_t i = 0; i < kBlock; ++i) {
      const auto code = static_cast<int8_t>(std::nearbyint(v[i] * inverse));
      codes[b * kBlock + i] = static_cast<uint8_t>(code) ^ flip;
      sum += code;
    }
    if (sums) sums[b] = sum;
#endif
  }
}

// A block product's call: A float [..., K] (its M rows), B and the scales as the op packs them, the output
// float [..., N]. Each op checks the shapes against its own contract, then asks for the output.
class ProductCall {
 public:
  ProductCall(OrtKernelContext* context, const char* op)
      : ctx(context), a(ctx.GetInput(0)), b(ctx.GetInput(1)), s(ctx.GetInput(2)),
        a_shape(a.GetTensorTypeAndShapeInfo().GetShape()), b_shape(b.GetTensorTypeAndShapeInfo().GetShape()),
        s_shape(s.GetTensorTypeAndShapeInfo().GetShape()), op_(op) {}

  // A graph that does not match the contract (a corrupt or hand-edited export) is an error, not a stray read.
  [[noreturn]] void fail(const std::string& why) const {
    ORT_CXX_API_THROW(op_ + (": " + why), ORT_INVALID_ARGUMENT);
  }

  // The output [..., n] (A's leading axes); sets m, the rows of A.
  float* output(int64_t n) {
    std::vector<int64_t> shape = a_shape;
    m = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
    shape.back() = n;
    return ctx.GetOutput(0, shape).GetTensorMutableData<float>();
  }

  // columns(call, n0) for every `per_task` groups of 16 columns from n0 (the last task may hold fewer), a batch per
  // task: a thread that finishes takes the next, rather than each thread a fixed share (the INT8 kernel measured both
  // ways round in one process, docs/kernels.md: ~1% quicker, same bits).
  template <class Call, void (*columns)(const Call&, int64_t)>
  void for_each_group(const Call& call, int64_t groups, int64_t per_task = 1) const {
    struct Tasks {
      const Call* call;
      int64_t per_task;
    } tasks{&call, per_task};
    const auto task = [](void* data, size_t i) {
      const Tasks& t = *static_cast<const Tasks*>(data);
      columns(*t.call, static_cast<int64_t>(i) * t.per_task * kColumns);
    };
    const auto count = static_cast<size_t>((groups + per_task - 1) / per_task);
    ctx.ParallelFor(task, count, count, &tasks);
  }

  Ort::KernelContext ctx;
  Ort::ConstValue a, b, s;
  std::vector<int64_t> a_shape, b_shape, s_shape;
  int64_t m = 0;

 private:
  std::string op_;
};

// A's rows quantized (quantize_row), each once, then read by every column task.
struct QuantizedRows {
  uint8_t* codes;  // [M][K]
  float* scales;  // [M][K/32]
  int32_t* sums;  // [M][K/32]: Σ of each block's codes, or null
  int32_t* half_sums;  // [M][K/16]: Σ of each half block's codes (sub-blocks of 16), or null
  float* scaled_sums;  // [M][K/32]: with sums, each block's scale · Σ of its codes (one rounding): what a minimum
                       // multiplies, one fused multiply-add per row, block and vector of columns
  const float* x;
  int64_t k;
  uint8_t flip;
};

inline void quantize_task(void* data, size_t row) {
  const QuantizedRows& q = *static_cast<const QuantizedRows*>(data);
  const int64_t r = static_cast<int64_t>(row), blocks = q.k / kBlock;
  uint8_t* codes = q.codes + r * q.k;
  int32_t* sums = q.sums ? q.sums + r * blocks : nullptr;
  quantize_row(q.x + r * q.k, q.k, codes, q.scales + r * blocks, q.flip, sums);
  if (!sums) return;
  for (int64_t b = 0; b < blocks; ++b)
    q.scaled_sums[r * blocks + b] = q.scales[r * blocks + b] * static_cast<float>(sums[b]);
  if (!q.half_sums) return;
  for (int64_t b = 0; b < blocks; ++b) {  // each block's first half summed, the second the rest (exact integers)
    int32_t first = 0;
    for (int64_t i = 0; i < kBlock / 2; ++i) first += static_cast<int8_t>(codes[b * kBlock + i]);
    q.half_sums[r * 2 * blocks + 2 * b] = first;
    q.half_sums[r * 2 * blocks + 2 * b + 1] = sums[b] - first;
  }
}

// The call's rows quantized into buffers the calling thread keeps between calls; with `sums` each block's Σ of
// codes (and scale · Σ), with `halves` (and `sums`, unflipped codes) each half block's too.
inline QuantizedRows quantize_rows(const ProductCall& call, uint8_t flip, bool sums, bool halves) {
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> scales, scaled_sums;
  thread_local std::vector<int32_t> block_sums, half_sums;
  const int64_t m = call.m, k = call.a_shape.back();
  QuantizedRows q{scratch(codes, m * k), scratch(scales, m * k / kBlock),
                  sums ? scratch(block_sums, m * k / kBlock) : nullptr,
                  halves ? scratch(half_sums, m * k / (kBlock / 2)) : nullptr,
                  sums ? scratch(scaled_sums, m * k / kBlock) : nullptr, call.a.GetTensorData<float>(), k, flip};
  for_each_row(call.ctx, m, quantize_task, &q);
  return q;
}

// The op class onnxruntime asks about: A float, B and the scales in, one float out, on the CPU. Kernel gives the
// name, B's and the scales' element types (kWeights, kScales) and Compute.
template <class Kernel>
struct ProductOp : Ort::CustomOpBase<ProductOp<Kernel>, Kernel> {
  void* CreateKernel(const OrtApi&, const OrtKernelInfo*) const { return new Kernel; }
  const char* GetName() const { return Kernel::kName; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : index == 1 ? Kernel::kWeights : Kernel::kScales;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

template <class Kernel>
void add_product(Ort::CustomOpDomain& domain) {
  static ProductOp<Kernel> op;
  domain.Add(&op);
}

#if defined(__AVX2__) && defined(__FMA__)
// Rows per tile: each tile reads the weights once, so a verify batch up to this size costs one pass over them.
// A tile keeps 2 registers per row and vector (its integer and float sums): 16-column vectors use one each, pairs of
// 8-column ones two; AVX2's 16 registers hold 2 rows of pairs, AVX-512's 32 hold 8 rows of 16-column vectors or 4
// of pairs (with 8 columns and 4 rows, the whole model's 5-token verify cost 1.76× one token's against 1.17× for 4
// tokens, and 1.36× with 8, on the AVX-512 EPYC: docs/kernels.md).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr int64_t kTileRows = 8;
#elif defined(__AVX512VL__)
constexpr int64_t kTileRows = 4;
#else
constexpr int64_t kTileRows = 2;
#endif

// Rows 0 … m − 1 as tiles of near-equal size, tile(first row, rows) each (5 rows in tiles of 4: 3 + 2, not 4 + 1).
template <class Tile>
void for_each_tile(int64_t m, Tile tile) {
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
  for (int64_t i = 0, m0 = 0; i < tiles; ++i) {
    const int64_t rows = (m - m0) / (tiles - i);
    tile(m0, rows);
    m0 += rows;
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The float side of a vector of output columns, alike in both kernels' lanes: a row's four codes broadcast into
// every lane, the accumulators zeroed and stored, and a block's integer sum scaled into them (each kernel adds how
// its weights load and how its integer dot products run).
struct FloatLanes8 {
  using Int = __m256i;
  using Float = __m256;
  static constexpr int64_t kWidth = 8;
  static Int broadcast(const uint8_t* codes) {  // four codes into every lane, read straight from memory
    uint32_t a4;
    std::memcpy(&a4, codes, sizeof a4);
    return _mm256_set1_epi32(static_cast<int>(a4));
  }
  static Float zero_float() { return _mm256_setzero_ps(); }
  static void store(float* p, Float v) { _mm256_storeu_ps(p, v); }
  // acc + float(sum) · (row_scale · column_scales), rounded as the portable path rounds it
  static Float step(Float acc, Int sum, float row_scale, Float column_scales) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(_mm256_set1_ps(row_scale), column_scales), acc);
  }
  // acc + row_value · column_values, one rounding (a minimum's step: row_value is a scaled sum)
  static Float fma(Float acc, float row_value, Float column_values) {
    return _mm256_fmadd_ps(_mm256_set1_ps(row_value), column_values, acc);
  }
};

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
struct FloatLanes16 {
  using Int = __m512i;
  using Float = __m512;
  static constexpr int64_t kWidth = 16;
  static Int broadcast(const uint8_t* codes) {
    uint32_t a4;
    std::memcpy(&a4, codes, sizeof a4);
    return _mm512_set1_epi32(static_cast<int>(a4));
  }
  static Float zero_float() { return _mm512_setzero_ps(); }
  static void store(float* p, Float v) { _mm512_storeu_ps(p, v); }
  static Float step(Float acc, Int sum, float row_scale, Float column_scales) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(_mm512_set1_ps(row_scale), column_scales), acc);
  }
  static Float fma(Float acc, float row_value, Float column_values) {
    return _mm512_fmadd_ps(_mm512_set1_ps(row_value), column_values, acc);
  }
};
#endif
#endif

}  // namespace edgespec_blocks
