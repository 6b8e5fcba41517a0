"""`edgespec generate` as a new user meets it: a chat model answers a plain request, an empty reply says why, and
no rate is ever negative (SmolLM2-135M-Instruct, the shipped Q4_1, as `edgespec generate` loads it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from edgespec.cli.main import main
from edgespec.engine.engine import Engine
from edgespec.engine.stats import GenerationStats

ROOT = Path(__file__).resolve().parents[2]
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


ANSWER = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}


def _report(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["generate", *args, "--json", "--threads", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_schema_reply_validates_and_equals_target_only(capsys: pytest.CaptureFixture[str]) -> None:
    """--json-schema holds the reply to the schema; --compare runs the target alone under the same constraint, and the
    two are identical (lossless under speculation, the forced tokens included)."""
    report = _report(capsys, "Is the sea salty? Answer in JSON.", "--json-schema", json.dumps(ANSWER),
                     "--max-tokens", "32", "--compare")
    jsonschema.validate(json.loads(report["text"]), ANSWER)
    assert report["finish_reason"] == "stop" and report["compare"]["identical"]
    assert report["stats"]["forced"] > 0 and report["compare"]["target_only"]["forced"] == 0  # mode none: no forcing


def test_the_stats_line_counts_forced_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "Is the sea salty?", "--json-schema", json.dumps(ANSWER), "--max-tokens", "32",
                 "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) in ({"answer": "yes"}, {"answer": "no"})
    assert re.search(r"\d+ tokens \(\d+ forced by the constraint\) · ", err)


@pytest.mark.parametrize(("prompt", "flags", "accepts"), [
    ("Give me an example.", ["--regex", "[0-9]{3}"], lambda text: re.fullmatch("[0-9]{3}", text)),
    ("Give me an example.", ["--choice", "red,green", "--choice", "blue"],
     lambda text: text in ("red", "green", "blue")),
    # A prompt that asks for an object: held to any JSON object, a 135M model asked for "an example" may write one
    # key as long as the reply can be.
    ("Give me a JSON object with a person's name and age.", ["--json-object"],
     lambda text: isinstance(json.loads(text), dict)),
])
def test_each_constraint_flag_holds_the_reply(capsys: pytest.CaptureFixture[str], prompt: str, flags: list[str],
                                              accepts: Callable[[str], object]) -> None:
    report = _report(capsys, prompt, *flags, "--max-tokens", "48")
    assert report["finish_reason"] == "stop" and accepts(report["text"]), report["text"]


def test_schema_and_grammar_from_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema, grammar = tmp_path / "answer.json", tmp_path / "answer.gbnf"
    schema.write_text(json.dumps(ANSWER))
    grammar.write_text('root ::= "maybe" | "never"\n')
    jsonschema.validate(json.loads(_report(capsys, "Is it?", "--json-schema", f"@{schema}", "--max-tokens",
                                           "32")["text"]), ANSWER)
    assert _report(capsys, "Is it?", "--grammar", f"@{grammar}", "--max-tokens", "8")["text"] in ("maybe", "never")


def test_logprobs_come_in_the_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(capsys, "Is it?", "--choice", "yes,no", "--logprobs", "2", "--max-tokens", "8")
    content = report["logprobs"]["content"]
    assert len(content) == len(report["tokens"]) and "".join(t["token"] for t in content) == report["text"]
    assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) <= 2 for t in content)


@pytest.mark.parametrize(("flags", "says"), [
    (["--json-schema", '{"type": "foo"}'], "--json-schema: Invalid type: foo"),
    (["--json-schema", "{not json"], "--json-schema is not valid JSON"),
    (["--json-schema", "@/nonexistent/schema.json"], "--json-schema: cannot read /nonexistent/schema.json"),
    (["--regex", "("], "--regex: "),
    (["--grammar", "root ::= ("], "--grammar: not a valid GBNF grammar"),
    (["--choice", "a", "--logprobs", "1"], "--logprobs needs --json"),
])
def test_bad_constraints_are_one_line_errors(capsys: pytest.CaptureFixture[str], flags: list[str], says: str) -> None:
    """Refused before any model loads: exit 2, one line naming the flag, no traceback."""
    assert main(["generate", "Hi", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"edgespec: error: {says}") and err.count("\n") == 1 and "Traceback" not in err
