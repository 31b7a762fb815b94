"""Issue 52 item 5: `train --help` (and `demo --help`) list every schema flag with its default and documentation,
generated from the schema; `demo` takes train's --section.key flags."""

from __future__ import annotations

from dataclasses import fields, is_dataclass

import pytest

from marti_ibrl.cli import main
from marti_ibrl.config import schema


def _every_flag() -> list[str]:
    out = [f"--roleN.{f.name}" for f in fields(schema.RoleConfig)]
    for f in fields(schema.Config):
        value = f.default_factory() if callable(f.default_factory) else None
        if is_dataclass(value):
            out += [f"--{f.name}.{g.name}" for g in fields(value)]
        elif f.name != "roles":
            out.append(f"--{f.name}")
    return out


@pytest.mark.parametrize("command", ["train", "demo"])
def test_help_lists_every_schema_flag_with_its_default_and_doc(command, capsys) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    missing = [flag for flag in _every_flag() if f"  {flag} (default " not in out]
    assert missing == [] and len(_every_flag()) >= 85
    # a field's default and the first words of its docstring, as the schema has them
    assert "  --train.warn_uninformative (default 5)\n      Warn once per role, in one console line" in out
    assert "  --roleN.lr (default 1e-06)\n      Adam learning rate" in out


def test_demo_takes_trains_flags(tmp_path, monkeypatch, capsys) -> None:
    from marti_ibrl import trainer

    seen = []

    def train(cfg):
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(trainer, "train", train)
    argv = ["demo", "--sft", "recipes/dond/tiny-sft", "--out", str(tmp_path / "demo"), "--iterations", "2"]
    with pytest.raises(SystemExit):
        main([*argv, "--role1.lr", "5e-4", "--train.seed", "3"])
    assert seen[0].roles[0].lr == 5e-4 and seen[0].train.seed == 3 and seen[0].train.iterations == 2
    assert main([*argv, "--role1.lr", "-1"]) == 2
    assert capsys.readouterr().err.strip().endswith("marti-ibrl demo: error: --role1.lr: must be > 0")
