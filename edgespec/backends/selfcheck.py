"""Exactness self-check: does this build, on this device, give a position the same logits inside a verify batch
as when it is decoded alone?

Greedy speculative output equals target-only output only if it does (docs/exact-numerics.md). edgespec's own
builds and settings are batch-invariant where they were measured, but a user's llama.cpp (a stock wheel with
llamafile's sgemm kernels, GPU kernels) or onnxruntime may not be. So at first use a short probe decodes a few
tokens one at a time and then the same tokens in one batch, after a short and after a several-hundred-token
context, and compares the logits. Where the model verifies token trees (``decode_tree``) and batched passes are
exact, a small tree is probed too, at the same pass shape: its rows against one-token decoding of each node's path,
then its second branch kept and decoding continued (``probe_trees``); ``exact_trees`` is that verdict. Where the
model would reuse a kept prompt prefix (``exact_reuse``), a prompt prefilled whole is compared with the same prompt
prefilled as a prefix and the rest (``probe_reuse``): what the prompt cache does; ``reuse_probe_exact`` is that
verdict. The verdict is cached per build and device in ``$EDGESPEC_HOME/exactness``:
llama.cpp's library files, version and system info (CPU features), the CPU, device, threads, the model's
quantization type and the numerics settings; for ONNX the onnxruntime version, execution providers, device,
threads, the export's quantization and graph revision, and the attention kernel's build (named after its source,
flags and CPU) when the export uses it.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ..controller.cost import MAX_GAMMA
from ..engine.arena import TreeCache
from ..errors import EdgespecError
from ..files import write_text
from ..home import fields_of, home_dir, keep, read_record
from ..identity import cpu_identity, key_digest
from ..kernels import library as custom_ops
from .base import GPU_DEVICES

FORMAT = 5  # 2: the padded pass size chosen; 3: whether trees are exact at it; 4: reuse; 5: every pass size probed
# The largest verify pass the engine sends (γ drafts and the committed token): every size up to it is probed, since
# a CPU kernel may change with the row count (llama.cpp's K-quant products on AVX-512 from 8 rows on).
PROBED_ROWS = MAX_GAMMA + 1
# Committed tokens before the probe: a short context, one just below a multiple of 256 (llama.cpp rounds the
# attended cache length n_kv up to one: a pass across it sees another n_kv than its first rows decoded alone;
# llamacpp/model.py's KV_STEP) and several hundred.
_KV_STEP = 256
CONTEXTS = (24, _KV_STEP - 3, 320)
GOES_ON = 2  # tokens decoded one at a time after a probed tree's second branch is kept
REUSE = (100, 320)  # a kept prefix, and the prompt it starts: prefilled whole against the prefix and then the rest
TREE_NODES = MAX_GAMMA + 1  # a probed tree's nodes: the most one verify pass carries (the trunk, then the draft)
# Pass sizes tried, smallest first, where unpadded passes are not exact (LlamaModel.set_pass_rows):
# every pass, a one-token decode too, is then padded to that many rows, and a draft is at most one fewer.
PADDED_ROWS = (4, 8, 16)
_TEXT = ("The river starts in the hills north of the town, runs past the mill and the old stone bridge, and "
         "reaches the sea after forty kilometres. In spring the water is high and brown; in late summer it is "
         "low enough to cross on foot. def count(words):\n    return {w: words.count(w) for w in set(words)}\n"
         "Q: How many apples are left if you have 7 and eat 3? A: 4. ")


class NotExactError(EdgespecError):
    """``require_exact`` was asked for, but this build and device are not batch-invariant."""

    def __init__(self, message: str, result: Exactness) -> None:
        super().__init__(message)
        self.result = result


class ExactnessWarning(UserWarning):
    """Greedy output may drift from target-only decoding on this build and device."""


class Probed(Protocol):
    """What the probe needs from a model: the arena's cache interface plus a tokenizer."""

    n_ctx: int

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray: ...
    def truncate(self, keep: int) -> None: ...
    def max_pass_rows(self, start: int) -> int: ...


class TreeProbed(Probed, TreeCache, Protocol):
    """A probed model that verifies token trees (llama.cpp, ONNX exports with the tree input, the scripted fake)."""

    exact_trees: bool


@dataclass
class Exactness:
    """One probe's verdict: exact when every compared logit was bit-identical."""

    key: dict[str, object]
    exact: bool
    max_abs_diff: float  # largest |single − batched| logit difference over the probed positions
    argmax_agree: int  # positions whose argmax was the same both ways
    positions: int
    seconds: float
    cached: bool = False  # read from the cache rather than measured now
    pass_rows: int = 0  # 0: exact (or not) unpadded; B: exact with every pass padded to B rows
    row_cap: int = 0  # 0: no cap; R: exact unpadded in passes of up to R rows, and the model capped there
    unpadded_max_abs_diff: float = 0.0  # what unpadded passes gave, when padding was needed
    exact_trees: bool = False  # tree rows equal one-token decoding at the chosen pass shape
    tree_max_abs_diff: float | None = None  # what the tree probe found; None: not probed (no trees, or not exact)
    reuse_max_abs_diff: float | None = None  # what the reuse probe found; None: not probed (no reuse here)

    def describe(self) -> str:
        figures = f"max logit difference {self.max_abs_diff:.3g}, argmax agrees at {self.argmax_agree}/" \
                  f"{self.positions} positions"
        if self.pass_rows:
            return (f"batched verify vs one-token decoding: exact with every pass padded to {self.pass_rows} rows "
                    f"({figures}; unpadded passes differ by up to {self.unpadded_max_abs_diff:.3g})")
        if self.row_cap:
            return (f"batched verify vs one-token decoding: exact in passes of up to {self.row_cap} rows, to which "
                    f"verify passes are held ({figures}; larger passes differ by up to "
                    f"{self.unpadded_max_abs_diff:.3g})")
        return f"batched verify vs one-token decoding: {'exact' if self.exact else 'NOT exact'} ({figures})"


def contexts(n_ctx: int, rows: int = 0) -> list[int]:
    """The probed context lengths that fit a context window of ``n_ctx`` tokens. Padded to ``rows``, the context
    below the n_kv step is the one where ``max_pass_rows`` must cut a pass short (to 3 rows) for it to be exact."""
    probed = (CONTEXTS[0], _KV_STEP - rows - 2, CONTEXTS[2]) if rows else CONTEXTS
    return sorted({max(1, min(c, n_ctx - max(rows, PROBED_ROWS))) for c in probed})


def _probe_text(model: Probed, length: int) -> list[int]:
    """The probes' text as ``length`` tokens (repeated as often as it takes)."""
    text = model.tokenize(_TEXT, add_special=True)
    return (text * (length // len(text) + 1))[:length]


def probe(model: Probed, rows: int = 0) -> tuple[float, int, int, int]:
    """Max |logit difference|, argmax agreements and positions compared, single-token vs batched decoding,
    both padded to ``rows`` when it is not 0 (the model's passes must already be padded so), and the largest pass
    size up to which every size probed was exact. Unpadded, passes of every size from 2 to ``PROBED_ROWS`` tokens
    (as many as the model allows there: ``max_pass_rows``) after the first context, and of the largest after the
    others (a kernel's choice by row count does not depend on the context; the longest pass crosses the most), are
    compared with the same tokens decoded one at a time; padded, one pass of up to ``rows`` tokens (every pass then
    has that shape). Leaves the model's cache empty."""
    probed = contexts(model.n_ctx, rows)
    tokens = _probe_text(model, max(probed) + max(rows, PROBED_ROWS))
    worst, agree, n, exact_up_to = 0.0, 0, 0, PROBED_ROWS
    for context in probed:
        model.truncate(0)
        model.decode(tokens[:context], 0, 1)
        longest = min(rows or PROBED_ROWS, model.max_pass_rows(context))
        tail = tokens[context:context + longest]
        single = np.stack([model.decode([t], context + i, 1)[0].copy() for i, t in enumerate(tail)])
        for k in range(2, longest + 1) if context == probed[0] and not rows else [longest]:
            model.truncate(context)
            batched = model.decode(tail[:k], context, k).copy()
            difference = float(np.abs(single[:k] - batched).max())
            if difference != 0.0:
                exact_up_to = min(exact_up_to, k - 1)
            worst = max(worst, difference)
            agree += int((single[:k].argmax(-1) == batched.argmax(-1)).sum())
            n += k
    model.truncate(0)
    return worst, agree, n, exact_up_to


def _tree(size: int) -> tuple[list[int], int]:
    """Parents of a probed tree of ``size`` >= 3 nodes: node 0 the trunk (the committed token ``extend_tree`` leads
    with), then the first root path, then a second branch off the trunk; and where that branch starts."""
    second = 1 + (size - 1) // 2
    return [-1, *range(0, second - 1), 0, *range(second, size - 1)], second


def probe_trees(model: TreeProbed, rows: int = 0) -> float | None:
    """Max |logit difference| between one-token decoding and a tree pass at each probed context: every row of a
    tree whose second branch is the text's continuation (so the kept path is not the tree's first, the case whose
    cells must be moved), then ``GOES_ON`` tokens decoded one at a time after keeping it. The tree is as large as
    the engine verifies (the trunk and MAX_GAMMA nodes: its second branch sits 8 cells from where sequential
    decoding puts it; smaller trees, with the exact numerics' kernels, often came out exact by chance) or as the
    model allows there (``max_tree_rows``). None where no context had room for a tree with a branch. Leaves the
    model's cache empty."""
    probed = contexts(model.n_ctx, rows)
    tokens = _probe_text(model, max(probed) + 2 * TREE_NODES + GOES_ON)
    worst, probed_trees, held = 0.0, 0, 0
    model.truncate(0)
    for context in probed:  # in increasing order: each context's prefix extends the last one's
        n = min(TREE_NODES, model.max_tree_rows(context), model.n_ctx - context - GOES_ON)
        if n < 3:
            continue
        model.truncate(held)
        model.decode(tokens[held:context], held, 1)
        held = context
        parents, second = _tree(n)
        branch = tokens[context:context + n - second + 1 + GOES_ON]  # the trunk, the second branch, what follows
        first = tokens[context + n:context + n + second - 1]  # other text: the first path
        tree = [branch[0], *first, *branch[1:n - second + 1]]
        rows_tree = model.decode_tree(tree, parents, context).copy()
        kept = [0, *range(second, n)]
        model.keep_tree_path(kept)
        after = np.stack([model.decode([t], context + len(kept) + i, 1)[0].copy()
                          for i, t in enumerate(branch[len(kept):])])
        for path, got in (([tree[0], *first], rows_tree[:second]), (branch, np.concatenate([rows_tree[kept], after]))):
            model.truncate(context)
            single = np.stack([model.decode([t], context + i, 1)[0].copy() for i, t in enumerate(path)])
            worst = max(worst, float(np.abs(single - got).max()))
        probed_trees += 1
    model.truncate(0)
    return worst if probed_trees else None


def probe_reuse(model: Probed) -> float:
    """Max |logit difference| of a prompt's last row between the prompt prefilled whole and prefilled as a kept
    prefix and then the rest, as the prompt cache reuses a conversation's earlier turns: a rest of many tokens, and of
    the last one alone (a request repeating a cached prompt feeds only that). Batch invariance of verify passes
    (``probe``) does not imply it: a prefill of hundreds of tokens takes other kernels than a verify (llama.cpp's
    K-quant products from 8 rows on, where a lone last token takes the one-row kernel), and where reuse was measured
    exact (two CPU kinds, 1-6 threads, the shipped Q4_1) it was measured, not derived. Leaves the cache empty."""
    end = max(2, min(REUSE[1], model.n_ctx - 1))
    tokens = _probe_text(model, end)
    model.truncate(0)
    whole = model.decode(tokens, 0, 1)[0].copy()
    worst = 0.0
    for kept in sorted({min(REUSE[0], end - 1), end - 1}):
        model.truncate(0)
        model.decode(tokens[:kept], 0, 1)
        resumed = model.decode(tokens[kept:], kept, 1)[0].copy()
        worst = max(worst, float(np.abs(whole - resumed).max()))
    model.truncate(0)
    return worst


def _files(folder: Path) -> list[list[object]]:
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(folder.iterdir()) if f.is_file()]


def build_key(model: object, device: str, exact_numerics: bool) -> dict[str, object]:
    """What the verdict depends on, for a llama.cpp or an ONNX model (module docstring)."""
    from .onnx.model import OnnxModel

    key: dict[str, object] = {"cpu": cpu_identity(), "device": device, "threads": getattr(model, "n_threads", None),
                              "contexts": contexts(model.n_ctx)}  # type: ignore[attr-defined]
    if isinstance(model, OnnxModel):
        import onnxruntime as ort

        m = model.manifest
        kernel = custom_ops.library() if custom_ops.needs_library(m) else None
        key.update(backend="onnx", onnxruntime=ort.__version__, providers=model.providers,
                   quant=m.get("quant"), graphs=(m.get("source") or {}).get("graphs"),
                   quant_options=m.get("quant_options"),
                   custom_ops=kernel.name if kernel else None)  # named after its source, flags and CPU
        return key
    import llama_cpp as lc

    lib = Path(lc.__file__).parent / "lib"
    on_gpu = bool(getattr(model, "on_gpu", device in GPU_DEVICES))  # where it runs (device auto: a GPU build's)
    key.update(backend="llamacpp", llama_cpp=lc.__version__, library=_files(lib) if lib.is_dir() else None,
               system_info=lc.llama_print_system_info().decode("utf-8", "replace").strip(),
               quant=model.description, gpu=on_gpu,  # type: ignore[attr-defined]
               # the settings loaded, not the flag: on a GPU both load llama.cpp's defaults (set_numerics), so
               # one verdict (and one probe) serves both
               exact_numerics=exact_numerics and not on_gpu)
    return key


def _path(key: dict[str, object]) -> Path:
    return home_dir("exactness") / f"{key['backend']}-{key_digest(key)}.json"


def check(model: Probed, device: str, exact_numerics: bool = True) -> Exactness:
    """The cached verdict for this build and device, probing ``model`` (about a second) when there is none.

    Where unpadded passes are exact only up to some size (2 or more rows) on a CPU and the model can hold its verify
    passes to that (``set_row_cap``: llama.cpp), it is held there. Else, where the model can pad its passes
    (``set_pass_rows``: llama.cpp), each of PADDED_ROWS is probed in turn and the first that is exact is kept. The
    model is left capped or padded so, whether the verdict was measured now or read from the cache. A model that
    verifies trees is then probed with trees at that shape, and left with ``exact_trees`` set to the verdict.
    """
    key = build_key(model, device, exact_numerics)
    path = _path(key)
    pad = getattr(model, "set_pass_rows", None)
    cached = read_record(path, lambda d: _cached(d, key))
    if cached is not None:
        if cached.pass_rows and pad is not None:
            pad(cached.pass_rows)
        if cached.row_cap and hasattr(model, "set_row_cap"):
            model.set_row_cap(cached.row_cap)  # type: ignore[attr-defined]
        _apply_trees(model, cached.exact_trees)
        _apply_reuse(model, cached.reuse_max_abs_diff)
        return cached
    started = time.perf_counter()
    worst, agree, n, exact_up_to = probe(model)
    unpadded, rows, cap = worst, 0, 0
    held = getattr(model, "set_row_cap", None)
    if worst != 0.0 and held is not None and exact_up_to >= 2 and not key.get("gpu"):
        # Exact in smaller passes: holding verify passes to those keeps a one-token decode at its own cost, where
        # padding every pass to B rows would charge it B rows (on a CPU a row costs nearly a pass).
        held(exact_up_to)
        worst, agree, n, _ = probe(model)
        cap = exact_up_to if worst == 0.0 else 0
        if not cap:
            held(0)
    if worst != 0.0 and pad is not None:
        for candidate in PADDED_ROWS:
            pad(candidate)
            padded = probe(model, candidate)
            if padded[0] == 0.0:
                (worst, agree, n, _), rows = padded, candidate
                break
        else:
            pad(0)
    tree_worst = probe_trees(model, rows) if worst == 0.0 and _verifies_trees(model) else None  # type: ignore[arg-type]
    _apply_trees(model, tree_worst == 0.0)
    reuse = probe_reuse(model) if getattr(model, "exact_reuse", False) else None
    _apply_reuse(model, reuse)
    result = Exactness(key, worst == 0.0, worst, agree, n, round(time.perf_counter() - started, 3),
                       pass_rows=rows, row_cap=cap, unpadded_max_abs_diff=unpadded, exact_trees=tree_worst == 0.0,
                       tree_max_abs_diff=tree_worst, reuse_max_abs_diff=reuse)
    keep(path, lambda p: write_text(p, json.dumps({"format": FORMAT, **asdict(result)} | {"cached": False}, indent=1)))
    return result


def _cached(d: dict[str, object], key: dict[str, object]) -> Exactness | None:
    """A stored verdict for ``key``; None for another format or key (probed again, not damaged)."""
    if d.pop("format", None) != FORMAT or d.get("key") != key:
        return None
    return fields_of(Exactness, d | {"cached": True})


def _verifies_trees(model: object) -> bool:
    """A model that can feed a tree in one pass (``TreeCache.tree_passes``)."""
    return bool(getattr(model, "tree_passes", False))


def _apply_trees(model: object, exact: bool) -> None:
    """Tell a tree-verifying model whether its trees are exact (the engine verifies trees only then)."""
    if _verifies_trees(model):
        model.exact_trees = exact  # type: ignore[attr-defined]


def _apply_reuse(model: object, difference: float | None) -> None:
    """Tell a model whose reuse was probed whether it is exact (it reuses a kept prefix only then)."""
    if difference is not None and hasattr(model, "reuse_probe_exact"):
        model.reuse_probe_exact = difference == 0.0  # type: ignore[attr-defined]


_warned: set[Path] = set()


def _advice(result: Exactness) -> str:
    """What may make this build exact, by device: on a CPU the kernels and settings edgespec builds with; on a GPU
    nothing but the CPU (padding was already tried, and both numerics use llama.cpp's defaults there)."""
    key = result.key
    if key.get("backend") == "onnx":
        return "build edgespec's kernels (`edgespec build-kernel`) and use an export made with them"
    if key.get("gpu"):  # a GPU named, or device auto with a GPU build
        tried = ", ".join(map(str, PADDED_ROWS))
        return (f"passes padded to {tried} rows were not exact either on this device: run speculation on the CPU "
                "(--device cpu)")
    if key.get("exact_numerics") is False:
        return "drop --fast-numerics"
    return "rebuild llama-cpp-python with -DGGML_LLAMAFILE=OFF (`make setup`)"


def enforce(result: Exactness, require_exact: bool, what: str) -> None:
    """Refuse (``require_exact``) or warn once per build, device and model file when the check failed."""
    if result.exact:
        return
    message = (f"{what}: {result.describe()}. Greedy output may drift from target-only decoding on this build "
               "and device (docs/exact-numerics.md).")
    if require_exact:
        raise NotExactError(f"{message} Refusing because exactness was required (--require-exact); "
                            f"{_advice(result)}.", result)
    path = _path(result.key)
    if path not in _warned:
        _warned.add(path)
        warnings.warn(message, ExactnessWarning, stacklevel=3)
