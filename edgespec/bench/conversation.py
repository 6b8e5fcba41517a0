"""``edgespec bench --chat``: one scripted conversation, played by every configuration on its own answers.

Each turn appends a Spec-Bench question to the configuration's own conversation (its previous answers, not
another decoder's), renders it with the model's chat template and asks the configuration's worker for the
next answer: edgespec through ``Engine.stream_chat``, the peers in their best own setting for a chat
(llama-cpp-python's RAM prompt cache, one onnxruntime-genai generator appended to). Whatever an engine kept
from earlier turns is its to reuse. Afterwards every turn is played again by a fresh engine (nothing cached)
on the same conversation, and the two texts are compared: reuse must not change what a decoder writes.

Per turn: context length, tokens new since the decoder's previous turn (the prompt tokens it had not seen:
the new question and the template around it), time to first token, prefill rate of the new tokens (new
tokens / time to first token), decode tok/s after the first token and the turn's total latency.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from ..engine.arena import common_prefix
from .configs import select
from .questions import conversation
from .run import RunArgs, machine, open_setup, start_workers
from .worker import Worker

SCHEMA = "edgespec-bench-chat/1"


@dataclass(frozen=True)
class ChatArgs(RunArgs):
    max_tokens: int = 128
    turns: int = 10
    skip: int = 0  # questions skipped at the start of each category


def _turn_record(result: dict, prompt: list[int], held: list[int]) -> dict:
    """The per-turn measures of one worker result; ``held`` is what the decoder's previous turn left it."""
    n = len(result["tokens"])
    decoded = max(n - result["first_tokens"], 0)
    new = len(prompt) - common_prefix(prompt, held)
    return {"context_tokens": len(prompt), "new_tokens": new, "ttft_s": result["ttft_s"],
            "prefill_tok_s": new / result["ttft_s"] if result["ttft_s"] > 0 else None,
            "decode_tok_s": decoded / result["decode_s"] if result["decode_s"] > 0 else None,
            "latency_s": result["ttft_s"] + result["decode_s"], "n_tokens": n, "tokens": result["tokens"],
            "arrivals": result["arrivals"], "peak_rss_mb": result["peak_rss_mb"], "extra": result["extra"]}


def time_to(arrivals: list[tuple[int, float]], n: int) -> float:
    """Seconds from the request until the first ``n`` tokens of the answer had arrived."""
    return next(t for received, t in arrivals if received >= n)


def lowest_turns(turns: dict[str, list[dict]], name: str, equal_length: bool) -> int:
    """From turn 3 on, the turns on which ``name``'s answer took less time than every other configuration's:
    whole answers, or (``equal_length``) each pair compared at the length both answers reach — each decoder
    writes its own answer, and a 128-token answer is not slower than a 33-token one for taking longer."""
    won = 0
    for i, mine in enumerate(turns[name][2:], start=2):
        others = [records[i] for other, records in turns.items() if other != name]
        if equal_length:
            won += all(time_to(mine["arrivals"], m) < time_to(o["arrivals"], m)
                       for o in others if (m := min(mine["n_tokens"], o["n_tokens"])) > 0)
        else:
            won += all(mine["latency_s"] < o["latency_s"] for o in others)
    return won


def run_chat(args: ChatArgs, log: Callable[[str], None] = print) -> dict:
    """Play the conversation through every configuration, then every turn again fresh; the records per turn."""
    started = datetime.now(timezone.utc)
    configs, skipped = select(list(args.configs), args.run_options, chat=True)
    for name, why in skipped.items():
        log(f"skipping {name}: {why}")
    script = conversation(args.questions, args.categories, args.turns, args.skip)
    chat, setup = open_setup(args)
    workers: dict[str, Worker] = {}
    messages: dict[str, list[dict[str, str]]] = {c.name: [] for c in configs}
    turns: dict[str, list[dict]] = {c.name: [] for c in configs}
    try:
        start_workers(configs, args, setup, workers, log)
        rng = random.Random(args.seed)
        held: dict[str, list[int]] = {c.name: [] for c in configs}
        for i, user in enumerate(script):
            order = list(configs)
            rng.shuffle(order)  # no configuration always runs right after another
            t0 = time.perf_counter()
            for c in order:
                conv = messages[c.name]
                conv.append({"role": "user", "content": user["content"]})
                prompt = chat.chat_tokens(conv)
                result = workers[c.name].chat_turn(conv, prompt, args.max_tokens, fresh=False)
                conv.append({"role": "assistant", "content": chat.target.detokenize(result["tokens"])})
                turns[c.name].append({"turn": i + 1, **_turn_record(result, prompt, held[c.name])})
                held[c.name] = prompt + result["tokens"]
            log(f"  turn {i + 1}/{len(script)} ({user['category']}) {time.perf_counter() - t0:.1f} s")
        # Every turn again with nothing cached: a fresh engine per turn, on the same conversation.
        for c in configs:
            t0 = time.perf_counter()
            for i, record in enumerate(turns[c.name]):
                conv = messages[c.name][:2 * i + 1]
                fresh = workers[c.name].chat_turn(conv, chat.chat_tokens(conv), args.max_tokens, fresh=True)
                record["fresh_ttft_s"] = fresh["ttft_s"]
                record["same_as_fresh"] = fresh["tokens"] == record["tokens"]
            log(f"  {c.name}: {len(turns[c.name])} turns again from a fresh engine {time.perf_counter() - t0:.1f} s")
    finally:
        for w in workers.values():
            w.close()
        chat.close()
    for records in turns.values():
        for r in records:
            r.pop("tokens")  # compared already; the texts are kept
    return {"schema": SCHEMA, "date": started.isoformat(),
            "duration_s": (datetime.now(timezone.utc) - started).total_seconds(), "machine": machine(),
            "args": asdict(args), "setup": {**asdict(setup), "eog": list(setup.eog)},
            "configs": [asdict(c) for c in configs], "skipped": skipped, "script": script,
            "workers": {name: w.info for name, w in workers.items()}, "turns": turns, "conversations": messages,
            "summary": summarize_chat(turns)}


def summarize_chat(turns: dict[str, list[dict]]) -> dict[str, dict[str, object]]:
    """Per configuration: the last turn's context and time to first token, mean latency from turn 3 on (the
    first turns have little to reuse), and how many turns equal a fresh engine's text."""
    out = {}
    for name, records in turns.items():
        later = [r["latency_s"] for r in records[2:]]
        out[name] = {"turns": len(records), "last_context_tokens": records[-1]["context_tokens"],
                     "last_ttft_s": records[-1]["ttft_s"],
                     "mean_latency_from_turn_3_s": sum(later) / len(later) if later else None,
                     "lowest_from_turn_3": lowest_turns(turns, name, equal_length=False),
                     "lowest_at_equal_length_from_turn_3": lowest_turns(turns, name, equal_length=True),
                     "same_as_fresh": sum(r["same_as_fresh"] for r in records)}
    return out


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def chat_table(result: dict) -> str:
    """One block per configuration, one line per turn; ``pf tok/s`` is new tokens / time to first token."""
    head = (f"{'config':<12}{'turn':>5}{'context':>8}{'new':>6}{'TTFT s':>8}{'fresh s':>8}{'pf tok/s':>9}"
            f"{'dec tok/s':>10}{'total s':>8}{'tokens':>7}  {'vs fresh':<8}")
    lines = [head]
    for name, records in result["turns"].items():
        for r in records:
            lines.append(f"{name:<12}{r['turn']:>5}{r['context_tokens']:>8}{r['new_tokens']:>6}{r['ttft_s']:>8.2f}"
                         f"{r['fresh_ttft_s']:>8.2f}{_fmt(r['prefill_tok_s'], '.0f'):>9}"
                         f"{_fmt(r['decode_tok_s'], '.1f'):>10}{r['latency_s']:>8.2f}{r['n_tokens']:>7}  "
                         f"{'same' if r['same_as_fresh'] else 'DIFFERS':<8}")
        s = result["summary"][name]
        later = _fmt(s["mean_latency_from_turn_3_s"], ".2f")
        lines.append(f"{name:<12} last turn: {s['last_context_tokens']} tokens of context, time to first token "
                     f"{s['last_ttft_s']:.2f} s; mean latency from turn 3 {later} s; {s['same_as_fresh']}/{s['turns']} "
                     "turns as a fresh engine writes them")
        if len(result["turns"]) > 1:
            lines.append(f"{'':<12} from turn 3, faster than every other configuration on {s['lowest_from_turn_3']} "
                         f"turns; on {s['lowest_at_equal_length_from_turn_3']} compared at the length both answers "
                         "reach")
        lines.append("")
    return "\n".join(lines)
