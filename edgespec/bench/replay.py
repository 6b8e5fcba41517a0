"""Replay: the γ controller and the n-gram drafter played over recorded greedy outputs, timed by a fixed cost curve.

Greedy output does not depend on drafting (edgespec is lossless), so the target-only token stream of a prompt is
what every speculative run of it commits. Recorded once with the real model (``record``), it decides every draft
offline: a draft token is accepted iff it equals the recorded next token. Time is counted, not measured: a step
that verifies k draft tokens costs ``shape[k + 1]`` target passes, plus a per-step overhead. So a controller can be
judged on a verify-cost curve of any machine (the AMD, Intel and ONNX curves measured on the machines
edgespec was developed on, or a flat one), deterministically, on a busy machine, in seconds.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..controller.cost import MAX_GAMMA, CostCurve, physical
from ..controller.gamma import GammaController
from ..drafters import Drafter, OutputStore, RecycledDrafter, SuffixDrafter
from ..drafters.base import ROOT, Draft, DraftKey, depths
from ..drafters.ngram import NgramDrafter
from ..drafters.proposal import propose
from ..drafters.recycled import top_successors
from ..drafters.tree import TreeDrafter
from ..engine.arena import MAX_TREE_LEAVES, common_prefix
from ..engine.sampling import SamplingParams
from ..engine.verify import accepted_tree_path
from .questions import BenchError

if TYPE_CHECKING:
    from ..engine.engine import Engine

# Verify cost of k tokens in one pass relative to one token, as measured (k: relative cost); linear in between
# and past the last point. ``flat`` stands for a GPU, where a few more rows are nearly free.
CURVES: dict[str, dict[int, float]] = {
    "amd-q4_1": {1: 1.0, 2: 1.75, 3: 2.29, 5: 2.95, 9: 4.84},
    "amd-q8_0": {1: 1.0, 2: 1.99, 3: 2.18, 5: 3.28, 9: 5.09},
    "intel-q4_0": {1: 1.0, 2: 1.34, 3: 1.61, 4: 1.91, 5: 2.20, 7: 2.85, 9: 3.32},
    "amd-onnx-int8": {1: 1.0, 2: 1.07, 3: 1.47, 4: 1.70, 5: 2.05, 7: 2.53, 9: 3.34},
    "onnx-int8": {1: 1.0, 2: 1.22, 3: 1.35, 4: 1.47, 5: 1.59, 7: 1.85, 9: 2.07},
    "flat": {1: 1.0, 2: 1.02, 17: 1.3},
    # AMD EPYC with AVX-512 and VNNI, edgespec's ops in tiles of 8 rows: the calibration (fastest of two) that a
    # Spec-Bench run of the default recorded there (docs/history/)
    "avx512-onnx-int8": {1: 1.0, 2: 1.18, 3: 1.19, 4: 1.24, 5: 1.36, 6: 1.50, 7: 1.80, 8: 2.05, 9: 2.57},
    # The same machine with the 16-column products: the start-up calibration (~100 tokens of context) and the curve
    # the decode loop paid at Spec-Bench's contexts (k = 2 from 1431 passes, k ≥ 3 from 3-7 each), both from
    # benchmarks/reference/decode_loop_curve-epyc-avx512-2core-16col.json
    "avx512-16col-calibration": {1: 1.0, 2: 1.07, 3: 1.19, 4: 1.19, 5: 1.19, 6: 1.19, 7: 1.25},
    "avx512-16col-loop": {1: 1.0, 2: 1.28, 3: 1.31, 4: 1.34, 5: 1.40, 6: 1.44, 7: 1.54},
    # The same machine after the prefetching products (a second row nearly free): the curve the decode loop paid,
    # benchmarks/reference/decode_loop_curve-epyc-avx512-2core-prefetch.json
    "avx512-prefetch-loop": {1: 1.0, 2: 1.05, 3: 1.15, 4: 1.22, 5: 1.22, 6: 1.34, 7: 1.40},
    # A start-up calibration of that build, flat at 2 rows, whose excess is a fifth to a half of the loop's (the
    # form the γ controller once fitted one factor to: docs/controller.md); replay it with --calibration,
    # benchmarks/reference/decode_loop_curve-epyc-avx512-2core-controller-belief.json
    "avx512-prefetch-calibration": {1: 1.0, 2: 1.0, 3: 1.05, 4: 1.15, 5: 1.21, 6: 1.24, 7: 1.28},
    # The same machine in its faster state (a one-token pass 3.3-3.6 ms instead of 4.6-4.7: docs/controller.md),
    # where rows cost most: the start-up calibration (~100 tokens of context) of a run of the README's smaller set
    # (docs/history/)
    "avx512-fast-state": {1: 1.0, 2: 1.17, 3: 1.28, 4: 1.28, 5: 1.37, 6: 1.47, 7: 1.54, 8: 1.76, 9: 1.89},
}
_SCALE = 0.01  # seconds per single-token pass: any value; only ratios are reported
GUESS_KEY = 1000  # LookupThenGuess's drafts: the γ controller tracks their acceptance apart from lookup's match lengths


def curve_shape(points: dict[int, float]) -> np.ndarray:
    """The shape array ``CostCurve`` takes (index k: cost(k) / cost(1), index 0 unused) from measured points, made
    physical as the controller makes its own (a point that dips below the one before is pooled with it, none above
    k single passes), then joined linearly and extended past the last point by the last slope: a measured tail that
    dipped would otherwise extend downward and make long drafts look nearly free."""
    ks = sorted(points)
    if ks[0] != 1 or len(ks) < 2:
        raise BenchError(f"a cost curve needs k = 1 and at least one more point, got {points}")
    values = physical([points[k] for k in ks], [1.0] * len(ks), ks)
    x = np.arange(1, MAX_GAMMA + 2)
    shape = np.interp(x, ks, values)
    slope = (values[-1] - values[-2]) / (ks[-1] - ks[-2])
    beyond = x > ks[-1]
    shape[beyond] = np.minimum(values[-1] + slope * (x[beyond] - ks[-1]), x[beyond])
    return np.concatenate(([np.nan], shape))


def measured_curves(path: str | Path) -> dict[str, dict[int, float]]:
    """The verify-cost curves a benchmark measured, as ``CURVES`` entries: from ``benchmarks/verify_curve_sizes.py``,
    each model's at each context, named MODEL@CONTEXT (the GGUF's file name without .gguf), real model sizes' costs,
    and with ``--compare`` each backend's on one file, BACKEND@FILE;
    from ``benchmarks/decode_loop_curve.py``, the curve its decode loop paid (each k's points pooled with its
    neighbours' by their passes where they dip) and its start-up calibration, named loop@FILE and calibration@FILE
    (the result's file name without .json): one machine's costs, to replay real outputs on; from ``edgespec bench``
    (a Spec-Bench result), the curve it timed for each model file (its passes' fastest times at the start and end of
    the run), named after the first configuration on that file, CONFIG@FILE: another machine's costs, from its JSON."""
    path = Path(path)
    try:
        result = json.loads(path.read_text())
        if "workers" in result and "summary" in result:
            return _bench_curves(result, path.stem)
        if result.get("mode") == "compare":  # verify_curve_sizes.py --compare: each backend's passes on one file
            return {f"{name}@{path.stem}": {int(k): float(row["relative"]) for k, row in info["verify"].items()}
                    for name, info in result["backends"].items()}
        if "loop_curve" in result:
            loop = sorted((int(k), float(row["relative"]), float(row["passes"]))
                          for k, row in result["loop_curve"].items())
            pooled = physical([cost for _, cost, _ in loop], [passes for _, _, passes in loop], [k for k, _, _ in loop])
            return {f"loop@{path.stem}": {k: cost for (k, _, _), cost in zip(loop, pooled, strict=True)},
                    f"calibration@{path.stem}": {int(k): float(v) for k, v in result["calibrated_curve"].items()}}
        return {f"{Path(m['path']).stem}@{context}": {int(k): float(row["relative"]) for k, row in curve.items()}
                for m in result["models"] for context, curve in m["curves"].items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise BenchError(f"{path} is not a verify_curve_sizes, decode_loop_curve or bench result "
                         f"({type(e).__name__}: {e})") from e


def _bench_curves(result: dict, stem: str) -> dict[str, dict[int, float]]:
    curves: dict[str, dict[int, float]] = {}
    files: set[str] = set()
    for name, info in result["workers"].items():
        curve, model = info.get("verify_curve"), str(info.get("model_file"))
        if curve and model not in files:  # every configuration on a model file has that file's curve
            files.add(model)
            curves[f"{name}@{stem}"] = {int(k): float(v) / float(curve["1"]) for k, v in curve.items()}
    if not curves:
        raise ValueError("none of its configurations timed a verify curve (edgespec configurations do)")
    return curves


@dataclass(frozen=True)
class Stream:
    """One generation: the prompt's tokens and the target's greedy continuation."""

    question_id: int | str
    category: str
    turn: int
    prompt: list[int]
    output: list[int]
    # Row j: the target's top-k tokens after output[j], and their probabilities (``annotate``); None: not recorded.
    successors: list[list[int]] | None = None
    successor_probs: list[list[float]] | None = None
    # Row j: the draft head's proposal after output[j] (``annotate_head``): its guesses (as many as it makes when
    # allowed MAX_GAMMA), the proposal's key, and whether its chain ended on doubt (one more pass paid, its guess
    # dropped) rather than at MAX_GAMMA. None: not recorded.
    head_tokens: list[list[int]] | None = None
    head_keys: list[int] | None = None
    head_doubted: list[bool] | None = None


def load_streams(path: str | Path) -> list[Stream]:
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"no recorded streams at {path}: record them first (edgespec replay --record)")
    try:
        return [Stream(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    except (ValueError, TypeError) as e:
        raise BenchError(f"{path}: not a file of recorded streams ({e})") from None


def record(model: str, questions: list[dict], max_tokens: int, path: str | Path, threads: int | None = None,
           log: Callable[[str], None] = print) -> None:
    """Target-only greedy outputs, one JSON line per turn, multi-turn questions played as conversations (as the
    bench does). Appends to ``path``, skipping questions already in it, so an interrupted recording resumes."""
    import edgespec

    path = Path(path)
    done = {s.question_id for s in load_streams(path)} if path.is_file() else set()
    engine = edgespec.load(model, mode="none", gamma=0, n_threads=threads, tuning=False)
    try:
        with path.open("a") as f:
            for i, q in enumerate(questions):
                if q["question_id"] in done:
                    continue
                messages: list[dict[str, str]] = []
                lines = []
                for turn, user in enumerate(q["turns"]):
                    messages.append({"role": "user", "content": user})
                    prompt = engine.chat_tokens(messages)
                    result = engine.generate(prompt, max_tokens=max_tokens)
                    messages.append({"role": "assistant", "content": result.text})
                    lines.append(json.dumps(asdict(Stream(q["question_id"], q["category"], turn, prompt,
                                                          result.tokens))) + "\n")
                f.writelines(lines)  # a question's turns together: an interrupted one is recorded again whole
                f.flush()
                log(f"  recorded {i + 1}/{len(questions)} ({q['category']})")
    finally:
        engine.close()


def _recorded_text(engine: Engine, streams: list[Stream], model: str, path: str | Path, what: str,
                   log: Callable[[str], None]) -> Iterator[tuple[Stream, np.ndarray]]:
    """Each stream's prompt + output in one target pass (with exact numerics, the rows and features one-token
    decoding gives): the stream and its output's rows, valid until the next. After the last, a recording that is not
    this model's greedy output is an error: another model (Q4_0 against Q4_1 agree on ~84% of top-1 tokens) would
    describe other rows than the recording saw; an older build of the same model differs on near-ties only (an
    older recording: 97.5%)."""
    agree = total = 0
    for i, stream in enumerate(streams):
        engine.arena.reset([*stream.prompt, *stream.output], reuse=False)
        rows = engine.arena.extend("target", [], len(stream.output))
        agree += int((rows[:-1].argmax(axis=1) == stream.output[1:]).sum())
        total += len(stream.output) - 1
        yield stream, rows
        log(f"  {what} {i + 1}/{len(streams)}")
    if agree < 0.95 * total:
        raise BenchError(f"{path}: {model}'s argmax equals the recorded next token at {agree} of {total} positions: "
                         "not this model's greedy output")
    log(f"  {model}'s argmax equals the recorded next token at {agree} of {total} positions")


def annotate(model: str, path: str | Path, k: int = 4, threads: int | None = None,
             log: Callable[[str], None] = print) -> None:
    """Add to recorded streams what the target's verify passes would show the recycled table: its top-k tokens
    after every output token. Rewrites ``path``; the recorded output must be the model's own greedy one."""
    import edgespec

    engine = edgespec.load(model, mode="none", gamma=0, n_threads=threads, tuning=False)
    annotated = []
    try:
        for stream, rows in _recorded_text(engine, load_streams(path), model, path, "annotated", log):
            top, probs = top_successors(rows, k)
            annotated.append(replace(stream, successors=top.tolist(), successor_probs=np.round(probs, 5).tolist()))
    finally:
        engine.close()
    Path(path).write_text("".join(json.dumps(asdict(s)) + "\n" for s in annotated))


def annotate_head(model: str, path: str | Path, threads: int | None = None,
                  log: Callable[[str], None] = print) -> None:
    """Add to recorded streams what the draft head would propose after every output token: the model's head (an
    ONNX export with one beside it) run as mode head runs it, over the target's features of the recorded text, so a
    replay can play mode head without timing it. Rewrites ``path``; the recorded output must be the model's own
    greedy one."""
    import edgespec

    engine = edgespec.load(model, mode="head", n_threads=threads, tuning=False)  # a clear error without a head
    head, annotated = engine.drafters["head"], []
    params, rng = SamplingParams(), np.random.default_rng(0)
    try:
        for stream, _ in _recorded_text(engine, load_streams(path), model, path, "head guesses", log):
            head.begin(stream.prompt)  # the pass kept every position's features: the head reads them as it goes
            drafts = [head.propose([*stream.prompt, *stream.output[:j + 1]], MAX_GAMMA, params, rng)
                      for j in range(len(stream.output))]
            annotated.append(replace(stream, head_tokens=[d.tokens for d in drafts], head_keys=[d.key for d in drafts],
                                     head_doubted=[d.passes is not None for d in drafts]))
    finally:
        engine.close()
    Path(path).write_text("".join(json.dumps(asdict(s)) + "\n" for s in annotated))


class RecordedHead:
    """The draft head as ``annotate_head`` recorded it: at each position the proposal the live head makes, cut where
    the live one would stop for the γ it is given. Counts the head passes it stands for (``take_passes``): the
    engine pays them whether the draft is then verified, cut or dropped."""

    name = "head"
    costs_per_token = True

    def __init__(self, streams: Iterable[Stream]) -> None:
        self.streams = {tuple(s.prompt): s for s in streams}
        self.prompt_length = 0
        self.guesses: list[list[int]] = []
        self.keys: list[int] = []
        self.doubted: list[bool] = []
        self.passes = 0

    def begin(self, context: Sequence[int]) -> None:
        stream = self.streams[tuple(context)]
        if stream.head_tokens is None or stream.head_keys is None or stream.head_doubted is None:
            raise BenchError(f"question {stream.question_id}: no head guesses recorded (replay --annotate-head)")
        self.prompt_length = len(stream.prompt)
        self.guesses, self.keys, self.doubted = stream.head_tokens, stream.head_keys, stream.head_doubted

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        at = len(context) - self.prompt_length - 1
        guesses = self.guesses[at]
        if max_tokens <= 0 or not guesses:
            return Draft([])
        # HeadDrafter.propose: a pass per guess; a chain that ended on doubt before max_tokens paid one more.
        doubted = self.doubted[at] and len(guesses) < max_tokens
        tokens = guesses[:max_tokens]
        self.passes += len(tokens) + doubted
        return Draft(tokens, passes=len(tokens) + 1 if doubted else None, key=self.keys[at])

    def take_passes(self) -> int:
        """Head passes spent since the last call."""
        passes, self.passes = self.passes, 0
        return passes


@dataclass
class Tally:
    """What a replay of some streams cost, in single-token target passes."""

    tokens: int = 0  # tokens after the first (the first comes with the prefill, in either run)
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    passes: float = 0.0  # time of the speculative run
    plain_passes: float = 0.0  # time of target-only decoding

    def add(self, other: Tally) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def summary(self) -> dict[str, float]:
        return {"speedup": round(self.plain_passes / self.passes, 4) if self.passes else 1.0,
                "tau": round(self.tokens / self.steps, 3) if self.steps else 0.0,
                "gamma_mean": round(self.drafted / self.steps, 3) if self.steps else 0.0,
                "alpha": round(self.accepted / self.drafted, 3) if self.drafted else 0.0,
                "depth_mean": round(self.accepted / self.steps, 3) if self.steps else 0.0,
                "generations": 0}


class Played(NamedTuple):
    """One replayed step: draft rows verified, how many accepted, the name and key the controller learns the draft
    under (None: nothing to learn, or judged already), its extra passes (``Draft.passes``), and what drafting cost
    beyond ``draft_overhead``, in single-token target passes."""

    drafted: int
    accepted: int
    name: str | None = None
    key: DraftKey = 0
    passes: int | None = None
    cost: float = 0.0


# One replayed step: (committed context, room, the recorded tokens ahead) → what it played.
Step = Callable[[list[int], int, Sequence[int]], Played]


def _replay_stream(stream: Stream, begin: Callable[[Stream], None], step: Step, controller: GammaController,
                   shape: np.ndarray, overhead: float, draft_overhead: float, noise: Callable[[], float]) -> Tally:
    """Mirrors Engine._run's loop: each step drafts from the committed text, keeps what matches the recorded output
    plus the target's own token, and the controller learns from the time the curve gives the pass. ``overhead``
    is paid by every step, plain decoding's too; ``draft_overhead`` (the drafter's own work) by speculation's."""
    begin(stream)
    controller.begin()
    out = stream.output
    context = [*stream.prompt, *out[:1]]
    tally = Tally(tokens=max(len(out) - 1, 0))
    tally.plain_passes = tally.tokens * (1 + overhead)
    pos = 1
    while pos < len(out):
        room = min(len(out) - pos - 1, MAX_GAMMA)
        played = step(context, room, out[pos:pos + room])
        k, accepted = played.drafted, played.accepted
        committed = out[pos:pos + accepted + 1]
        seconds = float(shape[k + 1]) * _SCALE * noise()  # what the controller sees; the tally counts the curve
        drafting = draft_overhead + played.cost
        controller.observe_overhead(overhead * _SCALE)
        controller.observe(played.name, played.key, k, accepted, drafting * _SCALE, seconds, played.passes,
                           committed=committed)
        tally.steps += 1
        tally.drafted += k
        tally.accepted += accepted
        tally.passes += shape[k + 1] + overhead + drafting
        context.extend(committed)
        pos += len(committed)
    return tally


def chain_step(drafters: Sequence[Drafter], controller: GammaController, head: RecordedHead | None = None,
               head_cost: float = 0.0) -> Step:
    """Engine._speculate's step: the engine's own rule (``proposal.propose``) picks and cuts the draft, its prefix
    that matches the recorded output is kept; the recorded head's passes cost ``head_cost`` each."""
    params, rng = SamplingParams(), np.random.default_rng(0)

    def step(context: list[int], room: int, truth: Sequence[int]) -> Played:
        draft = propose(drafters, context, "auto", controller, room, params, rng)
        cost = head.take_passes() * head_cost if head is not None else 0.0
        return Played(len(draft), common_prefix(draft.tokens, truth), draft.source or None, draft.key, draft.passes,
                      cost)

    return step


def tree_replay(drafter: TreeDrafter, controller: GammaController,
                max_leaves: int) -> tuple[Callable[[Stream], None], Step]:
    """Engine._speculate_tree's step: the tree the drafter shapes for the curve, verified against the recorded
    output. The recycled table learns from the rows of the committed tokens where the streams carry them
    (``annotate``), as the engine's does, and stays empty where they do not."""
    params, rng = SamplingParams(), np.random.default_rng(0)
    current: list[Stream] = []

    def begin(stream: Stream) -> None:
        current[:] = [stream]
        drafter.begin(stream.prompt)

    def step(context: list[int], room: int, truth: Sequence[int]) -> Played:
        tree, origins = drafter.propose_tree(context, room, controller, max_leaves, params, rng)
        path = accepted_path(tree, truth)
        drafter.learn(tree, origins, path)
        stream = current[0]
        if stream.successors is not None and stream.successor_probs is not None:
            rows = slice(len(context) - len(stream.prompt) - 1, len(context) - len(stream.prompt) + len(path))
            drafter.recycled.learn(stream.output[rows], np.array(stream.successors[rows]),
                                   np.array(stream.successor_probs[rows]))
        return Played(len(tree), len(path))  # the lookup spine is judged on the committed tokens

    return begin, step


def accepted_path(tree: Draft, truth: Sequence[int]) -> list[int]:
    """The nodes greedy tree verification keeps when the target's tokens are ``truth``: verify_tree_greedy's rule,
    each node's row replaced by the recorded token at its depth."""
    parents = tree.parent_list()
    depth = depths(parents)
    return accepted_tree_path(tree.tokens, parents,
                              lambda node: truth[d] if (d := 0 if node == ROOT else depth[node]) < len(truth) else None)


class _KnowsTheOutput(NgramDrafter):
    """A what-if drafter (benchmarks/draft_ceiling.py): n-gram lookup that can read the recorded output ahead."""

    def __init__(self, streams: Iterable[Stream]) -> None:
        super().__init__()
        self.outputs = {tuple(s.prompt): s.output for s in streams}
        self.prompt_length = 0
        self.output: list[int] = []

    def begin(self, context: Sequence[int]) -> None:
        super().begin(context)
        self.prompt_length, self.output = len(context), self.outputs[tuple(context)]

    def truth(self, context: Sequence[int], n: int) -> list[int]:
        """The next ``n`` tokens the target commits after ``context``."""
        at = len(context) - self.prompt_length
        return self.output[at:at + n]


class LookupThenGuess(_KnowsTheOutput):
    """Lookup's draft where it has one, else up to ``chain`` tokens of the recorded output, each kept with
    probability ``p`` (independently; a wrong one is the id −1, so the chain is accepted up to its first wrong
    token), at no cost: a second drafter of a given accuracy for the text lookup cannot copy."""

    def __init__(self, streams: Iterable[Stream], p: float, chain: int = 8, seed: int = 0) -> None:
        super().__init__(streams)
        self.p, self.chain = p, chain
        self.rng = np.random.default_rng(seed)

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        draft = super().propose(context, max_tokens, params, rng)
        if draft.tokens or max_tokens <= 0:
            return draft
        truth = self.truth(context, min(max_tokens, self.chain))
        return Draft([t if self.rng.random() < self.p else -1 for t in truth], key=GUESS_KEY)


class LookupCutWhereWrong(_KnowsTheOutput):
    """Lookup's draft cut at its first wrong token: what the γ controller would make of lookup if it knew how much
    of each draft is right (it then only weighs the verify curve); the gap to lookup's own replay is what better
    acceptance estimates could still win."""

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        draft = super().propose(context, max_tokens, params, rng)
        return Draft(draft.tokens[:common_prefix(draft.tokens, self.truth(context, len(draft)))], key=draft.key)


TREE_DRAFTERS = {"ngram": 0, "tree": MAX_TREE_LEAVES, "tree-chain": 1}  # --drafter: max leaves (0: lookup alone)
# A head pass, in single-token target passes, as the engine pays it (catching up, its pass, its softmax, the
# embeddings): the γ controller's own measure on the AVX-512 EPYC, 0.11-0.17 (docs/draft-head.md); the pass alone
# is 0.064.
HEAD_COST = 0.12


def simulate(streams: Iterable[Stream], shape: np.ndarray, overhead: float = 0.0, noise: float = 0.0,
             controller: Callable[[CostCurve], GammaController] = GammaController,
             drafter: Callable[[], NgramDrafter] = NgramDrafter,
             tree_leaves: int = 0, draft_overhead: float = 0.0,
             calibration: np.ndarray | None = None,
             head_cost: float | None = None) -> dict[str, dict[str, float | None]]:
    """Per category and overall: speed-up over target-only, τ, mean γ, α, mean accepted depth, and for trees
    (``tree_leaves``) the mean tree size, nodes per pass (None for lookup chains). One controller and one drafter
    play every stream in order, as one engine serves a bench run's requests; ``overhead`` is per step, in
    single-token passes, for speculation and plain decoding alike; ``draft_overhead`` per speculative step only
    (drafting and the drafters' upkeep: the bench's draft_s per step over its one-row pass; docs/tree-drafting.md
    gives what was measured). ``noise``: the
    controller sees each pass's time scaled by exp(noise · N(0, 1)) (a busy machine; seeded). ``drafter``: a free
    drafter proposing as n-gram lookup does (``LookupThenGuess``).
    ``tree_leaves`` > 0: mode tree instead, trees of up to that many leaves (1: chains). ``calibration``: the
    curve the controller starts from (default: ``shape``, the one the passes cost), as the engine starts from its
    start-up calibration and learns what the loop pays. ``head_cost``: mode head instead (lookup, else the draft
    head ``annotate_head`` recorded), each head pass costing that many single-token passes."""
    rng = np.random.default_rng(0)
    ctl = controller(CostCurve((shape if calibration is None else calibration).copy(), _SCALE))
    proposer = drafter()
    streams = list(streams)
    # Drafting time is charged by --draft-overhead, not read from this process's clock (which would make the replay
    # depend on the machine): every branch drafter is consulted on every step.
    tree = TreeDrafter(proposer, SuffixDrafter(OutputStore()),
                       RecycledDrafter(1 + max((t for s in streams for t in (*s.prompt, *s.output)), default=1)),
                       clock=lambda: 0.0)
    tallies: dict[str, Tally] = defaultdict(Tally)
    counts: dict[str, int] = defaultdict(int)

    def seen() -> float:  # the factor on a pass's time that the controller sees
        return float(np.exp(noise * rng.standard_normal()))

    head = RecordedHead(streams) if head_cost is not None else None
    chain: tuple[Drafter, ...] = (proposer,) if head is None else (proposer, head)

    def begin_chain(stream: Stream) -> None:
        for drafter in chain:
            drafter.begin(stream.prompt)

    begin, step = (tree_replay(tree, ctl, tree_leaves) if tree_leaves else
                   (begin_chain, chain_step(chain, ctl, head, head_cost or 0.0)))
    for stream in streams:
        tally = _replay_stream(stream, begin, step, ctl, shape, overhead, draft_overhead, seen)
        for name in (stream.category, "overall"):
            tallies[name].add(tally)
            counts[name] += 1
    results = {name: {**t.summary(), "generations": counts[name]} for name, t in tallies.items()}
    for summary in results.values():  # a tree's size per pass is its γ; lookup's chains have none
        summary["tree_size_mean"] = summary["gamma_mean"] if tree_leaves else None
    return results


def table(results: dict[str, dict[str, dict[str, float | None]]]) -> str:
    """Speed-up per category (rows) and curve (columns), then the worst category per curve, then per curve overall
    τ, the draft size per pass (a tree's nodes, or γ) and the accepted depth."""
    curves = list(results)
    categories = sorted({c for r in results.values() for c in r} - {"overall"}) + ["overall"]
    pad = [" " * max(0, len(c) + 2 - 18) for c in curves]  # measured curves' names (MODEL@CONTEXT) run longer
    lines = [f"{'category':<16}" + "".join(f"{c:>{18 + len(p)}}" for c, p in zip(curves, pad, strict=True))]
    for cat in categories:
        cells = [results[c].get(cat) for c in curves]
        lines.append(f"{cat:<16}" + "".join(p + (f"{s['speedup']:>8.3f}× γ{s['gamma_mean']:>5.2f}   " if s
                                                  else f"{'':>18}") for s, p in zip(cells, pad, strict=True)))
    worst = [min((s["speedup"], cat) for cat, s in results[c].items()) for c in curves]
    lines.append(f"{'worst':<16}" + "".join(f"{p}{w[0]:>8.3f}× {w[1][:8]:<8}" for w, p in zip(worst, pad, strict=True)))
    for c in curves:
        s = results[c]["overall"]
        size = (f"tree size {s['tree_size_mean']:.2f} nodes" if s.get("tree_size_mean") is not None
                else f"γ {s['gamma_mean']:.2f}")
        lines.append(f"{c}: τ {s['tau']:.3f} · {size} a pass · accepted depth {s['depth_mean']:.3f}")
    return "\n".join(lines)
