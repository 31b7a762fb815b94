"""``marti-ibrl play`` and ``marti-ibrl annotate`` in a real headless Chromium (Debian's ``chromium``, ``make
chromium``) driven by Playwright: a DoND game to a deal and one to a walk-away, a TeleSales call to consent (the
committed tiny SFT checkpoint as the sales agent), two annotators labelling the same five calls; bad input on every
page; then the database, the ``eval --human-db`` table and the κ report against hand-computed values.

Screenshots of every page go to ``$PEOPLE_SCREENSHOTS`` when set (``docs/images/`` holds the committed ones:
``PEOPLE_SCREENSHOTS=docs/images``), else to the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from people_calls import write_calls

from marti_ibrl.cli import main
from marti_ibrl.envs.dond.game import utility
from marti_ibrl.eval.dond.metrics import first_best
from marti_ibrl.people.annotate import load_calls
from marti_ibrl.people.app import create_app
from marti_ibrl.people.store import Store

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (as root: make chromium)", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package ([dev] extra)")
uvicorn = pytest.importorskip("uvicorn", reason="the people extra")

TINY_SFT = str(Path(__file__).resolve().parents[2] / "recipes" / "dond" / "tiny-sft")


def play_args(**kw):
    import argparse

    base = dict(policy="bot:greedy", env="dond", name=None, num_scenarios=4, scenario_seed=1, data=None, prompt_style="paper",
                show_complement=False, max_rounds=10, lang="en", temperature=1.0, top_p=1.0, max_new_tokens=24, seed=0)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


class Server:
    """The app served by uvicorn on a free local port, in a thread."""

    def __init__(self, app):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def shots(tmp_path):
    out = Path(os.environ.get("PEOPLE_SCREENSHOTS") or tmp_path / "shots")
    out.mkdir(parents=True, exist_ok=True)
    return lambda page, name: page.screenshot(path=str(out / f"{name}.png"), full_page=True)


def serve(store, **kw):
    return Server(create_app(store, **kw))


class Command:
    """``marti-ibrl ARGS --port P`` in a subprocess (the command line end to end), until its page answers."""

    def __init__(self, *args: str):
        import subprocess
        import sys
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        exe = Path(sys.executable).with_name("marti-ibrl")
        self.proc = subprocess.Popen([str(exe), *args, "--port", str(port)], stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{port}/"
        deadline = time.time() + 120
        while True:
            assert self.proc.poll() is None, self.proc.stderr.read()
            try:
                urllib.request.urlopen(self.url, timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "the server did not start"
                time.sleep(0.2)

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(30)
        return self.proc.stderr.read()


def wait_text(page, selector: str, text: str, timeout: float = 60_000):
    page.wait_for_function(
        "([s, t]) => document.querySelector(s) && document.querySelector(s).textContent.includes(t)",
        arg=[selector, text],
        timeout=timeout,
    )


def load_calls_then(store, files) -> list[dict]:
    """The calls ``annotate`` will register: the ones there, and the files' (registered here in a scratch copy)."""
    scratch = Store(store.path.with_name("scratch.sqlite"))
    load_calls(scratch, files)
    return scratch.calls()


def transcript(page) -> list[str]:
    return page.locator("#transcript li").all_inner_texts()


def test_dond_deal_walk_away_and_bad_input(browser, tmp_path, shots, capsys) -> None:
    from marti_ibrl.commands.people import build_game

    store = Store(tmp_path / "people.sqlite")
    server = serve(store, game=build_game(play_args()))
    try:
        page = browser.new_page()
        page.goto(server.url)
        page.click("#start")
        wait_text(page, "#gameinfo", "Game 1 (active)")
        values = [int(v) for v in page.locator("#items tbody tr td:nth-child(3)").all_inner_texts()]
        counts = [int(v) for v in page.locator("#items tbody tr td:nth-child(2)").all_inner_texts()]
        before = store.counts()
        # bad input: an empty message, an allocation beyond the counts
        page.click("#send")
        wait_text(page, "#error", "empty message")
        page.fill("#alloc0", "9")
        page.click("#propose")
        assert page.input_value("#message") == "<try> item0=9 item1=0 item2=0 <try>"
        page.click("#send")
        wait_text(page, "#error", "exceeds the item counts")
        # a message over the limit: refused on the page, and by the server (422, 413) when the page's check is
        # bypassed; the text stays in the box to be shortened
        long = "x" * 2001 + " <try> item0=0 item1=0 item2=0 <try>"
        page.fill("#message", long)
        page.click("#send")
        wait_text(page, "#error", "message too long: 2,037 characters, at most 2,000: shorten it and send it again")
        page.evaluate("() => { LIMITS.message = LIMITS.body = 1e9; say(''); }")
        page.click("#send")
        wait_text(page, "#error", "message too long: 2,037 characters, at most 2,000: shorten it and send it again")
        page.fill("#message", "y" * 100_000)
        page.click("#send")
        wait_text(page, "#error", "request too large: over 65,536 bytes")
        assert page.input_value("#message") == "y" * 100_000
        assert store.counts() == before
        # a generous offer through the allocation widget: the bot selects everything it was offered
        page.fill("#message", "All yours.")
        for i in range(3):
            page.fill(f"#alloc{i}", "0")
        page.click("#propose")
        page.click("#send")
        wait_text(page, "#offer", "Their offer leaves you: item0=0 item1=0 item2=0")
        shots(page, "people-play-dond")
        # a double submit: two clicks before the first answer, the same action id
        page.evaluate("() => { document.getElementById('accept').click(); document.getElementById('accept').click(); }")
        wait_text(page, "#result", "Deal!")
        wait_text(page, "#notice", "Already recorded")
        shots(page, "people-play-dond-result")
        their = [int(x.split("=")[1]) for x in page.inner_text("#result").split("were: ")[1].rstrip(".").split()]
        assert f"Your points: {utility([0, 0, 0], values)}" in page.inner_text("#result")
        assert f"Their points: {utility(counts, their)}" in page.inner_text("#result")
        deal = store.games("dond")[0]
        assert deal["status"] == "finished" and deal["outcome"]["agreed"] and len(deal["turns"]) == 3
        assert deal["turns"][0]["text"] == "All yours. <try> item0=0 item1=0 item2=0 <try>"
        assert store.counts()["actions"] == 2  # the offer and one accept
        # game 1: the bot opens, the person walks away
        page.click("#start")
        wait_text(page, "#gameinfo", "Game 2 (active)")
        assert transcript(page)[0].startswith("Them")
        page.click("#walkaway")
        wait_text(page, "#result", "No deal (disagree)")
        walk = store.games("dond")[1]
        assert walk["outcome"]["agreed"] is False and walk["turns"][-1]["text"] == "<disagree>"
        assert [t["role"] for t in walk["turns"]] == ["agent1", "agent2"] and walk["human_role"] == "agent2"
        # a tab closed half way: the game is abandoned, never a no-deal
        page.click("#start")
        wait_text(page, "#gameinfo", "Game 3 (active)")
        page.close()
        assert store.abandon_active() == 1
    finally:
        server.stop()
    assert [g["status"] for g in store.games("dond")] == ["finished", "finished", "abandoned"]
    assert main(["eval", "--human-db", str(store.path), "--out", str(tmp_path / "eval")]) == 0
    table = capsys.readouterr().out
    joint = utility(counts, their) / first_best(deal["scenario"])
    # seat-averaged (opened: the walk-away, 0/1; answered: the deal, own utility 10/10): agreement .5, own utility and
    # joint value undefined as a seat average since the opened seat has no deal
    assert "| greedy vs human | 2 | 0.50 | – | – | 0.50 | 0.00 | 0.00 |" in table, table
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())["pairs"][0]["summary"]
    assert summary["answered"]["own_utility"] == 1.0 and summary["answered"]["joint_value"] == pytest.approx(joint)


def test_unknown_token_is_refused_on_the_page(browser, tmp_path, shots) -> None:
    """``marti-ibrl play`` itself, off 127.0.0.1's default with a token: a wrong one is refused on the page."""
    db = tmp_path / "people.sqlite"
    server = Command("play", "--policy", "bot:greedy", "--env", "dond", "--db", str(db), "--token", "s3cret")
    try:
        page = browser.new_page()
        page.goto(server.url + "?token=guess")
        wait_text(page, "#error", "unknown token")
        page.click("#start")
        wait_text(page, "#error", "unknown token")
        shots(page, "people-unknown-token")
        store = Store(db)
        assert store.counts()["participants"] == 0 and store.counts()["games"] == 0
        page.goto(server.url + "?token=s3cret")
        page.click("#start")
        wait_text(page, "#gameinfo", "Game 1 (active)")
        assert store.counts()["games"] == 1 and store.games()[0]["policy"] == "greedy"
    finally:
        err = server.stop()
    assert "playing greedy (dond) at http://127.0.0.1:" in err and "?token=s3cret" in err


def test_telesales_call_to_consent(browser, tmp_path, shots) -> None:
    from marti_ibrl.commands.people import build_game

    store = Store(tmp_path / "people.sqlite")
    game = build_game(play_args(policy=TINY_SFT, env="telesales", name="tiny-sales", num_scenarios=2))
    server = serve(store, game=game)
    try:
        page = browser.new_page()
        page.goto(server.url)
        page.click("#start")
        wait_text(page, "#card", "personality")
        wait_text(page, "#transcript", "Agent")
        page.click("#say")
        wait_text(page, "#error", "empty message")
        page.fill("#message", "Which car is this about?")
        page.click("#say")
        page.wait_for_function("() => document.querySelectorAll('#transcript li').length >= 3")
        shots(page, "people-play-telesales")
        page.click("#consent")
        wait_text(page, "#result", "you agreed to add the agent on WeChat")
        shots(page, "people-play-telesales-result")
    finally:
        server.stop()
    (call,) = store.games("telesales", "finished")
    assert call["policy"] == "tiny-sales" and call["human_role"] == "customer" and call["policy_role"] == "sales"
    assert call["outcome"]["agreed"] and call["outcome"]["info"]["outcome"] == "success"
    roles = [t["role"] for t in call["turns"]]
    assert roles == ["sales", "customer", "sales", "customer"]
    said = [json.loads(t["text"]) for t in call["turns"] if t["role"] == "customer"]
    assert [s["reply"] for s in said] == ["Which car is this about?", "OK, I'll add you on WeChat."]
    assert [s["action"] for s in said] == ["Hesitate", "ConfirmAdded"]


def test_two_annotators_label_five_calls(browser, tmp_path, shots, capsys) -> None:
    files, truth = write_calls(tmp_path / "episodes")
    store = Store(tmp_path / "labels.sqlite")
    assert load_calls(store, files[:1]) == (3, 0)  # `annotate` adds the other file's two and keeps these three
    profile = {c["id"]: c["profile_id"] for c in load_calls_then(store, files)}
    by_profile = sorted(truth)
    # A labels as the simulator recorded; B says "no" to the second success and "unclear" to the last failure
    plan = {
        "A": {p: "yes" if truth[p] else "no" for p in by_profile},
        "B": dict(zip(by_profile, ["yes", "no", "no", "no", "unclear"], strict=True)),
    }
    server = Command("annotate", *map(str, files), "--blind", "--db", str(store.path))  # the command line itself
    seen = {}
    try:
        for name in ("A", "B"):
            page = browser.new_context().new_page()
            page.goto(server.url)
            page.fill("#annotator", name)
            page.click("#begin")
            seen[name] = []
            for k in range(5):
                wait_text(page, "#progress", f"Call {k + 1} of 5")
                cid = page.inner_text("#callid")
                seen[name].append(cid)
                text = page.inner_text("#call")
                for hidden in ("ibrl", "baseline", "ConfirmAdded", "HangUp", "rubric", "willingness"):
                    assert hidden not in text
                if name == "A" and k == 0:
                    n = store.counts()["labels"]
                    page.click("#submit")  # no label chosen
                    wait_text(page, "#error", "choose one of yes, no, unclear")
                    assert store.counts()["labels"] == n
                    shots(page, "people-annotate")
                page.check(f"#label-{plan[name][profile[cid]]}")
                page.fill("#note", f"{name} on call {k + 1}")
                if name == "B" and k == 0:  # a double submit
                    page.evaluate("() => { const b = document.getElementById('submit'); b.click(); b.click(); }")
                    wait_text(page, "#notice", "Already recorded")
                else:
                    page.click("#submit")
            wait_text(page, "#done", "All 5 calls labelled")
            if name == "B":
                shots(page, "people-annotate-done")
    finally:
        err = server.stop()
    assert "2 calls added (3 already there, 5 in all)" in err
    assert sorted(seen["A"]) == sorted(seen["B"]) == sorted(profile) and seen["A"] != seen["B"]
    labels = store.labels()
    assert len(labels) == 10 and all(r["note"] for r in labels)
    assert {(r["annotator"], profile[r["call_id"]]): r["label"] for r in labels} == {
        (a, p): label for a, by in plan.items() for p, label in by.items()
    }
    assert main(["annotate", "--report", "--db", str(store.path)]) == 0
    out = capsys.readouterr().out
    # A vs B: p_o = 3/5, p_e = .4 * .2 + .6 * .6 = .44, kappa = .16 / .56 = 0.2857; A vs simulator: identical labels
    assert "| A vs B | 5 | 60.0% | 0.29 |" in out
    assert "| A vs simulator | 5 | 100.0% | 1.00 | [1.00, 1.00] |" in out
    assert "| B vs simulator | 5 | 60.0% | 0.29 |" in out
