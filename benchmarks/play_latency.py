"""`marti-ibrl play`: how long one game's turn waits while another game sends the longest message allowed.

Two people play the same checkpoint seat (one shared engine, turns one at a time). Game B sends an ordinary
message and times the answer: alone, then while game A sends the longest message the seat accepts (its prompt at
the token bound, `people.seat.MAX_CONTEXT`), with the character limit raised to 400,000 (issue 50's probe: a 300 KB
message then held the engine 281 s). Prints both latencies and their ratio; the bound makes the wait one bounded
generation, whatever `--max-message-chars` is.

    .venv/bin/python benchmarks/play_latency.py [--model recipes/dond/tiny-sft] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from fastapi.testclient import TestClient

from marti_ibrl.commands.people import build_game
from marti_ibrl.people.app import create_app
from marti_ibrl.people.store import Store

DEAL = "<try> item0=0 item1=0 item2=0 <try>"
PHRASE = "I want the books. "


def _args(model: str) -> argparse.Namespace:
    base = dict(policy=model, env="dond", name=None, num_scenarios=4, scenario_seed=1, data=None, prompt_style="paper",
                show_complement=False, max_rounds=10, lang="en", temperature=1.0, top_p=1.0, max_new_tokens=24, seed=0)  # fmt: skip
    return argparse.Namespace(**base)


class Person:
    def __init__(self, client: TestClient):
        self.client, self.n = client, 0
        self.pid = client.post("/api/participant").json()["participant"]

    def start(self) -> int:
        return self.client.post("/api/games", json={"participant": self.pid}).json()["game"]["game_id"]

    def say(self, game: int, text: str):
        self.n += 1
        body = {
            "participant": self.pid,
            "action_id": f"{self.pid}-{self.n}",
            "action": {"kind": "message", "text": text},
        }
        return self.client.post(f"/api/games/{game}/act", json=body)


def longest_message(game, row: dict) -> str:
    """The longest message of ``I want the books`` phrases whose prompt stays within the seat's token bound, for
    the game ``row`` (its scenario, seats and the person's turn first), by bisection."""
    scenario, seats, role, who = game.scenario(row), row["seats"], row["policy_role"], row["human_role"]
    lo, hi = 1, 20_000
    while lo < hi:
        mid = (lo + hi + 1) // 2
        n = len(game.seat.prompt(game.env, role, scenario, seats, [(who, PHRASE * mid)]))
        lo, hi = (mid, hi) if n <= game.seat.max_prompt_tokens else (lo, mid - 1)
    return PHRASE * lo


def opened_by_person(person: Person, store: Store) -> int:
    """A new game of ``person`` in which the person speaks first (games alternate who opens)."""
    while True:
        g = person.start()
        if not store.game(g)["turns"]:
            return g


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="recipes/dond/tiny-sft")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    game = build_game(_args(args.model))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "p.sqlite")
        client = TestClient(create_app(store, game=game, max_message=400_000, max_body=6 * 400_000 + 4096))
        a, b = Person(client), Person(client)
        alone, beside, long_turn = [], [], []
        for _ in range(args.repeats):
            gb = opened_by_person(b, store)
            t = time.perf_counter()
            assert b.say(gb, DEAL).status_code == 200
            alone.append(time.perf_counter() - t)
            ga, gb = opened_by_person(a, store), opened_by_person(b, store)
            long = longest_message(game, store.game(ga))

            def send_long(game_id=ga, text=long):
                t0 = time.perf_counter()
                r = a.say(game_id, text)
                long_turn.append((time.perf_counter() - t0, r.status_code, len(text)))

            th = threading.Thread(target=send_long)
            th.start()
            time.sleep(0.05)  # A's turn has the engine
            t = time.perf_counter()
            assert b.say(gb, DEAL).status_code == 200
            beside.append(time.perf_counter() - t)
            th.join()
        print(f"seat bound {game.seat.max_prompt_tokens} prompt tokens; longest messages "
              f"{min(n for *_, n in long_turn):,}-{max(n for *_, n in long_turn):,} characters")  # fmt: skip
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        print(f"game B's turn alone: {mean(alone):.2f} s; beside A's longest message: {mean(beside):.2f} s")
        print(
            f"A's longest-message turn: {mean([x for x, *_ in long_turn]):.2f} s (statuses {[c for _, c, _ in long_turn]})"
        )
        print(f"beside/alone latency ratio: {mean(beside) / mean(alone):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
