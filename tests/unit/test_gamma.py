"""The γ controller's decisions from costs and acceptance (pure arithmetic: no model needed)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from edgespec.controller.cost import MAX_GAMMA, CostCurve
from edgespec.controller.gamma import GammaController
from edgespec.drafters.base import DraftKey

# A CPU-like verify curve: cost(k tokens) / cost(1) = 1 + 0.35 (k − 1), as llama.cpp's on this machine.
STEEP = np.concatenate(([np.nan], 1 + 0.35 * np.arange(MAX_GAMMA + 1)))
SCALE = 0.01


def _controller(shape: np.ndarray = STEEP) -> GammaController:
    return GammaController(CostCurve(shape.copy(), SCALE))


def _learn(controller: GammaController, accepted_share: float, drafted: int = 4, steps: int = 40) -> None:
    for i in range(steps):
        accepted = drafted if (i * accepted_share) % 1 + accepted_share >= 1 else 0
        controller.observe("ngram", 5, drafted, accepted, 0.0, SCALE * STEEP[drafted + 1])


def test_drafts_that_are_always_accepted_are_verified_long() -> None:
    controller = _controller()
    _learn(controller, 1.0, drafted=12)
    assert controller.choose("ngram", 5, 16, draft_cost_sunk=True) >= 8


def test_drafts_that_are_rarely_accepted_are_declined() -> None:
    controller = _controller()
    _learn(controller, 0.1)
    assert controller.choose("ngram", 5, 16, draft_cost_sunk=True) == 0


def test_a_draft_that_costs_a_target_pass_per_token_is_declined() -> None:
    """Draft tokens accepted 80% of the time but each as dear as a target pass cannot pay on this curve."""
    controller = GammaController(CostCurve(STEEP.copy(), SCALE), {"layerskip": [0.8]}, {"layerskip": SCALE})
    assert controller.choose("layerskip", 0, 8, draft_cost_sunk=False) == 0
    cheap = GammaController(CostCurve(STEEP.copy(), SCALE), {"layerskip": [0.8]}, {"layerskip": SCALE / 20})
    assert cheap.choose("layerskip", 0, 8, draft_cost_sunk=False) >= 1


def test_the_cost_curve_never_dips() -> None:
    """A noisy timing (a long verify that happened to run fast on a busy machine) must not make long drafts
    look cheaper than short ones."""
    curve = CostCurve(STEEP.copy(), SCALE)
    for _ in range(50):
        curve.observe(9, SCALE * 1.1)  # 9 tokens "as cheap as" one
    assert np.all(np.diff(curve.shape[1:]) >= 0)
    measured = CostCurve.measure(lambda k: None, rounds=1)  # timings of nothing: noise only
    assert np.all(np.diff(measured.shape[1:]) >= 0)


def test_the_cost_curve_never_says_a_batch_costs_more_than_its_tokens_one_by_one() -> None:
    """Timings taken while the machine stalled (k = 14 at 83× one token, measured) must not convince the
    controller that no draft could ever pay: k tokens in one pass are worth at most k single passes."""
    stalls = iter([1.0, 2.2, 40.0, 83.0] * 100)
    curve = CostCurve.measure(lambda k: time.sleep(1e-4 * next(stalls)) if k > 1 else time.sleep(1e-4), rounds=1)
    assert np.all(curve.shape[1:] <= np.arange(1, len(curve.shape)) + 1e-9)
    for _ in range(50):
        curve.observe(3, curve.scale * 50)
    assert curve.shape[3] <= 3


def test_a_draft_that_could_not_pay_even_if_always_right_is_never_explored() -> None:
    """Exploration (one token every 32 declined steps) is for drafts that might pay; a draft costing a whole
    target pass per token on a verify curve this steep cannot, at any acceptance."""
    dear = GammaController(CostCurve(STEEP.copy(), SCALE), {"layerskip": [0.3]}, {"layerskip": SCALE})
    assert all(dear.choose("layerskip", 0, 8, draft_cost_sunk=False) == 0 for _ in range(100))
    cheap = GammaController(CostCurve(STEEP.copy(), SCALE), {"layerskip": [0.05]}, {"layerskip": SCALE / 20})
    assert sum(cheap.choose("layerskip", 0, 8, draft_cost_sunk=False) for _ in range(100)) >= 3  # explored


def test_a_draft_that_cannot_pay_stays_declined_as_the_context_grows() -> None:
    """A longer context makes the target's passes dearer, and a self-draft's passes with them: a draft costing
    0.97 of a target pass on a flat verify curve (2 tokens at 1.2× one, as onnxruntime's) cannot pay at any
    context length, so the controller must not start drafting once the verify scale has doubled."""
    flat = np.concatenate(([np.nan], 1 + 0.2 * np.arange(MAX_GAMMA + 1)))
    controller = GammaController(CostCurve(flat.copy(), SCALE), {"layerskip": [0.86]}, {"layerskip": 0.97 * SCALE})
    assert controller.choose("layerskip", 0, 8, draft_cost_sunk=False) == 0
    for _ in range(100):  # plain steps at twice the cost: the context grew
        controller.observe(None, 0, 0, 0, 0.0, 2 * SCALE)
    assert all(controller.choose("layerskip", 0, 8, draft_cost_sunk=False) == 0 for _ in range(100))


def test_declined_keys_fade_back_to_drafting_but_a_bad_one_stays_rare() -> None:
    """Drafts that are never made when declined (no tokens reach the controller, as a model drafter's): rejections
    seen once must not switch a key off for good, so each declined step weighs them less, until the key drafts
    again. A key that keeps being rejected still drafts rarely. (Lookup drafts are judged when declined: below.)"""
    recovered = _controller()
    _learn(recovered, 0.1)
    assert sum(recovered.choose("ngram", 5, 16, draft_cost_sunk=True) > 0 for _ in range(200)) > 100
    bad = _controller()
    _learn(bad, 0.1)
    drafts = 0
    for _ in range(400):
        k = bad.choose("ngram", 5, 16, draft_cost_sunk=True)
        if k:
            drafts += 1
            bad.observe("ngram", 5, k, 0, 0.0, SCALE * STEEP[k + 1])
        else:
            bad.observe(None, 0, 0, 0, 0.0, SCALE)
    assert 400 / 32 <= drafts <= 400 * 0.15


# -- free drafts (lookup): every draft is judged by what the target commits next, verified or not -------------

def _curve(slope: float) -> CostCurve:
    """cost(k tokens) / cost(1) = 1 + slope (k − 1): slope 1.0 is a verify of 2 tokens at 2.0× one."""
    return CostCurve(np.concatenate(([np.nan], 1 + slope * np.arange(MAX_GAMMA + 1))), SCALE)


def _step(controller: GammaController, right: int, draft: tuple[int, ...] = (11, 12, 13, 14),
          key: DraftKey = 3) -> int:
    """One engine step with a free 4-token draft of which the first ``right`` tokens are what the target says
    next: the controller cuts it to k, the target keeps the matching prefix and adds its own token."""
    k = controller.choose("ngram", key, len(draft), True, draft)
    truth = [*draft[:right], 999, *draft[right + 1:]]
    accepted = min(k, right)
    verify_s = controller.curve.seconds(k + 1)
    controller.observe("ngram" if k else None, key, k, accepted, 0.0, verify_s, committed=truth[:accepted + 1])
    return k


def _mediocre(i: int) -> int:
    """A scripted draft quality: the first token right 3 times in 5, and then often the next ones too."""
    return (4, 1, 0, 2, 0)[i % 5]


def test_a_steep_verify_curve_declines_mediocre_drafts_that_a_flat_one_verifies() -> None:
    steep, flat = GammaController(_curve(1.0)), GammaController(_curve(0.05))
    steep_k = [_step(steep, _mediocre(i)) for i in range(200)]
    flat_k = [_step(flat, _mediocre(i)) for i in range(200)]
    assert sum(steep_k[50:]) == 0  # γ = 0: never worth a verify at 2× a plain pass
    assert min(flat_k[50:]) >= 1  # nearly free to verify: always worth trying


def test_declined_drafts_still_teach_so_drafting_stops_after_misses_and_resumes_when_drafts_match() -> None:
    """A copied passage, a stretch where lookup guesses wrong, and a copied passage again: the declined drafts of
    the middle stretch are judged by the target's tokens, so the controller sees the copying resume at once."""
    controller = GammaController(_curve(0.35))
    copying = [_step(controller, 4) for _ in range(30)]
    missing = [_step(controller, 0) for _ in range(60)]
    resumed = [_step(controller, 4) for _ in range(10)]
    assert min(copying[5:]) >= 3
    assert sum(missing[10:]) == 0  # no exploration needed: each declined draft was judged anyway
    assert min(resumed[3:]) >= 3


def test_a_new_key_leans_on_what_its_coarser_key_learned() -> None:
    """A tuple key is read coarse to fine: lookup's (match length, evidence). A key not seen yet starts from what its
    match length taught, not from the drafter's pooled rates, so one new kind of evidence on a long match is not
    judged by the one-token matches' misses; and what it learns is its own."""
    controller = GammaController(_curve(0.35))
    for _ in range(20):  # each twice in a row, so that each is learned on a streak and off one
        for _ in range(2):
            _step(controller, 4, key=(4, 2))  # long matches the text agreed with: right
        for _ in range(2):
            _step(controller, 0, key=(1, 2))  # one-token matches: wrong
    long_new, short_new = controller.acceptance("ngram", (4, 3), 2), controller.acceptance("ngram", (1, 3), 2)
    pooled = controller.acceptance("ngram", 7, 2)  # a plain key never seen: the pooled rates
    assert long_new[0] > pooled[0] > short_new[0]
    assert _step(controller, 4, key=(4, 3)) >= 2 and _step(controller, 4, key=(1, 3)) == 0
    for _ in range(40):
        _step(controller, 0, key=(4, 3))  # the new evidence proves wrong on long matches
    assert controller.acceptance("ngram", (4, 3), 1)[0] < 0.2 < controller.acceptance("ngram", (4, 2), 1)[0]
    restored = GammaController(_curve(0.35))
    restored.start_from(json.loads(json.dumps(controller.learned())))  # tuple keys survive the file (as lists)
    assert restored.learned() == controller.learned()


def test_the_rate_to_beat_is_never_below_plain_decoding() -> None:
    """λ is the rate achieved lately, floored at plain decoding's: drafts that lost must not lower the bar the
    next draft has to clear."""
    controller = GammaController(_curve(1.0))
    for _ in range(20):  # long drafts that all failed: achieved rate well below plain decoding
        controller.observe("ngram", 3, 8, 0, 0.0, controller.curve.seconds(9))
    assert controller.rate() == pytest.approx(1 / controller.curve.seconds(1))


def test_a_curve_calibrated_too_flat_learns_its_steepness_at_every_k() -> None:
    """Calibrated at 1 + 0.1 (k − 1) while verifying really costs 1 + 0.5 (k − 1) (a longer context than the
    calibration's, or a calibration timed on a busy machine): verifies at k = 3 alone correct the whole curve, so
    the k not yet used stop looking cheap."""
    curve = _curve(0.1)
    for _ in range(60):
        curve.observe(1, SCALE)
        curve.observe(3, SCALE * 2.0)
    assert curve.scale == pytest.approx(SCALE, rel=0.05)
    assert curve.shape[3] == pytest.approx(2.0, rel=0.05)
    assert curve.shape[9] == pytest.approx(5.0, rel=0.1)  # calibrated: 1.8


def test_a_curve_that_went_flat_turns_steep_again_while_every_step_drafts() -> None:
    """Verify times of one k alone cannot tell a dearer pass from a steeper curve: had the scale followed them
    too, a curve learned flat (a long context, where onnxruntime's padded single-token pass costs nearly what a
    batch does) would explain every later, steeper verify by a higher scale, and stay flat. The scale follows
    single-token passes only, so verifies at k = 9 correct the steepness."""
    curve = _curve(1.0)
    for _ in range(100):  # flat: a batch of 9 at 1.4× one token
        curve.observe(9, SCALE * 1.4)
    assert curve.shape[9] == pytest.approx(1.4, rel=0.05)
    for _ in range(100):  # steep again (a short context), and no plain step in between
        curve.observe(9, SCALE * 9.0)
    assert curve.shape[9] == pytest.approx(9.0, rel=0.05) and curve.scale == SCALE


def test_drafting_stops_when_verifying_turns_dear_after_a_flat_stretch() -> None:
    """The controller's own choices must not hide the change: after a stretch where verifying was nearly free
    (so it drafted every step), mediocre drafts on a steep curve are declined again, and the steep stretch runs
    within 3% of plain decoding, where no draft can pay (k tokens cost k passes): what the margin below a free
    draft's mean acceptance (half a deviation, gamma._LOWER_Z) still lets through after a right draft."""
    controller = GammaController(_curve(0.05))
    truth = {"flat": _curve(0.05), "steep": _curve(1.0)}

    def step(i: int, phase: str) -> tuple[int, int, float]:
        right = _mediocre(i)
        draft = (11, 12, 13, 14)
        k = controller.choose("ngram", 3, len(draft), True, draft)
        accepted = min(k, right)
        seconds = truth[phase].seconds(k + 1)
        controller.observe("ngram" if k else None, 3, k, accepted, 0.0, seconds,
                           committed=[*draft[:right], 999][:accepted + 1])
        return k, accepted + 1, seconds

    flat = [step(i, "flat") for i in range(200)]
    steep = [step(i, "steep") for i in range(200)]
    assert min(k for k, _, _ in flat[50:]) >= 1
    assert sum(1 for k, _, _ in steep[20:] if k) <= 18  # an occasional token after a copied streak, no more
    tokens, seconds = (sum(column) for column in list(zip(*steep[20:], strict=True))[1:])
    assert tokens / seconds >= 0.97 / SCALE  # plain decoding: 1 / SCALE


def test_each_verified_k_is_believed_at_what_it_costs_though_the_calibration_has_another_form() -> None:
    """The start-up calibration on the AVX-512 EPYC is flat at two rows (1.00-1.01) and its excess over one row is a
    fifth of what the decode loop pays at 3-7 rows (docs/controller.md). One steepness factor fitted to every verify
    (divided by a calibrated excess of a few thousandths at two rows) ran away there, to 9-520 in five runs, and
    believed 3+ rows up to k×; lookup then drafted too short or not at all (1.01×-1.41× its target where the same
    runs' per-k curve made 1.42×-1.49×). Each k verified is believed at what it costs, through noisy timings and
    stalls, and the curve stays physical."""
    truth = {2: 1.18, 3: 1.35, 4: 1.50, 5: 1.56, 7: 1.86}
    calibrated = np.concatenate(([np.nan, 1.0, 1.004, 1.05, 1.10, 1.12, 1.17, 1.17], 1.24 + 0.05 * np.arange(10)))
    curve = CostCurve(calibrated, SCALE)
    rng = np.random.default_rng(0)
    ks = rng.choice([1, 2, 3, 4, 5, 7], size=3000, p=[0.32, 0.5, 0.06, 0.01, 0.06, 0.05])
    errors: dict[int, list[float]] = {k: [] for k in truth}
    for i, k in enumerate(ks):
        stall = 2.0 if rng.random() < 0.03 else 1.0  # a pass preempted on a shared machine
        curve.observe(int(k), SCALE * truth.get(int(k), 1.0) * stall * float(np.exp(0.08 * rng.standard_normal())))
        if i >= 500:
            for j, cost in truth.items():
                errors[j].append(abs(np.log(curve.shape[j] / cost)))
    # (One factor: 0.6-1.1 on average at k = 3-7, i.e. believed 1.9-3.1× what they cost.)
    assert all(np.mean(e) < 0.08 and np.percentile(e, 95) < 0.2 for e in errors.values()), {
        k: (np.mean(e), np.percentile(e, 95)) for k, e in errors.items()}
    assert np.all(np.diff(curve.shape[1:]) >= 0) and np.all(curve.shape[1:] <= np.arange(1, len(curve.shape)))


def test_a_stalled_verify_of_a_k_no_longer_used_is_forgotten() -> None:
    """A calibration flat at two rows (its verifies cannot tell the steepness), one three-row verify stalled at 3× a
    pass, then only one- and two-row steps, as when every draft is cut to one token: the k not verified since
    return to the calibration's form (they were priced at 2-4× a pass for good, carried from process to process,
    and lookup's long drafts, right 80% of the time, were cut to one token), and such a draft is verified long
    again."""
    calibrated = np.concatenate(([np.nan, 1.0, 1.0, 1.07, 1.15, 1.18, 1.24, 1.31], 1.34 + 0.05 * np.arange(10)))
    controller = GammaController(CostCurve(calibrated, SCALE))
    controller.curve.observe(3, SCALE * 3.0)
    assert controller.curve.shape[5] > 2.0  # believed for now: the one verify of a dear k there is
    for _ in range(150):
        controller.curve.observe(1, SCALE)
        controller.curve.observe(2, SCALE * 1.03)
    assert controller.curve.shape[5] < 1.4 and controller.curve.steepness < 2.0
    for i in range(30):  # lookup's drafts (free: judged whether verified or not) right whole 4 times in 5
        _step(controller, 0 if i % 5 == 4 else 4)
    assert controller.choose("ngram", 3, 4, True, (11, 12, 13, 14)) >= 3


def test_what_the_curve_learned_carries_to_a_new_controller_and_a_damaged_record_is_refused() -> None:
    first = GammaController(_curve(0.05))
    for _ in range(20):
        first.curve.observe(1, SCALE)
        first.curve.observe(4, SCALE * 2.5)
    second = GammaController(_curve(0.05))
    second.start_from(first.learned())
    assert second.curve.shape[4] == pytest.approx(first.curve.shape[4]) and second.curve.shape[4] > 2.3
    for damaged in ({"cost": [1.0] * 3, "seen": [1.0] * 3}, {"cost": [float("nan")] * (MAX_GAMMA + 1),
                                                              "seen": [1.0] * (MAX_GAMMA + 1)}, {"cost": "x"}):
        with pytest.raises(ValueError):
            second.start_from({**first.learned(), "curve": damaged})
    assert second.curve.shape[4] == pytest.approx(first.curve.shape[4])  # nothing taken from a refused record


def test_a_draft_cost_learned_too_high_fades_until_the_drafter_is_tried_again() -> None:
    """A model drafter (the draft head: no calibrated cost) carried in from an earlier process at 1.25 target passes a
    token, as the default's learned state once had it: then even a draft accepted whole cannot pay, nothing is
    explored, and it was never timed again. Declined, its cost fades until it is tried; its real cost (0.1 of a pass)
    is then learned back, and one stalled proposal after that moves it by a tenth at most."""
    stuck = {"pooled": {}, "keyed": [], "draft_ratio": {"head": 1.25}}
    controller = GammaController(_curve(0.1))
    controller.start_from(stuck)
    declined = 0
    while controller.choose("head", 0, 4, draft_cost_sunk=False) == 0:
        declined += 1
        assert declined < 200, "the head is never tried again"
    assert declined > 10  # what was learned is not dropped at once
    for _ in range(30):  # its proposals, timed at what they cost
        controller.observe("head", 0, 1, 1, 0.1 * SCALE, SCALE * 1.1)
    assert controller.learned()["draft_ratio"]["head"] < 0.15
    controller.observe("head", 0, 1, 0, 50 * SCALE, SCALE * 1.1)  # a proposal that stalled for 50 passes
    assert controller.learned()["draft_ratio"]["head"] < 0.17
    assert controller.choose("head", 0, 4, draft_cost_sunk=False) > 0
    # A draft already made and timed, cut to nothing because its verify row is dear: its cost is not what decided,
    # and stays as measured.
    steep = GammaController(_curve(1.0))
    steep.start_from({"pooled": {}, "keyed": [], "draft_ratio": {"head": 0.1}})
    assert all(steep.choose("head", 3, 1, draft_cost_sunk=True) == 0 for _ in range(50))
    assert steep.learned()["draft_ratio"]["head"] == 0.1


def test_a_padded_target_pays_the_same_for_every_pass_up_to_its_rows() -> None:
    """A target padded to 4 rows (a GPU's fixed-shape passes): passes of 1-4 tokens are one shape, whatever the steep
    calibration said. Each of them times the scale, none bends the shape, and a draft lookup already made is verified
    whole (up to 3 tokens) when it is right now and then, which the steep curve declines."""
    controller = _controller()
    _learn(controller, 0.3)
    assert controller.choose("ngram", 5, 3, draft_cost_sunk=True) == 0  # steep: 1.35-2.05x a pass for a few hits
    controller.curve.pad_to(4)
    assert controller.curve.shape[1:5].tolist() == [1.0] * 4 and controller.curve.shape[5] == STEEP[5]
    for _ in range(30):
        controller.curve.observe(3, 2 * SCALE)  # the passes got dearer (a longer context): the scale follows
    assert controller.curve.scale == pytest.approx(2 * SCALE, rel=0.05)
    assert controller.curve.shape[1:5].tolist() == [1.0] * 4
    assert controller.choose("ngram", 5, 3, draft_cost_sunk=True) == 3
