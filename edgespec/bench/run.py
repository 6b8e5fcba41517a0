"""The benchmark run: every configuration in its own worker, questions interleaved, outputs cross-checked."""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import random
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..engine.engine import Engine
from .configs import Config, select
from .questions import load_questions
from .report import lookup_hits
from .worker import Setup, Worker

SCHEMA = "edgespec-bench/1"
_PACKAGES = ("edgespec", "llama-cpp-python", "numpy", "gguf", "torch", "transformers", "onnxruntime",
             "onnxruntime-genai", "matplotlib")


@dataclass(frozen=True)
class RunArgs:
    """What ``bench`` and ``bench --chat`` share."""

    questions: str
    categories: list[str] | None = None
    max_tokens: int = 256
    configs: tuple[str, ...] = ()
    model: str = "smollm2-135m"
    threads: int | None = None
    ctx: int = 4096
    seed: int = 0
    ort_genai_model: str | None = None
    onnx_model: str | None = None
    device: str = "cpu"
    fast_numerics: bool = False  # edgespec's llama.cpp configurations on the fast numerics (F16 KV, flash attention)

    @property
    def run_options(self) -> dict[str, object]:
        """The values configurations name as ``@option``."""
        return {"ort_genai_model": self.ort_genai_model, "onnx_model": self.onnx_model}


@dataclass(frozen=True)
class BenchArgs(RunArgs):
    per_category: int | None = 3
    limit: int | None = None


def machine() -> dict[str, object]:
    from ..cpu import physical_cores

    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor()
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "physical_cores": physical_cores(), "gpu": _gpu_names(), "platform": platform.platform(),
            "python": platform.python_version(), "versions": versions}


def _gpu_names() -> list[str]:
    """The NVIDIA GPUs nvidia-smi lists (none where it is missing): results taken on a GPU name it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    done = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True,
                          text=True, check=False)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def run(args: BenchArgs, log: Callable[[str], None] = print) -> dict:
    """Play the questions through every configuration; the raw records plus what the workers reported."""
    started = datetime.now(timezone.utc)
    questions = load_questions(args.questions, args.categories, args.per_category, args.limit)
    configs, skipped = select(list(args.configs), args.run_options,
                              constrained=any("schema" in q for q in questions))
    for name, why in skipped.items():
        log(f"skipping {name}: {why}")
    chat, setup = open_setup(args)
    workers: dict[str, Worker] = {}
    try:
        start_workers(configs, args, setup, workers, log)
        at_start = _measure_curves(workers)
        records = _play(questions, configs, workers, chat, args, log)
        _fastest_curves(workers, [at_start, _measure_curves(workers)])
    finally:
        for w in workers.values():
            w.close()
        chat.close()
    return {"schema": SCHEMA, "date": started.isoformat(), "duration_s": (datetime.now(timezone.utc) -
                                                                            started).total_seconds(),
            "machine": machine(), "args": asdict(args), "setup": {**asdict(setup), "eog": list(setup.eog)},
            "configs": [asdict(c) for c in configs], "skipped": skipped,
            "workers": {name: w.info for name, w in workers.items()}, "records": records}


def open_setup(args: RunArgs) -> tuple[Engine, Setup]:
    """The one tokenizer and chat template every configuration's prompts come from, and what they share."""
    import edgespec

    from ..catalog.models import resolve
    from ..cpu import physical_cores

    model_path = resolve(args.model)
    chat = edgespec.load(model_path, mode="none", gamma=0, n_ctx=64, n_threads=1, tuning=False)
    eog = tuple(t for t in range(chat.target.n_vocab) if chat.target.is_eog(t))
    return chat, Setup(str(model_path), args.threads or physical_cores(), args.ctx, eog, args.seed, args.device,
                       args.fast_numerics)


def start_workers(configs: list[Config], args: RunArgs, setup: Setup, workers: dict[str, Worker],
                  log: Callable[[str], None]) -> None:
    """Into ``workers`` (the caller closes them, also those started before a failure), one at a time: each
    engine times its verify passes as it starts (its γ controller's cost curve); timed beside 12 other loading
    workers on 2 cores, that curve was garbage (k = 2 at 2.2× k = 1, k = 14 at 83×) and the controller
    concluded that no draft could ever pay. Each waits idle for requests once loaded."""
    for c in configs:
        log(f"starting {c.name} ({c.description})")
        workers[c.name] = Worker(c, c.resolved_options(args.run_options), setup)
        workers[c.name].wait_ready()


def _play(questions: list[dict], configs: list[Config], workers: dict[str, Worker], chat: Engine,
          args: BenchArgs, log: Callable[[str], None]) -> list[dict]:
    """Question by question, turn by turn, every configuration in a seeded order that changes per question
    (so none always runs right after another); each plays multi-turn questions as its own conversation."""
    rng = random.Random(args.seed)
    records: list[dict] = []
    history: dict[str, dict] = {c.name: {} for c in configs}
    for qi, q in enumerate(questions):
        order = list(configs)
        rng.shuffle(order)
        t0 = time.perf_counter()
        for turn, user in enumerate(q["turns"]):
            outputs: dict[str, dict] = {}
            for c in order:
                messages = history[c.name].setdefault(q["question_id"], [])
                messages.append({"role": "user", "content": user})
                tokens = chat.chat_tokens(messages)
                result = workers[c.name].generate(tokens, args.max_tokens, q.get("schema"))
                reply = chat.target.detokenize(result["tokens"])
                messages.append({"role": "assistant", "content": reply})
                outputs[c.name] = {"config": c.name, "question_id": q["question_id"], "category": q["category"],
                                   "turn": turn, "prompt_tokens": len(tokens),
                                   "lookup_hits": lookup_hits(tokens, result["tokens"]),
                                   "schema_valid": schema_valid(reply, q["schema"]) if "schema" in q else None,
                                   **result}
            for c in configs:
                r = outputs[c.name]
                r["same_as_baseline"] = r["tokens"] == outputs[c.baseline]["tokens"]
                reference = c.lossless_reference
                r["lossless"] = None if reference == c.name else r["tokens"] == outputs[reference]["tokens"]
                records.append(r)
        log(f"  question {qi + 1}/{len(questions)} ({q['category']}, {len(q['turns'])} turns) "
            f"{time.perf_counter() - t0:.1f} s")
    return records


def schema_valid(text: str, schema: dict) -> bool:
    """Whether a reply is JSON that validates against ``schema`` (jsonschema's own check, not the grammar's): a reply
    cut by max_tokens is not."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _measure_curves(workers: dict[str, Worker]) -> dict[str, dict[str, float]]:
    """The verify-cost curve of each model file, timed once (model file → curve): the bound is the model's on
    this machine, whichever configuration runs it, so the first worker on a file whose engine exposes its passes
    times it. Done at the start and at the end of a run: the machine's load drifts in between."""
    curves: dict[str, dict[str, float]] = {}
    for worker in workers.values():
        model = str(worker.info.get("model_file"))
        if model not in curves and (curve := worker.verify_curve()):
            curves[model] = curve
    return curves


def _fastest_curves(workers: dict[str, Worker], measured: list[dict[str, dict[str, float]]]) -> None:
    """Each configuration's bound takes, for each k, the fastest pass seen on its model file."""
    for worker in workers.values():
        model = str(worker.info.get("model_file"))
        samples = [curves[model] for curves in measured if model in curves]
        worker.info["verify_curve_samples"] = samples
        worker.info["verify_curve"] = {k: min(c[k] for c in samples) for k in samples[0]} if samples else None
