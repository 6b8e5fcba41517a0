"""Spec-Bench on this machine: edgespec's modes against the target alone and against llama-cpp-python.

Every configuration runs in its own worker process (so each one's peak RSS is its own) and the
questions are played interleaved, question by question, so the machine's drift hits all configurations
alike. Greedy decoding; every output is compared with the target-only output of the same run.

    python benchmarks/spec_bench.py                       # 3 questions per category, 256 tokens
    python benchmarks/spec_bench.py --per-category 1 --max-tokens 64 --configs target,ngram-auto

Prints a table, writes JSON and PNG plots to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT.parent / "shared" / "benchmarks" / "spec_bench" / "question.jsonl"


@dataclass(frozen=True)
class Config:
    name: str
    kind: str  # "edgespec" or "llama-cpp-python"
    model: str
    mode: str = "none"
    gamma: int | str = "auto"
    draft: str | None = None
    baseline: str = "target"  # the target-only configuration its speed-up is measured against


CONFIGS = {c.name: c for c in [
    Config("target", "edgespec", "smollm2-135m"),
    Config("ngram-auto", "edgespec", "smollm2-135m", mode="ngram"),
    Config("ngram-g4", "edgespec", "smollm2-135m", mode="ngram", gamma=4),
    Config("lcpp-plain", "llama-cpp-python", "smollm2-135m"),
    Config("lcpp-pld", "llama-cpp-python", "smollm2-135m", mode="pld"),
    Config("target-q8", "edgespec", "smollm2-135m:q8_0", baseline="target-q8"),
    Config("draft-auto", "edgespec", "smollm2-135m:q8_0", mode="draft", draft="smollm2-135m:q4_0",
           baseline="target-q8"),
]}
DEFAULT_CONFIGS = "target,ngram-auto,ngram-g4,lcpp-plain,lcpp-pld"


# -- workers ------------------------------------------------------------------------------------------
def _edgespec_worker(config: Config, n_ctx: int, conn: mp.connection.Connection) -> None:
    import edgespec

    engine = edgespec.load(config.model, draft=config.draft, mode=config.mode, gamma=config.gamma, n_ctx=n_ctx)
    curve = engine.calibrate().as_dict() if config.mode == "none" else None
    conn.send({"ready": True, "verify_curve": curve})
    while (request := conn.recv()) is not None:
        out = engine.generate(request["tokens"], max_tokens=request["max_tokens"])
        s = out.stats
        conn.send({"tokens": out.tokens, "prefill_s": s.prefill_s, "decode_s": s.decode_s, "steps": s.steps,
                   "drafted": s.drafted, "accepted": s.accepted, "gamma_sum": s.gamma_sum,
                   "position_trials": s.position_trials, "position_accepts": s.position_accepts,
                   "draft_s": s.draft_s, "verify_s": s.verify_s, "peak_rss_mb": _peak_rss_mb()})


def _llama_cpp_worker(config: Config, n_ctx: int, conn: mp.connection.Connection) -> None:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from edgespec.llama_backend import physical_cores
    from edgespec.models import resolve

    # The AMX/repacked weight layouts crash on this Xeon (see llama_backend.py): load plain layouts, as
    # edgespec does. Everything else is llama-cpp-python's default behaviour.
    default_params = llama_cpp.llama_cpp.llama_model_default_params

    def plain_layouts() -> llama_cpp.llama_model_params:
        params = default_params()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_cpp.llama_model_default_params = plain_layouts
    draft = LlamaPromptLookupDecoding(num_pred_tokens=10) if config.mode == "pld" else None
    llm = llama_cpp.Llama(str(resolve(config.model)), n_ctx=n_ctx, n_threads=physical_cores(),
                          n_threads_batch=physical_cores(), draft_model=draft, logits_all=draft is not None,
                          verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    conn.send({"ready": True, "verify_curve": None})
    while (request := conn.recv()) is not None:
        start = time.perf_counter()
        tokens: list[int] = []
        first_at = start
        for token in llm.generate(request["tokens"], temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            if not tokens:
                first_at = time.perf_counter()
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                break
            tokens.append(token)
            if len(tokens) == request["max_tokens"]:
                break
        end = time.perf_counter()
        conn.send({"tokens": tokens, "prefill_s": first_at - start, "decode_s": end - first_at,
                   "steps": max(len(tokens) - 1, 0), "drafted": 0, "accepted": 0, "gamma_sum": 0,
                   "position_trials": [], "position_accepts": [], "draft_s": 0.0, "verify_s": 0.0,
                   "peak_rss_mb": _peak_rss_mb()})


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(config: Config, n_ctx: int, conn: mp.connection.Connection) -> None:
    (_edgespec_worker if config.kind == "edgespec" else _llama_cpp_worker)(config, n_ctx, conn)


# -- the run ------------------------------------------------------------------------------------------
def load_questions(path: Path, categories: list[str] | None, per_category: int) -> list[dict]:
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    chosen, seen = [], defaultdict(int)
    for q in questions:  # file order: fixed, reproducible
        if (categories is None or q["category"] in categories) and seen[q["category"]] < per_category:
            seen[q["category"]] += 1
            chosen.append(q)
    return chosen


def run(args: argparse.Namespace) -> dict:
    from edgespec.chat import ChatTemplate
    from edgespec.llama_backend import ContextOptions, LlamaModel
    from edgespec.models import resolve

    configs = [CONFIGS[name] for name in args.configs.split(",")]
    for c in configs:
        if c.baseline not in {x.name for x in configs}:
            raise SystemExit(f"configuration {c.name} needs its baseline {c.baseline} in --configs")
    questions = load_questions(Path(args.questions), args.categories.split(",") if args.categories else None,
                               args.per_category)
    tokenizer = LlamaModel(resolve("smollm2-135m"), ContextOptions(n_ctx=256))
    template = ChatTemplate(tokenizer.chat_template or "", "", "")

    ctx = mp.get_context("spawn")
    workers = {}
    info: dict[str, dict] = {}
    for c in configs:
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_worker, args=(c, args.ctx, child), daemon=True)
        process.start()
        workers[c.name] = (process, parent)
        info[c.name] = parent.recv()
    records: list[dict] = []
    history = {c.name: {} for c in configs}  # per config, per question: the conversation so far
    for qi, q in enumerate(questions):
        for turn, user in enumerate(q["turns"]):
            for c in configs:
                messages = history[c.name].setdefault(q["question_id"], [])
                messages.append({"role": "user", "content": user})
                tokens = tokenizer.tokenize(template.render(messages), add_special=False, parse_special=True)
                workers[c.name][1].send({"tokens": tokens, "max_tokens": args.max_tokens})
                result = workers[c.name][1].recv()
                messages.append({"role": "assistant", "content": tokenizer.detokenize(result["tokens"])})
                records.append({"config": c.name, "question_id": q["question_id"], "category": q["category"],
                                "turn": turn, "prompt_tokens": len(tokens), **result})
            for r in records[-len(configs):]:
                baseline = next(x for x in records[-len(configs):] if x["config"] == CONFIGS[r["config"]].baseline)
                r["identical"] = r["tokens"] == baseline["tokens"]
        print(f"  question {qi + 1}/{len(questions)} ({q['category']}) done", flush=True)
    for process, conn in workers.values():
        conn.send(None)
        process.join(timeout=30)
    return {"records": records, "workers": info, "configs": [c.__dict__ for c in configs]}


# -- the report ---------------------------------------------------------------------------------------
def summarize(records: list[dict], configs: list[Config]) -> dict:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["config"], r["category"])].append(r)
        groups[(r["config"], "overall")].append(r)
    summary: dict[str, dict] = {}
    for (config, category), rs in groups.items():
        decoded = sum(max(len(r["tokens"]) - 1, 0) for r in rs)
        decode_s = sum(r["decode_s"] for r in rs)
        total_s = decode_s + sum(r["prefill_s"] for r in rs)
        steps = sum(r["steps"] for r in rs)
        drafted = sum(r["drafted"] for r in rs)
        summary.setdefault(config, {})[category] = {
            "generations": len(rs),
            "tokens": sum(len(r["tokens"]) for r in rs),
            "decode_tokens_per_s": decoded / decode_s if decode_s else 0.0,
            "total_tokens_per_s": sum(len(r["tokens"]) for r in rs) / total_s if total_s else 0.0,
            "acceptance_rate": sum(r["accepted"] for r in rs) / drafted if drafted else None,
            "mean_accepted_per_step": decoded / steps if steps else None,
            "gamma_mean": sum(r["gamma_sum"] for r in rs) / steps if steps else 0.0,
            "draft_s": sum(r["draft_s"] for r in rs), "verify_s": sum(r["verify_s"] for r in rs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            "identical": sum(r["identical"] for r in rs),
        }
    for c in configs:
        for category, s in summary[c.name].items():
            base = summary[c.baseline][category]["decode_tokens_per_s"]
            s["speedup"] = s["decode_tokens_per_s"] / base if base else 0.0
            base_total = summary[c.baseline][category]["total_tokens_per_s"]
            s["speedup_with_prefill"] = s["total_tokens_per_s"] / base_total if base_total else 0.0
    return summary


def print_table(summary: dict, configs: list[Config]) -> None:
    categories = sorted({cat for s in summary.values() for cat in s} - {"overall"}) + ["overall"]
    print(f"\n{'config':<12}{'category':<16}{'tok/s':>7}{'×':>7}{'×+pre':>7}{'α':>6}{'τ':>6}{'γ':>6}"
          f"{'same':>8}{'RSS MB':>8}")
    for c in configs:
        for cat in categories:
            s = summary[c.name].get(cat)
            if s is None:
                continue
            alpha = f"{s['acceptance_rate']:.2f}" if s["acceptance_rate"] is not None else "-"
            tau = f"{s['mean_accepted_per_step']:.2f}" if s["mean_accepted_per_step"] is not None else "-"
            print(f"{c.name:<12}{cat:<16}{s['decode_tokens_per_s']:>7.1f}{s['speedup']:>7.2f}"
                  f"{s['speedup_with_prefill']:>7.2f}{alpha:>6}{tau:>6}{s['gamma_mean']:>6.1f}"
                  f"{s['identical']:>4}/{s['generations']:<3}{s['peak_rss_mb']:>8.0f}")
        print()


def plot(result: dict, configs: list[Config], path_stem: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    categories = sorted({cat for s in summary.values() for cat in s} - {"overall"}) + ["overall"]
    fig, axes = plt.subplots(1, 3, figsize=(20, 5.5))
    spec = [c for c in configs if c.name != c.baseline]
    width = 0.8 / max(len(spec), 1)
    for i, c in enumerate(spec):
        axes[0].bar([j + i * width for j in range(len(categories))],
                    [summary[c.name].get(cat, {}).get("speedup", 0) for cat in categories], width, label=c.name)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(categories))], categories, rotation=45, ha="right")
    axes[0].set_ylabel("decode speed-up vs target alone")
    axes[0].legend()
    for c in spec:
        rs = [r for r in result["records"] if r["config"] == c.name and r["position_trials"]]
        if rs:
            trials = [sum(r["position_trials"][j] for r in rs) for j in range(len(rs[0]["position_trials"]))]
            accepts = [sum(r["position_accepts"][j] for r in rs) for j in range(len(trials))]
            xs = [j + 1 for j, t in enumerate(trials) if t >= 5]
            axes[1].plot(xs, [accepts[j - 1] / trials[j - 1] for j in xs], marker="o", label=c.name)
    axes[1].set_xlabel("draft position")
    axes[1].set_ylabel("acceptance (given all before accepted)")
    axes[1].legend()
    for name, w in result["workers"].items():
        if w.get("verify_curve"):
            curve = {int(k): v for k, v in w["verify_curve"].items()}
            axes[2].plot(list(curve), [v * 1000 for v in curve.values()], marker="o", label=name)
    axes[2].set_xlabel("tokens verified in one pass (k)")
    axes[2].set_ylabel("ms per pass")
    axes[2].legend()
    fig.tight_layout()
    out = path_stem.with_suffix(".png")
    fig.savefig(out, dpi=90)
    return [str(out)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", default=str(QUESTIONS))
    parser.add_argument("--categories", default=None, help="comma-separated (default: all)")
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"from {', '.join(CONFIGS)}")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()

    import llama_cpp

    import edgespec
    from edgespec.llama_backend import physical_cores

    started = datetime.now(timezone.utc)
    result = run(args)
    configs = [CONFIGS[name] for name in args.configs.split(",")]
    result["summary"] = summarize(result["records"], configs)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    result["machine"] = {"cpu": cpu, "physical_cores": physical_cores(), "python": platform.python_version(),
                         "edgespec": edgespec.__version__, "llama_cpp_python": llama_cpp.__version__,
                         "started": started.isoformat(), "args": vars(args)}
    print_table(result["summary"], configs)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"spec_bench-{started.strftime('%Y%m%dT%H%M%S')}"
    result["plots"] = plot(result, configs, stem)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(f"wrote {stem.with_suffix('.json')} and {', '.join(result['plots'])}")


if __name__ == "__main__":
    main()
