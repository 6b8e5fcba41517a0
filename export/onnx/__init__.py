"""``edgespec export onnx``: a model → edgespec's split ONNX decoder (the graphs, the weights carried in their
GGUF blocks or re-quantized, the quality report against the source, onnxruntime-genai's builder)."""
