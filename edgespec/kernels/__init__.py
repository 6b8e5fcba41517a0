"""edgespec's own kernels: onnxruntime custom ops (C++ sources beside this file) built on this machine by
``library`` (``edgespec build-kernel``)."""
