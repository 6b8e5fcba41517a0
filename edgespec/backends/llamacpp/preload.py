"""Load a GPU build of llama.cpp's library before numpy.

On an NVIDIA machine, a llama-cpp-python built with CUDA crashed the process (a segfault at model load) when numpy
had been imported first: numpy's extension loads the system's libstdc++, older than the one the CUDA library was
compiled against; loading llama.cpp first worked (docs/gpu.md; a benchmark script that imported numpy first
crashed so again on an H100). ``import llama_cpp`` loads its library before it
imports numpy itself, so where the installed build has a GPU backend edgespec imports it first thing. A CPU build
is left alone: it has no such clash, and the ONNX path must not load llama.cpp at all
(tests/model/test_backend_contract.py).
A process that imported numpy before edgespec cannot be helped any more: it is told how to avoid the crash.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

_GPU_LIBRARIES = ("libggml-cuda*", "libggml-hip*", "libggml-vulkan*", "libggml-metal*")


def gpu_build() -> bool:
    """Whether the installed llama-cpp-python has a GPU backend (read from its library files: no import)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None:
        return False
    lib = Path(spec.origin or "").parent / "lib"
    return any(any(lib.glob(pattern)) for pattern in _GPU_LIBRARIES)


def load_llama_cpp_first() -> None:
    if "llama_cpp" in sys.modules or not gpu_build():
        return
    if "numpy" not in sys.modules:
        import llama_cpp  # noqa: F401  (loads libllama before numpy)
    else:
        warnings.warn("numpy was imported before edgespec with a GPU build of llama-cpp-python: on some systems "
                      "loading llama.cpp after numpy crashes the process (a libstdc++ mismatch); import edgespec "
                      "(or llama_cpp) before numpy", RuntimeWarning, stacklevel=3)


load_llama_cpp_first()
