"""The home is a cache: what edgespec keeps in ``$EDGESPEC_HOME`` may be missing, damaged, half-written, read-only or
on a full disk, and the runtime still runs (edgespec/home.py)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec import home
from edgespec.backends import selfcheck as exactness
from edgespec.backends.onnx.manifest import read_manifest
from edgespec.backends.selfcheck import _cached
from edgespec.catalog.models import families
from edgespec.controller.cost import MAX_GAMMA
from edgespec.engine.engine import Engine
from edgespec.errors import ModelLoadError
from edgespec.files import staged, write_text
from edgespec.tuning import default as default_model
from edgespec.tuning import race as default_race
from edgespec.tuning.default import FIXED, default_choice, open_default
from edgespec.tuning.race import choice_key
from edgespec.tuning.store import DefaultChoice, StoredCurve, Tuning, default_choice_path, find_default_choice
from tests.fake_backend import BOS, FakeModel, encode, scripted
from tests.live import ROOT, LiveServer, child_env, edgespec_command

SEQUENCE = [BOS, *encode("the home is a cache. " * 8)]


@contextlib.contextmanager
def mounted(*args: str, target: Path) -> Iterator[Path]:
    """``mount ARGS TARGET`` for the block (root with the right to mount, as this machine and CI are)."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` bind-mounted read-only onto itself: what a user's read-only home is, even to root."""
    with mounted("--bind", str(folder), target=folder):
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield folder


@pytest.fixture
def said(capsys: pytest.CaptureFixture[str]) -> Iterator[list[str]]:
    """The lines edgespec says on stderr, each once per process: forgotten between tests."""
    home._said.clear()
    lines: list[str] = []
    yield lines
    home._said.clear()


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("edgespec:")]


def fake_engine(stored: StoredCurve) -> Engine:
    return Engine(FakeModel(scripted(SEQUENCE), n_ctx=512), gamma="auto", stored_curve=stored)


# -- a home that cannot be written --------------------------------------------------------------------------------

def test_an_engine_generates_on_a_read_only_home_and_says_so_once(tmp_path: Path, said: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """What the γ controller measured and learned is written after each request: on a read-only home the
    generations go on (the learned state serves this process) with one line, not one per request."""
    with read_only(tmp_path / "home") as ro:
        engine = fake_engine(StoredCurve(ro / "tuning" / "curves" / "m.json"))
        for _ in range(3):
            assert engine.generate(SEQUENCE[:20], max_tokens=8).tokens == SEQUENCE[20:28]
    lines = stderr_lines(capsys)
    assert len(lines) == 1 and "cannot write to" in lines[0] and "Read-only file system" in lines[0]


def test_a_full_disk_is_a_home_that_cannot_be_written(tmp_path: Path, said: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with mounted("-t", "tmpfs", "-o", "size=16k", "tmpfs", target=tmp_path / "full") as full:
        (full / "filler").write_bytes(b"\0" * 12288)
        with contextlib.suppress(OSError):
            (full / "more").write_bytes(b"\0" * 16384)  # whatever is left
        engine = fake_engine(StoredCurve(full / "tuning" / "curves" / "m.json"))
        assert engine.generate(SEQUENCE[:20], max_tokens=8).tokens == SEQUENCE[20:28]
        assert not list(full.glob("**/.*tmp*"))  # nothing half-written left behind
    lines = stderr_lines(capsys)
    assert len(lines) == 1 and "No space left on device" in lines[0]


def test_other_write_errors_are_raised_not_hidden(tmp_path: Path) -> None:
    def broken(_: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError):
        home.keep(tmp_path / "x.json", broken)


def test_the_default_on_a_read_only_home_is_the_fixed_one_without_a_race(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing measured there could be kept (each process would race again for minutes), so: the fixed default."""
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    monkeypatch.setattr(default_race, "choose_default", lambda *_, **__: pytest.fail("raced on a read-only home"))
    with read_only(tmp_path / "home") as ro:
        monkeypatch.setenv("EDGESPEC_HOME", str(ro))
        chosen = default_choice(1, "cpu")
    assert (chosen.target, chosen.backend, chosen.mode) == (FIXED.target, FIXED.backend, FIXED.mode)
    assert "cannot be written" in chosen.reason
    assert any("running the fixed default" in line for line in stderr_lines(capsys))


def test_serve_on_a_read_only_home_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's warm-up writes what the engine learned: on a read-only home that killed its worker, and every
    request hung. Now it answers, says once why nothing is kept, and /health is ok."""
    with read_only(tmp_path / "home") as ro:
        monkeypatch.setenv("EDGESPEC_HOME", str(ro))
        monkeypatch.setenv("EDGESPEC_TUNING", "on")  # the stored curve and learned state are written
        with LiveServer.start("--ctx", "512", timeout=180) as server:
            body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
            for _ in range(2):
                r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
            assert httpx.get(server.url + "/health", timeout=5).json()["status"] == "ok"
            server.stop()
            log = server.log()
    assert log.count("cannot write to") == 1 and "Traceback" not in log


def test_generate_on_a_read_only_home_exits_cleanly(tmp_path: Path) -> None:
    """`generate` printed its reply, then a traceback, and exited 1."""
    with read_only(tmp_path / "home") as ro:
        env = child_env() | {"EDGESPEC_HOME": str(ro), "EDGESPEC_TUNING": "on"}
        done = subprocess.run(edgespec_command("generate", "--max-tokens", "4", "--ctx", "256", "Hello"), cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and "Traceback" not in done.stderr
    assert done.stderr.count("cannot be written") + done.stderr.count("cannot write to") >= 1


# -- damaged or hand-edited records -------------------------------------------------------------------------------

def _choice(key: dict[str, object], **changes: object) -> dict[str, object]:
    return {"format": 1, "key": key, "target": "smollm2-135m:q8_0", "backend": "llamacpp", "mode": "ngram",
            "gamma": "auto", "reason": "raced", "candidates": [], "skipped": {}, "details": {}} | changes


@pytest.mark.parametrize("damage", [
    "null", '"text"', "[]", "{", "\xff\xfe garbage", "target=123", "mode=bogus", "gamma=99", "backend=tpu",
    "missing=reason", "extra=field"])
def test_a_damaged_default_choice_is_measured_again_saying_which_file(
        damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    """``null`` or ``"text"`` in the stored choice was a traceback on every run, a bad mode, γ or backend an error
    that did not name the file, until someone deleted it by hand."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    key = choice_key(1, "cpu")
    assert key is not None
    path = default_choice_path(key)
    name, _, value = damage.partition("=")
    if value:
        record = _choice(key)
        if name == "missing":
            del record[value]
        else:
            record[name] = {"target": 123, "gamma": 99}.get(name, value)
        text = json.dumps(record)
    else:
        text = damage
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    measured: list[str] = []
    monkeypatch.setattr(default_race, "choose_default",
                        lambda *_, why, **__: measured.append(why) or FIXED)
    assert default_choice(1, "cpu") is FIXED and len(measured) == 1
    lines = stderr_lines(capsys)
    assert len(lines) == 1 and str(path) in lines[0] and "measuring again" in lines[0]


def test_an_export_that_cannot_be_opened_is_exported_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           said: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged file in the default's cached export failed every run with the same error; the cache's own export
    is removed and the default measured again (which exports it anew)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    export = default_race.onnx_export_path(families()["smollm2-135m"])
    (export / "layers").mkdir(parents=True)
    chosen = DefaultChoice({}, str(export), "onnx", "head", "auto", "raced", [], {})
    choices = [chosen, FIXED]
    monkeypatch.setattr(default_model, "default_choice", lambda *_: choices.pop(0))
    opened: list[str] = []

    def open_choice(choice: DefaultChoice) -> Engine:
        opened.append(choice.target)
        if choice.backend == "onnx":
            raise ModelLoadError(f"cannot load {export}/layers/layer_0.onnx: truncated")
        return "engine"  # type: ignore[return-value]

    assert open_default(1, "cpu", open_choice) == "engine"
    assert opened == [str(export), FIXED.target] and not export.exists()
    assert "cannot be opened" in stderr_lines(capsys)[0]
    # Not a file of the cache: the user's own export is never removed.
    mine = tmp_path / "mine"
    mine.mkdir()
    choices[:] = [DefaultChoice({}, str(mine), "onnx", "ngram", "auto", "raced", [], {})]
    with pytest.raises(ModelLoadError):
        open_default(1, "cpu", open_choice)
    assert mine.exists()


def test_a_choice_made_while_a_candidate_could_not_be_written_is_not_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk during the first use's export made the race store a GGUF choice for good, kept after space was
    freed though the export would have won: such a choice now serves its process only, and the next run races
    again."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    key = choice_key(1, "cpu")
    assert key is not None

    def disk_full(*_: object) -> tuple[str | None, str]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(default_race, "onnx_candidate", disk_full)
    said: list[str] = []
    choice = default_race.choose_default(families()["smollm2-135m"], key, 1, "cpu",
                                         default_race.Budget(prompts=1, max_tokens=8), say=said.append)
    assert "No space left on device" in choice.skipped["onnx int8"]
    assert not default_choice_path(key).exists()
    assert any(line.startswith("edgespec: not stored") and "onnx int8" in line for line in said)


def test_a_stored_choice_names_its_export_inside_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A home copied elsewhere (a new user folder, a backup restored) uses its own export, not the old home's."""
    old, new = tmp_path / "old", tmp_path / "new"
    monkeypatch.setenv("EDGESPEC_HOME", str(old))
    export = home.home_dir("onnx") / "m-int8"
    key: dict[str, object] = {"k": 1}
    path = DefaultChoice(key, str(export), "onnx", "ngram", "auto", "raced", [], {}).save()
    assert path is not None and json.loads(path.read_text())["target"] == "$EDGESPEC_HOME/onnx/m-int8"
    shutil.copytree(old, new)
    shutil.rmtree(old)
    monkeypatch.setenv("EDGESPEC_HOME", str(new))
    found = find_default_choice(key)
    assert found is not None and found.target == str(new / "onnx" / "m-int8")


# -- leftovers and two processes at once ------------------------------------------------------------------------

def test_sweep_removes_what_dead_processes_left_half_written(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftovers = [tmp_path / f".m-int8.tmp{dead.pid}", tmp_path / f".curve.json.tmp{dead.pid}"]
    leftovers[0].mkdir()
    (leftovers[0] / "layer.onnx").write_bytes(b"x" * 100)
    leftovers[1].write_text("{")
    mine = tmp_path / f".curve.json.tmp{os.getpid()}"  # this process is writing it
    mine.write_text("{")
    kept = [tmp_path / "m-int8", tmp_path / ".hidden", tmp_path / "a.tmp1"]
    kept[0].mkdir()
    kept[1].write_text("")
    kept[2].write_text("")
    home.sweep(tmp_path)
    assert not any(p.exists() for p in leftovers)
    assert mine.exists() and all(p.exists() for p in kept)


def test_a_write_killed_midway_is_cleaned_up_by_the_next_write_of_the_same_file(tmp_path: Path) -> None:
    """An export killed with kill -9 left its staging folder beside the export forever; the next write of the same
    export removes it (another file's, or a live writer's, is not touched)."""
    code = ("import os, sys, time\nfrom pathlib import Path\nfrom edgespec.files import staged\n"
            "with staged(Path(sys.argv[1])) as tmp:\n    tmp.mkdir(); (tmp / 'layer.onnx').write_bytes(b'x')\n"
            "    print('writing', flush=True); time.sleep(60)\n")
    export = tmp_path / "m-int8"
    writer = subprocess.Popen([sys.executable, "-c", code, str(export)], cwd=ROOT, env=child_env(),
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
    writer.kill()
    writer.wait()
    left = tmp_path / f".m-int8.tmp{writer.pid}"
    other = tmp_path / f".other.tmp{writer.pid}"
    other.write_text("")
    assert left.is_dir() and not export.exists()
    write_text(export.with_name("unrelated.json"), "{}")
    assert left.exists()
    with staged(export) as tmp:
        tmp.mkdir()
    assert not left.exists() and export.is_dir() and other.exists()


def test_two_processes_never_measure_the_same_thing_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two first uses at once both ran the whole race; the second now waits for the first and reads its choice."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setenv("EDGESPEC_TUNING", "on")
    key = choice_key(1, "cpu")
    assert key is not None
    measured: list[int] = []

    def race(*_: object, **__: object) -> DefaultChoice:
        measured.append(1)
        time.sleep(0.3)  # the other caller arrives meanwhile
        choice = DefaultChoice(key, "smollm2-135m:q8_0", "llamacpp", "ngram", "auto", "raced", [], {})
        choice.save()
        return choice

    monkeypatch.setattr(default_race, "choose_default", race)
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(default_choice(1, "cpu").target)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert measured == [1] and got == ["smollm2-135m:q8_0"] * 2


# -- every record the home holds, fuzzed ------------------------------------------------------------------------

def _records(key: dict[str, object]) -> dict[str, str]:
    """A valid example of each JSON record edgespec keeps in the home."""
    curve = {"format": 1, "shape": [0.0, *[1.0 + 0.1 * k for k in range(MAX_GAMMA + 1)]], "scale": 0.01}
    tuning = {"format": 1, "key": key, "mode": "ngram", "gamma": "auto", "curve_shape": curve["shape"],
              "curve_scale": 0.01, "acceptance": {"ngram": [0.5]}, "draft_cost_s": {"ngram": 0.0},
              "overhead_s": 0.001, "expected_speedup": 1.2, "details": {}}
    return {"choice": json.dumps(_choice(key)), "tuning": json.dumps(tuning), "curve": json.dumps(curve),
            "learned": json.dumps({"format": 1, "learned": {"acceptance": {}}}),
            "exactness": json.dumps({"format": exactness.FORMAT, "key": key, "exact": True, "max_abs_diff": 0.0,
                                     "argmax_agree": 3, "positions": 3, "seconds": 0.1})}


def _read_each(folder: Path, key: dict[str, object], name: str, data: bytes) -> object:
    """Write ``data`` where the record ``name`` lives and read it back the way edgespec does."""
    path = default_choice_path(key) if name == "choice" else folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if name == "choice":
        return default_model._stored(key)[0]
    if name == "tuning":
        return Tuning.read(path)
    if name == "exactness":
        return home.read_record(path, lambda d: _cached(d, key))
    stored = StoredCurve(folder / "curve.json")
    if name == "curve":
        return stored.read()
    shutil.copy(path, stored.learned_path)
    engine = fake_engine(stored)
    return engine.generate(SEQUENCE[:10], max_tokens=2)  # the controller starts from what it reads


@st.composite
def damaged(draw: st.DrawFn, valid: str) -> bytes:
    """Random bytes, a truncation of a valid record, or valid JSON of another shape."""
    kind = draw(st.sampled_from(["bytes", "truncated", "json", "field"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "truncated":
        return valid.encode()[:draw(st.integers(0, len(valid) - 1))]
    values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                         max_size=3), max_leaves=8)
    if kind == "json":
        return json.dumps(draw(values)).encode()
    record = json.loads(valid)
    record[draw(st.sampled_from(sorted(record)))] = draw(values)
    return json.dumps(record).encode()


@pytest.mark.parametrize("name", ["choice", "tuning", "curve", "learned", "exactness"])
def test_every_record_the_home_holds_reads_as_absent_when_damaged(name: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever bytes a record holds, reading it gives the record or nothing (then it is measured again): never an
    exception, which would stop every later run at the same file."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    key: dict[str, object] = {"target": "m", "threads": 1}
    valid = _records(key)[name]
    assert _read_each(tmp_path, key, name, valid.encode()) is not None

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=damaged(valid))
    def check(data: bytes) -> None:
        home._said.clear()
        _read_each(tmp_path, key, name, data)

    check()


@given(data=st.binary(max_size=300) | st.builds(lambda v: json.dumps(v).encode(), st.lists(st.integers())))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_damaged_onnx_manifest_is_a_load_error(data: bytes, tmp_path: Path) -> None:
    """The export's manifest: a clear ``ModelLoadError`` (the default's own export is then exported again)."""
    (tmp_path / "edgespec-onnx.json").write_bytes(data)
    with pytest.raises(ModelLoadError):
        read_manifest(tmp_path)
    assert not default_race.current_export(tmp_path)


def test_write_text_leaves_the_old_file_when_the_write_fails(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    write_text(path, "old")
    with mounted("-t", "tmpfs", "-o", "size=4k", "tmpfs", target=tmp_path / "small") as small:
        target = small / "record.json"
        write_text(target, "old")
        with pytest.raises(OSError):
            write_text(target, "x" * 100_000)
        assert target.read_text() == "old" and [p.name for p in small.iterdir()] == ["record.json"]


def test_a_damaged_file_in_the_cached_export_is_exported_again_by_the_race(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``edgespec tune --default`` (and a first use) failed with the same one-line error on every run while a layer
    of the cached export was damaged, and nothing said what to delete: the race now exports it again."""
    from tests.conftest import onnx_export_dir

    built = onnx_export_dir(quant="int8")  # the shared cache's export, copied: the race's is the same
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    family = families()["smollm2-135m"]
    export = default_race.onnx_export_path(family)
    shutil.copytree(built, export)
    assert default_race.current_export(export)
    layer = export / "layer_05.onnx"
    layer.write_bytes(layer.read_bytes()[:1000])
    said: list[str] = []
    path, note = default_race.onnx_candidate(family, 1, said.append)
    assert path == str(export), note
    assert any("cannot be opened" in line and "exporting it again" in line for line in said)
    assert layer.stat().st_size > 1000 and default_race.current_export(export)
