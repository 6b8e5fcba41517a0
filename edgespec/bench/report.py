"""From raw records to the summary: per configuration and category (and overall) the speeds, latencies,
acceptance, time split, memory, ratios against the baseline, losslessness, and the bounds beside them.

Bounds (where the time goes):
- ``bound_tok_s``: what the configuration would decode if the engine's own overhead were zero — its
  observed γ sequence (steps by number of draft tokens) priced with its own measured verify-cost curve
  (the fastest pass seen for each batch size), plus draft-model compute. Only engines with a curve. A
  generation whose verify passes took less than the curve prices them (the machine got quieter after the
  curve was timed, or the generation's context is shorter than the curve's) is priced at what they took:
  the fastest passes seen include the run's own, so the bound is one.
- ``verify_only_tok_s``: the same with the run's actual verify (and draft-model) time: the overhead-free
  rate at this run's contexts.
- ``bandwidth_bound_tok_s`` (per category, for plain decoding): measured memory bandwidth / bytes read per
  token (weights + KV cache at the category's mean context).

``prefill_tok_s``: prompt tokens per second of time to first token, over first turns only (a second turn's
prompt holds the first turn, which an engine with a prompt cache, llama-cpp-python's context or edgespec's
arena, does not prefill again; a first turn shares at most the template's system prompt with the previous
question).

Constrained questions (``bench --constrained``): ``forced_share``, the share of generated tokens the schema's grammar
forced (edgespec verifies them at no drafting cost; None for a runner that does not say), and ``schema_valid``, how
many replies parse as JSON and validate against their schema.

``lookup_share`` is about the text, not the decoder: the share of generated tokens that a 3-gram lookup over
the conversation predicts. Configurations writing different text (lossy modes, peers' own weights) are timed
on texts that n-gram drafting finds more or less to copy.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

import numpy as np

from ..drafters import NgramDrafter
from ..engine.sampling import SamplingParams

OVERALL = "overall"


def _curve_seconds(hist: list[int], curve: dict[str, float]) -> float:
    return sum(n * curve[str(g + 1)] for g, n in enumerate(hist) if n)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _generated(r: dict) -> int:
    """Tokens a generation produced (a saved JSON keeps their count, not the ids: summaries can be redone)."""
    return len(r["tokens"]) if "tokens" in r else r["n_tokens"]


def _decoded(r: dict) -> int:
    """Tokens decoded after the first step (decode tok/s counts these: prefill is excluded)."""
    return max(_generated(r) - r["first_tokens"], 0)


LOOKUP_N = 3  # the n-gram length of the predictability measure (onnxruntime-genai's n-gram mode drafts on 3)
GREEDY = SamplingParams()


def lookup_hits(prompt: list[int], output: list[int], n: int = LOOKUP_N) -> int:
    """How many tokens of ``output`` prompt lookup (edgespec's n-gram drafter, matching exactly n tokens) would
    have predicted from prompt + output so far: the token after the most recent occurrence of the last n.

    A property of the text, not of a decoder: configurations that write different text (a lossy mode, a
    peer's own quantization) are measured on different texts, and a text that repeats itself more is faster
    for every n-gram drafter. Summaries report it as ``lookup_share`` beside the speeds.
    """
    lookup = NgramDrafter(n_max=n, n_min=n, max_draft=1)
    seq = list(prompt)
    lookup.begin(seq)
    unused_rng = np.random.default_rng(0)  # a lookup neither samples nor reads the sampling parameters
    hits = 0
    for token in output:
        hits += lookup.propose(seq, 1, GREEDY, unused_rng).tokens == [token]
        seq.append(token)
    return hits


def _group(records: list[dict]) -> dict[str, dict[str, list[dict]]]:
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        groups[r["config"]][r["category"]].append(r)
        groups[r["config"]][OVERALL].append(r)
    return groups


def _summarize_group(rs: list[dict], curve: dict[str, float] | None) -> dict[str, object]:
    decoded = sum(_decoded(r) for r in rs)
    generated = sum(_generated(r) for r in rs)
    decode_s = sum(r["decode_s"] for r in rs)
    e2e_s = decode_s + sum(r["ttft_s"] for r in rs)
    first_turns = [r for r in rs if r["turn"] == 0]
    prefill_s = sum(r["ttft_s"] for r in first_turns)
    has = {k: all(r[k] is not None for r in rs) for k in ("steps", "drafted", "accepted", "draft_s", "gamma_hist")}
    steps = sum(r["steps"] for r in rs) if has["steps"] else None
    drafted = sum(r["drafted"] for r in rs) if has["drafted"] else None
    draft_s = sum(r["draft_s"] for r in rs) if has["draft_s"] else None
    verify_s = sum(r["verify_s"] for r in rs) if has["draft_s"] else None
    s: dict[str, object] = {
        "generations": len(rs), "tokens": generated,
        "decode_tok_s": decoded / decode_s if decode_s else 0.0,
        "e2e_tok_s": generated / e2e_s if e2e_s else 0.0,
        "e2e_latency_s": mean(r["ttft_s"] + r["decode_s"] for r in rs),
        "ttft_s": mean(r["ttft_s"] for r in rs),
        "prefill_tok_s": sum(r["prompt_tokens"] for r in first_turns) / prefill_s if prefill_s else None,
        "alpha": sum(r["accepted"] for r in rs) / drafted if drafted and has["accepted"] else None,
        "tau": decoded / steps if steps else None,
        "gamma_mean": drafted / steps if drafted is not None and steps else None,
        # Accepted draft tokens per pass (a tree's accepted path's depth), and a tree's nodes per pass (its γ) where
        # every generation ran mode tree.
        "depth_mean": sum(r["accepted"] for r in rs) / steps if steps and has["accepted"] else None,
        "tree_size_mean": (drafted / steps if drafted is not None and steps and all(r.get("mode") == "tree" for r in rs)
                           else None),
        "draft_s": draft_s, "verify_s": verify_s,
        "draft_share": draft_s / (draft_s + verify_s) if draft_s is not None and verify_s else None,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
        "lookup_share": (sum(r["lookup_hits"] for r in rs) / generated
                         if generated and all("lookup_hits" in r for r in rs) else None),
        "draft_steps_share": _draft_steps_share(rs, steps),
        "forced_share": (sum(r["forced"] for r in rs) / generated
                         if generated and all(r.get("forced") is not None for r in rs) else None),
        "schema_valid": (None if any(r.get("schema_valid") is None for r in rs) else
                         sum(r["schema_valid"] for r in rs)),
        "same_as_baseline": sum(r["same_as_baseline"] for r in rs),
        "lossless": None if any(r["lossless"] is None for r in rs) else sum(r["lossless"] for r in rs),
    }
    model_draft_s = sum(r["model_draft_s"] for r in rs)
    if curve is not None and has["gamma_hist"]:
        priced = [_curve_seconds(r["gamma_hist"], curve) for r in rs]
        if has["draft_s"]:  # the run's own passes count among the fastest seen
            priced = [min(cost, r["verify_s"]) for cost, r in zip(priced, rs, strict=True)]
        bound_s = sum(priced) + model_draft_s
        s["bound_tok_s"] = decoded / bound_s if bound_s else None
    else:
        s["bound_tok_s"] = None
    # c: a drafted token's model compute against one single-token target pass (draft models, layer-skip).
    s["draft_cost_ratio"] = (model_draft_s / drafted / curve["1"]
                             if curve is not None and model_draft_s and drafted else None)
    s["verify_only_tok_s"] = decoded / (verify_s + model_draft_s) if verify_s else None
    s["bound_fraction"] = _ratio(s["decode_tok_s"], s["bound_tok_s"])  # type: ignore[arg-type]
    return s


def _draft_steps_share(rs: list[dict], steps: int | None) -> dict[str, float] | None:
    """Per drafter, the share of verify steps whose draft it made; None where a runner does not say (a peer)."""
    if not steps or any(r.get("draft_steps") is None for r in rs):
        return None
    counts: dict[str, int] = defaultdict(int)
    for r in rs:
        for source, n in r["draft_steps"].items():
            counts[source] += n
    return {source: n / steps for source, n in sorted(counts.items())}


def summarize(result: dict) -> dict[str, dict[str, dict[str, object]]]:
    configs = {c["name"]: c for c in result["configs"]}
    groups = _group(result["records"])
    summary = {name: {cat: _summarize_group(rs, result["workers"][name].get("verify_curve"))
                      for cat, rs in by_cat.items()} for name, by_cat in groups.items()}
    for name, by_cat in summary.items():
        base = summary[configs[name]["baseline"]]
        for cat, s in by_cat.items():
            s["speedup"] = _ratio(s["decode_tok_s"], base[cat]["decode_tok_s"])  # type: ignore[arg-type]
            s["speedup_e2e"] = _ratio(s["e2e_tok_s"], base[cat]["e2e_tok_s"])  # type: ignore[arg-type]
            s["latency_ratio"] = _ratio(s["e2e_latency_s"], base[cat]["e2e_latency_s"])  # type: ignore[arg-type]
    return summary


def head_to_head(result: dict) -> dict[str, dict[str, object]]:
    """Per category: the fastest of edgespec's automatic configurations that was lossless on every generation,
    against the fastest peer configuration (any runner but edgespec's own), in decode tokens/s.

    Absolute rates, not ratios: peers run their own model files (an onnxruntime-genai export, weights
    dequantized for transformers) of the same source model, and the question a user asks is which is faster.
    """
    configs = {c["name"]: c for c in result["configs"]}
    summary = result["summary"]
    ours = [n for n in summary if configs[n]["auto"]]
    peers = [n for n in summary if configs[n]["runner"] != "edgespec"]
    out: dict[str, dict[str, object]] = {}
    if not ours or not peers:
        return out
    for cat in summary[ours[0]]:
        lossless = [n for n in ours if summary[n][cat]["lossless"] == summary[n][cat]["generations"]]
        if not lossless:
            continue
        best = max(lossless, key=lambda n: summary[n][cat]["decode_tok_s"])
        rival = max(peers, key=lambda n: summary[n][cat]["decode_tok_s"])
        a, b = summary[best][cat]["decode_tok_s"], summary[rival][cat]["decode_tok_s"]
        out[cat] = {"edgespec": best, "edgespec_tok_s": a, "peer": rival, "peer_tok_s": b, "ratio": a / b,
                    "peer_lossless": summary[rival][cat]["lossless"], "generations": summary[rival][cat]["generations"],
                    "lookup_share": [summary[best][cat].get("lookup_share"), summary[rival][cat].get("lookup_share")],
                    "ratio_90": ratio_interval(result.get("records", []), best, rival, cat)}
    return out


def versions(result: dict) -> dict[str, dict[str, object]]:
    """Each configuration run at a git revision (``NAME@REV``) against the same configuration of this checkout in the
    same run, overall: this checkout's decode tok/s over the revision's, its 90% interval over the questions, and
    both τ. Empty where the run has no such pair."""
    configs = {c["name"]: c for c in result["configs"]}
    summary = result["summary"]
    out: dict[str, dict[str, object]] = {}
    for name, config in configs.items():
        base = name.partition("@")[0]
        if not config.get("revision") or base not in summary or name not in summary:
            continue
        ours, theirs = summary[base][OVERALL], summary[name][OVERALL]
        out[name] = {"this_checkout": base, "revision": config["revision"],
                     "ratio": ours["decode_tok_s"] / theirs["decode_tok_s"],
                     "ratio_90": ratio_interval(result.get("records", []), base, name, OVERALL),
                     "tau": [ours["tau"], theirs["tau"]]}
    return out


def ratio_interval(records: list[dict], ours: str, peer: str, category: str, draws: int = 4000,
                    seed: int = 0) -> list[float] | None:
    """A 90% bootstrap interval of ours / peer decode tok/s over the category's questions.

    Which questions a category happened to get moves a ratio more than the machine does: a second turn that
    repeats the first answer decodes at 2–3× under n-gram drafting, and a lossy peer's text (so what it can
    copy) differs from edgespec's. Questions are resampled with both turns together and the same draw for both
    configurations; None with fewer than two questions.
    """
    totals: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for r in records:
        if r["config"] in (ours, peer) and category in (OVERALL, r["category"]):
            total = totals[r["question_id"]][r["config"]]
            total[0] += _decoded(r)
            total[1] += r["decode_s"]
    both = [t for t in totals.values() if ours in t and peer in t]
    if len(both) < 2:
        return None
    per_question = np.array([[*t[ours], *t[peer]] for t in both])  # decoded, seconds (ours); the same (peer)
    draw = np.random.default_rng(seed).integers(0, len(both), (draws, len(both)))
    sums = per_question[draw].sum(axis=1)
    ratios = (sums[:, 0] / sums[:, 1]) / (sums[:, 2] / sums[:, 3])
    lo, hi = np.percentile(ratios, [5, 95])
    return [float(lo), float(hi)]


def bandwidth_bounds(result: dict, bandwidth: float, per_token: dict[str, float]) -> dict[str, object]:
    """Plain decoding's memory-bandwidth bound per category, at that category's mean context."""
    contexts: dict[str, list[float]] = defaultdict(list)
    for r in result["records"]:
        ctx = r["prompt_tokens"] + _generated(r) / 2
        contexts[r["category"]].append(ctx)
        contexts[OVERALL].append(ctx)
    by_cat = {}
    for cat, ctxs in contexts.items():
        bytes_ = per_token["weights"] + per_token["kv_per_context_token"] * mean(ctxs)
        by_cat[cat] = {"mean_context": mean(ctxs), "bytes_per_token": bytes_, "bound_tok_s": bandwidth / bytes_}
    return {"bandwidth_gb_s": bandwidth / 1e9, **{k: v for k, v in per_token.items()}, "by_category": by_cat}


def _fmt(v: object, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(result: dict) -> str:
    """The printed table: one block per configuration, one line per category. ``pf/s`` is the prefill rate
    (prompt tokens / time to first token, first turns), ``bound`` is the curve bound,
    ``vonly`` the overhead-free rate with the run's actual passes, ``ach%`` decode tok/s as a share of bound; ``dep``
    the accepted draft tokens per pass (a tree's accepted depth), ``nodes`` a tree's size per pass (mode tree)."""
    summary, bw = result["summary"], result.get("bandwidth")
    categories = sorted({c for s in summary.values() for c in s} - {OVERALL}) + [OVERALL]
    width = max([14, *(len(name) + 1 for name in summary)])  # `default-target`, `default@HEAD~1` and the like
    head = (f"{'config':<{width}}{'category':<15}{'tok/s':>7}{'×':>6}{'×e2e':>6}{'TTFT':>6}{'pf/s':>6}{'lat s':>7}"
            f"{'α':>6}{'τ':>6}{'γ':>5}{'dep':>5}{'nodes':>6}{'c':>5}"
            f"{'draft%':>7}{'bound':>7}{'vonly':>7}{'ach%':>5}{'same':>8}{'lossless':>9}{'RSS MB':>7}")
    lines = [head]
    for name, by_cat in summary.items():
        for cat in categories:
            s = by_cat.get(cat)
            if s is None:
                continue
            draft_pct = None if s["draft_share"] is None else 100 * s["draft_share"]
            ach = None if s["bound_fraction"] is None else 100 * s["bound_fraction"]
            lossless = "-" if s["lossless"] is None else f"{s['lossless']}/{s['generations']}"
            lines.append(
                f"{name:<{width}}{cat:<15}{s['decode_tok_s']:>7.1f}{_fmt(s['speedup'], '.2f'):>6}"
                f"{_fmt(s['speedup_e2e'], '.2f'):>6}{s['ttft_s']:>6.2f}{_fmt(s['prefill_tok_s'], '.0f'):>6}"
                f"{s['e2e_latency_s']:>7.2f}"
                f"{_fmt(s['alpha'], '.2f'):>6}{_fmt(s['tau'], '.2f'):>6}{_fmt(s['gamma_mean'], '.1f'):>5}"
                f"{_fmt(s['depth_mean'], '.2f'):>5}{_fmt(s['tree_size_mean'], '.1f'):>6}"
                f"{_fmt(s['draft_cost_ratio'], '.2f'):>5}{_fmt(draft_pct, '.0f'):>7}{_fmt(s['bound_tok_s'], '.0f'):>7}"
                f"{_fmt(s['verify_only_tok_s'], '.0f'):>7}"
                f"{_fmt(ach, '.0f'):>5}"
                f"{s['same_as_baseline']:>4}/{s['generations']:<3}{lossless:>8} "
                f"{s['peak_rss_mb']:>7.0f}")
        shares = by_cat[OVERALL].get("draft_steps_share") if OVERALL in by_cat else None
        if shares:
            lines.append(f"{name}: steps drafted by " + ", ".join(f"{source} {100 * share:.0f}%"
                                                                 for source, share in shares.items()))
        lines.append("")
    duel = result.get("head_to_head")
    if duel:
        lines.append(f"{'head to head':<15}{'edgespec (auto, lossless)':<26}{'tok/s':>7}  {'fastest peer':<14}"
                     f"{'tok/s':>7}{'lossless':>9}{'×':>7}{'90% of questions':>18}{f'{LOOKUP_N}-gram share':>14}")
        for cat in categories:
            d = duel.get(cat)
            if d is not None:
                lossless = "-" if d["peer_lossless"] is None else f"{d['peer_lossless']}/{d['generations']}"
                spread = "-" if d["ratio_90"] is None else "{:.2f}–{:.2f}".format(*d["ratio_90"])
                shares = "/".join(_fmt(v, ".2f") for v in d.get("lookup_share", [None, None]))
                lines.append(f"{cat:<15}{d['edgespec']:<26}{d['edgespec_tok_s']:>7.1f}  {d['peer']:<14}"
                             f"{d['peer_tok_s']:>7.1f}{lossless:>9}{d['ratio']:>7.2f}{spread:>18}{shares:>14}")
        lines.append("")
    for name, v in result.get("versions", {}).items():  # this checkout against another revision of the same
        spread = "" if v["ratio_90"] is None else " (90% of question draws: {:.3f}–{:.3f})".format(*v["ratio_90"])
        lines.append(f"{v['this_checkout']} / {name} ({v['revision'][:10]}): {v['ratio']:.3f}× decode tok/s{spread}, "
                     f"τ {_fmt(v['tau'][0], '.3f')} / {_fmt(v['tau'][1], '.3f')}")
    if result.get("versions"):
        lines.append("")
    if bw:
        bound = bw["by_category"][OVERALL]["bound_tok_s"]
        target = summary.get("target", {}).get(OVERALL)
        reached = f"; target alone reaches {100 * target['decode_tok_s'] / bound:.0f}% of it" if target else ""
        lines.append(f"memory bandwidth {bw['bandwidth_gb_s']:.1f} GB/s; plain decoding reads "
                     f"{bw['weights'] / 1e6:.1f} MB of weights + {bw['kv_per_context_token'] / 1e3:.1f} kB per token "
                     f"of context per token → bound {bound:.0f} tok/s overall{reached}")
    return "\n".join(lines)


def constrained_table(result: dict) -> str:
    """The table of a constrained run: per configuration and category, decode and prefill rates, α, τ (forced tokens
    count as tokens of their pass), the share of tokens forced, how many replies validate against their schema, the
    same as the baseline, lossless, peak RSS; the CPU it ran on first."""
    summary, m = result["summary"], result["machine"]
    categories = sorted({c for s in summary.values() for c in s} - {OVERALL}) + [OVERALL]
    width = max([14, *(len(name) + 1 for name in summary)])
    lines = [f"{m['cpu']}, {m['physical_cores']} physical cores, {result['setup']['threads']} threads; "
             f"{result['args']['max_tokens']} tokens at most, greedy",
             f"{'config':<{width}}{'category':<12}{'dec tok/s':>10}{'×':>6}{'pf tok/s':>9}{'α':>6}{'τ':>6}"
             f"{'forced%':>8}{'valid':>8}{'same':>8}{'lossless':>9}{'RSS MB':>7}"]
    for name, by_cat in summary.items():
        for cat in categories:
            s = by_cat.get(cat)
            if s is None:
                continue
            n = s["generations"]
            forced = None if s["forced_share"] is None else 100 * s["forced_share"]
            valid = "-" if s["schema_valid"] is None else f"{s['schema_valid']}/{n}"
            lossless = "-" if s["lossless"] is None else f"{s['lossless']}/{n}"
            lines.append(f"{name:<{width}}{cat:<12}{s['decode_tok_s']:>10.1f}{_fmt(s['speedup'], '.2f'):>6}"
                         f"{_fmt(s['prefill_tok_s'], '.0f'):>9}{_fmt(s['alpha'], '.2f'):>6}{_fmt(s['tau'], '.2f'):>6}"
                         f"{_fmt(forced, '.0f'):>8}{valid:>8}{s['same_as_baseline']:>4}/{n:<3}{lossless:>9}"
                         f"{s['peak_rss_mb']:>7.0f}")
        lines.append("")
    configs = {c["name"]: c for c in result["configs"]}
    lines += [f"{name}: {c['description']}; × against {c['baseline']}" for name, c in configs.items()]
    return "\n".join(lines)
