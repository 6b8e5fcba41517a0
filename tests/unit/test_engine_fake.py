"""The engine on the scripted fake backend (tests/fake_backend.py): the loop, the γ controller, arena rollback,
the drafters and the sampling rule in milliseconds, including cases real models rarely hit."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec.controller.cost import MAX_GAMMA
from edgespec.controller.gamma import GammaController
from edgespec.drafters import Draft, proposal
from edgespec.engine.engine import Completion, Engine
from edgespec.engine.sampling import SamplingParams
from edgespec.errors import ContextOverflowError, InvalidParameterError
from edgespec.tuning.store import StoredCurve
from tests.fake_backend import BOS, EOS, FakeClock, FakeModel, Logits, bigram, encode, scripted

TEXT = "the cat sat on the mat. " * 6
SEQUENCE = [BOS, *encode(TEXT)]
PROMPT = SEQUENCE[:30]  # the rest of SEQUENCE, then EOS, is what the target alone generates


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Virtual time: the engine and the γ controller read it, the fake models' passes advance it."""
    c = FakeClock()
    monkeypatch.setattr(time, "perf_counter", c)
    return c


def target_only(model: FakeModel, prompt: Sequence[int], **kwargs: object) -> Completion:
    return Engine(model, mode="none", gamma=0).generate(prompt, **kwargs)


def wrong(sequence: Sequence[int]) -> Logits:
    """A draft that never agrees with ``scripted(sequence)``."""
    right = scripted(sequence)
    return lambda context: np.roll(right(context), 1)


@pytest.mark.parametrize("gamma", [*range(MAX_GAMMA + 1), "auto"])
def test_ngram_greedy_equals_target_only_for_every_gamma(clock: FakeClock, gamma: int | str) -> None:
    out = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock), gamma=gamma).generate(PROMPT, max_tokens=500)
    assert out.tokens == SEQUENCE[len(PROMPT):] and out.finish_reason == "stop"
    assert out.text == TEXT[len(PROMPT) - 1:]
    if gamma != 0:
        assert out.stats.accepted > 0  # the repeated sentence was drafted and kept


def test_plain_decoding_times_no_cost_curve(clock: FakeClock) -> None:
    """γ auto with nothing to draft (mode none) has nothing to choose: the first request pays no calibration."""
    model = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock)
    out = Engine(model, mode="none", gamma="auto").generate(PROMPT, max_tokens=10)
    assert out.tokens == SEQUENCE[len(PROMPT):len(PROMPT) + 10]
    assert model.passes == [len(PROMPT)] + [1] * 9  # the prompt, then one token a pass: no timed batches


def test_all_drafts_rejected(clock: FakeClock) -> None:
    target = FakeModel(scripted(SEQUENCE), clock=clock)
    engine = Engine(target, FakeModel(wrong(SEQUENCE), clock=clock), mode="draft", gamma=4)
    out = engine.generate(PROMPT, max_tokens=40)
    assert out.tokens == target_only(target, PROMPT, max_tokens=40).tokens
    assert out.stats.drafted > 100 and out.stats.accepted == 0 and out.stats.steps == 39  # one token per pass


@pytest.mark.parametrize("gamma", [0, 3, MAX_GAMMA, "auto"])
def test_context_exactly_full(clock: FakeClock, gamma: int | str) -> None:
    """γ auto included: its first step calibrates the passes, after less text where the context is small."""
    n_ctx = 64
    engine = Engine(FakeModel(scripted(SEQUENCE), n_ctx=n_ctx, clock=clock), gamma=gamma)
    assert engine.n_ctx == n_ctx
    out = engine.generate(PROMPT, max_tokens=500)
    assert out.finish_reason == "length" and out.tokens == SEQUENCE[len(PROMPT):n_ctx]
    last = engine.generate(SEQUENCE[:n_ctx - 1], max_tokens=500)  # room for one token
    assert last.tokens == [SEQUENCE[n_ctx - 1]] and last.finish_reason == "length"
    with pytest.raises(ContextOverflowError, match="context holds 64"):
        engine.generate(SEQUENCE[:n_ctx], max_tokens=5)


def test_gamma_auto_in_a_context_smaller_than_its_calibration(clock: FakeClock, tmp_path: Path) -> None:
    """A context with no room for the calibration's text and its longest pass (a first use with a small n_ctx) still
    generates, exactly, up to the end of the context; its cut calibration is not kept for the processes after it
    (they would price the long passes it could not time at the short ones'), and the next engine with room keeps its
    own."""
    n_ctx = MAX_GAMMA // 2
    stored = StoredCurve(tmp_path / "curve.json")
    model = FakeModel(scripted(SEQUENCE), n_ctx=n_ctx, clock=clock)
    out = Engine(model, gamma="auto", stored_curve=stored).generate(PROMPT[:3], max_tokens=500)
    assert out.finish_reason == "length" and out.tokens == SEQUENCE[3:n_ctx]
    assert stored.read() is None
    roomy = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock), stored_curve=stored)
    roomy.generate(PROMPT, max_tokens=5)
    assert stored.read() is not None


def test_eos_inside_an_accepted_draft(clock: FakeClock) -> None:
    """After the prompt's "hello wor" the target's first token is "l"; the n-gram draft then copies "d</s> the end"
    from the prompt and the target agrees up to EOS: the engine stops at EOS, inside the accepted draft."""
    sequence = [BOS, *encode("hello world"), EOS, *encode(" the end. hello world")]
    prompt = sequence[:-2]
    engine = Engine(FakeModel(scripted(sequence), clock=clock), gamma=MAX_GAMMA)
    chunks = list(engine.stream(prompt, max_tokens=50))
    assert [t for c in chunks for t in c.tokens] == encode("ld") == sequence[-2:]
    last = chunks[-1]
    assert last.finish_reason == "stop" and last.tokens == encode("d") and last.drafted > 3
    assert last.stats is not None and last.stats.accepted == 2  # "d" and EOS, in the one verify step


def test_stop_none_is_no_stop_strings_and_a_bad_stop_is_a_clear_error(clock: FakeClock) -> None:
    """None is no stop strings (as the server reads a null); anything but strings is an InvalidParameterError."""
    model = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock)
    assert target_only(model, PROMPT, max_tokens=8, stop=None).tokens == target_only(model, PROMPT, max_tokens=8).tokens
    for bad in (3, [b"the"], ["the", None]):
        with pytest.raises(InvalidParameterError, match="stop"):
            target_only(model, PROMPT, max_tokens=8, stop=bad)


def test_stop_string_inside_accepted_draft_tokens(clock: FakeClock) -> None:
    sequence = [BOS, *encode("one two three. one two three. one two three.")]
    prompt = sequence[:19]  # "<s>one two three. one"
    model = FakeModel(scripted(sequence), clock=clock)
    chunks = list(Engine(model, gamma=MAX_GAMMA).stream(prompt, max_tokens=50, stop=["three"]))
    reference = target_only(model, prompt, max_tokens=50, stop=["three"])
    assert "".join(c.text for c in chunks) == reference.text == " two "
    assert [t for c in chunks for t in c.tokens] == reference.tokens
    assert chunks[-1].finish_reason == "stop" and chunks[-1].accepted > 0  # cut inside the accepted draft


def test_max_tokens_lands_anywhere_in_a_draft(clock: FakeClock) -> None:
    model = FakeModel(scripted(SEQUENCE), clock=clock)
    engine = Engine(model, gamma=MAX_GAMMA)
    for max_tokens in range(1, 40):
        out = engine.generate(PROMPT, max_tokens=max_tokens)
        assert out.tokens == SEQUENCE[len(PROMPT):len(PROMPT) + max_tokens] and out.finish_reason == "length"


@pytest.mark.parametrize("mode", ["layerskip", "hybrid"])
def test_self_draft_view_never_overwrites_committed_kv(clock: FakeClock, mode: str) -> None:
    """The fake target computes something else wherever it reads KV its view wrote: equal greedy output means
    the arena kept every committed position the target's own."""
    half_right = scripted(SEQUENCE[:60])  # agrees for the first 60 positions, then drafts EOS
    model = FakeModel(scripted(SEQUENCE), clock=clock, self_draft=half_right)
    out = Engine(model, mode=mode, gamma=3).generate(PROMPT, max_tokens=500)
    assert out.tokens == SEQUENCE[len(PROMPT):]
    assert out.stats.accepted > 0 and out.stats.accepted < out.stats.drafted
    assert all(e is not None and e.writer == "target" for e in model.kv[:len(SEQUENCE) - 1])


def test_the_fake_target_notices_kv_written_by_its_view() -> None:
    """The check the previous test rests on: a committed position written by the view changes the target."""
    model = FakeModel(scripted(SEQUENCE), self_draft=scripted(SEQUENCE))
    view = model.self_draft()
    assert view is not None
    model.decode(SEQUENCE[:3], 0, 1)
    view.adopt(1)
    view.decode([SEQUENCE[1]], 1, 1)  # the view rewrites a committed position (what the arena prevents)
    assert int(model.decode([SEQUENCE[3]], 3, 1)[0].argmax()) != SEQUENCE[4]


def test_controller_drafts_where_verifying_is_flat_and_not_where_it_is_linear(clock: FakeClock) -> None:
    """γ auto against a chosen verify-cost curve: with k tokens costing one pass it drafts and beats plain
    decoding in virtual time; with k tokens costing k passes drafting cannot pay, and it stays near plain."""
    def decode_seconds(pass_cost: Callable[[int], float], mode: str) -> float:
        engine = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, pass_cost=pass_cost), mode=mode)
        engine.generate(PROMPT, max_tokens=5)  # calibrates the cost curve (virtual time too)
        out = engine.generate(PROMPT, max_tokens=500)
        assert out.tokens == SEQUENCE[len(PROMPT):]
        return out.stats.decode_s

    flat = lambda n: 0.01  # noqa: E731
    assert decode_seconds(flat, "ngram") < 0.5 * decode_seconds(flat, "none")
    linear = lambda n: 0.01 * n  # noqa: E731
    assert decode_seconds(linear, "ngram") <= 1.05 * decode_seconds(linear, "none")


def test_a_calibrated_self_draft_that_cannot_pay_is_declined_from_the_start(clock: FakeClock) -> None:
    model = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, self_draft=scripted(SEQUENCE),
                      draft_cost_ratio=0.95, calibrated=(0.1, 0.95), pass_cost=lambda n: 0.01 * (1 + 0.2 * (n - 1)))
    out = Engine(model, mode="layerskip").generate(PROMPT, max_tokens=30)
    assert out.tokens == SEQUENCE[len(PROMPT):len(PROMPT) + 30] and out.stats.drafted == 0


def test_a_self_draft_is_readied_before_the_request_not_charged_as_draft_cost(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """One-time work of a self-draft (the ONNX backend reloads its layers split at the skip set, ~1.5 s) happens
    in ``prepare``, before the request's first token: charged to a draft pass, it made the controller take a
    layer-skip token for 112 target passes and never draft with it again."""
    model = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, self_draft=scripted(SEQUENCE),
                      pass_cost=lambda n: 0.01)
    view = model.self_draft()
    assert view is not None
    readied: list[float] = []

    def slow_prepare() -> None:
        readied.append(clock.now)
        clock.now += 1.5

    monkeypatch.setattr(view, "prepare", slow_prepare)
    engine = Engine(model, mode="layerskip", gamma="auto")
    assert engine.generate(PROMPT, max_tokens=30, mode="ngram").tokens == SEQUENCE[len(PROMPT):len(PROMPT) + 30]
    assert readied == []  # a request that does not self-draft readies nothing
    out = engine.generate(PROMPT, max_tokens=30)
    assert out.tokens == SEQUENCE[len(PROMPT):len(PROMPT) + 30] and len(readied) == 1
    assert out.stats.prefill_s >= 1.5 and out.stats.draft_s < 1.0  # in the time to first token
    assert out.stats.drafted > 0


def test_a_draft_model_prefills_its_cache_before_the_first_token_not_in_its_first_draft(clock: FakeClock) -> None:
    """The draft model's prompt prefill is paid once, in the time to first token: charged to its first draft pass
    it looked to the γ controller like a draft token costing as much as a prefill."""
    target = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, pass_cost=lambda n: 0.01 * n)
    draft = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, pass_cost=lambda n: 0.001 * n)
    out = Engine(target, draft, mode="draft", gamma=4).generate(PROMPT, max_tokens=30)
    assert out.tokens == SEQUENCE[len(PROMPT):len(PROMPT) + 30]
    # The prompt (but its last token) in one pass, then one token a pass: two after a fully accepted draft, whose
    # bonus token the draft cache lacks.
    assert draft.passes[0] == len(PROMPT) - 1 and max(draft.passes[1:]) <= 2
    assert out.stats.draft_s == pytest.approx(0.001 * sum(draft.passes[1:]))
    assert out.stats.prefill_s == pytest.approx(0.01 * len(PROMPT) + 0.001 * (len(PROMPT) - 1))


# -- sampling: the engine's output follows the target's distribution, whatever drafts ---------------------
SUPPORT = encode("abcdef")
RUNS = 3000


def _marginals(target: FakeModel, last: int, params: SamplingParams, n: int) -> list[np.ndarray]:
    """Exact P(i-th generated token), i < n, of the target alone (a bigram model: each depends on the last)."""
    d = np.zeros(target.n_vocab)
    d[last] = 1.0
    out = []
    for _ in range(n):
        d = sum(d[t] * params.probs(target.logits([t]))[0] for t in np.flatnonzero(d))
        out.append(d)
    return out


@pytest.mark.parametrize(("mode", "params"), [("draft", SamplingParams(1.0)), ("draft", SamplingParams(0.8, top_k=4)),
                                               ("ngram", SamplingParams(1.0)), ("tree", SamplingParams(1.0))])
def test_sampled_output_follows_the_target_distribution(mode: str, params: SamplingParams) -> None:
    target = FakeModel(bigram(1, SUPPORT))
    engine = Engine(target, FakeModel(bigram(2, SUPPORT)), mode=mode, gamma=3)
    # A prompt of repeats: the n-gram drafter copies from it, so it proposes on most steps too.
    prompt = [BOS, *encode("abcabcabcab")]
    seen: list[Counter[int]] = [Counter() for _ in range(4)]
    drafted = 0
    leaves: list[int] = []  # of each token tree verified (mode tree: the recycled table's branches beside lookup's)
    verify_tree = target.decode_tree

    def counting(tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        leaves.append(len(set(range(len(tokens))) - set(parents)))
        return verify_tree(tokens, parents, start)

    target.decode_tree = counting  # type: ignore[method-assign]
    for seed in range(RUNS):
        out = engine.generate(prompt, max_tokens=4, temperature=params.temperature, top_k=params.top_k, seed=seed)
        for i, token in enumerate(out.tokens):
            seen[i][token] += 1
        drafted += out.stats.drafted
    assert drafted > RUNS  # tokens 2 to 4 came through verification of drafts
    assert (max(leaves, default=0) > 1) == (mode == "tree")  # sampled mode tree verifies trees, not only chains
    for i, expected in enumerate(_marginals(target, prompt[-1], params, 4)):
        support = [t for t in SUPPORT if expected[t] > 0]
        assert set(seen[i]) <= set(support)
        _, p_value = chisquare([seen[i][t] for t in support], [RUNS * expected[t] for t in support])
        assert p_value > 1e-4, (i, dict(seen[i]), {t: RUNS * expected[t] for t in support})


class _GreedyHead:
    """A model drafter proposing its own bigram model's most likely next token (a draft head proposes greedily)."""

    name = "head"
    costs_per_token = True

    def __init__(self, model: FakeModel) -> None:
        self.model = model

    def begin(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        return Draft([int(self.model.logits([context[-1]])[0].argmax())] if max_tokens > 0 else [], key=2)


def test_sampled_output_follows_the_target_distribution_with_the_heads_second_opinion(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mode head with γ auto, sampled: which draft is verified (lookup's, the head's beside a weak or declined
    lookup draft, or lookup's under the head's agreement) depends on the controller, never on the step's own
    randomness, so the output follows the target's distribution."""
    # Room for the cost curve's calibration; verify rows free, so the controller verifies what has a chance.
    target = FakeModel(bigram(1, SUPPORT), n_ctx=1024, clock=clock, pass_cost=lambda n: 0.01)
    engine = Engine(target, mode="ngram", gamma="auto")
    engine.drafters["head"] = _GreedyHead(FakeModel(bigram(1, SUPPORT)))  # the target's own argmax
    engine.modes["head"] = (engine.drafters["ngram"], engine.drafters["head"])
    second_opinions = 0
    asked = proposal._second_opinion

    def counting(*args: object, **kwargs: object) -> Draft:
        nonlocal second_opinions
        second_opinions += 1
        return asked(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(proposal, "_second_opinion", counting)
    prompt = [BOS, *encode("abcadbecfa")]  # one-token matches: lookup's weakest drafts
    params = SamplingParams(1.0)
    seen: list[Counter[int]] = [Counter() for _ in range(4)]
    sources: Counter[str] = Counter()
    for seed in range(RUNS):
        out = engine.generate(prompt, max_tokens=4, temperature=params.temperature, seed=seed, mode="head")
        for i, token in enumerate(out.tokens):
            seen[i][token] += 1
        sources.update(out.stats.draft_steps)
    assert second_opinions > RUNS  # the second opinion was asked on most requests
    assert sources["head"] > 50 and sources["ngram"] > 50, sources  # and both drafters' drafts were verified, often
    for i, expected in enumerate(_marginals(target, prompt[-1], params, 4)):
        support = [t for t in SUPPORT if expected[t] > 0]
        assert set(seen[i]) <= set(support)
        _, p_value = chisquare([seen[i][t] for t in support], [RUNS * expected[t] for t in support])
        assert p_value > 1e-4, (i, dict(seen[i]), {t: RUNS * expected[t] for t in support})


def test_what_the_controller_learned_is_kept_for_the_next_process(clock: FakeClock, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """An untuned engine writes what its controller learned (acceptance, each verified k's cost) after each request
    beside its stored curve; the next engine on the same model starts from it instead of the prior and the
    calibration (a one-shot generate starts warm). Outputs
    never change: what is kept only chooses γ. A damaged file is ignored, said once, and rewritten."""
    stored = StoredCurve(tmp_path / "curve.json")
    first = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock), stored_curve=stored)
    out = first.generate(PROMPT, max_tokens=60)
    assert out.tokens == SEQUENCE[len(PROMPT):len(PROMPT) + 60] and stored.learned_path.is_file()
    learned = first._get_controller().learned()
    assert learned["pooled"] and learned["keyed"] and not GammaController(stored.read()).learned()["pooled"]
    second = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock), stored_curve=stored)
    assert second._get_controller().learned() == learned  # the first engine's state, not the prior
    assert any(learned["curve"]["seen"]) and np.array_equal(second._get_controller().curve.shape[1:],
                                                            first._get_controller().curve.shape[1:])
    assert second.generate(PROMPT, max_tokens=60).tokens == out.tokens
    stored.learned_path.write_text(json.dumps({"format": 1, "learned": {"pooled": {"ngram": [[1.0], [2.0]]}}}))
    third = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock), stored_curve=stored)
    with caplog.at_level("WARNING", logger="edgespec.engine"):
        assert third.generate(PROMPT, max_tokens=60).tokens == out.tokens
    assert "ignoring" in caplog.text and stored.read_learned() != {"pooled": {"ngram": [[1.0], [2.0]]}}


class _ScriptedHead:
    """A model drafter (a pass per token) proposing one token of ``sequence``, wrong where the context's length is
    a multiple of ``wrong_every``. ``doubts``: it says how sure it is, as the draft head does with its key (1 where
    wrong, 2 where right); else key 2 throughout."""

    name = "head"
    costs_per_token = True
    identity = "scripted"

    def __init__(self, clock: FakeClock, sequence: Sequence[int], wrong_every: int, doubts: bool) -> None:
        self.clock, self.sequence, self.wrong_every, self.doubts = clock, sequence, wrong_every, doubts
        self.proposed: Counter[int] = Counter()

    def begin(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        if max_tokens <= 0 or len(context) >= len(self.sequence):
            return Draft([])
        self.clock.now += 0.001  # one draft pass
        wrong = len(context) % self.wrong_every == 0
        key = 1 if wrong and self.doubts else 2
        right = self.sequence[len(context)]
        self.proposed[key] += 1
        return Draft([(right + 1) % 40 if wrong else right], key=key)


def test_a_drafters_own_confidence_keys_what_is_verified(clock: FakeClock) -> None:
    """A model drafter's draft is cut after drafting to what the acceptance learned for its key (the draft head's
    confidence range) makes worth a verify row: unsure drafts that are never right stop being verified (bar the
    controller's exploration), sure ones keep being verified; the output is the target's alone."""
    target = FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock, pass_cost=lambda n: 0.01 * (1 + 0.3 * (n - 1)))
    engine = Engine(target, mode="ngram")
    drafter = _ScriptedHead(clock, SEQUENCE, wrong_every=3, doubts=True)
    engine.modes["head"] = (drafter,)
    verified: Counter[int] = Counter()
    verify = engine._verify_chain

    def counting(draft: Draft, *args: object) -> tuple[np.ndarray, int, int]:
        if draft.tokens:
            verified[draft.key] += 1
        return verify(draft, *args)  # type: ignore[arg-type]

    engine._verify_chain = counting  # type: ignore[method-assign]
    out = engine.generate(PROMPT, max_tokens=500, mode="head")
    assert out.tokens == target_only(target, PROMPT, max_tokens=500).tokens
    assert drafter.proposed[1] > 20 and drafter.proposed[2] > 20
    assert verified[1] <= 0.25 * drafter.proposed[1]
    assert verified[2] >= 0.75 * drafter.proposed[2]
    assert out.stats.draft_steps == {"head": sum(verified.values())}  # the steps that verified its drafts


# Text with little to copy: lookup's drafts mostly rest on a one-token match (a second opinion is asked). A head
# right at every second position agrees with lookup's right guesses there and argues with its wrong ones.
RANDOM = [BOS, *(int(t) for t in np.random.default_rng(7).integers(3, 15, 400))]


def test_lookup_and_a_model_drafter_that_agree_are_verified_together(clock: FakeClock, tmp_path: Path) -> None:
    """Mode head's rule (edgespec/drafters/proposal.py): where lookup drafts on a one-token match the model drafter
    is asked too; the drafts they agree on are verified under their own name, learned and kept with the drafter's
    identity, and the output is the target's alone."""
    target = FakeModel(scripted(RANDOM), n_ctx=1024, clock=clock, pass_cost=lambda n: 0.01 * (1 + 0.05 * (n - 1)))
    engine = Engine(target, mode="ngram", stored_curve=StoredCurve(tmp_path / "curve.json"))
    engine.drafters["head"] = _ScriptedHead(clock, RANDOM, wrong_every=2, doubts=False)
    engine.modes["head"] = (engine.drafters["ngram"], engine.drafters["head"])
    sources: Counter[str] = Counter()
    verify = engine._verify_chain

    def counting(draft: Draft, *args: object) -> tuple[np.ndarray, int, int]:
        sources[draft.source] += bool(draft.tokens)
        return verify(draft, *args)  # type: ignore[arg-type]

    engine._verify_chain = counting  # type: ignore[method-assign]
    prompt = RANDOM[:40]
    out = engine.generate(prompt, max_tokens=300, mode="head")
    assert out.tokens == target_only(target, prompt, max_tokens=300).tokens
    assert sources["ngram+head"] >= 5 and sources["head"] >= 5
    assert "ngram+head" in engine._get_controller().learned()["pooled"]  # type: ignore[operator]
    assert engine._identities() == {"head": "scripted", "ngram+head": "scripted"}


def test_what_was_learned_of_a_drafter_is_dropped_when_another_takes_its_name(clock: FakeClock, tmp_path: Path
                                                                               ) -> None:
    """The learned state is kept per model; a drafter that can be another one under the same name (a draft head
    exported again) is kept with its identity, and the next process forgets what it learned of a different one."""
    stored = StoredCurve(tmp_path / "curve.json")

    def engine_with(identity: str) -> Engine:
        engine = Engine(FakeModel(scripted(SEQUENCE), n_ctx=1024, clock=clock), stored_curve=stored)
        drafter = _ScriptedHead(clock, SEQUENCE, wrong_every=3, doubts=True)
        drafter.identity = identity  # type: ignore[attr-defined]
        engine.drafters["head"] = drafter
        engine.modes["head"] = (drafter,)
        return engine

    first = engine_with("one")
    first.generate(PROMPT, max_tokens=60, mode="ngram")
    first.generate(PROMPT, max_tokens=60, mode="head")
    learned = first._get_controller().learned()
    assert "head" in learned["pooled"] and stored.read_learned()["identities"] == {"head": "one"}  # type: ignore[index]
    assert engine_with("one")._get_controller().learned() == learned
    other = engine_with("two")._get_controller().learned()
    assert "head" not in other["pooled"] and not any(name == "head" for name, *_ in other["keyed"])  # type: ignore
    assert other["pooled"]["ngram"] == learned["pooled"]["ngram"]  # type: ignore[index]


def test_a_users_text_goes_through_the_chat_template_where_the_model_has_one() -> None:
    """What the races and the quality report feed a model: a model without a template (a base model) gets the text as
    it is, not an error."""
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    plain = Engine(FakeModel(scripted([BOS])), gamma=1)
    chat = Engine(FakeModel(scripted([BOS]), chat_template=template), gamma=1)
    assert plain.user_prompt("hi") == plain.tokenize("hi")
    assert chat.user_prompt("hi") == chat.chat_tokens([{"role": "user", "content": "hi"}]) != plain.tokenize("hi")
