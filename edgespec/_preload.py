"""Load llama.cpp's library before numpy.

On an NVIDIA machine, a llama-cpp-python built with CUDA crashed the process (a segfault at model load) when numpy
had been imported first: numpy's extension loads the system's libstdc++, older than the one the CUDA library was
compiled against; loading llama.cpp first worked (measured-facts.md, "CUDA, first run"). ``import llama_cpp`` loads
its library before it imports numpy itself, so edgespec imports it first thing. A process that imported numpy
before edgespec cannot be helped any more: where that meets a GPU build, it is told how to avoid the crash.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path


def load_llama_cpp_first() -> None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or "llama_cpp" in sys.modules:
        return
    if "numpy" not in sys.modules:
        import llama_cpp  # noqa: F401  (loads libllama before numpy)
        return
    lib = Path(spec.origin or "").parent / "lib"
    if any(lib.glob("libggml-cuda*")):
        warnings.warn("numpy was imported before edgespec with a CUDA build of llama-cpp-python: on some systems "
                      "loading llama.cpp after numpy crashes the process (a libstdc++ mismatch); import edgespec "
                      "(or llama_cpp) before numpy", RuntimeWarning, stacklevel=3)


load_llama_cpp_first()
