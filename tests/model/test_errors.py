"""Bad input gets a clear error (and the CLI no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import edgespec
from edgespec.catalog.models import resolve
from edgespec.engine.engine import Engine
from edgespec.errors import ContextOverflowError, InvalidParameterError, ModelLoadError, VocabMismatchError


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        edgespec.load(tmp_path / "nope.gguf")


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_text("this is not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        edgespec.load(bad)


def test_truncated_gguf(tmp_path: Path) -> None:
    source = resolve("smollm2-135m")
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(source.read_bytes()[: 4 << 20])
    with pytest.raises(ModelLoadError, match="corrupt, truncated"):
        edgespec.load(bad)


def test_unknown_model_name() -> None:
    with pytest.raises(ModelLoadError, match="unknown model"):
        edgespec.load("no-such-model")


def _copy_with_renamed_token(src: Path, dst: Path, token: int, text: str) -> None:
    """A GGUF identical to src except for one token's text (same vocabulary size)."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            value = list(value)
            value[token] = text
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_draft_with_a_different_vocabulary(tmp_path: Path) -> None:
    target = resolve("smollm2-135m")
    draft = tmp_path / "other-vocab.gguf"
    _copy_with_renamed_token(target, draft, 1234, "edgespec-renamed")
    with pytest.raises(VocabMismatchError, match=r"token 1234.*edgespec-renamed"):
        edgespec.load(target, draft=draft)


def test_prompt_longer_than_the_context() -> None:
    small = edgespec.load(n_ctx=256, gamma=2)
    try:
        with pytest.raises(ContextOverflowError, match=r"prompt has .* tokens but the context holds 256"):
            small.generate("word " * 300)
        # Generation that reaches the end of the context stops cleanly with finish_reason "length".
        # A count the model continues: it reaches the end of the context before it would stop on its own.
        out = small.generate("Count to 200: " + ", ".join(str(i) for i in range(1, 60)), max_tokens=500)
        assert out.finish_reason == "length"
        assert len(small.arena.tokens) == 256
    finally:
        small.close()


@pytest.mark.parametrize("kwargs, message", [
    (dict(gamma=-1), "gamma"),
    (dict(gamma=99), "gamma"),
    (dict(gamma="many"), "gamma"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.2), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(mode="draft"), "needs a draft model"),
    (dict(mode="telepathy"), "mode must be one of"),
])
def test_invalid_generation_parameters(engine: Engine, kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        engine.generate("Hello", **kwargs)


def test_empty_prompt(engine: Engine) -> None:
    with pytest.raises(InvalidParameterError, match="empty"):
        engine.generate("")
    with pytest.raises(InvalidParameterError, match="outside the vocabulary"):
        engine.generate([1, 10**9])


def test_invalid_load_parameters() -> None:
    with pytest.raises(InvalidParameterError, match="device"):
        edgespec.load(device="tpu")
    with pytest.raises(InvalidParameterError, match="gamma"):
        edgespec.load(gamma=-2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec.cli", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--model", "/no/such/model.gguf"], "model file not found"),
    (["generate", "hi", "--gamma", "-3"], "gamma must be"),
    (["generate", "hi", "--temperature", "-1"], "temperature must be"),
    (["generate", "", "--max-tokens", "4"], "prompt is empty"),
])
def test_cli_reports_errors_without_a_traceback(args: list[str], message: str) -> None:
    result = _cli(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
