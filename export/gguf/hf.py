"""GGUF (or a model name from ``models/``) → a local Hugging Face folder with dequantized safetensors.

transformers reads GGUF itself (``from_pretrained(dir, gguf_file=...)``) and dequantizes every tensor, but the
model it returns still carries a GGUF ``quantization_config`` that ``save_pretrained`` would write out and that
no later loader understands; so the model is rebuilt from the cleaned config and given the loaded state dict.
The folder holds config.json (transformers 5 writes RoPE under ``rope_parameters``), model.safetensors,
tokenizer.json and tokenizer_config.json with the chat template: everything the ONNX exporter, the quality
report and onnxruntime-genai's builder read.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from edgespec.catalog.discovery import is_store_name
from edgespec.catalog.gguf_header import check_gguf
from edgespec.catalog.models import prepare_named, resolve
from edgespec.errors import InvalidParameterError, ModelLoadError
from edgespec.files import staged
from edgespec.home import home_dir
from edgespec.identity import file_identity, key_digest

from .. import UnsupportedArchitectureError, require
from .ggufio import reader

# model_type values the ONNX exporter handles
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text")
# GGUF architecture → the model_type transformers loads it as (Qwen3 and Gemma 2 GGUFs failed transformers'
# loader on the tests' tiny models); the ONNX exporter reads these GGUFs itself (export/onnx/gguf_source.py)
FROM_GGUF = {"llama": "llama", "qwen2": "qwen2", "phi3": "phi3", "gemma3": "gemma3_text"}
DTYPES = ("float32", "float16", "bfloat16")
SOURCE_RECORD = "edgespec-source.json"  # in each folder gguf_to_hf writes: the identity of the GGUF it was made from


def resolve_source(src: str | os.PathLike[str]) -> Path:
    """SRC as the export commands take it — a GGUF file, a local HF folder or a model name — to a path."""
    text = os.fspath(src)
    if is_store_name(text):  # a model found in Ollama's store, LM Studio's folders, the HF cache, ...
        return resolve(text)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a Hugging Face model folder (no config.json)")
        return path
    if path.exists() or path.suffix == ".gguf" or os.sep in text:
        check_gguf(path)
        return path
    # The shipped file is the most faithful source: re-quantizing it again only loses precision.
    return prepare_named(text, "a GGUF file, a Hugging Face folder", shipped=True)


def check_architecture(model_type: str, where: Path, supported: Collection[str] = ARCHITECTURES) -> None:
    if model_type not in supported:
        raise UnsupportedArchitectureError(f"{where}: architecture {model_type!r} is not supported by the exporter "
                                           f"(supported: {', '.join(supported)})")


# Llama 3.x's RoPE scaling besides its factor, the same in every Llama 3.x config
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def llama3_rope(gguf: Path, config: Any) -> dict[str, object] | None:
    """The llama3 ``rope_parameters`` a Llama 3.x GGUF's ``rope_freqs`` tensor was computed from (by
    convert_hf_to_gguf), or None for a file without one. transformers' GGUF loader drops the tensor, and a folder
    without it computes another model (measured on a tiny Llama with rope_freqs: logits off by 0.27 of 69 against
    llama.cpp's), so the parameters go back into the config: the factor is the largest, the rest Llama 3.x's own;
    factors that formula does not give back are refused. (The ONNX exporter reads a GGUF's factors itself.)"""
    tensors = {t.name: t for t in reader(gguf).tensors}
    if "rope_freqs.weight" not in tensors:
        return None
    import numpy as np

    theta = config.rope_parameters["rope_theta"]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    factors = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float64).ravel()
    params = {"rope_type": "llama3", "rope_theta": theta, "factor": float(factors.max()), **LLAMA3_ROPE}
    wavelength = 2 * np.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    low, high = LLAMA3_ROPE["low_freq_factor"], LLAMA3_ROPE["high_freq_factor"]
    smooth = np.clip((LLAMA3_ROPE["original_max_position_embeddings"] / wavelength - low) / (high - low), 0, 1)
    expected = 1 / ((1 - smooth) / params["factor"] + smooth)
    if factors.shape != expected.shape or not np.allclose(factors, expected, rtol=1e-5):
        raise UnsupportedArchitectureError(f"{gguf}: its RoPE scaling factors (rope_freqs) are not Llama 3.x's "
                                           "llama3 scaling, which is all a Hugging Face config can say; export the "
                                           "GGUF to ONNX directly, or convert the model's Hugging Face folder instead")
    return params


def gguf_to_hf(gguf: Path, out: Path, dtype: str = "float32") -> Path:
    """Write the Hugging Face folder for ``gguf`` into ``out`` (atomically: a crash leaves no half folder)."""
    if dtype not in DTYPES:
        raise InvalidParameterError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    check_gguf(gguf)
    torch = require("torch", "export-hf")
    transformers = require("transformers", "export-hf")
    require("gguf")
    try:
        config = transformers.AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, RuntimeError) as e:
        raise UnsupportedArchitectureError(f"{gguf}: transformers cannot read this GGUF: {e}") from e
    check_architecture(config.model_type, gguf)
    rope = llama3_rope(gguf, config)
    if rope is not None:
        config.rope_parameters = rope
    loaded = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                               dtype=torch.float32)
    state = loaded.state_dict()
    del loaded
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied lm_head is the only key allowed to be absent (it aliases the embedding).
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ModelLoadError(f"{gguf}: weights do not match the architecture (missing {missing}, "
                             f"unexpected {unexpected})")
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with staged(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _inline_chat_template(tmp, tokenizer.chat_template)
        _check_saved(tmp)
        (tmp / SOURCE_RECORD).write_text(json.dumps(file_identity(gguf)), encoding="utf-8")
    return out


def _inline_chat_template(folder: Path, template: str | None) -> None:
    """transformers 5 saves the template as chat_template.jinja; older readers (onnxruntime-genai, other
    tokenizer libraries) look for it in tokenizer_config.json, so it goes there too."""
    if template is None:  # Gemma 3's GGUF ships none
        return
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _check_saved(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    if "quantization_config" in config:
        raise ModelLoadError(f"{folder}: the GGUF quantization config leaked into config.json")
    if not (folder / "tokenizer.json").is_file():
        raise ModelLoadError(f"{folder}: the tokenizer was not exported")


def hf_folder(src: str | os.PathLike[str], dtype: str = "float32") -> Path:
    """An HF folder for SRC: the folder itself, or the GGUF's conversion cached under the edgespec cache."""
    path = resolve_source(src)
    if path.is_dir():
        config = json.loads((path / "config.json").read_text())
        check_architecture(config.get("model_type", "?"), path)
        return path
    key = key_digest({"source": file_identity(path), "dtype": dtype})[:12]
    out = home_dir("hf") / f"{path.stem}-{dtype}-{key}"
    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        drop_stale(out.parent)
        gguf_to_hf(path, out, dtype)
    return out


def drop_stale(cache: Path) -> None:
    """Remove the cached conversions whose GGUF is gone or was replaced under its path (a new download, a removed
    checkout): nothing reads them again, and each holds the whole model in float32 or 16 bits (an 8B model: 32 GB).
    A folder without its source record (one being written, or not gguf_to_hf's) is left alone."""
    for record in cache.glob(f"*/{SOURCE_RECORD}"):
        try:
            made_from = json.loads(record.read_text(encoding="utf-8"))
            source = Path(made_from["path"])
            current = file_identity(source) if source.is_file() else None
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if current != made_from:
            shutil.rmtree(record.parent, ignore_errors=True)
