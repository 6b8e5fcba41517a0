"""What one generation did and how fast: the numbers users and benchmarks read."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field

from ..controller.cost import MAX_GAMMA
from .verify import positions_tested


def tokens_per_step(accepted: int, steps: int) -> float:
    """τ over ``steps`` verify passes: each gives the draft tokens it accepted plus the target's own token.

    Counted from the passes, not from the text: the pass that produces EOS (never emitted) or runs past
    max_tokens still produced its tokens, and a generation cut there is not a weaker speculation.
    """
    return (accepted + steps) / steps if steps else 0.0


@dataclass
class GenerationStats:
    mode: str = "none"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV was reused, not computed (the prompt cache)
    generated_tokens: int = 0
    prefill_s: float = 0.0  # prompt processing up to and including the first token: the time to first token
    decode_s: float = 0.0  # everything after the first token
    draft_s: float = 0.0
    verify_s: float = 0.0  # target passes after the first token
    steps: int = 0  # target passes after the first token
    drafted: int = 0  # draft tokens sent to verification
    accepted: int = 0  # of those, accepted
    forced: int = 0  # tokens a constraint forced, verified in passes of their own: no drafter's, not in drafted
    gamma_sum: int = 0
    # Verify steps whose draft came from each drafter (mode head: "ngram" or "head"; mode tree: each drafter with a
    # node in the step's tree, so its shares can sum past 1): which one the controller uses, where τ alone cannot tell
    # a drafter that stopped being asked from one that is asked and wrong.
    draft_steps: dict[str, int] = field(default_factory=dict)
    # per draft position j: how often it was verified and how often accepted
    position_trials: list[int] = field(default_factory=lambda: [0] * MAX_GAMMA)
    position_accepts: list[int] = field(default_factory=lambda: [0] * MAX_GAMMA)

    def record_forced(self, accepted: int) -> None:
        """A pass over the tokens a constraint forced, ``accepted`` of them kept."""
        self.steps += 1
        self.forced += accepted

    def record_step(self, drafted: int, accepted: int, sources: Collection[str] = ()) -> None:
        self.steps += 1
        for source in sources if drafted else ():
            self.draft_steps[source] = self.draft_steps.get(source, 0) + 1
        self.drafted += drafted
        self.accepted += accepted
        self.gamma_sum += drafted
        for j in range(positions_tested(drafted, accepted)):
            self.position_trials[j] += 1
        for j in range(accepted):
            self.position_accepts[j] += 1

    @property
    def decode_tokens(self) -> int:
        """Tokens after the first (the first comes with the prefill); 0 when the reply ended at once."""
        return max(self.generated_tokens - 1, 0)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second of decoding (prefill excluded); 0.0 when none were decoded."""
        return self.decode_tokens / self.decode_s if self.decode_tokens and self.decode_s > 0 else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        """All generated tokens per second, prefill included."""
        total = self.prefill_s + self.decode_s
        return self.generated_tokens / total if total > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        """α: the fraction of verified draft tokens the target accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_per_step(self) -> float:
        """τ: tokens each target pass after the first token produced (1.0 = no speculation), forced ones too."""
        return tokens_per_step(self.accepted + self.forced, self.steps)

    @property
    def gamma_mean(self) -> float:
        return self.gamma_sum / self.steps if self.steps else 0.0

    @property
    def depth_mean(self) -> float:
        """Draft tokens accepted per verify pass: the mean accepted depth (in mode tree, the accepted path's)."""
        return self.accepted / self.steps if self.steps else 0.0

    @property
    def tree_size_mean(self) -> float | None:
        """Mode tree: draft nodes per verify pass, the mean tree size (its γ); None in the other modes."""
        if self.mode != "tree":
            return None
        return self.drafted / self.steps if self.steps else 0.0

    def acceptance_by_position(self) -> list[float | None]:
        return [a / t if t else None for a, t in zip(self.position_accepts, self.position_trials, strict=True)]

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        del d["position_trials"], d["position_accepts"], d["gamma_sum"]
        d.update(decode_tokens_per_s=self.decode_tokens_per_s, total_tokens_per_s=self.total_tokens_per_s,
                 acceptance_rate=self.acceptance_rate, mean_accepted_per_step=self.mean_accepted_per_step,
                 gamma_mean=self.gamma_mean, depth_mean=self.depth_mean, tree_size_mean=self.tree_size_mean,
                 acceptance_by_position=self.acceptance_by_position())
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}
