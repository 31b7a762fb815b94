"""marti_ibrl.people without a browser: the app's API (FastAPI's test client), the store, blind annotation, Cohen's
κ and ``eval --human-db``, each against hand-computed values. The browser itself: tests/e2e/test_e2e_people_browser.py."""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest
from people_calls import write_calls

from marti_ibrl.cli import main
from marti_ibrl.commands.people import build_game
from marti_ibrl.envs.dond.game import utility
from marti_ibrl.people.agreement import agreement, contingency, report
from marti_ibrl.people.annotate import Annotation, blind_transcript, call_id, load_calls, order
from marti_ibrl.people.app import TOKEN_ENV, allowed_hosts, bind, check_bind, create_app, resolve_token
from marti_ibrl.people.human_eval import dond_episodes
from marti_ibrl.people.store import Rejected, Store

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402


def local(app) -> TestClient:
    """A client of ``app`` as a browser on this machine reaches it (Host 127.0.0.1: the apps refuse other names)."""
    return TestClient(app, base_url="http://127.0.0.1")


TINY_SFT = str(Path(__file__).resolve().parents[2] / "recipes" / "dond" / "tiny-sft")


def play_args(policy: str = "bot:greedy", env: str = "dond", **kw) -> argparse.Namespace:
    base = dict(policy=policy, env=env, name=None, num_scenarios=4, scenario_seed=1, data=None, prompt_style="paper",
                show_complement=False, max_rounds=10, lang="en", temperature=1.0, top_p=1.0, max_new_tokens=24, seed=0)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


class Player:
    """A person at the API: their participant id and the action ids their page sends."""

    def __init__(self, client: TestClient):
        self.client = client
        self.pid = client.post("/api/participant").json()["participant"]
        self.n = 0

    def start(self) -> dict:
        return self.client.post("/api/games", json={"participant": self.pid}).json()["game"]

    def act(self, game_id: int, kind: str, text: str = "", action_id: str | None = None):
        self.n += 1
        body = {
            "participant": self.pid,
            "action_id": action_id or f"{self.pid}-{self.n}",
            "action": {"kind": kind, "text": text},
        }
        return self.client.post(f"/api/games/{game_id}/act", json=body)


@pytest.fixture
def dond(tmp_path):
    store = Store(tmp_path / "people.sqlite")
    game = build_game(play_args())
    return store, game, local(create_app(store, game=game))


IMPORT_WITHOUT_WEB = r"""
import importlib, pkgutil, sys
for m in ("fastapi", "uvicorn", "playwright", "starlette"):
    sys.modules[m] = None  # as if the people extra were not installed
import marti_ibrl.people
for m in pkgutil.walk_packages(marti_ibrl.people.__path__, "marti_ibrl.people."):
    importlib.import_module(m.name)
from marti_ibrl.cli import main
sys.exit(main(["play", "--policy", "bot:greedy", "--env", "dond", "--db", sys.argv[1]]))
"""


def test_imports_without_the_people_extra(tmp_path) -> None:
    import subprocess
    import sys

    db = tmp_path / "p.sqlite"
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_WITHOUT_WEB, str(db)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "fastapi and uvicorn not installed: pip install -e '.[people]'" in out.stderr and not db.exists()


def test_bind_needs_a_token_off_loopback(monkeypatch) -> None:
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "secret")
    with pytest.raises(ValueError, match="--token"):
        check_bind("0.0.0.0", None)
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert resolve_token(None) == "from-env" and resolve_token("flag") == "flag"


def test_play_refuses_other_hosts_without_token(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    db = tmp_path / "p.sqlite"
    assert main(["play", "--policy", "bot:greedy", "--env", "dond", "--db", str(db), "--host", "0.0.0.0"]) == 2
    assert "--token" in capsys.readouterr().err and not db.exists()
    assert main(["play", "--policy", "bot:greedy", "--env", "telesales", "--db", str(db)]) == 2
    assert "scripted bots play Deal-or-No-Deal only" in capsys.readouterr().err and not db.exists()
    assert main(["play", "--policy", str(tmp_path), "--env", "dond", "--db", str(db)]) == 2
    assert "is not a model (no config.json" in capsys.readouterr().err and not db.exists()


def test_dond_deal_scored_by_the_env(dond) -> None:
    store, game, client = dond
    person = Player(client)
    g = person.start()  # game 0: the person is agent1 and opens
    assert g["your_turn"] and g["transcript"] == []
    values = [it["value"] for it in g["items"]]
    r = person.act(g["game_id"], "message", "All yours. <try> item0=0 item1=0 item2=0 <try>").json()["game"]
    assert r["transcript"][-1]["who"] == "them" and "<selection>" in r["transcript"][-1]["text"]
    counts = [it["count"] for it in g["items"]]
    assert r["offer"] == [0, 0, 0] and r["must_answer"]
    done = person.act(g["game_id"], "accept").json()["game"]
    assert done["status"] == "finished" and done["result"]["agreed"]
    their = done["result"]["their_values"]
    assert done["result"]["your_utility"] == utility([0, 0, 0], values) == 0
    assert done["result"]["their_utility"] == utility(counts, their) == 10
    row = store.game(g["game_id"])
    assert row["status"] == "finished" and [t["role"] for t in row["turns"]] == ["agent1", "agent2", "agent1"]
    assert row["turns"][2]["text"] == "<selection> item0=0 item1=0 item2=0 <selection>"


def test_bad_input_changes_nothing(dond, tmp_path) -> None:
    store, game, client = dond
    person = Player(client)
    g = person.start()
    before = store.counts()
    cases = [
        ("message", "<try> item0=9 item1=0 item2=0 <try>", "exceeds the item counts"),
        ("message", "   ", "empty message"),
        ("message", "<try> item0=1 <try>", "body must be exactly"),
        ("accept", "", "no offer to accept"),
        ("dance", "", "unknown action"),
    ]
    for kind, text, reason in cases:
        r = person.act(g["game_id"], kind, text)
        assert r.status_code == 400 and reason in r.json()["error"], r.json()
    assert store.counts() == before
    # a double submit (the same action id twice) is stored once
    first = person.act(g["game_id"], "message", "hi <try> item0=1 item1=0 item2=0 <try>", action_id="same")
    counts = store.counts()
    again = person.act(g["game_id"], "message", "hi <try> item0=1 item1=0 item2=0 <try>", action_id="same")
    assert first.json()["duplicate"] is False and again.json()["duplicate"] is True
    assert again.json()["game"] == first.json()["game"] and store.counts() == counts
    # someone else's game
    other = Player(client)
    counts = store.counts()
    r = other.act(g["game_id"], "walk_away")
    assert r.status_code == 404 and r.json()["error"] == f"no game {g['game_id']} of yours" and store.counts() == counts


def test_token_checked_on_every_request(tmp_path) -> None:
    store = Store(tmp_path / "p.sqlite")
    client = local(create_app(store, game=build_game(play_args()), token="s3cret"))
    assert client.get("/").status_code == 200  # the page itself, which then shows the API's refusal
    r = client.post("/api/participant", headers={"X-Token": "wrong"})
    assert r.status_code == 403 and "unknown token" in r.json()["error"]
    assert client.post("/api/participant").json()["error"].startswith("no token")
    assert store.counts()["participants"] == 0
    assert client.post("/api/participant", headers={"X-Token": "s3cret"}).status_code == 200


def test_a_foreign_host_or_origin_gets_403_and_nothing_is_stored(tmp_path) -> None:
    """Issue 63: without a token, a DNS name rebound to 127.0.0.1 (``Host: evil.example``) and another site's form post
    (``Origin: http://evil.example``) each created a participant row; now 403, and the page's own requests pass."""
    store = Store(tmp_path / "p.sqlite")
    app = create_app(store, game=build_game(play_args()), hosts=allowed_hosts(None, ["lab-pc"]))
    client = local(app)
    r = client.post("/api/participant", headers={"Host": "evil.example"})
    assert r.status_code == 403 and "'evil.example' is not this app's host" in r.json()["error"]
    assert client.get("/", headers={"Host": "evil.example:8000"}).status_code == 403  # the page too
    r = client.post("/api/participant", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "http://evil.example" in r.json()["error"]
    assert client.post("/api/participant", headers={"Origin": "null"}).status_code == 403  # a sandboxed frame
    assert store.counts()["participants"] == 0
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "lab-pc:8000"):  # the loopback names, and ours
        origin = f"http://{host}"
        assert client.post("/api/participant", headers={"Host": host, "Origin": origin}).status_code == 200, host
    assert store.counts()["participants"] == 4
    assert allowed_hosts("s3cret", ["lab-pc"]) is None  # with a token, the token is the guard (no page can send it)


def test_half_finished_games_are_abandoned_never_no_deals(dond) -> None:
    store, game, client = dond
    person = Player(client)
    first = person.start()
    second = person.start()  # leaving the first half way
    assert store.game(first["game_id"])["status"] == "abandoned"
    r = person.act(first["game_id"], "walk_away")
    assert r.status_code == 400 and "abandoned" in r.json()["error"]
    person.act(second["game_id"], "walk_away")  # game 1: the policy (agent1) opened, the person walks away
    third = person.start()
    assert store.abandon_active() == 1 and store.game(third["game_id"])["status"] == "abandoned"
    episodes = dond_episodes(store)
    assert [e["episode_id"] for e in episodes] == [f"human-{second['game_id']}"]
    assert episodes[0]["agreed"] is False and episodes[0]["reason"] == "disagree"


def test_human_db_eval_tables(dond, tmp_path, capsys) -> None:
    store, game, client = dond
    person = Player(client)
    g0 = person.start()  # scenario 0, the policy answers (agent2)
    person.act(g0["game_id"], "message", "<try> item0=0 item1=0 item2=0 <try>")
    person.act(g0["game_id"], "accept")
    g1 = person.start()  # scenario 1, the policy opens (agent1)
    person.act(g1["game_id"], "walk_away")
    # hand-computed: the deal gives the policy every unit, own utility 10/10 = 1 and joint value 10 / first best
    scenario = store.game(g0["game_id"])["scenario"]
    from marti_ibrl.eval.dond.metrics import first_best

    joint = 10 / first_best(scenario)
    out = tmp_path / "eval"
    assert main(["eval", "--human-db", str(store.path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    # seat-averaged: answered seat 1/1 agreed, opened seat 0/1 -> agreement 0.5; utilities only on the answered seat
    summary = json.loads((out / "summary.json").read_text())["pairs"][0]["summary"]
    assert summary["answered"]["agreement"] == 1.0 and summary["opened"]["agreement"] == 0.0
    assert summary["averaged"]["agreement"] == 0.5 and summary["averaged"]["n"] == 2
    assert summary["answered"]["own_utility"] == 1.0 and summary["answered"]["joint_value"] == pytest.approx(joint)
    assert "| greedy vs human | 2 | 0.50 |" in text
    assert "Clustered by participant" in text and "Clustered by scenario" in text
    episodes = [json.loads(x) for x in (out / "episodes" / "greedy__human.jsonl").read_text().splitlines()]
    assert [e["participant"] for e in episodes] == [person.pid] * 2
    assert main(["eval", "--human-db", str(tmp_path / "none.sqlite"), "--out", str(out)]) == 2


def test_human_db_gee_by_participant_and_scenario(tmp_path, capsys) -> None:
    """Two policies, six participants: the GEE of the automatic evaluation runs on human games, clustered both ways."""
    store = Store(tmp_path / "p.sqlite")
    scenario = {"counts": [1, 1, 3], "values": [[7, 0, 1], [1, 9, 0]]}
    for p in range(6):
        pid = store.new_participant()
        for k in range(4):
            policy = "a" if k % 2 == 0 else "b"
            agreed = (p + k) % 3 != 0 if policy == "a" else (p + k) % 2 == 0
            alloc = {"agent1": [1, 0, 3], "agent2": [0, 1, 0]} if agreed else {}
            utilities = {"agent1": 10.0, "agent2": 9.0} if agreed else {"agent1": 0.0, "agent2": 0.0}
            outcome = {"agreed": agreed, "malformed": False, "failed": False, "utilities": utilities,
                       "info": {"reason": "deal" if agreed else "disagree", "allocations": alloc}}  # fmt: skip
            store.create_game(pid, "dond", policy, f"s{k % 2}", scenario, "agent2", "agent1",
                              ["agent1", "agent2"][:: 1 if k < 2 else -1], [], status="finished", outcome=outcome)  # fmt: skip
    assert main(["eval", "--human-db", str(store.path), "--out", str(tmp_path / "e")]) == 0
    stats = (tmp_path / "e" / "statistics.md").read_text()
    assert stats.count("Reference: **a**") == 2 and "GEE not estimable" not in stats


def test_checkpoint_seat_plays_a_turn(tmp_path) -> None:
    """The committed tiny SFT checkpoint in the policy's seat (HF generate in process, RoleView prompts)."""
    store = Store(tmp_path / "p.sqlite")
    game = build_game(play_args(policy=TINY_SFT, name="tiny"))
    client = local(create_app(store, game=game))
    person = Player(client)
    person.start()  # game 0: the person opens
    g = person.start()  # game 1: the checkpoint (agent1) opens
    row = store.game(g["game_id"])
    assert row["policy"] == "tiny" and row["turns"] and row["turns"][0]["role"] == "agent1"
    assert g["transcript"][0]["who"] == "them"


def test_a_message_too_long_for_the_checkpoint_is_refused_in_tokens(tmp_path) -> None:
    """Issue 50: with --max-message-chars raised to 400,000, a 300 KB message kept the shared engine 281 s (every
    other game waited). Now the checkpoint's prompt is bounded in tokens whatever the character limit: refused,
    nothing stored, and the game goes on."""
    store = Store(tmp_path / "p.sqlite")
    game = build_game(play_args(policy=TINY_SFT, name="tiny"))
    assert game.seat.max_prompt_tokens > 0
    client = local(create_app(store, game=game, max_message=400_000, max_body=6 * 400_000 + 4096))
    person = Player(client)
    g = person.start()  # game 0: the person opens
    long = "item0 " * 50_000  # 300,000 characters, far more tokens than the prompt may hold
    r = person.act(g["game_id"], "message", long)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err.startswith("too long for the policy to read: its prompt would be ") and "tokens, at most" in err, err
    assert store.game(g["game_id"])["turns"] == []  # nothing stored
    r = person.act(g["game_id"], "message", DEAL)  # a message of normal length: played, and answered
    assert r.status_code == 200, r.text
    assert [t["role"] for t in store.game(g["game_id"])["turns"]][:2] == ["agent1", "agent2"]


class ScriptedSales:
    """A sales agent that says the same thing every turn (its turn always valid)."""

    name = "scripted-sales"

    def respond(self, env, role, scenario, uid, seats, history):
        return "Hi, this is Li from the used-car app. Could I add you on WeChat?"


def test_telesales_consent_and_hang_up(tmp_path) -> None:
    from marti_ibrl.envs.telesales.profiles import generate_profiles
    from marti_ibrl.people.games import HumanCallEnv, TeleSalesGame

    store = Store(tmp_path / "p.sqlite")
    game = TeleSalesGame(HumanCallEnv(), ScriptedSales(), "scripted", generate_profiles(2, 3, "eval"))
    person = Player(local(create_app(store, game=game)))
    g = person.start()
    assert g["transcript"][0]["who"] == "them" and g["your_turn"]
    titles = [s["title"] for s in g["card"]]
    assert titles == ["identity", "purchase", "contact", "concerns", "speech", "what the agent's lead says about you"]
    profile = store.game(g["game_id"])["scenario"]
    assert ["name", profile["user_profile"]["identity"]["name"]] in g["card"][0]["fields"]
    assert "willingness" not in json.dumps(g["card"])  # the simulator's state is not the person's business
    assert person.act(g["game_id"], "say", "  ").json()["error"].startswith("empty message")
    g = person.act(g["game_id"], "say", "Which car?").json()["game"]
    g = person.act(g["game_id"], "consent").json()["game"]
    assert g["status"] == "finished" and g["result"] == {"success": True, "reason": "success", "outcome": "success"}
    turns = store.game(g["game_id"])["turns"]
    assert [t["role"] for t in turns] == ["sales", "customer", "sales", "customer"]
    assert json.loads(turns[-1]["text"])["action"] == "ConfirmAdded"
    h = person.start()
    h = person.act(h["game_id"], "hang_up").json()["game"]
    assert h["result"] == {"success": False, "reason": "hang_up", "outcome": "hang_up"}
    # eval --human-db: the calls as `telesales eval` episodes and its Table 1; then annotatable like any episodes
    assert main(["eval", "--human-db", str(store.path), "--out", str(tmp_path / "e")]) == 0
    results = (tmp_path / "e" / "telesales" / "results.md").read_text()
    # Success@1 = 1/2, Wilson: (.5 ± 1.96 * sqrt(.125 + .2401)) / (1 + 1.9208) -> [0.095, 0.905]; a person's turns carry
    # no rubric code, so the deltas are 0
    assert "| scripted | 2 × 1 | 0.500 [0.095, 0.905] | +0.000 | +0.000 |" in results
    episodes = tmp_path / "e" / "telesales" / "episodes" / "scripted__human.jsonl"
    recs = [json.loads(x) for x in episodes.read_text().splitlines()]
    assert [(r["success"], r["reason"], r["simulator"], r["participant"]) for r in recs] == [
        (True, "success", "human", person.pid),
        (False, "hang_up", "human", person.pid),
    ]
    labels = Store(tmp_path / "labels.sqlite")
    assert load_calls(labels, [episodes]) == (2, 0)
    assert sorted(c["simulator_label"] for c in labels.calls()) == ["no", "yes"]


def test_blind_annotation_order_and_labels(tmp_path) -> None:
    files, truth = write_calls(tmp_path / "episodes")
    store = Store(tmp_path / "labels.sqlite")
    assert load_calls(store, files) == (5, 0) and load_calls(store, files) == (0, 5)
    calls = store.calls()
    assert sorted(c["simulator_label"] for c in calls) == ["no", "no", "no", "yes", "yes"]
    ids = [c["id"] for c in calls]
    assert order("A", ids) == order("A", ids) and order("A", ids) != order("B", ids) and sorted(order("A", ids)) == ids
    shown = Annotation(store).next_call("A")
    assert shown["position"] == 1 and shown["total"] == 5 and shown["call_id"] == order("A", ids)[0]
    page = json.dumps(shown)
    for hidden in ("ibrl", "baseline", "ConfirmAdded", "HangUp", "rubric_hits", "willingness", "simulator-x"):
        assert hidden not in page
    rec = json.loads(files[0].read_text().splitlines()[0])
    assert blind_transcript(rec)[2]["text"].endswith("[The agent sent an SMS with a WeChat invitation link]")
    assert call_id("ibrl.jsonl", rec["episode_id"]) in ids
    with pytest.raises(Rejected, match="choose one of"):
        store.label("A", ids[0], "maybe")
    assert store.label("A", ids[0], "yes") == {"duplicate": False}
    assert store.label("A", ids[0], "yes") == {"duplicate": True}
    with pytest.raises(Rejected, match="already labelled"):
        store.label("A", ids[0], "no")
    assert [r["label"] for r in store.labels("A")] == ["yes"]


def test_misshapen_episodes_are_refused_at_load_and_simulator_is_reserved(tmp_path) -> None:
    """Issue 63: a string transcript was registered and then made every /api/annotate/next a 500 for that annotator;
    a list episode_id was a traceback; "simulator" was accepted as a person and doubled the report's rows."""
    files, _ = write_calls(tmp_path / "episodes")
    good = json.loads(Path(files[0]).read_text().splitlines()[0])
    cases = {
        "string transcript": ({**good, "transcript": "hello"}, "its transcript is a str, not a list of turns"),
        "turn not an object": ({**good, "transcript": ["hi"]}, "turn 1 of its transcript is not a {role, text} object"),
        "list id": ({**good, "episode_id": ["a", 1]}, "record 1's episode_id is not a string"),
    }
    for name, (rec, said) in cases.items():
        store = Store(tmp_path / f"{name}.sqlite")
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(rec) + "\n")
        with pytest.raises(ValueError, match=re.escape(said)):
            load_calls(store, [path])
        assert store.calls() == [], name  # nothing registered
    store = Store(tmp_path / "labels.sqlite")
    load_calls(store, files)
    client = local(create_app(store, annotation=Annotation(store)))
    for who in ("simulator", "Simulator"):
        r = client.post("/api/annotate/session", json={"annotator": who})
        assert r.status_code == 400 and "is the simulator's" in r.json()["error"], r.text
    session = client.post("/api/annotate/session", json={"annotator": "ana"}).json()["session"]
    assert client.get("/api/annotate/next", params={"session": session}).status_code == 200


def test_an_annotator_is_the_browser_that_chose_the_name_not_a_name_sent(tmp_path, capsys) -> None:
    """Issue 63: labels were stored under whatever name a request sent, so anyone could label as anyone. A name is
    now bound to the session of the browser that chose it; the organiser frees it with ``annotate --release``."""
    files, _ = write_calls(tmp_path / "episodes")
    store = Store(tmp_path / "labels.sqlite")
    load_calls(store, files)
    client = local(create_app(store, annotation=Annotation(store)))
    mine = client.post("/api/annotate/session", json={"annotator": "A"}).json()
    assert mine["annotator"] == "A" and len(mine["session"]) >= 32
    again = client.post("/api/annotate/session", json={"annotator": "A", "session": mine["session"]}).json()
    assert again["session"] == mine["session"]  # a reload: the page sends the session it kept
    for sent in (None, "guess", 7):  # another browser, or a guess
        r = client.post("/api/annotate/session", json={"annotator": "A", "session": sent})
        assert r.status_code == 409 and "is taken by another browser" in r.json()["error"], r.text
    first = client.get("/api/annotate/next", params={"session": mine["session"]}).json()["call_id"]
    # the name in the body, if any, is ignored: the label is the session's annotator's
    r = client.post("/api/annotate/label", json={"session": mine["session"], "annotator": "B", "call_id": first,
                                                 "label": "yes"})  # fmt: skip
    assert r.status_code == 200 and [(x["annotator"], x["call_id"]) for x in store.labels()] == [("A", first)]
    before = store.counts()
    for bad in ({"session": "guess"}, {"annotator": "A"}, {}):
        r = client.post("/api/annotate/label", json={**bad, "call_id": first, "label": "no"})
        assert r.status_code == 403 and r.json()["error"].startswith("unknown annotator session"), r.text
    assert client.get("/api/annotate/next", params={"session": "guess"}).status_code == 403
    assert store.counts() == before
    assert main(["annotate", "--release", "A", "--db", str(store.path)]) == 0
    assert capsys.readouterr().err == "annotator 'A' freed: the next browser to enter it continues its labels\n"
    moved = client.post("/api/annotate/session", json={"annotator": "A"}).json()["session"]
    assert (
        moved != mine["session"] and client.get("/api/annotate/next", params={"session": moved}).json()["position"] == 2
    )
    assert client.get("/api/annotate/next", params={"session": mine["session"]}).status_code == 403
    assert main(["annotate", "--release", "nobody", "--db", str(store.path)]) == 0
    assert "was not taken; nothing changed" in capsys.readouterr().err
    assert main(["annotate", "--release", "A", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert (
        capsys.readouterr().err.endswith("none.sqlite: no such database\n") and not (tmp_path / "none.sqlite").exists()
    )


def test_kappa_against_hand_computed_values(tmp_path) -> None:
    # A = the simulator; B disagrees on one success (no) and is unsure of one failure
    sim = ["yes", "yes", "no", "no", "no"]
    b = ["yes", "no", "no", "no", "unclear"]
    assert contingency(sim, b) == [[1, 1, 0], [0, 2, 1], [0, 0, 0]]
    res = agreement(sim, b)
    # p_o = 3/5; p_e = .4 * .2 + .6 * .6 + 0 * .2 = .44; kappa = (.6 - .44) / (1 - .44) = 2/7
    assert res["percent"] == pytest.approx(60.0) and res["kappa"] == pytest.approx(2 / 7)
    assert res["ci_low"] == pytest.approx(2 / 7 - 1.959964 * res["se"], abs=1e-5) and res["ci_high"] > res["kappa"]
    same = agreement(sim, sim)
    assert same["kappa"] == pytest.approx(1.0) and same["percent"] == 100.0
    assert agreement([], [])["kappa"] is None
    constant = agreement(["yes"] * 3, ["yes"] * 3)  # p_e = 1: kappa is 0/0
    assert constant["percent"] == 100.0 and constant["kappa"] is None and constant["ci_low"] is None
    # through the store: two annotators on five calls
    files, truth = write_calls(tmp_path / "episodes")
    store = Store(tmp_path / "labels.sqlite")
    load_calls(store, files)
    for c in store.calls():
        store.label("A", c["id"], c["simulator_label"])
    for c, label in zip(sorted(store.calls(), key=lambda c: c["profile_id"]), b):
        store.label("B", c["id"], label)
    rows = {(p["first"], p["second"]): p for p in report(store)["pairs"]}
    assert rows[("A", "simulator")]["kappa"] == pytest.approx(1.0)
    assert rows[("A", "B")]["kappa"] == pytest.approx(2 / 7) and rows[("B", "simulator")]["kappa"] == pytest.approx(
        2 / 7
    )
    assert rows[("A", "B")]["table"] == [[1, 1, 0], [0, 2, 1], [0, 0, 0]]


def test_endpoint_seat_uses_the_openai_client(tmp_path) -> None:
    """``--policy endpoint:MODEL@URL``: the evaluation's EndpointPlayer (its chat messages, its client) in the seat."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps(
                {"choices": [{"message": {"content": " I'd like the books. <try> item0=1 item1=0 item2=0 <try>"}}]}
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        game = build_game(play_args(policy=f"endpoint:negotiator@{url}", max_new_tokens=20, temperature=0.5))
        store = Store(tmp_path / "p.sqlite")
        person = Player(local(create_app(store, game=game)))
        g = person.start()  # the person opens
        g = person.act(g["game_id"], "message", "Hello! <try> item0=0 item1=1 item2=1 <try>").json()["game"]
    finally:
        server.shutdown()
    assert store.game(g["game_id"])["policy"] == "negotiator"
    assert g["transcript"][-1] == {"who": "them", "text": "I'd like the books. <try> item0=1 item1=0 item2=0 <try>"}
    (request,) = seen
    assert request["model"] == "negotiator" and request["temperature"] == 0.5 and request["max_tokens"] == 20
    messages = request["messages"]
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"].startswith("Hello!")
    assert "item0" in messages[0]["content"]  # the Table 17 role prompt of the policy's role


# ---- issue 36: never lose a user's work (limits, concurrency, one server per database, ids) -------------------------

DEAL = "<try> item0=0 item1=0 item2=0 <try>"


def test_oversized_message_and_body_refused_and_nothing_stored(dond, tmp_path) -> None:
    store, game, client = dond
    person = Player(client)
    g = person.start()  # game 0: the person opens
    before = store.counts()
    r = person.act(g["game_id"], "message", "x" * 2001)
    assert r.status_code == 422
    assert r.json()["error"] == "message too long: 2,001 characters, at most 2,000: shorten it and send it again"
    body = {"participant": person.pid, "action_id": "big", "action": {"kind": "message", "text": DEAL}}
    r = client.post(f"/api/games/{g['game_id']}/act", json={**body, "pad": "x" * 64 * 1024})
    assert r.status_code == 413
    assert (
        r.json()["error"] == "request too large: over 65,536 bytes (the server's --max-body-bytes); nothing was stored"
    )
    r = client.post(f"/api/games/{g['game_id']}/act", json={**body, "pad": "x" * 10 * 1024 * 1024})  # 10 MB
    assert r.status_code == 413 and store.counts() == before
    at_limit = "a" * (2000 - len(DEAL) - 1) + " " + DEAL
    r = person.act(g["game_id"], "message", at_limit)
    assert r.status_code == 200 and store.game(g["game_id"])["turns"][0]["text"] == at_limit
    # the limits are the server's flags; the page gets them with common.js, to check before sending
    small = local(create_app(store, game=game, max_message=10, max_body=8000))
    assert small.get("/common.js").text.startswith('const LIMITS = {"message": 10, "body": 8000};\n')
    r = small.post(f"/api/games/{g['game_id']}/act", json={**body, "action": {"kind": "message", "text": "x" * 11}})
    assert r.status_code == 422 and "11 characters, at most 10" in r.json()["error"]
    assert main(["play", "--policy", "bot:greedy", "--env", "dond", "--db", str(tmp_path / "x.sqlite"),
                 "--max-body-bytes", "1000"]) == 2  # fmt: skip


def test_oversized_annotation_note_refused(tmp_path) -> None:
    files, _ = write_calls(tmp_path / "episodes")
    store = Store(tmp_path / "labels.sqlite")
    load_calls(store, files)
    client = local(create_app(store, annotation=Annotation(store)))
    session = client.post("/api/annotate/session", json={"annotator": "A"}).json()["session"]
    first = client.get("/api/annotate/next", params={"session": session}).json()["call_id"]
    r = client.post(
        "/api/annotate/label", json={"session": session, "call_id": first, "label": "yes", "note": "n" * 2001}
    )
    assert r.status_code == 422 and r.json()["error"].startswith("note too long: 2,001 characters, at most 2,000")
    assert store.labels() == []
    r = client.post(
        "/api/annotate/label", json={"session": session, "call_id": first, "label": "yes", "note": "n" * 2000}
    )
    assert r.status_code == 200 and store.labels()[0]["note"] == "n" * 2000


def test_a_huge_body_is_refused_before_it_is_read() -> None:
    """Memory stays bounded: a body over the cap is refused by its Content-Length without a byte read, and a body
    without one (chunked, here endless) after the first chunk that passes the cap."""
    import asyncio

    from marti_ibrl.people.app import BodyLimit

    reached, sent, pulled = [], [], [0]

    async def app(scope, receive, send):
        reached.append(scope)

    async def endless():  # a client that streams 1 MB chunks without end
        pulled[0] += 1
        assert pulled[0] < 1000, "the whole stream was read"
        return {"type": "http.request", "body": b"x" * 2**20, "more_body": True}

    async def send(message):
        sent.append(message)

    limit = BodyLimit(app, 64 * 1024)
    scope = {"type": "http", "method": "POST", "path": "/api/games/1/act", "headers": []}
    asyncio.run(limit(scope, endless, send))
    assert pulled[0] == 1 and sent[0]["status"] == 413 and not reached
    pulled[0], sent[:] = 0, []
    asyncio.run(limit({**scope, "headers": [(b"content-length", b"10485760")]}, endless, send))
    assert pulled[0] == 0 and sent[0]["status"] == 413 and not reached
    assert json.loads(sent[1]["body"])["error"].startswith("request too large: over 65,536 bytes")


class SlowSeat:
    """The policy's seat, whose next turn, once ``armed``, waits until ``release`` (a slow checkpoint)."""

    def __init__(self, seat):
        self.seat, self.armed = seat, False
        self.entered, self.release = threading.Event(), threading.Event()

    def respond(self, *args):
        if self.armed:
            self.armed = False
            self.entered.set()
            self.release.wait(60)
        return self.seat.respond(*args)


def test_a_client_that_leaves_mid_body_is_one_line_and_nothing_is_stored(tmp_path, capfd) -> None:
    """Issue 63: a client that closed its connection before its body was whole left a traceback in the server's
    output ("RuntimeError: No response returned"); now one line, and the server goes on serving."""
    import uvicorn

    files, _ = write_calls(tmp_path / "episodes")
    store = Store(tmp_path / "labels.sqlite")
    load_calls(store, files)
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(store, annotation=Annotation(store)), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        until = time.monotonic() + 60
        while not server.started and time.monotonic() < until:
            time.sleep(0.05)
        before = store.counts()
        with socket.create_connection(("127.0.0.1", port)) as c:
            head = "POST /api/annotate/session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            c.sendall(f"{head}Content-Length: 1000\r\n\r\n".encode() + b'{"annotator": "A"')
        said = ""
        while "left during" not in said and time.monotonic() < until:
            time.sleep(0.05)
            said += capfd.readouterr().err
        assert said.strip() == (
            f"marti-ibrl: a client (127.0.0.1:{said.split('127.0.0.1:')[1].split(')')[0]}) left during POST "
            "/api/annotate/session after 17 of 1,000 bytes; nothing was stored"
        ), said
        assert store.counts() == before
        with socket.create_connection(("127.0.0.1", port)) as c:  # the server goes on
            body = b'{"annotator": "A"}'
            c.sendall(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and store.counts()["annotators"] == 1
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_slow_turn_in_one_game_does_not_block_another(tmp_path) -> None:
    store = Store(tmp_path / "p.sqlite")
    game = build_game(play_args())
    game.seat = slow = SlowSeat(game.seat)
    client = local(create_app(store, game=game))
    a, b = Player(client), Player(client)
    ga, gb = a.start(), b.start()  # game 0: a opens; game 1: the policy opened, b answers
    answers: dict[str, object] = {}
    slow.armed = True
    ta = threading.Thread(target=lambda: answers.update(a=a.act(ga["game_id"], "message", DEAL)))
    ta.start()
    assert slow.entered.wait(30)  # the policy is generating its answer in game A ...
    started = time.monotonic()
    tb = threading.Thread(target=lambda: answers.update(b=b.act(gb["game_id"], "message", "hi " + DEAL)))
    tb.start()
    tb.join(10)  # ... while b moves in game B, and gets the policy's answer
    b_done, waited = not tb.is_alive(), time.monotonic() - started
    slow.release.set()
    ta.join(60)
    tb.join(60)
    assert b_done, f"game B waited {waited:.0f} s for game A's turn"
    assert answers["b"].status_code == 200 and answers["b"].json()["game"]["transcript"][-1]["who"] == "them"
    assert answers["a"].status_code == 200 and answers["a"].json()["game"]["transcript"][-1]["who"] == "them"
    assert [len(store.game(g["game_id"])["turns"]) for g in (ga, gb)] == [2, 3]


def test_action_ids_count_within_their_game(dond, tmp_path) -> None:
    store, game, client = dond
    a, b = Player(client), Player(client)
    ga, gb = a.start(), b.start()
    first = a.act(ga["game_id"], "message", "Mine: <try> item0=1 item1=0 item2=0 <try>", action_id="shared").json()
    r = b.act(gb["game_id"], "walk_away", action_id="shared")  # the same id from another participant: their own action
    assert r.status_code == 200 and r.json()["duplicate"] is False
    assert r.json()["game"]["game_id"] == gb["game_id"] and r.json()["game"]["status"] == "finished"
    assert r.json()["game"]["items"] == gb["items"] and "Mine:" not in json.dumps(r.json())
    r = b.act(ga["game_id"], "walk_away", action_id="shared")
    assert r.status_code == 404 and r.json()["error"] == f"no game {ga['game_id']} of yours"
    again = a.act(ga["game_id"], "message", "Mine: <try> item0=1 item1=0 item2=0 <try>", action_id="shared").json()
    assert again["duplicate"] is True and again["game"] == first["game"]
    # a database of before (actions keyed by their id alone) is migrated: its double submits still answered once
    import sqlite3

    store.close()
    db = sqlite3.connect(store.path)
    db.executescript("ALTER TABLE actions RENAME TO a2; CREATE TABLE actions (id TEXT PRIMARY KEY, game_id INTEGER, "
                     "response TEXT NOT NULL, created REAL NOT NULL); INSERT INTO actions SELECT id, game_id, response, "
                     f"created FROM a2 WHERE game_id = {ga['game_id']}; DROP TABLE a2;")  # fmt: skip
    db.close()
    store = Store(store.path)
    client = local(create_app(store, game=game))
    a.client = client
    again = a.act(ga["game_id"], "message", "Mine: <try> item0=1 item1=0 item2=0 <try>", action_id="shared").json()
    assert again["duplicate"] is True and again["game"] == first["game"] and store.counts()["actions"] == 1


def test_game_ids_are_drawn_at_random_and_games_listed_oldest_first(tmp_path) -> None:
    """Issue 63: a game's id says nothing of another's (drawn in 1..2**53-1, exact in the pages' JavaScript), and
    listings keep the order games were made in."""
    from marti_ibrl.people.store import GAME_IDS

    store = Store(tmp_path / "p.sqlite")
    pid = store.new_participant()
    seats, done = ["agent1", "agent2"], {"status": "finished", "outcome": {"agreed": False}}
    made = [store.create_game(pid, "dond", "a", f"s{k}", {}, "agent2", "agent1", seats, [], **done) for k in range(40)]
    assert len(set(made)) == 40 and all(1 <= g <= GAME_IDS for g in made)
    assert sum(b - a == 1 for a, b in zip(made, made[1:])) == 0 and max(made) > 2**40  # not a counter
    assert [g["id"] for g in store.games()] == made and [g["scenario_uid"] for g in store.games()][:2] == ["s0", "s1"]


def test_ids_out_of_range_are_404_or_422(dond) -> None:
    store, game, client = dond
    person = Player(client)
    person.start()
    before = store.counts()
    for bad in (10**23, 2**63, 0, -1, "abc"):
        r = client.get(f"/api/games/{bad}", params={"participant": person.pid})
        assert r.status_code == 422 and r.json()["error"].startswith("game_id: "), r.text
        r = person.act(bad, "walk_away")
        assert r.status_code == 422 and r.json()["error"].startswith("game_id: "), r.text
    assert store.counts() == before
    # issue 63: another's game and no game answer alike (ids cannot be probed), and no lock is kept for a missing id
    theirs = Player(client).start()["game_id"]
    for gid in (theirs, theirs + 1, 10**9):
        r = client.get(f"/api/games/{gid}", params={"participant": person.pid})
        assert r.status_code == 404 and r.json() == {"error": f"no game {gid} of yours"}, gid
        r = person.act(gid, "walk_away")
        assert r.status_code == 404 and r.json() == {"error": f"no game {gid} of yours"}, gid
    assert 10**9 not in store._game_locks and theirs + 1 not in store._game_locks
    before = store.counts()
    r = client.post("/api/games", content=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"].startswith("body: ")
    assert store.counts() == before


def test_a_second_server_on_the_database_refuses(tmp_path, capsys, monkeypatch) -> None:
    """A running ``play`` holds its database: a second one (here on the same port too) refuses with one line naming
    it and leaves its live games alone. Both run ``main`` in this process; ``serve`` is replaced by a stand-in that
    keeps the first one serving (its app, through the test client) until told to stop."""
    import os

    import marti_ibrl.people.app as web

    apps, serving, stop = [], threading.Event(), threading.Event()

    def serve(app, *where):
        apps.append(app)
        if len(apps) == 1:
            serving.set()
            stop.wait(120)

    monkeypatch.setattr(web, "serve", serve)
    db = tmp_path / "p.sqlite"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["play", "--policy", "bot:greedy", "--env", "dond", "--db", str(db), "--port", str(port)]
    codes: list[int] = []
    first = threading.Thread(target=lambda: codes.append(main(args)))
    first.start()
    try:
        assert serving.wait(120), "the first server did not start"
        person = Player(local(apps[0]))
        live = person.start()
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err == (f"marti-ibrl play: error: {db} is served by another `marti-ibrl` server (pid {os.getpid()} on "
                       f"{socket.gethostname()}, since {err.split('since ')[1][:23]}, at http://127.0.0.1:{port}/); "
                       "stop it, or give another --db\n")  # fmt: skip
        assert store_status(db, live["game_id"]) == "active" and len(apps) == 1
        assert person.act(live["game_id"], "message", DEAL).json()["game"]["status"] == "active"
    finally:
        stop.set()
        first.join(60)
    assert codes == [0]
    from marti_ibrl.people.store import ServerLock

    lock = ServerLock(db)  # released when the first one stopped
    lock.acquire("test")
    lock.release()


def store_status(db: Path, game_id: int) -> str:
    return Store(db).game(game_id)["status"]


def test_a_server_that_cannot_listen_changes_nothing(tmp_path, capsys) -> None:
    db = tmp_path / "p.sqlite"
    store = Store(db)
    person = store.new_participant()
    live = build_game(play_args()).start(store, person)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["play", "--policy", "bot:greedy", "--env", "dond", "--db", str(db), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == (f"marti-ibrl play: error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in "
                   "use); is another server on it? Give another --port\n")  # fmt: skip
    assert store.game(live)["status"] == "active"
    from marti_ibrl.people.store import ServerLock

    lock = ServerLock(db)  # released by the server that did not start
    lock.acquire("test")
    lock.release()
