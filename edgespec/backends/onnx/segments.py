"""Running runs of consecutive decoder layers as ONE onnxruntime session (a segment).

The exported format keeps one graph per layer so that a layer-skip draft can leave any layer out with one
copy of the weights. Chaining 30 sessions per forward pass costs, though: each call re-binds and re-enters
onnxruntime, and the hidden state crosses a session boundary per layer (SmolLM2 INT8, 2 threads: 10.3 ms
per token over 30 layer sessions, 9.4 ms over 5 sessions of the same graphs, same logits). So when the
model loads, the layer graphs are merged into segments: runs of consecutive layers, capped in size. Once a
layer-skip draft is readied, the segments are planned again, split where a run of skipped layers starts or ends,
so that the draft chains the ones it keeps. Every layer's weights are in exactly one session.

A segment graph is the layer graphs joined hidden_out → hidden, with every name prefixed by its layer, the
step's inputs (``SHARED_INPUTS``) shared, and each layer's KV as ``past_key.{i}``/``present_key.{i}`` (and
value). The graph optimizer may then fuse across layer boundaries: numerics stay batch-invariant (the same
kernels run for any number of rows), which is what losslessness needs (tests/model/test_onnx_backend.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LAYER_INPUTS = ("hidden", "past_key", "past_value", "seqlens_k", "total_sequence_length")
LAYER_OUTPUTS = ("hidden_out", "present_key", "present_value")
KV_NAMES = ("past_key", "past_value", "present_key", "present_value")
TREE_INPUT = "tree_parents"  # each row's parent row for a token tree; exact-attention exports only
SHARED_INPUTS = ("seqlens_k", "total_sequence_length", TREE_INPUT)
LOGIT_INPUT = "logit_start"  # ``whole_pass``: −n, the logits of the last n rows
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Dropout"}
# Segment size cap, in layer-file bytes. A session call costs ~40 µs beyond its compute (SmolLM2 INT8, 2 threads:
# 10.3 ms per token over 30 sessions, 9.4 over 5, the same over 3), and 48 MiB of weights take ~1.5 ms to read
# at this machine's 31 GB/s, so bigger segments gain nothing; but merging one costs transient memory, ~3× its
# size (peak RSS 365 MB unfused, 490 MB with this cap, 800 MB with the whole run of 24 layers in one segment).
MAX_SEGMENT_BYTES = 48 << 20


def io_name(name: str, layer: int, fused: bool) -> str:
    """A layer's input/output name inside its session: as exported, or suffixed by the layer in a segment."""
    return f"{name}.{layer}" if fused and name in KV_NAMES else name


def contract_error(file: Path, inputs: Sequence[str], outputs: Sequence[str]) -> str | None:
    """Why a graph with these input/output names is not a layer graph of the format, or None."""
    missing = [n for n in LAYER_INPUTS if n not in inputs] + [n for n in LAYER_OUTPUTS if n not in outputs]
    if not missing:
        return None
    kv = " (it has no KV cache inputs)" if any(n in KV_NAMES for n in missing) else ""
    return f"{file} lacks {', '.join(missing)}{kv}: not a layer graph of the edgespec ONNX format"


def plan(n_layer: int, skip: Sequence[int], sizes: Sequence[int], fuse: bool) -> list[list[int]]:
    """Split layers 0..n_layer−1 into sessions: each skipped or kept run whole (capped in bytes) if ``fuse``,
    else one layer per session (what calibration needs: it runs arbitrary subsets and clocks each layer)."""
    if not fuse:
        return [[i] for i in range(n_layer)]
    skipped = set(skip)
    segments: list[list[int]] = []
    size = 0
    for i in range(n_layer):
        if segments and (i - 1 in skipped) == (i in skipped) and size + sizes[i] <= MAX_SEGMENT_BYTES:
            segments[-1].append(i)
            size += sizes[i]
        else:
            segments.append([i])
            size = sizes[i]
    return segments


def fuse(files: Sequence[Path], layers: Sequence[int], out: Path) -> None:
    """Write to ``out`` one ONNX model running the layer graphs ``files`` (of ``layers``) one after the other.

    A file, not bytes: onnxruntime's Python session keeps the bytes it was made from for its whole life (a
    second copy of the weights); from a file it keeps nothing, and the file can go once the session exists.
    Raises ValueError (with the reason) for a file that is not a layer graph of the format.
    """
    import onnx
    from onnx import helper

    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    first: onnx.ModelProto | None = None
    seen: dict[bytes, list[str]] = {}  # a constant's content or a node's computation → the names it has here
    hidden = "hidden"  # the name of the hidden state flowing into the next layer
    for n, (file, layer) in enumerate(zip(files, layers, strict=True)):
        model = _loaded(file)
        graph = model.graph
        why = contract_error(file, [i.name for i in graph.input], [o.name for o in graph.output])
        if why:
            raise ValueError(why)
        first = first or model
        if [(o.domain, o.version) for o in model.opset_import] != [(o.domain, o.version) for o in first.opset_import]:
            raise ValueError(f"{file}: its opsets differ from {files[0]}'s")
        last = n == len(layers) - 1
        rename = {name: f"l{layer}.{name}" for name in
                  [t.name for t in graph.initializer] + [o for node in graph.node for o in node.output if o]
                  if name not in SHARED_INPUTS}
        rename.update({name: io_name(name, layer, True) for name in KV_NAMES})  # never shared: no node dedupes
        rename.update({"hidden": hidden, "hidden_out": "hidden_out" if last else f"l{layer}.hidden_out"})
        for tensor in graph.initializer:  # constants several layers share (rotary caches, shapes) are kept once
            if tensor.name in SHARED_INPUTS:  # a shared input's default: the first layer's, under its own name
                if n == 0:
                    initializers.append(tensor)
                continue
            name, tensor.name = tensor.name, ""
            key = b"T" + hashlib.blake2b(tensor.SerializeToString(), digest_size=20).digest()
            if key in seen:
                rename[name] = seen[key][0]
            else:
                tensor.name = rename[name]
                seen[key] = [tensor.name]
                initializers.append(tensor)
        for node in graph.node:
            node.input[:] = [rename.get(x, x) for x in node.input]
            if node.op_type == "Shape" and node.input[0] == hidden:
                node.input[0] = "hidden"  # the hidden state has the same shape at every layer (the contract)
            key = _node_key(node)
            if (key in seen and node.input and node.op_type not in _NONDETERMINISTIC
                    and not set(node.output) & set(LAYER_OUTPUTS)):
                # The same op on the same values as in an earlier layer (the single-row padding arithmetic on
                # the shared inputs): computed once per segment.
                rename.update(zip(node.output, seen[key], strict=True))
                continue
            node.name = f"l{layer}.{node.name}"
            node.output[:] = [rename.get(x, x) for x in node.output]
            seen[key] = list(node.output)
            nodes.append(node)
        for value in graph.input:
            if value.name in ("hidden", *SHARED_INPUTS) and n > 0:
                continue  # fed by the previous layer / shared
            value.name = rename.get(value.name, value.name)
            inputs.append(value)
        for value in graph.output:
            if value.name == "hidden_out" and not last:
                continue
            value.name = rename[value.name]
            outputs.append(value)
        hidden = rename["hidden_out"]
    assert first is not None
    merged = helper.make_model(helper.make_graph(nodes, f"layers_{layers[0]}_{layers[-1]}", inputs, outputs,
                                                 initializers),
                               opset_imports=list(first.opset_import), ir_version=first.ir_version)
    onnx.save_model(merged, str(out))


def whole_pass(embed: Path, files: Sequence[Path], head: Path, out: Path) -> None:
    """Write to ``out`` one ONNX model running a whole pass of a small export (a draft head's): its embed graph,
    its layer graphs, and its head graph on the last rows only, how many given by the input ``LOGIT_INPUT``
    (−n: the last n rows). Its outputs: ``hidden_out`` (every row's last hidden state), the layers' KV, ``logits``.

    Why: a session call costs more than its compute when it starts cold, as a draft head's does right after the
    target's pass (its weights, onnxruntime's state and Python's evicted from the caches): one call instead of
    three. The same kernels on the same rows: the logits and states are those of the three graphs run apart.
    Raises ValueError (with the reason) for a file that is not a graph of the format.
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    fuse(files, range(len(files)), out)  # the layers joined as a segment is, then its ends added
    model = _loaded(out)
    graph = model.graph
    # The embed graph writes the layers' input "hidden"; the head graph reads the Slice of the last rows.
    ends = [_loaded(embed), _loaded(head)]
    opsets = {o.domain: o.version for o in model.opset_import}
    for file, part in zip((embed, head), ends, strict=True):  # each graph may use ops of fewer domains
        for o in part.opset_import:
            if opsets.setdefault(o.domain, o.version) != o.version:
                raise ValueError(f"{file}: its opset of {o.domain or 'onnx'} differs from {files[0]}'s")
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in opsets.items())
    embed_graph = _prefixed(ends[0].graph, "embed.", {"hidden": "hidden"})
    head_graph = _prefixed(ends[1].graph, "head.", {"hidden": "head.rows", "logits": "logits"})
    graph.input.remove(next(value for value in graph.input if value.name == "hidden"))
    graph.input.extend([*embed_graph.input, helper.make_tensor_value_info(LOGIT_INPUT, onnx.TensorProto.INT64, [1])])
    graph.output.extend(head_graph.output)
    graph.initializer.extend([*embed_graph.initializer, *head_graph.initializer,
                              numpy_helper.from_array(np.array([np.iinfo(np.int64).max]), "head.rows_end"),
                              numpy_helper.from_array(np.array([1]), "head.rows_axis")])
    last_rows = helper.make_node("Slice", ["hidden_out", LOGIT_INPUT, "head.rows_end", "head.rows_axis"],
                                 ["head.rows"], name="head.last_rows")
    nodes = [*embed_graph.node, *graph.node, last_rows, *head_graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save_model(model, str(out))


def _prefixed(graph: Any, prefix: str, keep: dict[str, str]) -> Any:
    """``graph`` with its constants and values named ``prefix`` + name, but for the names ``keep`` maps (its
    inputs' names stay as they are)."""
    rename = {name: prefix + name for name in [t.name for t in graph.initializer]
              + [o for node in graph.node for o in node.output if o]}
    rename.update(keep)
    for tensor in graph.initializer:
        tensor.name = rename[tensor.name]
    for node in graph.node:
        node.name = prefix + node.name
        node.input[:] = [rename.get(x, x) for x in node.input]
        node.output[:] = [rename.get(x, x) for x in node.output]
    return graph


def _loaded(file: Path) -> Any:
    import onnx

    try:
        return onnx.load(str(file))
    except Exception as e:  # protobuf decode errors, unreadable files
        raise ValueError(f"cannot read {file}: {e}") from e


def _node_key(node: object) -> bytes:
    """What a node computes: its op, attributes and (renamed) inputs, without its own and its outputs' names."""
    import onnx

    probe = onnx.NodeProto()
    probe.CopyFrom(node)  # type: ignore[arg-type]
    probe.name = ""
    del probe.output[:]
    return b"N" + probe.SerializeToString()
