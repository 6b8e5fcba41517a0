"""edgespec's kernels (edgespec/kernels/) as onnxruntime runs them: exactness on random inputs, every ISA build, and a
model's sessions on huge pages."""
