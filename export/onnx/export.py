"""SRC (GGUF file, HF folder or model name) → an edgespec ONNX directory (docs/onnx-format.md).

A GGUF of a mapped architecture (``gguf_source.ARCHITECTURES``: llama — Llama 2/3.x, Mistral, SmolLM2 —,
Qwen2/2.5, Qwen3, Phi-3, Gemma 2 and 3) is read with the ``gguf`` package alone (``gguf_source``: no torch, no
transformers), and by default (``quant="gguf"``) its Q4_0 / Q4_1 / Q8_0 blocks are carried into MatMulNBits or
edgespec's 4-bit products as they are (``block_weights``, ``block_q4``), and under edgespec's kernels its Q2_K …
Q6_K super-blocks and Q5_0 / Q5_1 blocks too (``block_kquant``); tensors of other types are dequantized and
quantized to 8 bits. Other sources (Hugging Face folders, GGUFs of other architectures) go through transformers
(``hf``, the ``export-hf`` extra).

FP32 graphs are written first; ``fp16`` stores weights in half precision (cast back to float32 when the
session loads, so compute stays float32); ``int8``/``int4`` quantize every MatMul weight with
onnxruntime's MatMulNBits quantizer (block-wise, symmetric). ``quantize_dynamic`` is never used: it quantizes
activations per call, so a position's logits would depend on which other tokens share the call.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np

from edgespec.backends.onnx.manifest import MANIFEST
from edgespec.errors import EdgespecError, InvalidParameterError
from edgespec.files import staged
from edgespec.kernels import library as custom_ops

from .. import require
from ..gguf.ggufio import info, reader
from ..gguf.hf import hf_folder, resolve_source
from ..gguf.tokenizer import write_tokenizer
from . import block_int8, block_kquant
from .block_kquant import KQuantWeight
from .block_weights import BLOCK, CARRIED, BlockWeight
from .gguf_source import ARCHITECTURES as GGUF_ARCHITECTURES
from .gguf_source import GgufWeights, spec_from_gguf
from .graphs import (
    ATTENTIONS,
    CARRIED_ACCURACY_LEVEL,
    GRAPHS_REVISION,
    ModelSpec,
    attention_min_total,
    embed_graph,
    head_graph,
    kv_dtype,
    kv_length,
    layer_graph,
)

GGUF_QUANT = "gguf"  # carry the GGUF file's own quantization (the default for a GGUF source)
QUANTS = (GGUF_QUANT, "fp32", "fp16", "int8", "int4")
FORMAT = "edgespec-onnx/1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "generation_config.json")
# accuracy_level 4 (int8 activations, integer dot products) measured here: bit-identical rows for 1 or k rows
# and 1 or 2 threads, and the fast kernels (SmolLM2 ~0.03 ms per 576×1536 MatMul vs 1.3–1.8 ms at level 1,
# whose 8-bit path dequantizes the whole weight per call; level 1 is also not exact for a single row).
DEFAULT_ACCURACY_LEVEL = 4
DEFAULT_BLOCK_SIZE = 32


class OnnxExportError(EdgespecError):
    """The ONNX export could not be written (disk, an unexpected model, a failed quantization)."""


class Weights:
    """The HF folder's safetensors as float32 numpy arrays, read lazily by name."""

    def __init__(self, folder: Path) -> None:
        safetensors = require("safetensors", "export-hf")
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise OnnxExportError(f"{folder}: no *.safetensors weights")
        self.folder = folder
        self._where = {name: handle for handle in (safetensors.safe_open(str(f), "np") for f in files)
                       for name in handle.keys()}  # noqa: SIM118 (safe_open is not a mapping)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __call__(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise OnnxExportError(f"{self.folder}: weight {name!r} is missing")
        return self._where[name].get_tensor(name).astype(np.float32)


def pads_every_product(bits: int | None, four_bit: bool, accuracy_level: int) -> bool:
    """Whether single-token calls are padded around every weight product, not only around attention.

    float32 MatMul (prepacked weights) and 8-bit MatMulNBits at level 4 are exact for one row; other levels are
    not (see graphs.single_row_padding), nor is 4-bit at level 4 on every CPU (measured on an AMD EPYC: up
    to 1e-4 apart from the same row in a 2+-row call; on an Intel Xeon it was exact)."""
    return bool(bits) and (accuracy_level != 4 or four_bit)


def _save(model, path: Path) -> None:
    require("onnx").save_model(model, str(path))


def nbits_quantizer() -> ModuleType:
    """onnxruntime's MatMulNBits quantizer module. Importing it calls ``logging.basicConfig(level=INFO)``: in a
    program that has not set up logging (the Python API, the bench's workers) every library's INFO lines would
    then print, llama.cpp's hundreds of loader lines among them. The root logger is the application's: it is put
    back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    module = require("onnxruntime.quantization.matmul_nbits_quantizer", "onnx")
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger(module.__name__).setLevel(logging.WARNING)
    return module


def _quantized(model: object, bits: int, block_size: int, accuracy_level: int, symmetric: bool) -> object:
    """``model`` with its float weight products as MatMulNBits (carried GGUF blocks are already)."""
    # Q4_1's minima products are part of a carried weight's exact form: never re-quantized
    graph = model.graph  # type: ignore[attr-defined]
    minima = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1].endswith("_minima")]
    if all(n.op_type != "MatMul" or n.name in minima for n in graph.node):
        return model  # every weight was carried from a GGUF
    quantizer = nbits_quantizer().MatMulNBitsQuantizer(model, bits=bits, block_size=block_size,
                                                       is_symmetric=symmetric, accuracy_level=accuracy_level,
                                                       nodes_to_exclude=minima)
    quantizer.process()
    quantizer.model.topological_sort()
    return quantizer.model.model


def export_onnx(src: str | os.PathLike[str], out: Path, quant: str | None = None, context_length: int = 4096,
                block_size: int = DEFAULT_BLOCK_SIZE, accuracy_level: int = DEFAULT_ACCURACY_LEVEL,
                symmetric: bool = True, head_bits: int = 8, progress: bool = True,
                attention: str | None = None, products: str = "auto") -> dict:
    """Write the ONNX directory for SRC into ``out`` and return its manifest (without the quality report).

    ``quant``: default ``"gguf"`` for a GGUF the reader maps (its own blocks carried), else ``"int8"``.
    ``head_bits``: the output projection's bits for int8/int4 (default 8: measured on SmolLM2 int4, an int8
    head raises top-1 agreement with FP32 from 0.58 to 0.65 for 15 MB).
    ``attention``: "exact" (edgespec's kernel, no single-row padding) or "gqa"; default "exact" where the kernel
    is built on this machine (``edgespec.kernels.library``), else "gqa".
    ``products``: 8-bit products at block size 32 and level 4 as "edgespec" (``edgespec.BlockInt8MatMul``, in the
    kernel's library: needs attention "exact"), "nbits" (MatMulNBits) or "auto": whichever one layer's products
    run faster here (``block_int8.choose``). A GGUF's carried Q4_0 / Q4_1 blocks are ``edgespec.BlockQ4MatMul``
    under attention "exact" unless ``products`` is "nbits" (MatMulNBits, single rows padded); its Q2_K … Q6_K
    super-blocks are ``edgespec.BlockKQuantMatMul`` there and its Q5_0 / Q5_1 blocks ``edgespec.BlockQ4MatMul``,
    and they are dequantized and quantized to 8 bits otherwise.
    """
    path = resolve_source(src)
    gguf = not path.is_dir() and info(path).architecture in GGUF_ARCHITECTURES
    quant = quant or (GGUF_QUANT if gguf else "int8")
    if quant == GGUF_QUANT and not gguf:
        raise InvalidParameterError(f"--quant {GGUF_QUANT} carries a GGUF file's blocks: {src} is not a GGUF of "
                                    f"a supported architecture ({', '.join(GGUF_ARCHITECTURES)}); choose from "
                                    f"{', '.join(QUANTS[1:])}")
    if quant == GGUF_QUANT and accuracy_level != CARRIED_ACCURACY_LEVEL:
        raise InvalidParameterError(f"--quant {GGUF_QUANT} runs the file's blocks at accuracy level "
                                    f"{CARRIED_ACCURACY_LEVEL} (int8 activations, the fast kernels)")
    if quant not in QUANTS:
        raise InvalidParameterError(f"unknown ONNX quantization {quant!r}; choose from {', '.join(QUANTS)}")
    if context_length < 16:
        raise InvalidParameterError(f"context length {context_length} is too small")
    if block_size < 16 or block_size & (block_size - 1):
        raise InvalidParameterError(f"block size must be a power of two ≥ 16, not {block_size}")
    if head_bits not in (4, 8):
        raise InvalidParameterError(f"head bits must be 4 or 8, not {head_bits}")
    attention = attention or custom_ops.default_attention()
    if attention not in ATTENTIONS:
        raise InvalidParameterError(f"unknown attention {attention!r}; choose from {', '.join(ATTENTIONS)}")
    if attention == "exact" and custom_ops.ensure() is None:  # asked for by name where it cannot be built
        raise InvalidParameterError("attention exact needs edgespec's kernels, which cannot be built here "
                                    f"({custom_ops.build_failure()}); export with --attention gqa")
    if products not in block_int8.PRODUCTS:
        raise InvalidParameterError(f"unknown products {products!r}; choose from {', '.join(block_int8.PRODUCTS)}")
    if products == "edgespec" and (attention != "exact" or quant != "int8" or head_bits != 8 or block_size != 32
                                   or not symmetric or accuracy_level != 4):
        raise InvalidParameterError("edgespec's BlockInt8MatMul computes int8 exports (8-bit head, symmetric, "
                                    "blocks of 32, accuracy level 4) with the exact attention kernel built here")
    tqdm = require("tqdm").tqdm
    started = time.time()
    folder: Path | None = None
    if gguf:
        spec = spec_from_gguf(path)
        weights: Weights | GgufWeights = GgufWeights(path, spec, carry=quant == GGUF_QUANT)
        source: dict = {"gguf": str(path), "gguf_types": weights.types()}
    else:
        folder = hf_folder(path)
        spec = ModelSpec.from_hf(folder)
        weights = Weights(folder)
        source = {"hf_folder": str(folder)}
    out = Path(out)
    store = np.float16 if quant != "fp32" else np.float32  # quantized exports keep the embedding in fp16
    dense = np.float16 if quant == "fp16" else np.float32
    layers = [f"layer_{i:02d}.onnx" for i in range(spec.num_layers)]
    # carried blocks need no quantizer; tensors of other types in a GGUF are quantized to 8 bits
    bits = {"int8": 8, "int4": 4, GGUF_QUANT: 8}.get(quant)
    carried_four_bit = quant == GGUF_QUANT and bool({"Q4_0", "Q4_1"} & set(source["gguf_types"]))
    kernel_kinds = set(block_kquant.KINDS) & set(source["gguf_types"]) if quant == GGUF_QUANT else set()
    kquants = bool(kernel_kinds)
    # A GGUF's 4-bit blocks under edgespec's kernels (the exact attention's library): BlockQ4MatMul, its K-quants
    # BlockKQuantMatMul, its Q5_0 / Q5_1 BlockQ4MatMul, exact for one row, so nothing is padded
    q4_products = (carried_four_bit or kquants) and attention == "exact" and products != "nbits"
    if isinstance(weights, GgufWeights):
        weights.kquants = kquants and q4_products
    pad_matmuls = pads_every_product(bits, quant == "int4" or (carried_four_bit and not q4_products), accuracy_level)
    with replacing(out) as tmp:
        if folder is None:  # first: a vocabulary it cannot write is refused before any layer is
            chat_template = _gguf_tokenizer(path, tmp)
        else:
            for name in TOKENIZER_FILES:
                if (folder / name).is_file():
                    shutil.copy2(folder / name, tmp / name)
            chat_template = _chat_template(folder)
        bar = tqdm(total=spec.num_layers + 2, desc=f"ONNX {quant}", unit="graph", disable=not progress)
        # A GGUF's vocabulary-sized matrices are read a chunk of rows at a time, and none is held while the layers
        # are written: a float32 copy of one can outweigh the whole file
        embed_name = "model.embed_tokens.weight"
        if isinstance(weights, GgufWeights):
            embed = weights.table(embed_name, store)
        else:
            embed = weights(embed_name)
            embed = embed if isinstance(embed, BlockWeight | KQuantWeight) else embed.astype(store)
        _save(embed_graph(spec, embed), tmp / "embed.onnx")
        del embed
        bar.update()
        timed: dict = {"op": block_int8.OP if products == "edgespec" else "MatMulNBits"}
        for i, name in enumerate(layers):
            layer = layer_graph(spec, weights, i, context_length, dense, pad_matmuls, attention,
                                kv_dtype(attention, quant), q4_products)
            if bits:
                layer = _quantized(layer, bits, block_size, accuracy_level, symmetric)
                if i == 0 and attention == "exact" and products == "auto":  # the op is in the kernel's library
                    timed = block_int8.choose(layer)
                if timed["op"] == block_int8.OP:
                    block_int8.rewrite(layer)
            _save(layer, tmp / name)
            bar.update()
        head_name = "lm_head.weight" if "lm_head.weight" in weights else embed_name  # tied embeddings
        # A GGUF's output projection, to be quantized to MatMulNBits' 8-bit blocks, is quantized as it is read
        streamed = (isinstance(weights, GgufWeights) and bits and head_bits == 8 and block_size == BLOCK and symmetric
                    and accuracy_level == CARRIED_ACCURACY_LEVEL)
        lm_head = weights.blocks_8bit(head_name) if streamed else weights(head_name)  # type: ignore[union-attr]
        head = head_graph(spec, weights("model.norm.weight"), lm_head, dense, pad_matmuls, q4_products)
        del lm_head
        if bits:
            head = _quantized(head, head_bits, block_size, accuracy_level, symmetric)
            if timed["op"] == block_int8.OP:
                block_int8.rewrite(head)
        _save(head, tmp / "head.onnx")
        bar.update()
        bar.close()
        manifest = _manifest(spec, chat_template, quant, context_length, layers, attention)
        manifest["source"].update(source)
        if timed["op"] == block_int8.OP:
            manifest["quant_options"]["weights"] = f"{custom_ops.PRODUCTS} (MatMulNBits' 8-bit blocks)"
        if q4_products:
            used = {f"{custom_ops.DOMAIN}.{block_kquant.OPS[kind]}" for kind in kernel_kinds}
            used |= {custom_ops.Q4_PRODUCTS} if carried_four_bit else set()
            ops = [op for op in (custom_ops.Q4_PRODUCTS, custom_ops.KQUANT_PRODUCTS) if op in used]
            manifest["quant_options"]["weights"] = f"{', '.join(ops)} and MatMulNBits with the GGUF's own blocks"
            if custom_ops.Q4_PRODUCTS in used:
                manifest["quant_options"]["four_bit_products"] = custom_ops.Q4_PRODUCTS
            if custom_ops.KQUANT_PRODUCTS in used:
                manifest["quant_options"]["kquant_products"] = custom_ops.KQUANT_PRODUCTS
        if "median_us" in timed:
            manifest["quant_options"]["products_timed_us"] = timed["median_us"]
        manifest["quant_options"]["single_row_padding"] = ("layer" if pad_matmuls else
                                                           "none" if attention == "exact" else "attention")
        manifest["quant_options"]["attention_min_total"] = attention_min_total(spec, context_length, attention)
        if quant == GGUF_QUANT:
            carried_types = list(CARRIED) + (list(block_kquant.KINDS) if kquants and q4_products else [])
            manifest["quant_options"].update(carried=carried_types, other_bits=bits, block_size=block_size,
                                             accuracy_level=accuracy_level)
        elif bits:
            manifest["quant_options"].update(bits=bits, head_bits=head_bits, block_size=block_size,
                                             is_symmetric=symmetric, accuracy_level=accuracy_level)
        manifest["source"].update(src=os.fspath(src), export_seconds=round(time.time() - started, 1))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


@contextmanager
def replacing(out: Path) -> Iterator[Path]:
    """A scratch directory beside ``out`` to write into; once the block ends without error it replaces ``out``
    whole (a reader never sees half an export), else it is removed. Disk errors become ``OnnxExportError``."""
    try:
        with staged(out) as tmp:
            tmp.mkdir()
            yield tmp
    except OSError as e:
        raise OnnxExportError(f"could not write {out}: {e}") from e


def _gguf_tokenizer(path: Path, out: Path) -> str | None:
    """Write the GGUF's tokenizer into ``out`` with edgespec's own writer (byte-level BPE and SentencePiece
    vocabularies, tokenizing as llama.cpp does; no transformers); returns the chat template."""
    return write_tokenizer(reader(path), out)["chat_template"]


def _chat_template(folder: Path) -> str | None:
    tokenizer_config = folder / "tokenizer_config.json"
    config = json.loads(tokenizer_config.read_text()) if tokenizer_config.is_file() else {}
    chat_template = config.get("chat_template")
    if chat_template is None and (folder / "chat_template.jinja").is_file():
        chat_template = (folder / "chat_template.jinja").read_text()
    return chat_template


def _manifest(spec: ModelSpec, chat_template: str | None, quant: str, context_length: int, layers: list[str],
              attention: str) -> dict:
    options: dict = {"weights": {"fp32": "float32", "fp16": "float16, cast to float32 at load",
                                 GGUF_QUANT: "MatMulNBits with the GGUF's own blocks"}.get(quant, "MatMulNBits"),
                     "embedding": {"fp32": "float32", GGUF_QUANT: "the GGUF's own blocks or float16"}.get(
                         quant, "float16"),
                     "attention": (custom_ops.ATTENTION if attention == "exact" else
                                   "com.microsoft.GroupQueryAttention")}
    return {"format": FORMAT, "architecture": spec.architecture, "num_layers": spec.num_layers,
            "hidden_size": spec.hidden_size, "num_attention_heads": spec.num_heads,
            "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "vocab_size": spec.vocab_size,
            "context_length": context_length, "kv_length": kv_length(context_length),
            "kv_dtype": kv_dtype(attention, quant),
            "quant": quant, "quant_options": options,
            "bos_token_id": spec.bos_token_id, "eos_token_ids": list(spec.eos_token_ids),
            "chat_template": chat_template, "layer_types": list(spec.layer_types),
            "sliding_window": spec.sliding_window, "embed": "embed.onnx", "layers": layers, "head": "head.onnx",
            "source": {"exporter": "edgespec export onnx", "graphs": GRAPHS_REVISION},
            "quality": {}}
