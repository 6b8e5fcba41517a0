"""Benchmark configurations as data: a name, which runner builds it, and that runner's options.

A runner (``RUNNERS``) is a module with ``open_runner(options, setup) -> Runner`` (see ``worker.py``),
imported only inside the worker process of a configuration that uses it. Adding a configuration is one
entry here; adding an engine is one runner module and one line in ``RUNNERS``. An option value ``"@name"``
is replaced by the run option ``name`` (e.g. ``--onnx-model``): configurations that name one the user did
not give are skipped, not failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .questions import BenchError
from .revision import commit_of

RUNNERS = {
    "edgespec": "edgespec.bench.peers.native",
    "llama-cpp-python": "edgespec.bench.peers.lcpp",
    "transformers": "edgespec.bench.peers.hf",
    "onnxruntime-genai": "edgespec.bench.peers.ort_genai",
}


@dataclass(frozen=True)
class Config:
    name: str
    runner: str  # a key of RUNNERS
    options: dict[str, object] = field(default_factory=dict)
    baseline: str = "target"  # speed ratios are against this configuration of the same run
    # The output it must equal to count as lossless (None: the baseline). A plain decoder is its own
    # reference: its "lossless" is empty, and "same as baseline" says whether its numerics match edgespec's.
    reference: str | None = None
    description: str = ""
    auto: bool = False  # one of edgespec's automatic modes (γ chosen by the controller): the head-to-head's side
    revision: str | None = None  # the commit whose edgespec runs it (``NAME@REV``); None: this checkout's

    @property
    def lossless_reference(self) -> str:
        return self.reference or self.baseline

    def needs(self) -> list[str]:
        """Run options (``@name`` values) this configuration cannot run without."""
        return [v[1:] for v in self.options.values() if isinstance(v, str) and v.startswith("@")]

    def resolved_options(self, run_options: dict[str, object]) -> dict[str, object]:
        return {k: run_options[v[1:]] if isinstance(v, str) and v.startswith("@") else v
                for k, v in self.options.items()}


# Peers are compared for losslessness with their own plain greedy output too (reference), because their
# numerics differ from edgespec's: "same as baseline" and "lossless" are separate columns.
CONFIGS = {c.name: c for c in [
    # `edgespec generate` with no flags, through its own code path: whatever the default becomes, this measures it.
    Config("default", "edgespec", {"generate_flags": []}, baseline="default-target", auto=True,
           description="edgespec generate (no flags: the default model, mode, γ and tuning)"),
    Config("default-target", "edgespec", {"generate_flags": ["--draft", "none"]}, baseline="default-target",
           description="edgespec generate --draft none (the default model alone)"),
    Config("target", "edgespec", {"mode": "none"}, description="edgespec, target alone"),
    Config("ngram-auto", "edgespec", {"mode": "ngram"}, auto=True, description="edgespec, n-gram lookup, γ auto"),
    Config("ngram-g4", "edgespec", {"mode": "ngram", "gamma": 4}, description="edgespec, n-gram lookup, γ = 4"),
    # Not in the defaults: real trees on ONNX exports (exact there), chains on llama.cpp.
    Config("tree-auto", "edgespec", {"mode": "tree"}, auto=True,
           description="edgespec, mode tree (lookup spine, suffix-trie and recycled-logits branches), γ auto"),
    Config("tuned", "edgespec", {"tuned": True}, auto=True, description="edgespec with what `edgespec tune` chose"),
    Config("target-q8", "edgespec", {"model": "smollm2-135m:q8_0", "mode": "none"}, baseline="target-q8",
           description="edgespec, Q8_0 target alone"),
    Config("draft-auto", "edgespec", {"model": "smollm2-135m:q8_0", "draft": "smollm2-135m:q4_0", "mode": "draft"},
           baseline="target-q8", auto=True, description="edgespec, Q8_0 target, Q4_0 draft model, γ auto"),
    Config("lcpp-plain", "llama-cpp-python", {}, reference="lcpp-plain", description="llama-cpp-python Llama.generate"),
    Config("lcpp-pld", "llama-cpp-python", {"prompt_lookup": 10}, reference="lcpp-plain",
           description="llama-cpp-python LlamaPromptLookupDecoding(num_pred_tokens=10)"),
    # For conversations (bench --chat): llama-cpp-python's prompt cache, as Llama.create_completion uses it.
    Config("lcpp-cache", "llama-cpp-python", {"prompt_cache": True}, reference="lcpp-cache",
           description="llama-cpp-python Llama.generate with its LlamaRAMCache"),
    Config("hf-plain", "transformers", {}, reference="hf-plain",
           description="transformers generate, weights dequantized to F32"),
    Config("hf-pld", "transformers", {"prompt_lookup_num_tokens": 10}, reference="hf-plain",
           description="transformers generate(prompt_lookup_num_tokens=10)"),
    # Not in the defaults: measured here at ~0.15× hf-plain (τ ≈ 1.06 with 12 or 20 of SmolLM2's 30 layers,
    # 1.5 with 26), it would add about an hour to a default run.
    Config("hf-early-exit", "transformers", {"assistant_early_exit": 20}, reference="hf-plain",
           description="transformers generate(assistant_early_exit=20): the first 20 layers draft"),
    Config("ortg-plain", "onnxruntime-genai", {"model_dir": "@ort_genai_model"}, reference="ortg-plain",
           description="onnxruntime-genai on an exported genai model"),
    Config("ortg-ngram", "onnxruntime-genai", {"model_dir": "@ort_genai_model", "ngram_size": 3,
                                               "max_draft_tokens": 8}, reference="ortg-plain",
           description="onnxruntime-genai speculative n-gram decoding"),
    # edgespec's own ONNX Runtime backend: edgespec.load(onnx_dir, mode=...) (the `ort` branch).
    Config("onnx-target", "edgespec", {"model": "@onnx_model", "mode": "none"}, baseline="onnx-target",
           description="edgespec ONNX backend, target alone"),
    Config("onnx-ngram", "edgespec", {"model": "@onnx_model", "mode": "ngram"}, baseline="onnx-target",
           auto=True, description="edgespec ONNX backend, n-gram lookup, γ auto"),
    Config("onnx-layerskip", "edgespec", {"model": "@onnx_model", "mode": "layerskip"}, baseline="onnx-target",
           auto=True, description="edgespec ONNX backend, layer-skip self-draft, γ auto"),
    Config("onnx-hybrid", "edgespec", {"model": "@onnx_model", "mode": "hybrid"}, baseline="onnx-target",
           auto=True, description="edgespec ONNX backend, n-gram lookup else layer-skip self-draft, γ auto"),
    Config("onnx-head", "edgespec", {"model": "@onnx_model", "mode": "head"}, baseline="onnx-target",
           auto=True, description="edgespec ONNX backend, n-gram lookup else the trained draft head, γ auto"),
    Config("onnx-tree", "edgespec", {"model": "@onnx_model", "mode": "tree"}, baseline="onnx-target",
           auto=True, description="edgespec ONNX backend, mode tree, γ auto"),
]}
DEFAULT_CONFIGS = ("default", "target", "ngram-auto", "ngram-g4", "lcpp-plain", "lcpp-pld", "hf-plain", "hf-pld",
                   "ortg-plain", "ortg-ngram", "onnx-target", "onnx-ngram", "onnx-layerskip", "onnx-hybrid")

# bench --chat: edgespec as `edgespec generate` loads it (the measured default) and each peer in its best own
# configuration for a conversation (onnxruntime-genai keeps one generator and appends each turn's tokens).
DEFAULT_CHAT_CONFIGS = ("default", "lcpp-cache", "ortg-plain")
CHAT_RUNNERS = ("edgespec", "llama-cpp-python", "onnxruntime-genai")  # runners with ``chat_turn``
# bench --constrained: edgespec as `edgespec generate` loads it, the same model alone, and llama-cpp-python with the
# schema as its own GBNF grammar (edgespec's llama.cpp target alone comes along as lcpp-plain's baseline).
DEFAULT_CONSTRAINED_CONFIGS = ("default", "default-target", "lcpp-plain")
CONSTRAINED_RUNNERS = ("edgespec", "llama-cpp-python")  # runners with ``generate_constrained``


def select(names: list[str], run_options: dict[str, object], chat: bool = False,
           constrained: bool = False) -> tuple[list[Config], dict[str, str]]:
    """The configurations to run (baselines and references added first, except for a conversation, which
    compares each turn with a fresh run of the same decoder instead), and those skipped with the reason.
    ``constrained``: the questions carry JSON schemas, which only some runners can hold their output to."""
    unknown = [n for n in names if n.partition("@")[0] not in CONFIGS]
    if unknown:
        raise BenchError(f"unknown configurations {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    unconstrained = [n for n in names if constrained and CONFIGS[n.partition("@")[0]].runner not in
                     CONSTRAINED_RUNNERS]
    if unconstrained:
        raise BenchError(f"{', '.join(unconstrained)} cannot hold output to a JSON schema (questions with a "
                         f"'schema' run {', '.join(CONSTRAINED_RUNNERS)} configurations)")
    no_chat = [n for n in names if chat and CONFIGS[n.partition("@")[0]].runner not in CHAT_RUNNERS]
    if no_chat:
        raise BenchError(f"{', '.join(no_chat)} cannot play a conversation (bench --chat runs "
                         f"{', '.join(CHAT_RUNNERS)} configurations)")
    configs = {**CONFIGS, **{name: at_revision(name) for name in names}}
    chosen: list[str] = []
    skipped: dict[str, str] = {}

    def add(name: str) -> bool:
        if name in chosen:
            return True
        config = configs[name]
        missing = [n for n in config.needs() if not run_options.get(n)]
        if missing:
            skipped[name] = f"needs --{missing[0].replace('_', '-')}"
            return False
        for dep in () if chat else dict.fromkeys((config.baseline, config.lossless_reference)):
            if dep != name and not add(dep):
                skipped[name] = f"its baseline/reference {dep} is skipped ({skipped[dep]})"
                return False
        chosen.append(name)
        return True

    for name in names:
        add(name)
    if not chosen:
        raise BenchError(f"no configuration can run: {'; '.join(f'{k} {v}' for k, v in skipped.items())}")
    return [configs[n] for n in chosen], skipped


def at_revision(name: str) -> Config:
    """The configuration ``name``: one of ``CONFIGS``, or ``NAME@REV``, NAME as git revision REV's edgespec runs it
    (its baselines stay this checkout's)."""
    base, at, rev = name.partition("@")
    config = CONFIGS[base]
    if not at:
        return config
    if config.runner != "edgespec":
        raise BenchError(f"{name}: only edgespec's configurations run at a revision ({base} runs {config.runner})")
    try:
        commit = commit_of(rev)
    except ValueError as e:
        raise BenchError(f"{name}: {e}") from None
    return replace(config, name=name, revision=commit, description=f"{config.description}, at {rev} ({commit[:10]})")
