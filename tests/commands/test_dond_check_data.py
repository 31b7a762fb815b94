"""``dond check-data`` and ``dond sample`` subcommands, called through a tiny argparse CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from marti_ibrl.commands.dond import add_dond_subparsers, record_scores
from marti_ibrl.envs.dond.scenarios import DondScenario, parse_lewis_line, rule_violations

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dond_lewis_sample.txt"


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="marti-ibrl")
    add_dond_subparsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_check_data_clean_fixture(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["dond", "check-data", str(FIXTURE)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"lines": 8, "agreed": 4, "no_deal": 4, "mismatches": 0, "unparseable": 0}
    assert err == ""


def test_check_data_reports_mismatch_and_garbage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = FIXTURE.read_text().splitlines()
    # line 3: THEM's recorded pick of item2 no longer complements YOU's (3+0 books, 0+1 hat, 0+1 of 2 balls)
    lines[2] = lines[2].replace("item0=0 item1=1 item2=2 </output>", "item0=0 item1=1 item2=1 </output>")
    lines.append("THEM: hello <eos> this is not a Lewis line")
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(lines) + "\n")
    assert run_cli(["dond", "check-data", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"lines": 9, "agreed": 4, "no_deal": 4, "mismatches": 1, "unparseable": 1}
    assert "mismatch at lines 3" in err
    assert "unparseable lines 9" in err


def test_record_scores() -> None:
    lines = FIXTURE.read_text().splitlines()
    assert record_scores(parse_lewis_line(lines[0])) == (6, 8)
    assert record_scores(parse_lewis_line(lines[1])) == (8, 6)
    assert record_scores(parse_lewis_line(lines[2])) == (6, 10)
    assert record_scores(parse_lewis_line(lines[4])) == (0, 0)


def test_sample_prints_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["dond", "sample", "-n", "5", "--seed", "11"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5
    for line in out:
        obj = json.loads(line)
        assert set(obj) == {"counts", "values"} and len(obj["values"]) == 2
        assert rule_violations(DondScenario.from_json(obj)) == []
    assert run_cli(["dond", "sample", "-n", "5", "--seed", "11"]) == 0
    assert capsys.readouterr().out.splitlines() == out
