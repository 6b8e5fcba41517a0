// A blockwise-INT8 matrix product for verify batches, timed against onnxruntime's MatMulNBits by
// benchmarks/blockwise_int8_gemm.py as a standalone program. The runtime's op is edgespec/kernels/block_int8_matmul.cc.
//
// The arithmetic is MatMulNBits' at 8 bits and accuracy_level 4: weights in blocks of 32 along K, one float scale
// per block and column; each activation row quantized per block of 32 to INT8 (scale max|x| / 127); per block an
// exact integer dot product, then scaled and summed in float, blocks in ascending order.
//
// Why another form: MatMulNBits takes each row through the weights on its own, so a verify batch of k rows
// costs almost k single-token products (README, "ONNX export", row costs on the AMD EPYC). Here the weights are
// packed 8 columns × 4 k per 32-byte vector; a row's 4 activations are broadcast against it (an outer product:
// vpmaddubsw, vpmaddwd), so the integer sums of 8 columns accumulate in one register with no horizontal sums, and
// up to 4 rows use each weight vector while it is in a register. Per (row, column) the operations are the same
// whatever the tile or the call's row count: a row's result has the same bits alone or in any batch (checked).
//
// Usage: outer_product_gemm K N threads copies rows...   prints one JSON line per row count
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kBlock = 32;

struct Weights {
  int K, N;
  std::vector<int8_t> packed;  // [N/8][K/4][8 columns][4 k]
  std::vector<float> scale;    // [K/32][N]
};

struct Rows {  // activations quantized per row and block
  std::vector<int8_t> q;       // [M][K]
  std::vector<uint8_t> magnitude;  // |q|: vpmaddubsw multiplies unsigned by signed, the sign moves to the weight
  std::vector<float> scale;    // [M][K/32]
};

void quantize(const float* x, int M, int K, Rows& out) {
  out.q.resize(size_t(M) * K);
  out.magnitude.resize(size_t(M) * K);
  out.scale.resize(size_t(M) * K / kBlock);
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < K / kBlock; ++b) {
      const float* v = x + size_t(m) * K + b * kBlock;
      float amax = 0.0f;
      for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
      out.scale[size_t(m) * (K / kBlock) + b] = d;
      for (int i = 0; i < kBlock; ++i) {
        const int q = int(std::nearbyint(v[i] * inverse));
        out.q[size_t(m) * K + b * kBlock + i] = int8_t(q);
        out.magnitude[size_t(m) * K + b * kBlock + i] = uint8_t(std::abs(q));
      }
    }
}

// Rows m0 … m0 + R − 1 against columns n0 … n0 + 7.
template <int R>
void panel(const Weights& w, const Rows& a, int m0, int n0, float* out) {
  const int K = w.K, blocks = K / kBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* packed = w.packed.data() + size_t(n0 / 8) * K * 8;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    __m256i sum[R];  // lane c: column n0 + c's integer dot product over this block
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    for (int k = b * kBlock; k < (b + 1) * kBlock; k += 4) {
      const __m256i weights = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + size_t(k) * 8));
      for (int r = 0; r < R; ++r) {
        int32_t q4, magnitude4;
        std::memcpy(&q4, a.q.data() + size_t(m0 + r) * K + k, 4);
        std::memcpy(&magnitude4, a.magnitude.data() + size_t(m0 + r) * K + k, 4);
        // |127 · 127| · 2 fits int16: no saturation
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi32(magnitude4),
                                                   _mm256_sign_epi8(weights, _mm256_set1_epi32(q4)));
        sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(pairs, ones));
      }
    }
    const __m256 column_scales = _mm256_loadu_ps(w.scale.data() + size_t(b) * w.N + n0);
    for (int r = 0; r < R; ++r) {
      const __m256 scales = _mm256_mul_ps(_mm256_set1_ps(a.scale[size_t(m0 + r) * blocks + b]), column_scales);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), scales, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + size_t(m0 + r) * w.N + n0, acc[r]);
}

template <int R>
void panels(const Weights& w, const Rows& a, int m0, int n0, int n1, float* out) {
  for (int n = n0; n < n1; n += 8) panel<R>(w, a, m0, n, out);
}

// Columns split between the threads, walked 64 at a time (their weights stay in cache while every row tile
// reads them); rows in ceil(M / 4) tiles of near-equal size (5 rows: 3 + 2, not 4 + 1).
void gemm(const Weights& w, const Rows& a, int M, float* out, int threads) {
  constexpr int kColumns = 64;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int chunk = (w.N / nt + 7) / 8 * 8, first = std::min(w.N, t * chunk), last = std::min(w.N, first + chunk);
    const int tiles = (M + 3) / 4;
    for (int n0 = first; n0 < last; n0 += kColumns) {
      const int n1 = std::min(last, n0 + kColumns);
      for (int i = 0, m = 0; i < tiles; ++i) {
        const int rows = (M - m) / (tiles - i);
        switch (rows) {
          case 4: panels<4>(w, a, m, n0, n1, out); break;
          case 3: panels<3>(w, a, m, n0, n1, out); break;
          case 2: panels<2>(w, a, m, n0, n1, out); break;
          default: panels<1>(w, a, m, n0, n1, out); break;
        }
        m += rows;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s K N threads copies rows...\n", argv[0]);
    return 2;
  }
  const int K = std::atoi(argv[1]), N = std::atoi(argv[2]), threads = std::atoi(argv[3]), copies = std::atoi(argv[4]);
  if (K % kBlock || N % (8 * threads) || copies < 1) {
    std::fprintf(stderr, "K must be a multiple of 32, N of 8 · threads\n");
    return 2;
  }
  std::mt19937 rng(0);
  std::uniform_int_distribution<int> level(-127, 127);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Weights> weights(copies);  // each its own memory, as a model's layers
  for (Weights& w : weights) {
    w.K = K, w.N = N;
    w.packed.resize(size_t(N) * K);
    for (int8_t& q : w.packed) q = int8_t(level(rng));
    w.scale.resize(size_t(N) * K / kBlock);
    for (float& s : w.scale) s = 0.01f * (1.0f + 0.1f * normal(rng));
  }
  int most = 1;
  for (int i = 5; i < argc; ++i) most = std::max(most, std::atoi(argv[i]));
  std::vector<float> x(size_t(most) * K);
  for (float& v : x) v = normal(rng);

  // Batch invariance: each row of the largest call equals that row computed alone, bit for bit.
  Rows all, one;
  quantize(x.data(), most, K, all);
  std::vector<float> together(size_t(most) * N), alone(N);
  gemm(weights[0], all, most, together.data(), threads);
  int differing = 0;
  for (int m = 0; m < most; ++m) {
    quantize(x.data() + size_t(m) * K, 1, K, one);
    gemm(weights[0], one, 1, alone.data(), threads);
    differing += std::memcmp(alone.data(), together.data() + size_t(m) * N, sizeof(float) * N) != 0;
  }

  std::vector<float> out(size_t(most) * N);
  Rows rows;
  for (int i = 5; i < argc; ++i) {
    const int M = std::atoi(argv[i]);
    std::vector<double> us;
    for (int rep = 0; rep < std::max(20, 600 / copies); ++rep) {
      const auto start = std::chrono::steady_clock::now();
      for (const Weights& w : weights) {  // the activations are quantized by every product, as MatMulNBits does
        quantize(x.data(), M, K, rows);
        gemm(w, rows, M, out.data(), threads);
      }
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                   copies);
    }
    std::sort(us.begin(), us.end());
    std::printf("{\"rows\": %d, \"median_us\": %.2f, \"rows_differing_from_alone\": %d}\n", M, us[us.size() / 2],
                differing);
  }
  return 0;
}
