"""Spec-Bench questions: JSON lines of ``{"question_id", "category", "turns": [...]}``; a question may carry a
``"schema"`` (a JSON schema every answer to it is held to: ``edgespec bench --constrained``)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from ..engine import constraints
from ..errors import EdgespecError

# edgespec's own structured-output prompts (JSON-schema extraction, tool calls), kept in the repository.
CONSTRAINED_QUESTIONS = Path(__file__).resolve().parents[2] / "benchmarks" / "constrained_prompts.jsonl"


class BenchError(EdgespecError):
    """A benchmark cannot run as asked: missing questions, unknown configurations, a peer that failed."""


def spec_bench(path: str | None) -> str:
    """The Spec-Bench question file the user named: its questions are not part of the repository (nor a default)."""
    if path is None:
        raise BenchError("Spec-Bench's questions are not part of edgespec: give its question.jsonl with --questions "
                         "FILE (data/spec_bench/question.jsonl in the hemingkx/Spec-Bench repository)")
    return path


def load_questions(path: str | Path, categories: list[str] | None = None, per_category: int | None = None,
                   limit: int | None = None) -> list[dict]:
    """Questions in file order (fixed and reproducible): at most ``per_category`` of each category asked for,
    at most ``limit`` in all."""
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"question file not found: {path} (Spec-Bench's question.jsonl; give one with --questions)")
    questions = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            ok = isinstance(q["category"], str) and q["turns"] and all(isinstance(t, str) for t in q["turns"])
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise BenchError(f"{path}:{n}: not a Spec-Bench question (needs 'category' and a list of 'turns')")
        if "schema" in q:  # checked now, not by the first worker that meets it
            if not isinstance(q["schema"], dict):
                raise BenchError(f"{path}:{n}: 'schema' must be a JSON schema object")
            constraints.json_schema(q["schema"], param=f"{path}:{n}: schema")
        q.setdefault("question_id", n)
        questions.append(q)
    known = {q["category"] for q in questions}
    unknown = sorted(set(categories or ()) - known)
    if unknown:
        raise BenchError(f"unknown categories {', '.join(unknown)}; {path.name} has {', '.join(sorted(known))}")
    chosen, seen = [], defaultdict(int)
    for q in questions:
        if categories and q["category"] not in categories:
            continue
        if per_category is not None and seen[q["category"]] >= per_category:
            continue
        seen[q["category"]] += 1
        chosen.append(q)
    return chosen[:limit] if limit is not None else chosen


def conversation(path: str | Path, categories: list[str] | None, turns: int, skip: int = 0) -> list[dict]:
    """A scripted conversation of ``turns`` user messages, a chat about documents and more: the categories take
    turns, each giving its next question's first turn after skipping the first ``skip`` questions of each, and
    the categories whose questions are longest on average (those carrying a text to summarize or answer from)
    come first, as a user pastes a text and then talks about it and other things. So the history grows the way
    a long chat's does, and a late turn is a question, not a new document whose prefill no cache can spare: 10
    turns with ~128-token answers reach ~2500 tokens. (Second turns are left out: they refer to the answer to
    their own first turn.)"""
    by_category: dict[str, list[dict]] = defaultdict(list)
    for q in load_questions(path, categories):
        by_category[q["category"]].append(q)
    order = sorted(by_category.values(), key=lambda qs: -sum(len(q["turns"][0]) for q in qs) / len(qs))
    queues = [qs[skip:] for qs in order]
    script: list[dict] = []
    while len(script) < turns and any(queues):
        for queue in queues:
            if queue:
                q = queue.pop(0)
                script.append({"question_id": q["question_id"], "category": q["category"], "content": q["turns"][0]})
    if len(script) < turns:
        raise BenchError(f"{Path(path).name} has only {len(script)} questions to give after skipping {skip} per "
                         "category; ask for fewer --turns or more categories")
    return script[:turns]
