"""``marti-ibrl diagnose RUN_DIR --role ROLE``: checkpoint diagnostics of a training run (paper Fig. 5, Fig. 6).

For every saved checkpoint of ``ROLE`` (``ROLE/ckpt/global_stepK_hf``, written every ``--ckpt.save_steps``):

* it plays ``-n`` scenarios (seat-averaged) against a **fixed step-0 counterpart** — the other role's
  initial checkpoint (its ``pretrain``), or ``--fixed SPEC`` — and against its **in-system** counterpart,
  the other role's checkpoint of the same step;
* the role's utterances against the fixed counterpart are embedded (all-MiniLM-L6-v2) and compared across
  checkpoints: the cross-checkpoint semantic similarity heatmap (Fig. 6);
* agreement against the in-system and the fixed counterpart across checkpoints gives Fig. 5.

Dialogue settings (env, prompts, lengths, sampling) are the run's own (``RUN_DIR/config.yaml``). Episodes
go to ``RUN_DIR/diagnostics/episodes`` (resumable, like ``marti-ibrl eval``); the figures to
``RUN_DIR/figures``; the numbers to ``RUN_DIR/diagnostics/ROLE.json``. ``marti-ibrl report`` embeds them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


def role_checkpoints(run_dir: Path, role: str) -> list[tuple[int, Path]]:
    """(step, HF dir) of every saved checkpoint of ``role``, by step."""
    found = []
    for d in (run_dir / role / "ckpt").glob("global_step*_hf"):
        m = re.fullmatch(r"global_step(\d+)_hf", d.name)
        if m and (d / "config.json").exists():
            found.append((int(m.group(1)), d))
    return sorted(found)


def run_config(run_dir: Path):
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not a training run directory")
    return OmegaConf.load(path)


def diagnosable(env_name: str, roles: list[str]):
    """The run's :class:`~marti_ibrl.envs.registry.EnvSpec`; ``ValueError`` unless it is a two-role environment (a
    checkpoint plays its role, or both seats where the roles are interchangeable, against the other role's)."""
    from marti_ibrl.envs import registry

    spec = registry.get(env_name)
    if len(roles) != 2:
        raise ValueError(f"diagnose compares a role against the other one: {env_name} has {len(roles)} roles {roles}")
    return spec


def diagnosis_env_config(env, n: int):
    """The run's env settings (``env``: its ``config.yaml`` section) with ``n`` generated scenarios, no data file, and
    the default invalid penalty (only agreement and utterances are read here)."""
    from dataclasses import fields

    from omegaconf import OmegaConf

    from marti_ibrl.config import EnvConfig

    known = {f.name for f in fields(EnvConfig)}
    settings = {k: v for k, v in OmegaConf.to_container(env).items() if k in known}
    return EnvConfig(**{**settings, "data": None, "num_scenarios": n, "invalid_penalty": EnvConfig.invalid_penalty})


def checked_checkpoints(run_dir: Path, role: str) -> list:
    """``role``'s saved ``global_stepK_hf`` checkpoints (:func:`role_checkpoints`), at least two, each one a model whose
    weight files are whole (headers only: milliseconds; a truncated one is one line before Ray starts, not a
    SafetensorError after it)."""
    from marti_ibrl.checkpoints import checkpoint_problem

    checkpoints = role_checkpoints(run_dir, role)
    if len(checkpoints) < 2:
        raise FileNotFoundError(
            f"{run_dir / role / 'ckpt'}: {len(checkpoints)} global_stepK_hf checkpoint(s), diagnose compares 2 or more: "
            "train with --ckpt.save_steps K (a checkpoint every K iterations; the demo saves only its last)"
        )
    for _, path in checkpoints:
        if why := checkpoint_problem(path):
            raise ValueError(f"{run_dir}: {why}")
    return checkpoints


def diagnose(run_dir: Path, role: str, n: int, fixed: str | None, scenario_seed: int, embedder: str | None, engines):
    """Play, embed, plot; returns the diagnostics dict (also written to RUN_DIR/diagnostics/ROLE.json)."""
    cfg = run_config(run_dir)
    roles = [r.name for r in cfg.roles]
    if role not in roles:
        raise ValueError(f"--role {role}: the run's roles are {roles}")
    spec = diagnosable(cfg.env.name, roles)

    from marti_ibrl.eval.episodes import Named
    from marti_ibrl.eval.evaluator import Evaluator
    from marti_ibrl.eval.figures import insystem_vs_fixed, load_embedder, similarity_heatmap, similarity_matrix

    other = roles[1 - roles.index(role)]
    checkpoints = checked_checkpoints(run_dir, role)
    other_cfg = cfg.roles[roles.index(other)]
    fixed_spec = fixed or f"checkpoint:{other_cfg.pretrain}"
    env, scenarios = spec.factory(diagnosis_env_config(cfg.env, n), scenario_seed)
    sampling = {
        "temperature": cfg.rollout.temperature,
        "top_p": cfg.rollout.top_p,
        "max_new_tokens": cfg.rollout.max_new_tokens,
    }
    seats = tuple(roles) if spec.interchangeable_roles else (role,)  # the roles a checkpoint of ``role`` plays
    names = {step: f"{role}-step{step}" for step, _ in checkpoints}
    ev = Evaluator(
        env, scenarios, sampling, cfg.rollout.max_len, cfg.env.max_resamples, engines,
        policy_roles=dict.fromkeys(names.values(), seats),
    )  # fmt: skip
    out = run_dir / "diagnostics"
    points, utterances = [], {}
    for step, path in checkpoints:
        policy = Named(names[step], f"checkpoint:{path}")
        vs_fixed = ev.run_pair(policy, Named("fixed", fixed_spec), out / "episodes" / f"{policy.name}__fixed.jsonl")
        utterances[f"step {step}"] = [
            t["text"] for e in vs_fixed for t in e["transcript"] if t["role"] == e["policy_role"] and t["text"]
        ]
        point = {"checkpoint": step, "fixed": agreement(vs_fixed), "n": len(seats) * n}
        partner = run_dir / other / "ckpt" / f"global_step{step}_hf"
        if (partner / "config.json").exists():
            named = Named("in-system", f"checkpoint:{partner}")
            vs_in = ev.run_pair(policy, named, out / "episodes" / f"{policy.name}__in-system.jsonl")
            point["in_system"] = agreement(vs_in)
            ev.release(named)
        else:
            point["in_system"] = None
        ev.release(policy)
        points.append(point)
    figures = run_dir / "figures"
    empty = [k for k, v in utterances.items() if len(v) < 2]
    result = {"role": role, "fixed": fixed_spec, "points": points}
    if not empty:
        labels, matrix = similarity_matrix(utterances, load_embedder(embedder))
        similarity_heatmap(
            labels,
            matrix,
            figures / f"similarity_{role}.png",
            title=f"{role}: semantic similarity vs fixed step-0 {other}",
        )
        result["similarity"] = {"labels": labels, "matrix": [[float(x) for x in row] for row in matrix]}
    else:
        result["similarity_skipped"] = f"fewer than 2 utterances for {empty}"
    insystem_vs_fixed(
        [{**p, "method": role} for p in points], figures / f"insystem_vs_fixed_{role}.png", ylabel="agreement rate"
    )
    (out / f"{role}.json").write_text(json.dumps(result, indent=1))
    return result


def agreement(episodes: list[dict]) -> float:
    """The agreement rate of a checkpoint's episodes, seat-averaged: the mean of its rates in the episodes it opened
    and in those it answered (DoND's Table 2 average, :func:`marti_ibrl.eval.dond.metrics.summarize_seat_averaged`;
    a role that always opens, or never does, has one of the two)."""
    rates = []
    for opened in (True, False):
        mine = [e for e in episodes if (e["seats"][0] == e["policy_role"]) == opened]
        if mine:
            rates.append(sum(bool(e["agreed"]) for e in mine) / len(mine))
    return sum(rates) / len(rates) if rates else 0.0
