"""The backend contract: the engine imports no concrete backend, every backend implements ``Backend``, and the
registry picks one by path without loading the others."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.backends.base import Backend, ModelOptions, SelfDraft
from edgespec.backends.registry import BACKENDS, REGISTRY, choose, open_model
from edgespec.engine.engine import Engine
from edgespec.errors import InvalidParameterError
from tests.conftest import onnx_export_dir
from tests.fake_backend import FakeModel, scripted

ROOT = Path(__file__).resolve().parents[2]


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
                         check=True)
    return set(out.stdout.split())


def test_the_engine_and_the_package_import_no_concrete_backend() -> None:
    loaded = _modules_after("import edgespec, edgespec.engine.engine, edgespec.backends.registry")
    assert not loaded & {"edgespec.backends.llamacpp.model", "edgespec.backends.onnx.model", "llama_cpp", "onnxruntime"}


def test_every_backend_implements_the_contract(engine: Engine) -> None:
    assert isinstance(engine.target, Backend)  # llama.cpp
    fake = FakeModel(scripted([0]), self_draft=scripted([0]))
    assert isinstance(fake, Backend) and isinstance(fake.self_draft(), SelfDraft)
    assert engine.target.self_draft() is None  # llama.cpp cannot skip layers: asked, not isinstance-checked


def test_the_registry_chooses_by_path(tmp_path: Path) -> None:
    assert ("auto", *REGISTRY) == BACKENDS
    assert choose("smollm2-135m:q8_0") == choose(tmp_path / "m.gguf") == "llamacpp"
    assert choose(tmp_path) == choose(tmp_path / "model.onnx") == "onnx"  # an export directory
    assert choose(tmp_path, "llamacpp") == "llamacpp"
    with pytest.raises(InvalidParameterError, match="backend must be one of auto, llamacpp, onnx"):
        choose(tmp_path, "mlx")
    with pytest.raises(InvalidParameterError, match="layer_skip needs an ONNX model"):
        open_model("smollm2-135m", "llamacpp", ModelOptions(layer_skip=[3]))


def test_the_onnx_path_never_loads_llama_cpp() -> None:
    folder = str(onnx_export_dir())
    loaded = _modules_after(f"import edgespec\ne = edgespec.load({folder!r}, n_ctx=64, n_threads=1, tuning=False)\n"
                            "assert e.generate('Hello', max_tokens=3, gamma=2).tokens")
    assert "edgespec.backends.onnx.model" in loaded
    assert not loaded & {"llama_cpp", "edgespec.backends.llamacpp.model"}


def test_the_command_line_on_an_onnx_export_never_loads_llama_cpp() -> None:
    """The CLI registers the export commands (whose quality report runs llama.cpp) without importing llama.cpp: a
    `generate` on an ONNX export loads only onnxruntime, as the library does."""
    folder = str(onnx_export_dir())
    loaded = _modules_after("from edgespec.cli.main import main\nimport contextlib, io\n"
                            "with contextlib.redirect_stdout(io.StringIO()):\n"
                            f"    assert main(['generate', '--model', {folder!r}, '--max-tokens', '3',"
                            " '--threads', '1', '--ctx', '64', '--raw', 'Hello']) == 0")
    assert "edgespec.backends.onnx.model" in loaded
    assert not loaded & {"llama_cpp", "edgespec.backends.llamacpp.model"}


def test_a_gguf_without_llama_cpp_installed_is_one_clear_line() -> None:
    """llama-cpp-python missing (a broken install): a llama.cpp model is refused with what to run, no traceback."""
    code = ("import sys\nsys.modules['llama_cpp'] = None  # as if not installed\nfrom edgespec.cli.main import main\n"
            "sys.exit(main(['generate', '--model', 'smollm2-135m:q4_1', '--max-tokens', '2', 'Hi']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("edgespec: error: llama.cpp models") and "make setup" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
