"""A trained draft head (EAGLE) → the ONNX directory the runtime's ``HeadDrafter`` runs (docs/draft-head.md).

The head is a Llama decoder layer, so it is written with the same graphs as an exported model's layers: edgespec's
exact attention over its own KV buffer, 8-bit products. Its directory holds ``fuse.onnx`` (the "embed" graph: the
2w → w map of [f_i / scale, embedding(x_{i+1})]), ``layer_00.onnx``, ``head.onnx`` (the target's final norm and
output rows for the tokens in ``vocab.npy``) and a manifest with ``"input": "features"``. No torch here: the
weights come as numpy arrays (``write_head``); training them is ``head_training``'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.backends.onnx.manifest import MANIFEST, head_folder, read_manifest
from edgespec.backends.onnx.session import session_options
from edgespec.errors import EdgespecError
from edgespec.kernels import library as custom_ops

from .. import require
from ..onnx import block_int8
from ..onnx.export import _manifest, _quantized, replacing
from ..onnx.graphs import GraphBuilder, ModelSpec, _tensor, head_graph, kv_dtype, layer_graph, linear

# The head's parameters as head_training's module names them ([out, in] like torch.nn.Linear).
PARAMETERS = ("fuse.weight", "norm1.weight", "norm2.weight", "qkv.weight", "o.weight", "up.weight", "down.weight")
ROPE_THETA = 10000.0  # the head's own rotary base (it is not the target's layer)
EPS = 1e-6


def head_spec(target: dict, rows: int) -> ModelSpec:
    """The head as a one-layer Llama of the target's width and head count, with ``rows`` output rows."""
    width, heads = target["hidden_size"], target["num_attention_heads"]
    return ModelSpec("llama", 1, width, heads, heads, width // heads, rows, EPS, ("full_attention",),
                     {"full_attention": ROPE_THETA}, None, (width // heads) ** -0.5, None, ())


def output_rows(export: Path) -> np.ndarray:
    """The target's final norm and output projection as one matrix [width, vocab]: its head graph applied to a
    scaled one-hot row gives √width · g_i · W[:, i], so any hidden x gives (x / rms(x)) @ rows / √width."""
    ort = require("onnxruntime")
    manifest = read_manifest(export)
    width = manifest["hidden_size"]
    so, _ = session_options(1, make_shared=False)
    head = ort.InferenceSession(str(export / manifest["head"]), so, providers=["CPUExecutionProvider"])
    return head.run(None, {"hidden": np.eye(width, dtype=np.float32)[None] * 1000.0})[0][0] / width ** 0.5


def layer_weights(state: dict[str, np.ndarray], heads: int) -> dict[str, np.ndarray]:
    """The layer's parameters under a decoder layer's names. The head rotates adjacent pairs of each head's q and k
    (as ggml's normal mode does); the exported attention rotates halves: q and k rows are reordered so that the
    pair (2i, 2i + 1) becomes (i, i + d/2), which leaves every q·k the same."""
    width = state["o.weight"].shape[0]
    dim = width // heads
    halves = np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])
    order = (np.arange(heads)[:, None] * dim + halves).ravel()
    q, k, v = np.split(state["qkv.weight"], 3)
    gate, up = np.split(state["up.weight"], 2)
    p = "model.layers.0."
    return {p + "input_layernorm.weight": state["norm1.weight"],
            p + "post_attention_layernorm.weight": state["norm2.weight"],
            p + "self_attn.q_proj.weight": q[order], p + "self_attn.k_proj.weight": k[order],
            p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": state["o.weight"],
            p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": state["down.weight"]}


def write_head(export: Path, state: dict[str, np.ndarray], vocab: np.ndarray, scale: float,
               details: dict | None = None, bits: int = 8) -> Path:
    """Write the head for the ONNX export ``export`` beside it (``head_folder``); return its directory.
    ``state``: the parameters (``PARAMETERS``, float32); ``vocab``: the target's token of each output row;
    ``scale``: what the target's features are divided by before the head reads them."""
    target = read_manifest(export)
    width = target["hidden_size"]
    missing = [n for n in PARAMETERS if n not in state]
    if missing:
        raise EdgespecError(f"the head's parameters lack {', '.join(missing)}")
    state = {n: np.asarray(state[n], dtype=np.float32) for n in PARAMETERS}
    if state["fuse.weight"].shape != (width, 2 * width):
        raise EdgespecError(f"a head of width {state['fuse.weight'].shape[0]} for a model of width {width}")
    vocab = np.asarray(vocab, dtype=np.int64)
    if vocab.ndim != 1 or not len(vocab) or vocab.min() < 0 or vocab.max() >= target["vocab_size"]:
        raise EdgespecError(f"the head's output tokens must be ids below {target['vocab_size']}")
    spec = head_spec(target, len(vocab))
    attention = custom_ops.default_attention()
    out = head_folder(export)
    onnx = require("onnx")
    with replacing(out) as tmp:
        fuse = GraphBuilder("fuse")
        fuse.one("Identity", [linear(fuse, "features", state["fuse.weight"], "fuse")], "hidden")
        graphs = {"fuse.onnx": fuse.model([_tensor("features", onnx.TensorProto.FLOAT, [1, "S", 2 * width])],
                                          [_tensor("hidden", onnx.TensorProto.FLOAT, [1, "S", width])]),
                  "layer_00.onnx": layer_graph(spec, layer_weights(state, spec.num_heads).__getitem__, 0,
                                               target["context_length"], attention=attention,
                                               kv=kv_dtype(attention, "int8")),
                  "head.onnx": head_graph(spec, np.ones(width, np.float32), output_rows(export)[:, vocab].T)}
        timed: dict = {"op": "MatMulNBits"}
        for name in ("layer_00.onnx", "fuse.onnx", "head.onnx"):  # 8-bit products, the op timed on the layer
            graph = _quantized(graphs[name], bits, 32, 4, True)
            if name == "layer_00.onnx" and attention == "exact":
                timed = block_int8.choose(graph)
            if timed["op"] == block_int8.OP:
                block_int8.rewrite(graph)
            onnx.save_model(graph, str(tmp / name))
        np.save(tmp / "vocab.npy", vocab)
        manifest = _manifest(spec, None, "int8", target["context_length"], ["layer_00.onnx"], attention)
        manifest.update(embed="fuse.onnx", input="features", eos_token_ids=[],
                        draft_head={"vocab": "vocab.npy", "scale": float(scale), "target": str(export),
                                    "target_vocab_size": target["vocab_size"], **(details or {})})
        manifest["source"]["exporter"] = "edgespec export head"
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out
