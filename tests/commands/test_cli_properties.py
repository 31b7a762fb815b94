"""Issue 50: the command line, property-based. For each command, hypothesis draws flag values and input files — valid,
out of range, of the wrong kind, truncated, missing — and every case must end in exit 0 (or reach the point where the
real work would start), or in exit 2 (4 for a stopped evaluation) with one ``marti-ibrl CMD: error:`` line and no
traceback. Derandomized: the same cases on every run.

What would start real work is replaced by a sentinel (:class:`Started`): the trainer, an evaluation's play, the demo's
SFT, the web server's socket and loop, a checkpoint seat's model load, scenario generation beyond a few scenarios. Not covered
here (they download, modify the virtual environment or load full models before any check of theirs can fail):
``model``, ``patch``, ``export-merged``, ``sft``, ``telesales eval`` and ``telesales sft``, ``diagnose``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from fake_model import fake_checkpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marti_ibrl import cli

EXAMPLES = int(os.environ.get("MARTI_CLI_EXAMPLES", "1000"))
CLI = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ROOT = Path(__file__).resolve().parents[2]


class Started(Exception):
    """The command got past every check to where its real work starts."""


def _start(*args, **kwargs):
    raise Started


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Inputs of every kind a user might pass where a file is expected."""
    tmp = tmp_path_factory.mktemp("cli_inputs")
    (tmp / "empty").write_bytes(b"")
    (tmp / "junk.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "trunc.json").write_text('{"a": ')
    (tmp / "list.yaml").write_text("- 1\n- 2\n")
    (tmp / "notdb.sqlite").write_text("not a database\n")
    (tmp / "lewis.txt").write_text("garbage line\n")
    (tmp / "episodes.jsonl").write_text('{"x": 1}\n{"episode_id": "a"\n')
    (tmp / "adir").mkdir()
    ckpt = fake_checkpoint(tmp / "ckpt")
    broken = fake_checkpoint(tmp / "ckpt_truncated")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    bad_run = tmp / "run_list"
    bad_run.mkdir()
    (bad_run / "config.yaml").write_text("- 1\n")
    run = tmp / "run_transcripts"
    run.mkdir()
    (run / "transcripts.jsonl").write_text('{"iteration": 1, "seats": []}\nnot json\n{"iteration": "x"}\n')
    (run / "config.yaml").write_text("env:\n  max_rounds: abc\n")
    paths = {p.name: str(p) for p in tmp.iterdir()}
    paths["missing"] = str(tmp / "missing")
    paths["ckpt"] = str(ckpt)
    # copies: a case may write where a path points (the checkout is never handed to a case)
    paths["sft"] = str(shutil.copytree(ROOT / "recipes/dond/tiny-sft", tmp / "sft"))
    paths["recipe"] = str(shutil.copy(ROOT / "recipes/dond/tiny-cpu.yaml", tmp / "tiny-cpu.yaml"))
    paths["recipe_4b"] = str(shutil.copy(ROOT / "recipes/dond/qwen3.5-4b.yaml", tmp / "qwen3.5-4b.yaml"))
    return paths


@pytest.fixture(scope="module")
def parser():
    return cli.build_parser()  # built once: every case parses with it (10 ms a build)


@pytest.fixture
def stubs(monkeypatch, parser, tmp_path):
    """Where real work would start: :class:`Started` (or a small stand-in); the parser built once."""
    from marti_ibrl import demo, trainer
    from marti_ibrl.commands import dond as dond_commands
    from marti_ibrl.envs import dond
    from marti_ibrl.eval.dond import command as eval_dond
    from marti_ibrl.people import app, seat

    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(trainer, "train", _start)
    monkeypatch.setattr(trainer, "IBRLTrainer", _start)
    monkeypatch.setattr(eval_dond, "play", _start)
    monkeypatch.setattr(demo, "prepare", _start)  # the demo's SFT warm start (OpenRLHF's SFT trainer)
    monkeypatch.setattr(app, "bind", _start)
    monkeypatch.setattr(app, "serve", _start)
    monkeypatch.setattr(seat.CheckpointSeat, "__init__", _start)
    from marti_ibrl.envs.telesales import profiles

    some = profiles.generate_profiles
    monkeypatch.setattr(profiles, "generate_profiles", lambda n, seed=0, split="eval": some(min(n, 4), seed, split))
    from marti_ibrl.envs.telesales import scripted

    calls = scripted.scripted_calls
    monkeypatch.setattr(scripted, "scripted_calls", lambda n, seed=0, strategies=scripted.STRATEGIES: calls(
        min(n, 1), seed, strategies))  # fmt: skip
    few = dond.generate_scenarios
    monkeypatch.setattr(dond, "generate_scenarios", lambda n, seed=0: few(min(n, 4), seed))
    monkeypatch.setattr(dond_commands, "generate_scenarios", lambda n, seed=0: few(min(n, 4), seed))
    monkeypatch.chdir(tmp_path)  # relative paths a case writes land here, never in the checkout
    return tmp_path


NUMBERS = st.one_of(
    st.integers(-3, 70_000),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["0", "-1", "1", "nan", "inf", "-inf", "1e400", "0x10", "", " 3", "3.5", "65536", "99999"]),
).map(str)
TEXT = st.text(alphabet=st.sampled_from("ab-_/:=.@# \u00e9\u4e2d0\\"), max_size=12)


def _value(files: dict[str, str], kind: str) -> st.SearchStrategy[str]:
    paths = st.sampled_from(sorted(files.values()))
    return {
        "number": st.one_of(NUMBERS, NUMBERS, TEXT),
        "path": st.one_of(paths, paths, TEXT),
        "policy": st.one_of(
            paths.map(lambda p: f"p={p}"),
            st.sampled_from(
                [
                    "bot:greedy",
                    "p=bot:fair",
                    "heldout:hardliner",
                    "endpoint:m@http://127.0.0.1:9/v1",
                    "p=checkpoint:/nope",
                    "zzz:1",
                    "=",
                    "p=",
                ]
            ),  # fmt: skip
            TEXT,
        ),
        "text": st.one_of(TEXT, st.sampled_from(["dond", "telesales", "agent1", "0.0.0.0", "127.0.0.1", "x:y"])),
    }[kind]


def _fill(arg: str, files: dict[str, str]) -> str:
    """``<name>`` in a command's base argument: that input's path (``p=<sft>``: ``p=`` and the SFT checkpoint)."""
    for name, path in files.items():
        arg = arg.replace(f"<{name}>", path)
    return arg


def _argv(files: dict[str, str], command: list[str], flags: dict[str, str], positional: list[str]):
    """A command line: each flag present or not, with a value of its kind; positionals of theirs."""

    @st.composite
    def draw(draw_) -> list[str]:
        argv = [_fill(a, files) for a in command]
        for kind in positional:
            argv.append(draw_(_value(files, kind)))
        for flag, kind in flags.items():
            if draw_(st.booleans()):
                argv += [flag] if kind == "switch" else [flag, draw_(_value(files, kind))]
        return argv

    return draw()


OUTCOMES: dict[str, Counter] = {}
"""Per command: how its cases ended (``started``, ``exit 0``, ``exit 2`` ...), for the coverage check below."""


def run(argv: list[str], out: Path) -> None:
    """One case: exit 0, :class:`Started`, or exit 2/4 with one error line and no traceback."""
    here = Path(tempfile.mkdtemp(dir=out))  # each case in a directory of its own: no case sees another's files, so
    os.chdir(here)  # a case replays the same (hypothesis re-runs a failing one); the fixture restores the cwd
    argv = [a.replace("{out}", str(here)) for a in argv]  # (later flags override the command's valid base)
    err = io.StringIO()
    tally = OUTCOMES.setdefault(" ".join(argv[:2] if argv[0] in ("dond", "telesales") else argv[:1]), Counter())
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    except Started:
        tally["started"] += 1
        return
    tally[f"exit {code}"] += 1
    text = err.getvalue()
    assert "Traceback" not in text, (argv, text)
    if argv[:2] == ["dond", "check-data"] and code == 1:  # its verdict on a file it read: bad lines, one per kind
        return
    assert code in (0, 2, 4), (argv, code, text)
    if code:
        lines = [line for line in text.splitlines() if line.strip()]
        prog = "marti-ibrl " + " ".join(a for a in argv[:2] if not a.startswith("-") and "/" not in a)
        errors = [line for line in lines if ": error: " in line]
        assert len(errors) == 1 and errors[0].startswith(prog.split(" ")[0]), (argv, text)


COMMANDS = {
    "plan": (
        [
            "plan",
            "--config",
            "<recipe_4b>",
            "--role1.pretrain",
            "Qwen/Qwen3.5-4B",
            "--role2.pretrain",
            "Qwen/Qwen3.5-4B",
        ],
        {
            "--config": "path",
            "--nodes": "number",
            "--gpus-per-node": "number",
            "--gpu-memory": "number",
            "--model-config": "path",
            "--role1.pretrain": "path",
            "--role2.pretrain": "path",
            "--strict": "switch",
            "--rollout.batch_size": "number",
        },  # fmt: skip
        [],
    ),
    "train": (
        [
            "train",
            "--config",
            "<recipe>",
            "--role1.pretrain",
            "<sft>",
            "--role2.pretrain",
            "<sft>",
            "--ckpt.path",
            "{out}/run",
        ],  # fmt: skip
        {
            "--config": "path",
            "--role1.pretrain": "path",
            "--role2.pretrain": "path",
            "--train.iterations": "number",
            "--rollout.batch_size": "number",
            "--role1.lr": "number",
            "--pool.probs": "text",
            "--ckpt.path": "path",
            "--env.name": "text",
            "--logger.transcripts": "number",
            "--train.warn_uninformative": "number",
        },  # fmt: skip
        [],
    ),
    "eval": (
        ["eval", "--policy", "p=<sft>", "--self-play", "--out", "{out}/eval"],
        {
            "--policy": "policy",
            "--counterpart": "policy",
            "--in-system": "policy",
            "--self-play": "switch",
            "-n": "number",
            "--samples": "number",
            "--temperature": "number",
            "--top-p": "number",
            "--max-new-tokens": "number",
            "--max-len": "number",
            "--run": "path",
            "--data": "path",
            "--human-db": "path",
            "--batch": "number",
            "--env": "text",
        },  # fmt: skip
        [],
    ),
    "show": (["show"], {"--iteration": "number", "-n": "number", "--all": "switch"}, ["path"]),
    "report": (["report"], {"--eval": "path", "--reference": "text"}, ["path"]),
    "play": (
        ["play", "--policy", "bot:greedy", "--env", "dond", "--db", "{out}/people.sqlite"],
        {
            "--policy": "policy",
            "--env": "text",
            "--db": "path",
            "--port": "number",
            "--host": "text",
            "-n": "number",
            "--max-message-chars": "number",
            "--max-body-bytes": "number",
            "--temperature": "number",
            "--top-p": "number",
            "--max-new-tokens": "number",
            "--max-rounds": "number",
            "--data": "path",
        },  # fmt: skip
        [],
    ),
    "annotate": (
        ["annotate", "--report", "--db", "{out}/labels.sqlite"],
        {
            "--blind": "switch",
            "--report": "switch",
            "--db": "path",
            "--port": "number",
            "--max-message-chars": "number",
            "--host": "text",
        },  # fmt: skip
        [],
    ),
    "demo": (["demo", "--out", "{out}/demo"], {"--config": "path", "--iterations": "number", "--sft": "path"}, []),
    "dond sample": (["dond", "sample"], {"-n": "number", "--seed": "number"}, []),
    "dond check-data": (["dond", "check-data"], {}, ["path"]),
    "telesales profiles": (["telesales", "profiles"], {"-n": "number", "--seed": "number", "--out": "path"}, []),
    "telesales calls": (["telesales", "calls"], {"-n": "number", "--seed": "number", "--out": "path"}, []),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_answers_in_one_line_or_runs(name, files, stubs) -> None:
    command, flags, positional = COMMANDS[name]

    @CLI
    @given(argv=_argv(files, command, flags, positional))
    def case(argv):
        run(argv, stubs)

    case()
    seen = OUTCOMES[name]
    print(f"{name}: {dict(seen)}")
    assert sum(seen.values()) >= min(EXAMPLES, 1000) and seen["exit 2"] > 0, seen  # refused cases were drawn ...
    if name not in ("dond check-data", "report", "show"):  # (their inputs here are all broken)
        assert seen["started"] + seen["exit 0"] > 0, seen  # ... and cases that got through


def test_the_tier_can_fail(stubs, parser) -> None:
    """A traceback is caught as a failure, not passed over."""
    import argparse

    def broken(args):
        raise json.JSONDecodeError("boom", "", 0)

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["show"]
    func = sub.get_default("func")
    sub.set_defaults(func=broken)
    try:
        with pytest.raises(json.JSONDecodeError):
            run(["show", "x"], stubs)
    finally:
        sub.set_defaults(func=func)


def _record(k: int) -> dict:
    """A whole kept dialogue of iteration ``k``, as the trainer writes it (rollout/transcripts.py)."""
    from types import SimpleNamespace as NS

    from marti_ibrl.rollout.transcripts import transcript_record

    turns = [
        NS(role="agent1", text="<try> item0=1 <try>", valid=True, resamples=1),
        NS(role="agent2", text="ça", valid=False, resamples=0),
    ]
    outcome = NS(agreed=False, malformed=True, utilities={}, info={"fault_role": "agent2", "reason": "x"})
    traj = NS(scenario_uid=f"s{k}", sample_index=0, seats=["agent1", "agent2"], policies={"agent1": "current", "agent2": "pool:1"},
              turns=turns, rewards={"agent1": 0.5, "agent2": -1.0}, outcome=outcome, truncated=False, discarded=[])  # fmt: skip
    return transcript_record(k, traj)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def transcript_line(draw) -> bytes:
    """A line of RUN/transcripts.jsonl as a crash, an edit or another program may leave it."""
    rec = _record(draw(st.integers(1, 4)))
    kind = draw(st.sampled_from(["whole", "field", "drop", "cut", "bytes", "json", "deep"]))
    if kind == "field":  # one field of another type
        rec[draw(st.sampled_from(sorted(rec)))] = draw(JSON_VALUES)
    elif kind == "drop":
        rec.pop(draw(st.sampled_from(sorted(rec))))
    elif kind == "bytes":
        return draw(st.binary(max_size=300)).replace(b"\n", b" ")
    elif kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    elif kind == "deep":
        n = draw(st.integers(50, 5000))
        return b"[" * n + b"]" * n
    line = json.dumps(rec, ensure_ascii=False).encode()
    if kind == "cut":
        line = line[: draw(st.integers(0, len(line) - 1))]  # even inside a UTF-8 character
    return line


def test_show_reads_any_transcripts_file(stubs) -> None:
    """Issue 63: hypothesis-made ``transcripts.jsonl`` files (whole records, fields of other types or gone, lines cut
    anywhere, bytes, other JSON, deep nesting) under ``show`` in each of its modes: exit 0, or 2 with one line."""
    run_dir = stubs / "run"
    run_dir.mkdir()
    seen = Counter()

    @CLI
    @given(lines=st.lists(transcript_line(), min_size=0, max_size=8), mode=st.sampled_from([[], ["--all"], ["--malformed"], ["-n", "1"], ["--iteration", "2"]]))  # fmt: skip
    def case(lines, mode):
        (run_dir / "transcripts.jsonl").write_bytes(b"\n".join(lines) + (b"\n" if lines else b""))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["show", str(run_dir), *mode])
        text = err.getvalue()
        assert "Traceback" not in text and code in (0, 2), (lines, mode, code, text)
        assert len([line for line in text.splitlines() if ": error: " in line]) == (code == 2), text
        seen[f"exit {code}"] += 1

    case()
    assert sum(seen.values()) >= min(EXAMPLES, 1000) and seen["exit 0"] > 0 and seen["exit 2"] > 0, seen
