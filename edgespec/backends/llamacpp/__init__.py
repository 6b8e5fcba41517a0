"""llama.cpp through llama-cpp-python: ``model`` (the backend), ``preload`` (a GPU build's library loaded first)."""
