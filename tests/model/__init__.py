"""The engine on the real shipped model, through llama.cpp and onnxruntime: lossless output, the backends, the home and
the default choice."""
