"""Does IB-RL move TextArena's games, and how fast? (issue 52, item 6)

Per game of ``marti_ibrl.envs.arena.VERIFIED`` (SimpleNegotiation, TicTacToe, Kuhn Poker, the iterated prisoner's
dilemma): the demo's tiny model (``sft.DEMO_TINY_MODEL``, its tokenizer trained on the game's own text), a warm start
from the game's scripted ``random`` players (``marti-ibrl sft --env textarena:GAME``, :data:`SFT`), then a short
IB-RL run from it (``marti-ibrl train``, the demo's hyperparameters, :data:`TRAIN`), HF engines, seed 42. A unit
``GAME+own`` trains the same game from the same warm start with ``--env.payoff own`` (each player's own score, not
zero-sum: the games of ``arena.OWN_PAYOFF``).

Question, fixed before any run (the issue sets no floor): per game and role, does the mean reward move from the first
3 to the last 3 iterations, and the share of decisive games (a player won, or gained where nobody loses: the
iteration table's ``agreement``)? How many turns stay malformed, how valid is the warm start, and how many seconds
does an iteration take on 2 cores? Reported as measured; a game that does not move is said so.

Each game is a unit (``benchmarks/results/textarena_games/<game>.json``, kept; a game with a file is not run again,
``--rerun``); the report (``benchmarks/results/textarena_games.md``, curves ``textarena_games.png``) is rebuilt from
the units (``--report-only``). Run in a clone of its own:

    .venv/bin/python benchmarks/textarena_games.py --out runs/textarena_games [--games TicTacToe-v0]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from units import LoadMeter, commit, unit_parser, write_unit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
UNITS = RESULTS / "textarena_games"
K = 3
SEED = 42
SFT = ["--dialogues", "1000", "--lr", "7e-3", "--batch-size", "16", "--micro-batch-size", "8", "--max-len", "2048"]
TRAIN = [
    *("--train.iterations", "20", "--train.max_epochs", "2", "--train.micro_batch_size", "8"),
    *("--rollout.engine", "hf", "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "8"),
    *("--rollout.max_new_tokens", "32", "--rollout.max_len", "2048", "--env.num_scenarios", "256"),
    *(x for r in ("--role1", "--role2") for x in (f"{r}.lr", "1e-3", f"{r}.kl_coef", "0.015")),
    *(x for r in ("--role1", "--role2") for x in (f"{r}.lr_warmup_steps", "10", f"{r}.lr_schedule", "cosine")),
    *("--ds.param_dtype", "fp32", "--ckpt.save_hf", "false", "--train.seed", str(SEED)),
]


def _log(msg: str) -> None:
    print(f"[textarena_games] {msg}", flush=True)


def _exe() -> str:
    return str(Path(sys.executable).parent / "marti-ibrl")


def base_model(game: str, out: Path) -> str:
    """The demo's tiny architecture with a tokenizer trained on this game's prompts and scripted dialogues."""
    import random

    from marti_ibrl.config import EnvConfig
    from marti_ibrl.envs import make_env
    from marti_ibrl.sft import DEMO_TINY_MODEL
    from marti_ibrl.sft.data import scripted_dialogue
    from marti_ibrl.tiny import build_tiny_model

    env, scenarios = make_env(EnvConfig(name=f"textarena:{game}", num_scenarios=64), SEED + 3)
    players = {r: env.scripted_players()["random"] for r in env.roles}
    corpus = [env.system_prompt(s, r) for _, s in scenarios for r in env.roles]
    for i, (_, s) in enumerate(scenarios):
        corpus += [
            t for h in scripted_dialogue(env, s, players, env.roles, random.Random(i)) for t in [h[1], *h[2].values()]
        ]
    return build_tiny_model(out / "tiny", corpus, vocab_size=1024, **DEMO_TINY_MODEL)


OWN = "+own"
"""A unit ``GAME+own``: the game with ``--env.payoff own`` (each player's own score: not zero-sum), from the same warm
start as ``GAME``."""


def run_unit(unit: str, out: Path) -> dict:
    from marti_ibrl.eval.figures import load_history, roles_in_history

    game = unit.removesuffix(OWN)
    made, work = out / game, out / unit  # the game's warm start (shared by its payoffs), this unit's run
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with LoadMeter() as load, open(out / f"{unit}.log", "w") as log:
        sft = [_exe(), "sft", "--env", f"textarena:{game}", "--out", str(made / "sft"), *SFT]
        if not (made / "sft" / "sft_record.json").exists():
            sft[4:4] = ["--pretrain", base_model(game, made)]
            _log(f"{game}: {' '.join(sft[1:])}")
            if subprocess.run(sft, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode:
                sys.exit(f"[textarena_games] {game}: sft failed; see {out}/{unit}.log")
        t_sft = time.perf_counter() - t0
        train = [_exe(), "train", "--env.name", f"textarena:{game}", "--ckpt.path", str(work / "ibrl")]
        train += ["--role1.pretrain", str(made / "sft"), "--role2.pretrain", str(made / "sft"), *TRAIN]
        train += ["--env.payoff", "own"] if unit.endswith(OWN) else []
        _log(f"{unit}: {' '.join(train[1:])}")
        t1 = time.perf_counter()
        if subprocess.run(train, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode:
            sys.exit(f"[textarena_games] {unit}: train failed; see {out}/{unit}.log")
        t_train = time.perf_counter() - t1
    history = load_history(work / "ibrl")
    roles = roles_in_history(history)
    record = json.loads((made / "sft" / "sft_record.json").read_text())
    return {
        "game": unit,
        "commit": commit(),
        "sft": {"command": " ".join(sft[1:]), "seconds": round(t_sft, 1), "valid_turns": record["valid_turns"]},
        "command": " ".join(train[1:]),
        "train_seconds": round(t_train, 1),
        "load_average": load.mean,
        "roles": roles,
        "history": [
            {k: m[k] for k in ("iteration", "rollout/agreement", "rollout/malformed")}
            | {f"{r}/{c}": m.get(f"{r}/{c}") for r in roles for c in ("reward", "attempts_malformed")}
            for m in history
        ],
    }


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def summary(u: dict) -> dict:
    h = u["history"]
    return {
        "game": u["game"],
        "valid_turns": u["sft"]["valid_turns"],
        "reward": {
            r: (_mean(m[f"{r}/reward"] for m in h[:K]), _mean(m[f"{r}/reward"] for m in h[-K:])) for r in u["roles"]
        },
        "decisive": (_mean(m["rollout/agreement"] for m in h[:K]), _mean(m["rollout/agreement"] for m in h[-K:])),
        "malformed_last3": _mean(m["rollout/malformed"] for m in h[-K:]),
        "s_per_iteration": u["train_seconds"] / len(h),
        "load_average": u.get("load_average"),
    }


def figure(units: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(units), figsize=(4 * len(units), 3.4), squeeze=False)
    for ax, u in zip(axes[0], units):
        it = [m["iteration"] for m in u["history"]]
        for r in u["roles"]:
            ax.plot(it, [m[f"{r}/reward"] for m in u["history"]], label=f"{r} reward")
        ax.plot(it, [m["rollout/agreement"] for m in u["history"]], "k--", label="decisive share")
        ax.set(title=u["game"], xlabel="iteration")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(units: list[dict]) -> str:
    lines = [
        "| game | warm start: valid turns (base → SFT) | reward first 3 → last 3 | decisive first 3 → last 3 "
        "| malformed last 3 | s/iteration (mean load) |",
        "|---|---|---|---|---|---|",
    ]
    for u in units:
        s = summary(u)
        v = s["valid_turns"]
        rew = "; ".join(f"{r} {a:+.2f} → {b:+.2f}" for r, (a, b) in s["reward"].items())
        load = f" ({s['load_average']:.1f})" if s["load_average"] is not None else ""
        lines.append(
            f"| {s['game']} | {v['base']:.0%} → {v['sft']:.0%} | {rew} | {s['decisive'][0]:.2f} → {s['decisive'][1]:.2f} "
            f"| {s['malformed_last3']:.3f} | {s['s_per_iteration']:.1f}{load} |"
        )
    return "\n".join(
        [
            "# TextArena's games under IB-RL (benchmarks/textarena_games.py)",
            "",
            "Issue 52, item 6. Question fixed before the runs (no floor): per game, does each role's reward and the "
            "share of decisive games move from the first 3 to the last 3 iterations, and how fast is an iteration on "
            f"2 cores? Tiny model, warm start from the game's scripted players, seed {SEED}. Rewards are TextArena's "
            f"(win 1 / loss -1 / draw 0, zero-sum in every game) except in `GAME{OWN}` rows (`--env.payoff own`: each "
            "player's own score, not zero-sum; decisive there means some player scored above 0). Commits: "
            f"{', '.join(sorted({u['commit'] for u in units}))}.",
            "",
            *lines,
            "",
            "![reward and decisive share per iteration, each game](textarena_games.png)",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    from marti_ibrl.envs.arena import OWN_PAYOFF, VERIFIED

    games = [*VERIFIED, *(g + OWN for g in VERIFIED if g in OWN_PAYOFF)]
    p = unit_parser(__doc__, "runs/textarena_games", "game")
    p.add_argument("--games", nargs="*", default=games, choices=games, help=f"GAME{OWN}: with --env.payoff own")
    args = p.parse_args(argv)
    UNITS.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for game in args.games:
            unit_file = UNITS / f"{game}.json"
            if unit_file.exists() and not args.rerun:
                _log(f"{game}: kept from {unit_file}")
                continue
            write_unit(unit_file, run_unit(game, out))
            _log(f"{game}: {summary(json.loads(unit_file.read_text()))}")
    units = [json.loads(f.read_text()) for f in sorted(UNITS.glob("*.json"))]
    if not units:
        sys.exit("[textarena_games] no results yet")
    figure(units, RESULTS / "textarena_games.png")
    (RESULTS / "textarena_games.md").write_text(report(units))
    _log(f"report: {RESULTS / 'textarena_games.md'} ({len(units)} games)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
