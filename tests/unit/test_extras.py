"""A command whose optional extra is missing says, in one line, which `pip install` adds it: no traceback. The
package is blocked from importing in a fresh interpreter (``sys.modules[name] = None``, which Python's import
system answers with ModuleNotFoundError, as for a package never installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.extras import install_command
from tests.conftest import onnx_export_dir

ROOT = Path(__file__).resolve().parents[2]


def _without(module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            f"from edgespec.cli.main import main\nsys.exit(main({argv!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          check=False)


@pytest.mark.parametrize("module", ["starlette", "uvicorn"])
def test_serve_without_the_server_extra(module: str) -> None:
    """Before loading any model: the line names the package and the command that installs the extra."""
    run = _without(module, ["serve", "--port", "0"])
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        f"edgespec: error: edgespec serve needs {module!r}, which is not installed: {install_command('server')}"]


def test_onnx_model_without_onnxruntime() -> None:
    export = onnx_export_dir()
    run = _without("onnxruntime", ["generate", "hello", "--model", str(export), "--max-tokens", "4"])
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        f"edgespec: error: an ONNX model needs 'onnxruntime', which is not installed: {install_command('onnx')}"]


def test_install_command_installs_into_this_python_from_this_checkout() -> None:
    """In a checkout (or an editable install) PyPI's edgespec would be another copy: the command installs the extra
    from the checkout, into the interpreter running edgespec, typed as a user here would."""
    command = install_command("server")
    assert command.endswith("[server]'") and " -m pip install -e '" in command
    python, _, target = command.partition(" -m pip install -e ")
    assert Path(python).resolve() == Path(sys.executable).resolve()
    assert (Path(target.strip("'").removesuffix("[server]")) / "pyproject.toml").resolve() == ROOT / "pyproject.toml"
