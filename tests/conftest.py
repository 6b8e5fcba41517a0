"""Shared fixtures: real models from the PyPI packages, loaded once per session."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import edgespec
from edgespec.engine.engine import Engine
from tests.live import LiveServer

# A developer's `edgespec tune` must not change what the tests check (mode, γ); tests/model/test_tune.py turns it on.
os.environ["EDGESPEC_TUNING"] = "off"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test`: one worker per CPU), each worker gets CPUs of its own, so that every engine,
    server and export it starts sizes its threads to them (edgespec.cpu.physical_cores reads the affinity):
    llama.cpp's and onnxruntime's threads spin while they wait, and two workers' threads sharing cores slow both."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if count <= len(cpus):
            os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) % count::count])


def cpu_has(flag: str) -> bool:
    """Whether this machine's x86 CPU has a feature flag (``avx512_vnni``): a build for it can run beside the native
    one."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:  # not Linux: the flags are not read here
        return False


@contextlib.contextmanager
def building() -> Iterator[None]:
    """Workers share the edgespec cache: one builds a shared artefact (an export) while the others wait for it,
    then find it built."""
    from edgespec.home import home_dir

    lock = home_dir(".tests-building.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def hf_checkpoint(model: str) -> Path:
    """A shipped model as an HF checkpoint (converted once from its GGUF into the edgespec cache)."""
    from edgespec.export.gguf.hf import hf_folder

    with building():
        return hf_folder(model)


# The first three questions of nine of Spec-Bench's categories, in its file order (hemingkx/Spec-Bench's
# question.jsonl, Apache-2.0): the tests' prompts, the same ones the whole file would give them.
SPEC_BENCH = Path(__file__).resolve().parent / "spec_bench.jsonl"
SpecBench = Callable[..., list[dict]]


@pytest.fixture(scope="session")
def spec_bench() -> SpecBench:
    """``spec_bench(categories, per_category=1)``: the first questions of each category, in file order (fixed,
    not tuned)."""
    questions = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]

    def choose(categories: list[str], per_category: int = 1) -> list[dict]:
        chosen = []
        for category in categories:
            chosen += [q for q in questions if q["category"] == category][:per_category]
        return chosen

    return choose


@pytest.fixture(scope="session")
def questions(spec_bench: SpecBench) -> list[dict]:
    """The first question of nine Spec-Bench categories: the lossless checks' prompts."""
    return spec_bench(["writing", "roleplay", "reasoning", "coding", "translation", "summarization", "qa",
                       "math_reasoning", "rag"])


def onnx_export_dir(model: str = "smollm2-135m", quant: str = "fp32", **options: object) -> Path:
    """An ONNX export of a shipped model, written into the edgespec cache by the real exporter (again when the
    graph writer's revision changed)."""
    from edgespec.export.onnx.export import export_onnx
    from edgespec.export.onnx.graphs import GRAPHS_REVISION

    from edgespec.home import home_dir

    suffix = "".join(f"-{k}{v}" for k, v in sorted(options.items()))
    out = home_dir("onnx") / f"{model}-{quant}{suffix}"
    manifest = out / "edgespec-onnx.json"
    with building():
        if not manifest.is_file() or json.loads(manifest.read_text())["source"].get("graphs") != GRAPHS_REVISION:
            export_onnx(model, out, quant=quant, progress=False, **options)  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="session")
def onnx_engine() -> Iterator[Engine]:
    """SmolLM2-135M exported to ONNX (FP32) on one thread: layer-skip, hybrid and n-gram drafting."""
    e = edgespec.load(onnx_export_dir(), n_ctx=2048, n_threads=1)
    yield e
    e.close()


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    """The default model (SmolLM2-135M as shipped, Q4_1) with n-gram lookup."""
    e = edgespec.load(n_ctx=4096)
    yield e
    e.close()


@pytest.fixture(scope="session")
def pair_engine() -> Iterator[Engine]:
    """Two-model speculation: SmolLM2 Q8_0 verifies, SmolLM2 Q4_0 drafts."""
    e = edgespec.load("smollm2-135m:q8_0", draft="smollm2-135m:q4_0", n_ctx=4096)
    yield e
    e.close()


# -- live servers and bridges: real subprocesses on 127.0.0.1 -------------------------------------------
@pytest.fixture(scope="session")
def solo_engine() -> Iterator[Engine]:
    """The default model on one thread, as the live servers run it (tests/live.py says why): the reference
    outputs that served ones must equal."""
    e = edgespec.load(n_ctx=4096, n_threads=1)
    yield e
    e.close()


@pytest.fixture(scope="session")
def server() -> Iterator[LiveServer]:
    """`edgespec serve` on the default model, as a user would start it (γ auto, n-gram lookup)."""
    with LiveServer.start() as s:
        yield s
