"""Issue 50: what an outside probe found answered with a traceback (or not at all) is one `error:` line and exit 2,
before anything is started or written."""

from __future__ import annotations

import json

import pytest
from fake_model import fake_checkpoint

from marti_ibrl.cli import main

SFT = "recipes/dond/tiny-sft"


def _one_line(capsys, code: int, *needles: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert all(n in err[0] for n in needles), err
    assert "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--gpus-per-node", "0"], "argument --gpus-per-node: expected a number >= 1, got 0"),
        (["--nodes", "0"], "argument --nodes: expected a number >= 1, got 0"),
        (["--gpu-memory", "nan"], "argument --gpu-memory: expected a finite number > 0 and <= 16384, got nan"),
        (["--gpu-memory", "inf"], "argument --gpu-memory: expected a finite number > 0 and <= 16384, got inf"),
        (["--gpu-memory", "1e300"], "argument --gpu-memory: expected a finite number > 0 and <= 16384, got 1e300"),
        (["--model-config", "{notjson}"], "--model-config {notjson}: not a JSON config (JSONDecodeError"),
        (["--model-config", "{alist}"], "--model-config {alist}: not a config.json (a JSON list, not an object)"),
    ],
)
def test_plan(tmp_path, capsys, flags, needle) -> None:
    (tmp_path / "n.json").write_text("nope{")
    (tmp_path / "l.json").write_text("[1, 2]")
    fill = {"{notjson}": str(tmp_path / "n.json"), "{alist}": str(tmp_path / "l.json")}
    flags = [fill.get(f, f) for f in flags]
    needle = needle.replace("{notjson}", fill["{notjson}"]).replace("{alist}", fill["{alist}"])
    base = ["plan", "--config", "recipes/dond/qwen3.5-4b.yaml", "--role1.pretrain", "Qwen/Qwen3.5-4B"]
    _one_line(capsys, main([*base, "--role2.pretrain", "Qwen/Qwen3.5-4B", *flags]), needle)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["play", "--policy", "bot:greedy", "--env", "dond", "--db", "{db}", "--port", "99999"], "got 99999"),
        (["eval", "--policy", f"p={SFT}", "--self-play", "-n", "100000000000", "--out", "{out}"], "in 1..1000000"),
        (["eval", "--policy", f"p={SFT}", "--self-play", "--samples", "0", "--out", "{out}"], "--samples"),
        (["eval", "--policy", f"p={SFT}", "--self-play", "--temperature", "inf", "--out", "{out}"], "finite"),
    ],
)
def test_numbers_out_of_range(tmp_path, capsys, argv, needle) -> None:
    """`play --port 99999` printed a link to port 99999 and listened elsewhere; `eval -n 1e11` hung for minutes."""
    fill = {"{db}": str(tmp_path / "p.sqlite"), "{out}": str(tmp_path / "out")}
    _one_line(capsys, main([fill.get(a, a) for a in argv]), needle)
    assert not (tmp_path / "out").exists() and not (tmp_path / "p.sqlite").exists()


def test_databases_that_are_not_sqlite(tmp_path, capsys) -> None:
    bad = tmp_path / "notes.sqlite"
    bad.write_text("not a database\n")
    for argv in (
        ["eval", "--human-db", str(bad), "--out", str(tmp_path / "he")],
        ["annotate", "--report", "--db", str(bad)],
        ["play", "--policy", "bot:greedy", "--env", "dond", "--db", str(bad), "--port", "8766"],
    ):
        _one_line(capsys, main(argv), f"{bad}: not a database marti-ibrl can use (file is not a database)")
        assert bad.read_text() == "not a database\n"
    _one_line(
        capsys,
        main(["play", "--policy", "bot:greedy", "--env", "dond", "--db", str(tmp_path), "--port", "8766"]),
        f"{tmp_path} is a directory; give a SQLite file",
    )


def test_annotate_a_record_without_episode_id(tmp_path, capsys) -> None:
    rec = tmp_path / "rec.jsonl"
    rec.write_text(json.dumps({"x": 1}) + "\n")
    code = main(["annotate", str(rec), "--blind", "--db", str(tmp_path / "l.sqlite"), "--port", "8767"])
    _one_line(capsys, code, f"{rec}: record 1 has no episode_id: not a `telesales eval` episode file")


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("- 1\n- 2\n", "config.yaml is not a training config (a YAML ListConfig, not a mapping)"),
        ("env:\n  name: dond\n  max_rounds: abc\n", "has env.max_rounds: 'abc', not of type int"),
    ],
)
def test_eval_run_with_a_damaged_config(tmp_path, capsys, config, needle) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config)
    code = main(["eval", "--run", str(run), "--policy", f"p={SFT}", "--self-play", "--out", str(tmp_path / "o")])
    _one_line(capsys, code, f"--run {run}", needle)
    assert not (tmp_path / "o").exists()


def test_eval_data_not_in_lewis_format(tmp_path, capsys) -> None:
    data = tmp_path / "lewis.txt"
    data.write_text("garbage line\n")
    code = main(["eval", "--data", str(data), "--policy", f"p={SFT}", "--self-play", "--out", str(tmp_path / "o")])
    _one_line(capsys, code, f"--data {data}:1: line is not '<input>")
    assert not (tmp_path / "o").exists()  # (eval_settings.json was written before the data was read)


def test_a_pretrain_whose_config_is_not_json(tmp_path, capsys) -> None:
    m = fake_checkpoint(tmp_path / "m")
    (m / "config.json").write_text("nope{")
    code = main(["train", "--config", "recipes/dond/tiny-cpu.yaml", "--role1.pretrain", str(m), "--role2.pretrain",
                 SFT, "--ckpt.path", str(tmp_path / "run")])  # fmt: skip
    _one_line(capsys, code, f"--role1.pretrain: {m / 'config.json'} is not JSON")


def test_eval_on_a_full_disk_stops_in_one_line_and_resumes_later(tmp_path, capsys, monkeypatch) -> None:
    """`eval` on a full disk was a traceback; now one line, exit 4 (stopped, resumable), the lock released."""
    import errno

    from marti_ibrl.commands import eval as command

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "o" / "episodes" / "p__p.jsonl"))

    monkeypatch.setattr(command, "evaluate", full)
    code = main(["eval", "--policy", f"p={SFT}", "--self-play", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4 and len(err) == 1 and "No space left on device" in err[0] and "to resume" in err[0], err
    assert not (tmp_path / "o").exists()  # nothing but the lock was there, and it is released
