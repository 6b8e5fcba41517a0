"""``--format genai``: the same Hugging Face weights through onnxruntime-genai's own model builder, so the
benchmark can compare edgespec's loop with onnxruntime-genai's generation loop on the same model.

Known traps (onnxruntime-genai 0.18 with transformers 5), handled here on a temporary copy of the folder:
transformers 5 writes RoPE as ``rope_parameters`` (nested per layer type for Gemma 3), which the builder
misreads, so config.json gets the keys it looks for; Gemma 3 needs ``windowed_kv_cache=false``;
asymmetric INT4 (the builder's default) broke SmolLM2, so quantization is symmetric.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import require
from ..gguf.hf import hf_folder
from .export import OnnxExportError

GENAI_QUANTS = {"fp32": "fp32", "fp16": "fp16", "int8": "int8", "int4": "int4"}


def _builder_rope_config(config: dict) -> dict:
    """config.json as the builder reads it. transformers 5 (which the builder loads the config with) keeps
    unknown keys inside ``rope_parameters`` and the builder lifts every key of it to the top level, so the
    keys it wants (a top-level ``rope_type``; Gemma 3's ``rope_local_base_freq``) go there."""
    rope = dict(config.get("rope_parameters") or {})
    if "sliding_attention" in rope:  # Gemma 3: one RoPE base per layer type
        rope.update(rope_type="default", rope_theta=rope["full_attention"]["rope_theta"],
                    rope_local_base_freq=rope["sliding_attention"]["rope_theta"])
    return dict(config, rope_parameters=rope) if rope else config


def export_genai(src: str | os.PathLike[str], out: Path, quant: str = "int4", block_size: int = 32,
                 accuracy_level: int | None = None) -> dict:
    """Build an onnxruntime-genai model folder (model.onnx + genai_config.json + tokenizer) in ``out``."""
    require("onnxruntime_genai", "export-hf")
    folder = hf_folder(src)
    config = json.loads((folder / "config.json").read_text())
    extra = [f"int4_block_size={block_size}", "int4_is_symmetric=true"]
    if accuracy_level is not None:
        extra.append(f"int4_accuracy_level={accuracy_level}")
    if config.get("model_type") == "gemma3_text":
        extra.append("windowed_kv_cache=false")
    with tempfile.TemporaryDirectory(prefix="edgespec-genai-") as tmp:
        copy = Path(tmp) / "hf"
        copy.mkdir()
        for f in folder.iterdir():
            (copy / f.name).symlink_to(f.resolve())
        (copy / "config.json").unlink()
        (copy / "config.json").write_text(json.dumps(_builder_rope_config(config), indent=2))
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(copy), "-o", str(out),
               "-p", GENAI_QUANTS[quant], "-e", "cpu", "-c", str(Path(tmp) / "cache"), "--extra_options", *extra]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "genai_config.json").is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise OnnxExportError(f"onnxruntime-genai's builder failed for {folder}:\n{tail}")
    return {"format": "onnxruntime-genai", "quant": quant, "extra_options": extra, "hf_folder": str(folder),
            "size_bytes": sum(f.stat().st_size for f in out.iterdir() if f.is_file())}
