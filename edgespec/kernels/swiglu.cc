// edgespec.SwiGlu: a Llama MLP's gated activation, silu(gate) · up, from the packed gate|up projection's output.
//
// Why: the graphs computed it as Split (two copies of the [rows, 2·I] output), x · sigmoid(x) (onnxruntime fuses
// Sigmoid and Mul into QuickGelu) and Mul: three kernel launches per layer and token for arithmetic that takes less
// time than one launch (SmolLM2 INT8 at 300 tokens of context: ~0.6 ms of a one-row pass's ~9.5 ms of kernels under
// onnxruntime's profiler; in the decode loop the target alone ~1.5% quicker, docs/kernels.md). One op, one pass.
//
// Exactness: every element runs the same IEEE operations (no contraction, edgespec/kernels/library.py), its own e^x
// (vector_math.h), so an element has the same bits wherever it sits in a vector, a row or a call; a tail shorter
// than a vector is computed in a padded one the same way.
//
// silu(x) = x · s(x), s(x) = 1 / (1 + e^−x) for x ≥ 0 and e^x / (1 + e^x) below: e^ of −|x| only, never overflowing.
//
// Input: X float [..., 2·I] (gate in the first I columns, up in the last I). Output: Y float [..., I].

#include "ops.h"  // onnxruntime's C++ API
#include "vector_math.h"  // Vec, load / store, exp_nonpositive

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace edgespec_vec;  // NOLINT: the vectors every function here computes with

inline Vec swiglu(Vec gate, Vec up) {
  const Vec magnitude = gate < 0.0f ? -gate : gate;
  const Vec e = exp_nonpositive(-magnitude);  // e^−|x| ∈ (0, 1]
  const Vec sigmoid = gate < 0.0f ? e / (e + 1.0f) : 1.0f / (e + 1.0f);
  return (gate * sigmoid) * up;
}

void swiglu_row(const float* x, int64_t width, float* y) {
  const float* up = x + width;
  int64_t i = 0;
  for (; i + kLanes <= width; i += kLanes) store(y + i, swiglu(load(x + i), load(up + i)));
  if (i < width) {  // the tail in a padded vector: each lane's arithmetic is its own
    float gate_tail[kLanes] = {}, up_tail[kLanes] = {}, out[kLanes];
    std::memcpy(gate_tail, x + i, sizeof(float) * (width - i));
    std::memcpy(up_tail, up + i, sizeof(float) * (width - i));
    store(out, swiglu(load(gate_tail), load(up_tail)));
    std::memcpy(y + i, out, sizeof(float) * (width - i));
  }
}

struct Rows {
  const float* in;  // [rows, 2·width]
  float* out;       // [rows, width]
  int64_t width;
};

void row_task(void* data, size_t row) {
  const Rows& c = *static_cast<const Rows*>(data);
  const int64_t r = static_cast<int64_t>(row);
  swiglu_row(c.in + r * 2 * c.width, c.width, c.out + r * c.width);
}

struct SwiGluKernel {
  SwiGluKernel(const OrtApi&, const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const Ort::ConstValue x = ctx.GetInput(0);
    std::vector<int64_t> shape = x.GetTensorTypeAndShapeInfo().GetShape();
    if (shape.empty() || shape.back() % 2 != 0)
      ORT_CXX_API_THROW("SwiGlu: the input's last dimension must be even (gate | up)", ORT_INVALID_ARGUMENT);
    const int64_t width = shape.back() / 2;
    shape.back() = width;
    Ort::UnownedValue y = ctx.GetOutput(0, shape);
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    Rows call{x.GetTensorData<float>(), y.GetTensorMutableData<float>(), width};
    for_each_row(ctx, rows, row_task, &call);  // ~2 µs a row of SmolLM2's 1536
  }
};

struct SwiGluOp : Ort::CustomOpBase<SwiGluOp, SwiGluKernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new SwiGluKernel(api, info); }
  const char* GetName() const { return "SwiGlu"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

void add_swiglu(Ort::CustomOpDomain& domain) {
  static SwiGluOp op;
  domain.Add(&op);
}
