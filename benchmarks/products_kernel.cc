// The harness of benchmarks/products_kernel.py: included at the end of a program that defines kKernels (two
// revisions of edgespec/kernels/block_int8_matmul.cc's products loop, each behind the same three functions).
// Arguments: K N COPIES REPEATS ROWS... Prints one JSON object per row count.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

// Bytes starting on a 64-byte boundary, as onnxruntime allocates a tensor (a vector's own start is not: 512-bit
// loads would then straddle two cache lines each).
struct Aligned {
  std::vector<int8_t> storage;
  int8_t* data;
  explicit Aligned(size_t size) : storage(size + 64) {
    data = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  }
};

// Each kernel's weights packed its own way: columns n0 … n0 + C − 1 × k … k + 3 per 4·C bytes, k fastest.
Aligned pack(const std::vector<int8_t>& w, int64_t n, int64_t k, int64_t columns) {
  Aligned packed(w.size());
  for (int64_t col = 0; col < n; ++col)
    for (int64_t i = 0; i < k; ++i)
      packed.data[col / columns * columns * k + i / 4 * 4 * columns + col % columns * 4 + i % 4] = w[col * k + i];
  return packed;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s K N COPIES REPEATS ROWS...\n", argv[0]);
    return 2;
  }
  const int64_t k = std::atoll(argv[1]), n = std::atoll(argv[2]), copies = std::atoll(argv[3]);
  const int repeats = std::atoi(argv[4]);
  std::vector<int> rows_list;
  for (int i = 5; i < argc; ++i) rows_list.push_back(std::atoi(argv[i]));
  const int64_t max_rows = *std::max_element(rows_list.begin(), rows_list.end());

  std::mt19937 rng(0);
  std::uniform_int_distribution<int> byte(-128, 127);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  std::vector<float> x(max_rows * k), scales(k / 32 * n);
  for (auto& v : x) v = normal(rng);
  for (auto& v : scales) v = scale(rng);
  // COPIES weight matrices in turn: past the caches, as a decode pass reads each layer's weights from memory
  std::vector<Aligned> packed[2];
  for (int64_t c = 0; c < copies; ++c) {
    std::vector<int8_t> w(n * k);
    for (auto& v : w) v = static_cast<int8_t>(byte(rng));
    for (int i = 0; i < 2; ++i) packed[i].push_back(pack(w, n, k, kKernels[i].columns));
  }
  std::vector<uint8_t> codes[2];
  std::vector<float> row_scales[2], out[2];
  for (int i = 0; i < 2; ++i) {
    codes[i].resize(max_rows * k);
    row_scales[i].resize(max_rows * k / 32);
    out[i].resize(max_rows * n);
    for (int64_t r = 0; r < max_rows; ++r)
      kKernels[i].quantize(x.data() + r * k, k, codes[i].data() + r * k, row_scales[i].data() + r * k / 32);
  }

  for (int rows : rows_list) {
    double memory[2] = {1e30, 1e30}, cache[2] = {1e30, 1e30};
    for (int rep = 0; rep < repeats; ++rep)
      for (int i = 0; i < 2; ++i) {  // the two kernels take turns: the machine's load falls on both
        const auto run = [&](int64_t c) {
          kKernels[i].product(codes[i].data(), row_scales[i].data(), packed[i][c].data, scales.data(),
                              out[i].data(), rows, k, n);
        };
        auto start = std::chrono::steady_clock::now();
        for (int64_t c = 0; c < copies; ++c) run(c);
        memory[i] = std::min(memory[i], seconds_since(start) / copies);
        start = std::chrono::steady_clock::now();
        for (int64_t c = 0; c < copies; ++c) run(0);
        cache[i] = std::min(cache[i], seconds_since(start) / copies);
      }
    const bool same = std::memcmp(out[0].data(), out[1].data(), sizeof(float) * rows * n) == 0;
    std::printf("{\"rows\": %d, \"memory_us\": [%.2f, %.2f], \"cache_us\": [%.2f, %.2f], \"same_bits\": %s}\n", rows,
                memory[0] * 1e6, memory[1] * 1e6, cache[0] * 1e6, cache[1] * 1e6, same ? "true" : "false");
  }
  return 0;
}
