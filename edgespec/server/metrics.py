"""Counters for every served model, as a JSON snapshot (bridge ``stats``) and as Prometheus text (``/metrics``)."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Mapping

from ..controller.cost import MAX_GAMMA
from ..engine.stats import GenerationStats

_COUNTERS = {  # snapshot key → (Prometheus name, help)
    "prompt_tokens": ("edgespec_prompt_tokens_total", "Prompt tokens of finished generations."),
    "generated_tokens": ("edgespec_generated_tokens_total", "Tokens generated, cancelled generations included."),
    "steps": ("edgespec_verify_steps_total", "Target verify passes after the first token."),
    "drafts": ("edgespec_drafts_total", "Verify passes that checked at least one draft token."),
    "draft_tokens": ("edgespec_draft_tokens_total", "Draft tokens sent to verification."),
    "accepted_tokens": ("edgespec_accepted_tokens_total", "Draft tokens the target accepted."),
    "cache_hits": ("edgespec_prompt_cache_hits_total", "Finished generations that reused cached prompt tokens."),
    "cached_tokens": ("edgespec_prompt_cached_tokens_total", "Prompt tokens reused from the cache, not computed."),
}
_GAUGES = {  # snapshot key → (Prometheus name, help); their values are read from the pool when asked
    "queue_depth": ("edgespec_queue_depth", "Generations waiting or running."),
    "prompt_cache_bytes": ("edgespec_prompt_cache_bytes", "Bytes of saved conversation states (bounded by "
                           "--cache-mb; approximate while a generation runs)."),
}
_TTFT = ("edgespec_time_to_first_token_seconds", "Time from a finished generation's start to its first token "
         "(prompt processing), not counting the queue.")


class _ModelCounters:
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # by outcome: done, cancelled, error, client_error, rejected
        self.totals: Counter[str] = Counter()
        self.position_trials = [0] * MAX_GAMMA
        self.position_accepts = [0] * MAX_GAMMA
        self.ttft_sum, self.ttft_count = 0.0, 0


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: defaultdict[str, _ModelCounters] = defaultdict(_ModelCounters)
        # HTTP error replies by (status, code): labelled by our own codes only, never by what a client sent (a
        # model name it made up), so that no client can grow the label set.
        self._errors: Counter[tuple[int, str]] = Counter()

    def count_error(self, status: int, code: str | None) -> None:
        with self._lock:
            self._errors[status, code or ""] += 1

    def count_request(self, model: str, outcome: str) -> None:
        with self._lock:
            self._models[model].requests[outcome] += 1

    def record(self, model: str, outcome: str, stats: GenerationStats | None, generated: int) -> None:
        """One generation ended; ``stats`` only when it finished (a cancelled one has none)."""
        with self._lock:
            m = self._models[model]
            m.requests[outcome] += 1
            m.totals["generated_tokens"] += generated
            if stats is None:
                return
            m.totals.update(prompt_tokens=stats.prompt_tokens, steps=stats.steps, draft_tokens=stats.drafted,
                            accepted_tokens=stats.accepted, cached_tokens=stats.cached_tokens,
                            cache_hits=int(stats.cached_tokens > 0))
            m.ttft_sum += stats.prefill_s
            m.ttft_count += 1
            # A step drafted something iff its first position was tried.
            m.totals["drafts"] += stats.position_trials[0]
            for j in range(MAX_GAMMA):
                m.position_trials[j] += stats.position_trials[j]
                m.position_accepts[j] += stats.position_accepts[j]

    def snapshot(self, gauges: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, object]]:
        """``gauges``: each loaded model's current values of the _GAUGES keys."""
        with self._lock:
            names = sorted(set(self._models) | set(gauges))
            return {name: self._model_snapshot(self._models[name], gauges.get(name, {})) for name in names}

    @staticmethod
    def _model_snapshot(m: _ModelCounters, gauges: Mapping[str, int]) -> dict[str, object]:
        return {"requests": dict(m.requests), **{k: m.totals[k] for k in _COUNTERS},
                **{k: gauges.get(k, 0) for k in _GAUGES},
                "time_to_first_token_s": {"sum": round(m.ttft_sum, 6), "count": m.ttft_count},
                "acceptance_by_position": [round(a / t, 6) if t else None
                                           for a, t in zip(m.position_accepts, m.position_trials, strict=True)]}

    def prometheus(self, gauges: Mapping[str, Mapping[str, int]]) -> str:
        snap = self.snapshot(gauges)
        lines = ["# HELP edgespec_requests_total Generations by outcome (done, cancelled, error, client_error: "
                 "refused as a bad request, rejected: queue full).",
                 "# TYPE edgespec_requests_total counter"]
        lines += [f'edgespec_requests_total{{model="{_esc(name)}",outcome="{outcome}"}} {n}'
                  for name, s in snap.items() for outcome, n in sorted(s["requests"].items())]  # type: ignore[union-attr]
        for key, (metric, text) in _COUNTERS.items():
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} counter"]
            lines += [f'{metric}{{model="{_esc(name)}"}} {s[key]}' for name, s in snap.items()]
        metric, text = _TTFT
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} summary"]
        for name, s in snap.items():
            ttft = s["time_to_first_token_s"]
            lines += [f'{metric}_{part}{{model="{_esc(name)}"}} {ttft[part]}' for part in ("sum", "count")]  # type: ignore[index]
        with self._lock:
            errors = sorted(self._errors.items())
        lines += ["# HELP edgespec_error_responses_total HTTP error replies by status and code: requests refused "
                  "(bad JSON or parameters, unknown model or path, the guard, the API key, a full queue) and "
                  "server errors. A generation refused by the engine also counts in edgespec_requests_total.",
                  "# TYPE edgespec_error_responses_total counter"]
        lines += [f'edgespec_error_responses_total{{status="{status}",code="{_esc(code)}"}} {n}'
                  for (status, code), n in errors]
        for key, (metric, text) in _GAUGES.items():
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} gauge"]
            lines += [f'{metric}{{model="{_esc(name)}"}} {s[key]}' for name, s in snap.items()]
        lines += ["# HELP edgespec_draft_acceptance Fraction of draft tokens accepted at each draft position "
                  "(1 = first), among those verified there.", "# TYPE edgespec_draft_acceptance gauge"]
        for name, s in snap.items():
            lines += [f'edgespec_draft_acceptance{{model="{_esc(name)}",position="{j + 1}"}} {rate}'
                      for j, rate in enumerate(s["acceptance_by_position"]) if rate is not None]  # type: ignore[arg-type]
        return "\n".join(lines) + "\n"


def _esc(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
