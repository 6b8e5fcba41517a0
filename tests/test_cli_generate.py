"""`edgespec generate` as a new user meets it: a chat model answers a plain request, an empty reply says why, and
no rate is ever negative (SmolLM2-135M-Instruct, the shipped Q4_1, as `edgespec generate` loads it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.cli import main
from edgespec.engine import Engine
from edgespec.stats import GenerationStats

ROOT = Path(__file__).resolve().parents[1]
STORY = "Write a short story about a robot learning to paint."
N = 24


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGESPEC_TUNING": "off"}
    return subprocess.run([sys.executable, "-m", "edgespec.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_generate_answers_a_request_through_the_chat_template(engine: Engine) -> None:
    """The issue's command prints a story: the prompt goes through the model's chat template by default, and the
    text printed is what the engine's chat gives (greedy, so one answer)."""
    run = _cli("generate", STORY, "--max-tokens", str(N))
    assert run.returncode == 0, run.stderr
    expected = engine.chat([{"role": "user", "content": STORY}], max_tokens=N).text
    assert expected.strip() and run.stdout.strip() == expected.strip()
    assert "tok/s decode" in run.stderr and " -" not in run.stderr.split("tok/s")[0]


def test_raw_is_a_plain_completion_and_an_empty_reply_says_why(capsys: pytest.CaptureFixture[str],
                                                               engine: Engine) -> None:
    """--raw hands the text over as it is: this instruct model then ends at once (the issue's empty story); the
    stats line prints no rate for it and one line says why, naming the way out."""
    assert engine.generate(STORY, max_tokens=N).tokens == []  # the premise: raw, the model has nothing to say
    assert main(["generate", STORY, "--raw", "--max-tokens", str(N), "--compare"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == ""
    assert "0 tokens · no tokens decoded" in err and "tok/s decode" not in err
    assert "ended it at once" in err and "without --raw" in err
    assert "no decode speed-up to compare" in err and "×" not in err.split("target alone:")[1]


def test_json_has_no_negative_rate_and_no_speedup_for_empty_replies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", STORY, "--raw", "--json", "--compare", "--max-tokens", str(N)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == [] and report["stats"]["decode_tokens_per_s"] == 0.0
    assert report["compare"]["speedup"] is None and report["compare"]["target_only"]["decode_tokens_per_s"] == 0.0


def test_json_compare_of_two_replies_has_a_speedup(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", STORY, "--chat", "--json", "--compare", "--max-tokens", "16"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["text"].strip() and report["compare"]["identical"]
    assert report["stats"]["decode_tokens_per_s"] > 0 and report["compare"]["speedup"] > 0


@pytest.mark.parametrize("generated", [0, 1])
def test_decode_rate_of_a_reply_without_decoded_tokens_is_zero(generated: int) -> None:
    """The first token comes with the prefill: a reply of 0 or 1 tokens decoded nothing, whatever time the loop's
    bookkeeping took (the issue's -9114.4 tok/s was -1 token over 0.1 ms)."""
    stats = GenerationStats(generated_tokens=generated, prefill_s=0.05, decode_s=1e-4)
    assert stats.decode_tokens == 0 and stats.decode_tokens_per_s == 0.0
    assert stats.to_dict()["decode_tokens_per_s"] == 0.0


def test_mode_tree_prints_its_tree_size_and_accepted_depth(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", STORY, "--draft", "tree", "--max-tokens", str(N), "--threads", "1"]) == 0
    line = next(line for line in capsys.readouterr().err.splitlines() if "tok/s decode" in line)
    assert " nodes · depth " in line and "mode tree" in line and "γ" not in line
