// edgespec.BlockInt8MatMul: MatMulNBits' arithmetic at 8 bits, symmetric, blocks of 32, accuracy level 4, in a
// form where the rows of a call share each weight load.
//
// The arithmetic: weights w in blocks of 32 along K, one float scale per block and output column; each activation
// row quantized per block of 32 to int8 (scale max|x| / 127, round to nearest even); per block an exact integer
// dot product, then, blocks in ascending order, acc = fma(float(dot), row scale · column scale, acc).
//
// Why: MatMulNBits takes each row through the weights on its own, and its single-row path is slower than this one
// on an AVX2 CPU (benchmarks/blockwise_int8_gemm.py at 90c5f3f: one layer's products 0.86× its time at one row).
// Weights are packed at export, 8 columns × 4 k per 32-byte vector; a row's 4 activations are broadcast against it
// (an outer product), so 8 columns' integer sums accumulate in one register with no horizontal sums, and the rows of
// a tile (up to 4, or 8 with AVX-512's registers) use each weight vector while it is in a register. Per row and
// vector that is 4 instructions on AVX2 (vpsignb, vpmaddubsw, vpmaddwd, vpaddd) and 1 where the CPU has VNNI's
// dot product (vpdpbusd, AVX512-VNNI or AVX-VNNI): a verify batch's extra rows cost what the CPU's integer units
// compute, the weights being read once per tile.
//
// Exactness: a block's integer sum is exact whatever the order, and every (row, column) then runs the same float
// operations in the same order, whatever the call's row count, tile or thread: a row has the same bits alone or
// in a verify batch, and the portable path below gives the same bits as the AVX2 and VNNI ones.
//
// Inputs: A float [..., K]; B int8 [N/8, K/4, 32] (columns n0..n0+7 × k..k+3 per 32 bytes, k fastest);
// scales float [K/32, N]. Output: float [..., N].

#include "ops.h"  // onnxruntime's C++ API

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
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;  // weights and activations share their blocks along K
constexpr int64_t kColumns = 8;  // per task and per packed vector
constexpr int64_t kDepth = 4;    // k per packed column
constexpr int64_t kParallelRows = 16;  // rows from which their quantization is shared between threads

// Activation rows quantized per block: the codes, and one scale per row and block.
struct Rows {
  const int8_t* codes;  // [M][K]
  const float* scales;  // [M][K/32]
};

struct Call {
  Rows rows;
  const int8_t* weights;
  const float* scales;  // [K/32][N]
  float* out;
  int64_t m, k, n;
};

void quantize_row(const float* x, int64_t k, int8_t* codes, float* scales) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* v = x + b * kBlock;
    float amax = 0.0f;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float scale = amax / 127.0f, inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    scales[b] = scale;
    for (int64_t i = 0; i < kBlock; ++i) codes[b * kBlock + i] = static_cast<int8_t>(std::nearbyint(v[i] * inverse));
  }
}

#if defined(__AVX2__) && defined(__FMA__)
#ifdef EDGESPEC_VNNI
// One block's integer sums for R rows against columns n0 … n0 + 7 (lane j: column n0 + j). vpdpbusd multiplies
// unsigned by signed bytes, four per lane, into int32 without saturating: the unsigned side is each activation
// plus 128 (its code with the top bit flipped), the signed side the weights, and the 128 · Σ w that this adds is
// taken off once per block, the same for every row (|sum| ≤ 32 · 255 · 128, inside int32).
template <int R>
void block_sums(const int8_t* packed, const int8_t* const* codes, __m256i (&sum)[R]) {
  const __m256i offset = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i bias = _mm256_setzero_si256();
  for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
  for (int64_t k = 0; k < kBlock; k += kDepth) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + k * kColumns));
    bias = EDGESPEC_VNNI(bias, offset, w);
    for (int r = 0; r < R; ++r) {
      uint32_t a4;
      std::memcpy(&a4, codes[r] + k, sizeof a4);
      sum[r] = EDGESPEC_VNNI(sum[r], _mm256_set1_epi32(static_cast<int>(a4 ^ 0x80808080u)), w);
    }
  }
  for (int r = 0; r < R; ++r) sum[r] = _mm256_sub_epi32(sum[r], bias);
}
#else
// The same sums with AVX2's byte products: vpmaddubsw multiplies unsigned by signed bytes into saturating int16
// pairs, so the unsigned side is |w| (≤ 128: a weight of −128 is 128 as unsigned), the signed side the activation
// with w's sign (|a| ≤ 127): a pair's sum is at most 2 · 128 · 127, inside int16.
template <int R>
void block_sums(const int8_t* packed, const int8_t* const* codes, __m256i (&sum)[R]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
  for (int64_t k = 0; k < kBlock; k += kDepth) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + k * kColumns));
    const __m256i magnitude = _mm256_abs_epi8(w);
    for (int r = 0; r < R; ++r) {
      int32_t a4;
      std::memcpy(&a4, codes[r] + k, sizeof a4);
      const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(_mm256_set1_epi32(a4), w));
      sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(pairs, ones));
    }
  }
}
#endif

// Rows m0 … m0 + R − 1 against columns n0 … n0 + 7: each block's exact integer sums, then the float steps.
template <int R>
void panel(const Call& c, int64_t m0, int64_t n0) {
  const int64_t blocks = c.k / kBlock;
  const int8_t* packed = c.weights + n0 * c.k;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int8_t* codes[R];
    for (int r = 0; r < R; ++r) codes[r] = c.rows.codes + (m0 + r) * c.k + b * kBlock;
    __m256i sum[R];
    block_sums<R>(packed + b * kBlock * kColumns, codes, sum);
    const __m256 column_scales = _mm256_loadu_ps(c.scales + b * c.n + n0);
    for (int r = 0; r < R; ++r) {
      const __m256 scales = _mm256_mul_ps(_mm256_set1_ps(c.rows.scales[(m0 + r) * blocks + b]), column_scales);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), scales, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(c.out + (m0 + r) * c.n + n0, acc[r]);
}

// Rows per tile: each tile reads the weights once, so a verify batch up to this size costs one pass over them.
// A tile keeps 2 vectors per row in registers (its integer and float sums): AVX2's 16 hold 4 rows, AVX-512's 32
// hold 8 (with 4, the whole model's 5-token verify cost 1.76× one token's against 1.17× for 4 tokens, and 1.36×
// with 8: the AVX-512 EPYC's Spec-Bench references, benchmarks/reference/spec_bench-2026-11-24-epyc-avx512-*).
#if defined(__AVX512VL__)
constexpr int64_t kTileRows = 8;
#else
constexpr int64_t kTileRows = 4;
#endif

using Panel = void (*)(const Call&, int64_t, int64_t);

// panel<1> … panel<kTileRows>: a tile of r rows runs panels[r − 1].
template <size_t... I>
constexpr std::array<Panel, sizeof...(I)> panel_table(std::index_sequence<I...>) {
  return {panel<static_cast<int>(I) + 1>...};
}
constexpr auto kPanels = panel_table(std::make_index_sequence<kTileRows>());

// Columns n0 … n0 + 7 for every row, in tiles of near-equal size (5 rows in tiles of 4: 3 + 2, not 4 + 1).
void columns(const Call& c, int64_t n0) {
  const int64_t tiles = (c.m + kTileRows - 1) / kTileRows;
  for (int64_t i = 0, m = 0; i < tiles; ++i) {
    const int64_t rows = (c.m - m) / (tiles - i);
    kPanels[static_cast<size_t>(rows - 1)](c, m, n0);
    m += rows;
  }
}
#else
// The same sums, one (row, column) at a time: integer block sums are exact, and the float steps are the AVX2
// path's (the product of the two scales rounded, then one fused multiply-add per block).
void columns(const Call& c, int64_t n0) {
  const int64_t blocks = c.k / kBlock;
  const int8_t* packed = c.weights + n0 * c.k;
  for (int64_t m = 0; m < c.m; ++m)
    for (int64_t j = 0; j < kColumns; ++j) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t dot = 0;
        for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k)
          dot += int32_t(packed[k / kDepth * kColumns * kDepth + j * kDepth + k % kDepth]) *
                 int32_t(c.rows.codes[m * c.k + k]);
        const float scale = c.rows.scales[m * blocks + b] * c.scales[b * c.n + n0 + j];
        acc = std::fma(static_cast<float>(dot), scale, acc);
      }
      c.out[m * c.n + n0 + j] = acc;
    }
}
#endif

void columns_task(void* data, size_t task) {
  const Call& c = *static_cast<const Call*>(data);
  columns(c, static_cast<int64_t>(task) * kColumns);
}

struct QuantizeCall {
  const float* x;
  int8_t* codes;
  float* scales;
  int64_t k;
};

void quantize_task(void* data, size_t row) {
  const QuantizeCall& q = *static_cast<const QuantizeCall*>(data);
  const int64_t r = static_cast<int64_t>(row);
  quantize_row(q.x + r * q.k, q.k, q.codes + r * q.k, q.scales + r * (q.k / kBlock));
}

struct BlockInt8MatMulKernel {
  BlockInt8MatMulKernel(const OrtApi&, const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const Ort::ConstValue a = ctx.GetInput(0), b = ctx.GetInput(1), s = ctx.GetInput(2);
    std::vector<int64_t> shape = a.GetTensorTypeAndShapeInfo().GetShape();
    const std::vector<int64_t> b_shape = b.GetTensorTypeAndShapeInfo().GetShape();
    const std::vector<int64_t> s_shape = s.GetTensorTypeAndShapeInfo().GetShape();
    const auto fail = [](const std::string& why) {
      ORT_CXX_API_THROW("BlockInt8MatMul: " + why, ORT_INVALID_ARGUMENT);
    };
    // A graph that does not match the contract (a corrupt or hand-edited export) is an error, not a stray read.
    if (shape.empty() || b_shape.size() != 3 || b_shape[2] != kColumns * kDepth || s_shape.size() != 2)
      fail("A must be [..., K], B [N/8, K/4, 32], scales [K/32, N]");
    const int64_t k = shape.back(), n = b_shape[0] * kColumns;
    if (k % kBlock != 0 || b_shape[1] * kDepth != k || s_shape[0] != k / kBlock || s_shape[1] != n)
      fail("K must be a multiple of 32 and A, B and scales must agree on K and N");
    int64_t m = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
    shape.back() = n;
    Ort::UnownedValue out = ctx.GetOutput(0, shape);
    if (m == 0) return;

    // Each row quantized once, then read by every column task (kept by the calling thread between calls).
    thread_local std::vector<int8_t> codes;
    thread_local std::vector<float> row_scales;
    QuantizeCall q{a.GetTensorData<float>(), scratch(codes, m * k), scratch(row_scales, m * k / kBlock), k};
    if (m < kParallelRows) {  // a verify batch: fewer rows than a thread hand-off costs
      for (int64_t r = 0; r < m; ++r) quantize_task(&q, static_cast<size_t>(r));
    } else {
      ctx.ParallelFor(quantize_task, static_cast<size_t>(m), 0, &q);
    }
    Call call{{q.codes, q.scales}, b.GetTensorData<int8_t>(), s.GetTensorData<float>(),
              out.GetTensorMutableData<float>(), m, k, n};
    ctx.ParallelFor(columns_task, static_cast<size_t>(n / kColumns), 0, &call);  // 0 batches: one per thread
  }
};

struct BlockInt8MatMulOp : Ort::CustomOpBase<BlockInt8MatMulOp, BlockInt8MatMulKernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const {
    return new BlockInt8MatMulKernel(api, info);
  }
  const char* GetName() const { return "BlockInt8MatMul"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

void add_block_int8_matmul(Ort::CustomOpDomain& domain) {
  static BlockInt8MatMulOp op;
  domain.Add(&op);
}
