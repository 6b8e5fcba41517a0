"""PNG plots of a run: speed-up per category per configuration, acceptance per draft position, and the
measured verify-cost curves against batch size. matplotlib is imported here only."""

from __future__ import annotations

from pathlib import Path

from .report import OVERALL


def plot(result: dict, stem: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    configs = {c["name"]: c for c in result["configs"]}
    paths = []

    # 1. Decode speed-up per category, each configuration against its baseline.
    categories = sorted({c for s in summary.values() for c in s} - {OVERALL}) + [OVERALL]
    compared = [n for n in summary if configs[n]["baseline"] != n]
    fig, ax = plt.subplots(figsize=(max(8, len(categories) * 1.1), 5))
    width = 0.8 / max(len(compared), 1)
    for i, name in enumerate(compared):
        ax.bar([j + i * width for j in range(len(categories))],
               [summary[name].get(cat, {}).get("speedup") or 0 for cat in categories], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(categories))], categories, rotation=45, ha="right")
    ax.set_ylabel("decode speed-up vs its target-only baseline")
    ax.legend(fontsize=8)
    paths.append(_save(fig, stem, "speedup"))

    # 2. Acceptance per draft position, where the engine reports it.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in summary:
        rs = [r for r in result["records"] if r["config"] == name and r["position_trials"]]
        if not rs:
            continue
        trials = [sum(r["position_trials"][j] for r in rs) for j in range(len(rs[0]["position_trials"]))]
        accepts = [sum(r["position_accepts"][j] for r in rs) for j in range(len(trials))]
        xs = [j for j, t in enumerate(trials) if t >= 5]
        if xs:
            ax.plot([j + 1 for j in xs], [accepts[j] / trials[j] for j in xs], marker="o", label=name)
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted | all before accepted)")
    ax.set_ylim(0, 1)
    if ax.get_lines():
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no configuration drafted", ha="center", transform=ax.transAxes)
    paths.append(_save(fig, stem, "acceptance"))

    # 3. Verify-cost curves: one per model file measured (configurations on one file measure the same).
    fig, ax = plt.subplots(figsize=(7, 4.5))
    seen = set()
    for name, info in result["workers"].items():
        curve = info.get("verify_curve")
        if not curve or info.get("model_file") in seen:
            continue
        seen.add(info.get("model_file"))
        ks = sorted(curve, key=int)
        ax.plot([int(k) for k in ks], [curve[k] * 1000 for k in ks], marker="o",
                label=f"{Path(str(info.get('model_file'))).name} ({name})")
    ax.set_xlabel("tokens in one target pass (γ + 1)")
    ax.set_ylabel("ms per pass (fastest seen)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    paths.append(_save(fig, stem, "verify_cost"))
    return paths


def plot_chat(result: dict, stem: Path) -> list[str]:
    """bench --chat: time to first token against context length, per configuration, beside the same turn
    played by a fresh engine (the whole conversation prefilled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, records in result["turns"].items():
        contexts = [r["context_tokens"] for r in records]
        (line,) = ax.plot(contexts, [r["ttft_s"] for r in records], marker="o", label=name)
        ax.plot(contexts, [r["fresh_ttft_s"] for r in records], linestyle="--", color=line.get_color(),
                alpha=0.6, label=f"{name}, fresh engine")
    ax.set_xlabel("context length at the turn (tokens)")
    ax.set_ylabel("time to first token (s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return [_save(fig, stem, "ttft")]


def line_chart(path: Path, x: list[float], lines: list[tuple[str, list[float], str, str]], xlabel: str,
               ylabel: str, title: str) -> None:
    """One PNG of lines over a shared x axis, each (label, values, colour, line style), a marker on every point
    (the benchmarks/ scripts' plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values, color, style in lines:
        ax.plot(x, values, style, color=color, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _save(fig: object, stem: Path, what: str) -> str:
    path = stem.with_name(f"{stem.name}-{what}.png")
    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=90)  # type: ignore[attr-defined]
    import matplotlib.pyplot as plt

    plt.close(fig)  # type: ignore[arg-type]
    return str(path)
