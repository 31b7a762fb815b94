"""When does the demo's tiny warm start learn the format, and when does it learn to close every deal?

One SFT of the 4-head tiny model (``sft.DEMO_TINY_MODEL``, ``DEMO_SFT``) on the demo's scripted
dialogues, with an HF checkpoint every 75 optimizer steps; per checkpoint the protocol-valid opening turns and, in
self-play (``sft.validity_report``), the share of answers that are the offer's complement (a deal). Results in
``benchmarks/results/sft_checkpoints.json``; docs/measured.md ("Every path learns? The warm start first") reads them.
Run in a clone of its own, from a directory where ``marti-ibrl demo --model tiny --make-sft``
left ``runs/demo/tiny`` and ``runs/demo/sft_data.jsonl``, or with ``--accept-share S``, which makes both here as the
demo makes them (the recipe's environment, seed 0) with acceptances taught in that share of the dialogues:

    .venv/bin/python benchmarks/sft_checkpoints.py [--every 75] [--out runs/sft_checkpoints] [--accept-share 0.3]
"""

import argparse
import json
from pathlib import Path

from marti_ibrl.envs.dond import DondEnv, generate_scenarios
from marti_ibrl.sft import DEMO_SFT, protocol_validity, run_sft, validity_report

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "dond" / "tiny-cpu.yaml"


def make_data(accept_share: float) -> None:
    """``runs/demo/tiny`` and ``runs/demo/sft_data.jsonl`` as ``marti-ibrl demo --make-sft``
    makes them (:func:`marti_ibrl.demo.prepare`, seed 0), the share of acceptances taught ``accept_share``."""
    from omegaconf import OmegaConf

    from marti_ibrl.config import EnvConfig
    from marti_ibrl.demo import base_model
    from marti_ibrl.envs import make_env
    from marti_ibrl.envs.dond import TRAINING_BOTS
    from marti_ibrl.sft import sft_records, write_sft_data

    env_cfg = EnvConfig(**OmegaConf.to_container(OmegaConf.load(RECIPE).env))
    base_model("tiny", Path("runs/demo"), env_cfg, seed=0)
    env, _ = make_env(env_cfg, 0)
    scenarios = generate_scenarios(DEMO_SFT["n_scenarios"], 1)
    records = sft_records(env, scenarios, sorted(TRAINING_BOTS), 0, accept_share=accept_share)
    print(f"{len(records)} records, accept_share {accept_share}:", write_sft_data("runs/demo/sft_data.jsonl", records))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=int, default=75)
    p.add_argument("--out", default="runs/sft_checkpoints")
    p.add_argument("--results", default="sft_checkpoints.json", help="file name under benchmarks/results/")
    p.add_argument("--accept-share", type=float, help="make runs/demo's base model and data here, with this share")
    args = p.parse_args()
    out = Path(args.out)
    if args.accept_share is not None:
        make_data(args.accept_share)
    cfg = {k: v for k, v in DEMO_SFT.items() if k not in ("n_scenarios", "accept_share")}  # the data's own
    run_sft("runs/demo/tiny", "runs/demo/sft_data.jsonl", str(out), seed=0,
            extra_args=["--ckpt.save_steps", str(args.every), "--ckpt.save_hf"], **cfg)  # fmt: skip
    env = DondEnv(max_rounds=5, prompt_style="compact", bot_speech="markers", show_complement=True)
    rows = []
    for d in sorted((out / "ds_ckpt").glob("global_step*_hf"), key=lambda p: int(p.name[11:-3])):
        valid = protocol_validity(str(d), env, generate_scenarios(32, 2), n_turns=2, seed=0)
        r = validity_report(str(d), env, generate_scenarios(64, 2), n_turns=6, seed=0)
        rows.append({"sft_step": int(d.name[11:-3]), "valid_opening": round(valid, 3),
                     "protocol_6_turns": round(r["protocol"], 3), "closing_answers": round(r["complement"], 3),
                     "answers": int(r["n_answers"])})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    results = Path(__file__).parent / "results" / args.results
    what = f"DEMO_SFT {json.dumps(DEMO_SFT)}, a checkpoint every {args.every} steps"
    what += "" if args.accept_share is None else f", data made here with accept_share {args.accept_share}"
    results.write_text(json.dumps({"what": what, "checkpoints": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
