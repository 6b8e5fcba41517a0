"""Spec-Bench questions: JSON lines of ``{"question_id", "category", "turns": [...]}``."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from ..errors import EdgespecError

# Next to the repository, as the project keeps it (../shared/benchmarks/spec_bench/question.jsonl).
DEFAULT_QUESTIONS = Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "spec_bench" / "question.jsonl"


class BenchError(EdgespecError):
    """A benchmark cannot run as asked: missing questions, unknown configurations, a peer that failed."""


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
