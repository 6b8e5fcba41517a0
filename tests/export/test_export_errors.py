"""Bad input to `edgespec export` gets one clear line, exit code 2, and leaves no partial file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from edgespec.export.draft.layers import LayerSetError, check_keep, parse_layers

from edgespec.catalog.models import families
from edgespec.cli.main import main
from edgespec.extras import install_command
from edgespec.kernels import library as custom_ops


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return families()["smollm2-135m"].prepare("q4_0")


def _fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["export", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgespec: error: ") and "Traceback" not in err
    return err


def test_not_a_gguf_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    assert "is not a GGUF file" in _fails(["gguf", str(junk), "--quant", "f16", "--out", str(tmp_path / "o.gguf")],
                                          capsys)
    assert "model file not found" in _fails(["draft", str(tmp_path / "nope.gguf"), "--keep-layers", "0",
                                             "--out", str(tmp_path / "o.gguf")], capsys)
    assert "unknown model 'nosuchmodel'" in _fails(["gguf", "nosuchmodel", "--quant", "f16", "--out",
                                                     str(tmp_path / "o.gguf")], capsys)
    assert not (tmp_path / "o.gguf").exists()


def test_truncated_gguf(smollm2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2.read_bytes()[:100_000])
    err = _fails(["draft", str(cut), "--keep-layers", "0-3", "--out", str(tmp_path / "o.gguf")], capsys)
    assert "is not a valid GGUF file" in err


def _toy_gguf(path: Path, arch: str) -> Path:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(path, arch=arch)
    w.add_block_count(2)
    for il in range(2):
        w.add_tensor(f"blk.{il}.ffn_up.weight", np.ones((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toy = _toy_gguf(tmp_path / "toy.gguf", "mamba")
    err = _fails(["draft", str(toy), "--keep-layers", "0", "--out", str(tmp_path / "o.gguf")], capsys)
    assert "support the llama, gemma3 architectures" in err and "mamba" in err
    err = _fails(["gguf", str(toy), "--quant", "q8_0", "--out", str(tmp_path / "o.gguf")], capsys)
    assert "could not quantize" in err and "'mamba'" in err
    assert not (tmp_path / "o.gguf").exists()


def test_layer_sets_out_of_range_empty_or_malformed(smollm2: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "o.gguf")
    assert "out of range" in _fails(["draft", str(smollm2), "--keep-layers", "0-30", "--out", out], capsys)
    assert "removes every layer" in _fails(["draft", str(smollm2), "--skip-layers", "0-29", "--out", out], capsys)
    assert "bad layer range" in _fails(["draft", str(smollm2), "--keep-layers", "a-b", "--out", out], capsys)
    assert "budget" in _fails(["draft", str(smollm2), "--search", "--budget", "1.5", "--out", out], capsys)
    assert "quality report needs" in _fails(["gguf", str(smollm2), "--quant", "q8_0", "--out", out, "--prompts", "0"],
                                            capsys)
    with pytest.raises(LayerSetError, match="empty"):
        check_keep([], 30)
    with pytest.raises(LayerSetError, match="5 > 2"):
        parse_layers("5-2", 30)
    assert not Path(out).exists()


@pytest.mark.parametrize("module", ["gguf", "tqdm"])
def test_missing_export_extra(module: str, smollm2: Path, tmp_path: Path) -> None:
    """A user without `edgespec[export]` is told what to install (the package is blocked from importing)."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from edgespec.cli.main import main\n"
            f"sys.exit(main(['export', 'draft', {str(smollm2)!r}, '--keep-layers', '0-3', "
            f"'--out', {str(tmp_path / 'o.gguf')!r}, '--no-quality']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert f"needs {module!r}" in result.stderr and install_command("export") in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture()
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A real 4 MB file system (tmpfs) where this process may mount one; else the free space is reported
    as 4 MB, which is all the export's check reads."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode == 0
    if not mounted:
        real = shutil.disk_usage
        monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=4 << 20)
                            if Path(p).is_relative_to(mnt) else real(p))
    try:
        yield mnt
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=True)


def test_no_disk_space(smollm2: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = small_disk / "sub" / "o.gguf"
    err = _fails(["gguf", str(smollm2), "--quant", "f16", "--out", str(out)], capsys)
    assert "not enough disk space" in err and "MB free" in err
    err = _fails(["draft", str(smollm2), "--keep-layers", "0-3", "--out", str(out)], capsys)
    assert "not enough disk space" in err
    assert not out.exists() and not any(small_disk.rglob("*.gguf*"))


def test_invalid_manifests_and_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from edgespec.export import manifest

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    with pytest.raises(manifest.ManifestError, match="missing field 'kind'"):
        manifest.validate({"format": manifest.FORMAT})
    good = {"format": manifest.FORMAT, "kind": "draft", "artefact": str(tmp_path / "d.gguf"), "file_bytes": 1,
            "architecture": "llama", "n_layers": 2, "quality": None,
            "source": {"path": "s.gguf", "name": None, "architecture": "llama", "n_layers": 30},
            "made": {"method": "m", "quant": None, "kept_layers": [0, 31], "tools": {}, "created": "now"}}
    with pytest.raises(manifest.ManifestError, match="not layers of the source"):
        manifest.validate(good)
    # The registry is the home's cache of what was exported: a damaged one is read as empty, saying so once, and
    # the next export writes a new one (it was an error on every later command until deleted by hand).
    manifest.registry_path().parent.mkdir(parents=True)
    manifest.registry_path().write_text("{not json")
    assert main(["models"]) == 0
    err = capsys.readouterr().err
    assert "exports.json is damaged" in err and "measuring again" not in err


def test_products_and_attention_that_cannot_run_here(smollm2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "onnx"
    args = ["onnx", str(smollm2), "--quant", "int8", "--out", str(out)]
    err = _fails([*args, "--attention", "gqa", "--products", "edgespec"], capsys)
    assert "BlockInt8MatMul computes int8 exports" in err
    err = _fails([*args, "--quant", "int4", "--products", "edgespec"], capsys)
    assert "BlockInt8MatMul computes int8 exports" in err
    # A machine where edgespec's kernels cannot be built: asking for them by name is an error, not onnxruntime's
    monkeypatch.setattr(custom_ops, "ensure", lambda say=None: None)
    monkeypatch.setattr(custom_ops, "_unbuildable", "no C++ compiler found (set CXX)")
    err = _fails([*args, "--attention", "exact"], capsys)
    assert "cannot be built here (no C++ compiler found" in err and "--attention gqa" in err
    assert not out.exists()
