"""Issue 53 item 4: progress in a log file is plain lines (no carriage returns, no cursor moves)."""

from __future__ import annotations

import io

from tqdm import tqdm

from marti_ibrl import progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_keeps_tqdm_as_it_is() -> None:
    assert progress.log_style(Tty()) == {}


def test_a_log_gets_plain_lines_even_from_nested_bars(monkeypatch) -> None:
    log = io.StringIO()
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.0)
    style = {**progress.log_style(log), "mininterval": 0.0, "maxinterval": 0.0}
    outer = tqdm(range(3), desc="IB-RL", unit="it", **style)
    for _ in outer:
        inner = tqdm(total=4, desc="rollout", unit="dlg", leave=False, **style)
        for _ in range(4):
            inner.update(1)
        tqdm.write("iteration done", file=style["file"])
        inner.close()
    outer.close()
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert any(line.startswith("IB-RL: 100%") and "3/3" in line for line in lines), lines
    assert any(line.startswith("rollout:") and "4/4" in line for line in lines), lines
    assert lines.count("iteration done") == 3 and all(line == line.strip() and line for line in lines)


def test_bar_picks_the_style_of_stderr(monkeypatch) -> None:
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    with progress.bar(total=2, desc="x") as b:
        b.update(2)
    assert "\r" not in log.getvalue() and "x: 100%" in log.getvalue()
