"""What stops or warns a run, each in one line: a config whose first prompts cannot fit (before Ray starts), rewards
that failed, optimizer steps skipped for NaN/inf, roles with no informative update, an update that broke a role's
output format, engines out of sync with their actor (``--train.check_sync``). docs/troubleshooting.md says what to do
about each."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from marti_ibrl.algorithm import ablations
from marti_ibrl.algorithm.advantages import GroupSpread
from marti_ibrl.cluster.placement import frozen_checkpoints
from marti_ibrl.config import Config, ConfigError
from marti_ibrl.envs import make_env
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.runner import PROMPT_CHARS_PER_TOKEN, first_turns_overflowing, overlong_system_prompts

SYNC_CHECKS_FILE = "sync_checks.jsonl"  # --train.check_sync


def applied_ablation(cfg: Config):
    """The run's ablation (Table 3, :mod:`marti_ibrl.algorithm.ablations`); a ConfigError when its config changes are
    not applied to ``cfg`` (a config built by hand, not by load_config: refused rather than run half-ablated)."""
    ablation = ablations.get(cfg.ablation)
    _, pending = ablation.resolve(cfg)
    if pending:
        raise ConfigError(
            f"--ablation {cfg.ablation} is not applied to this config ({'; '.join(pending)}): "
            "make it with marti_ibrl.config.load_config or ablations.resolve"
        )
    return ablation


def report_reward_failures(k: int, trajectories: Sequence[Trajectory], roles: Sequence[str]) -> None:
    """One console line per role with dialogues whose reward could not be computed (left out of its groups)."""
    for r in roles:
        reasons = [t.reward_failures[r] for t in trajectories if r in t.reward_failures]
        if reasons:
            tqdm.write(
                f"iteration {k}: {len(reasons)} of {len(trajectories)} dialogues have no {r} reward and are left out "
                f"of its groups (first reason: {reasons[0]})"
            )


class TrainingStopped(RuntimeError):
    """The run stopped before the iteration named in the message trained or was saved; the last commit (the previous
    save) is intact and ``--ckpt.load_enable true`` resumes from it."""


def check_reward_failures(k: int, trajectories: Sequence[Trajectory], roles: Sequence[str], limit: float) -> None:
    """:class:`TrainingStopped` when more than ``limit`` (``--train.max_reward_failures``) of iteration k's dialogues
    have no reward for one of ``roles`` (the trained roles), naming the role, the reasons by kind and the first."""
    for r in roles:
        reasons = [t.reward_failures[r] for t in trajectories if r in t.reward_failures]
        if trajectories and len(reasons) / len(trajectories) > limit:
            kinds = Counter(reason.split(":")[0] for reason in reasons)
            raise TrainingStopped(
                f"--train.max_reward_failures {limit:g}: iteration {k}: {len(reasons)} of {len(trajectories)} dialogues "
                f"have no {r} reward ({', '.join(f'{n} {kind}' for kind, n in kinds.most_common())}; first: "
                f"{reasons[0]}); stopped before iteration {k} trained or saved anything"
            )


def weights_moved(status: dict) -> bool:
    """Whether a role's update moved its weights: some optimizer step of it was not skipped for a NaN/inf loss or
    gradient (``update/steps`` > ``update/skipped``, from :meth:`RolePolicyActorBase.fit`)."""
    return status.get("update/steps", 1.0) > status.get("update/skipped", 0.0)


def count_skipped_updates(k: int, status: dict[str, dict], in_a_row: dict[str, int], limit: int) -> None:
    """Per updated role: a console line when optimizer steps of its update were skipped (a NaN/inf loss or gradient;
    the weights did not move for them), and ``in_a_row[role]`` counted; :class:`TrainingStopped` when it reaches
    ``limit`` (``--train.max_skipped_updates``), before the iteration is saved."""
    for r, s in status.items():
        skipped = int(s.get("update/skipped", 0))
        in_a_row[r] = in_a_row.get(r, 0) + 1 if skipped else 0
        if not skipped:
            continue
        tqdm.write(
            f"iteration {k}: {r}: {skipped} of {int(s['update/steps'])} optimizer steps skipped for a NaN/inf loss or "
            f"gradient norm (weights unchanged by them; {in_a_row[r]} update(s) in a row)"
        )
        if in_a_row[r] >= limit:
            raise TrainingStopped(
                f"--train.max_skipped_updates {limit}: {r}'s last {in_a_row[r]} updates (to iteration {k}) had optimizer "
                f"steps skipped for a NaN/inf loss or gradient norm; stopped before iteration {k} was saved (lower its "
                "--roleN.lr, check its rewards)"
            )


def warn_uninformative(
    k: int, spreads: dict[str, GroupSpread], in_a_row: dict[str, int], warned: set[str], limit: int
) -> None:
    """Per role due at k (``spreads``: its groups, :func:`marti_ibrl.algorithm.advantages.group_spread`): count its
    due iterations in a row with no informative group in ``in_a_row`` and, when that reaches ``limit``
    (``--train.warn_uninformative``; 0 never), warn once per run in one console line naming the role and the likely
    cause (``warned`` remembers who was warned)."""
    for r, spread in spreads.items():
        in_a_row[r] = 0 if spread.informative else in_a_row.get(r, 0) + 1
        if limit and in_a_row[r] >= limit and r not in warned:
            warned.add(r)
            tqdm.write(
                f"iteration {k}: warning: {r} has had no informative update for {in_a_row[r]} iterations in a row "
                f"(every advantage 0: {spread.cause}); it learns nothing from its rewards until its groups differ "
                "(docs/troubleshooting.md)"
            )


def warn_malformed_jump(k: int, before: dict | None, now: dict, lr_flags: dict[str, str], jump: float) -> list[str]:
    """Per trained role (``lr_flags``: each one's learning-rate flag, ``--roleN.lr``): one console line when the share
    of its turns the env refused (``ROLE/attempts_malformed``, re-sampled attempts included) rose by at least ``jump``
    (``--train.warn_malformed_jump``; 0 never) from iteration k-1 (``before``: its metrics; None at a run's first
    iteration) to k (``now``), after updates of that role: the sign of an update that broke its output format
    (docs/troubleshooting.md). Returns the lines written."""
    if not jump or before is None:
        return []
    lines = []
    for r, flag in lr_flags.items():
        was, is_ = before.get(f"{r}/attempts_malformed"), now.get(f"{r}/attempts_malformed")
        if was is None or is_ is None or is_ - was < jump or not before.get(f"{r}/updated"):
            continue
        lr = before.get(f"{r}/actor_lr")
        at = f" (learning rate {lr:.2g})" if lr else ""
        lines.append(
            f"iteration {k}: warning: {r}'s malformed turns rose from {was:.2f} at iteration {k - 1} to {is_:.2f} after "
            f"its update{at}: an update that broke its output format; if it persists, lower {flag} "
            "(`marti-ibrl show RUN --malformed` says what it writes; docs/troubleshooting.md)"
        )
    for line in lines:
        tqdm.write(line)
    return lines


def training_scenarios(cfg: Config) -> tuple:
    """The environment and its training scenarios; a ConfigError naming ``--env.data`` (or ``--env.num_scenarios``)
    when the scenario file does not parse or there is nothing to train on."""
    from marti_ibrl.envs.custom import UserCodeError

    try:
        env, scenarios = make_env(cfg.env, cfg.train.seed)
    except UserCodeError as e:  # an environment of your own that broke its contract: one line, before Ray
        raise ConfigError(str(e)) from None
    except ValueError as e:  # the env's loaders name the file and line (UnicodeDecodeError: a binary file)
        if cfg.env.data is None:
            raise
        why = f"{cfg.env.data} is not a text file ({e.reason})" if isinstance(e, UnicodeDecodeError) else str(e)
        raise ConfigError(why if why.startswith("--env.data") else f"--env.data: {why}") from None
    if not scenarios:
        flag = f"--env.data: {cfg.env.data} holds" if cfg.env.data else "--env.num_scenarios: gives"
        raise ConfigError(f"{flag} no training scenarios")
    return env, scenarios


PROMPT_CHECK_SCENARIOS = 8
"""Training scenarios whose first prompts :func:`check_first_turns_fit` renders before Ray starts (cheap)."""


def check_first_turns_fit(cfg: Config, env, scenarios: Sequence[tuple[str, object]]) -> None:
    """A ConfigError naming ``--rollout.max_len`` when the first prompt of some role (its system prompt, before
    any turn) leaves no room for ``--rollout.max_new_tokens`` on one of the first :data:`PROMPT_CHECK_SCENARIOS`
    training scenarios. Such dialogues end as ``context_limit`` before anyone speaks (the runner's rule,
    :func:`marti_ibrl.rollout.runner.context_full`); prompts too long for the cap would lose most of the run.
    Every engine-served policy is checked with its own tokenizer: trained roles' and frozen checkpoints'."""
    paths = {r.name: ([] if r.frozen else [r.pretrain]) + frozen_checkpoints(r) for r in cfg.roles}
    flags = {
        p: f"--role{i}.{'frozen' if r.frozen else 'pretrain'}"
        for i, r in enumerate(cfg.roles, 1)
        for p in paths[r.name]
    }
    loaded = {p: checkpoint_tokenizer(p, flags[p]) for p in {p for ps in paths.values() for p in ps}}
    tokenizers = {role: [loaded[p] for p in ps] for role, ps in paths.items()}
    max_new, max_len = cfg.rollout.max_new_tokens, cfg.rollout.max_len
    served = [role for role, toks in tokenizers.items() if toks]
    if huge := overlong_system_prompts(env, scenarios[:PROMPT_CHECK_SCENARIOS], served, max_len):
        uid, role, n = max(huge, key=lambda x: x[2])
        raise ConfigError(
            f"--env.name {cfg.env.name}: {role}'s system prompt for scenario {uid} is {n:,} characters, more than "
            f"{PROMPT_CHARS_PER_TOKEN} per token of --rollout.max_len {max_len} ({PROMPT_CHARS_PER_TOKEN * max_len:,}): "
            "it cannot fit and was not tokenized; shorten the prompt (or raise --rollout.max_len)"
        )
    over = first_turns_overflowing(env, scenarios[:PROMPT_CHECK_SCENARIOS], tokenizers, max_new, max_len)
    if over:
        uid, role, n = max(over, key=lambda x: x[2])
        raise ConfigError(
            f"--rollout.max_len: {max_len} leaves no room for a first turn: {role}'s prompt for scenario {uid} is "
            f"{n} tokens before --rollout.max_new_tokens {max_new} (prompts of {len({u for u, _, _ in over})} of the "
            f"first {min(len(scenarios), PROMPT_CHECK_SCENARIOS)} scenarios do not fit); "
            f"need --rollout.max_len >= {n + max_new}"
        )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def checkpoint_tokenizer(path: str, flag: str):
    """The tokenizer of the HF checkpoint ``path`` (given by ``flag``); a ConfigError naming the flag when ``path`` is
    no checkpoint (no ``config.json``) or its tokenizer does not load, before Ray or DeepSpeed would find out."""
    from transformers import AutoTokenizer

    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"{flag}: {path} is not a Hugging Face checkpoint (no config.json in it)")
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):  # transformers would make an empty one
        raise ConfigError(f"{flag}: {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:  # e.g. a slow tokenizer without sentencepiece / tiktoken installed
        why = " ".join(str(e).split())
        raise ConfigError(f"{flag}: the tokenizer of {path} does not load: {why[:300]}") from None
    if not tokenizer.chat_template:
        raise ConfigError(f"{flag}: the tokenizer of {path} has no chat template (every turn is rendered with it)")
    return tokenizer


def check_sync(k: int, run_dir: Path, stacks: dict, snapshots, colocation, topology: dict) -> None:
    """``--train.check_sync``: after iteration k (0: start-up) every trained role's engines hold its actor's weights
    and its pool engines the snapshot file they loaded (``snapshots``: :class:`~marti_ibrl.training.snapshots.
    SnapshotBook`); the digests go to ``RUN/sync_checks.jsonl`` (a resumed run appends: the last line of an iteration
    is the committed run's). A mismatch stops the run, naming the engines."""
    from safetensors.torch import load_file

    from marti_ibrl.rollout.digest import params_digest

    colocation.wake_for_reading(k, list(stacks))  # colocated engines asleep hold no weights to read
    for r, stack in stacks.items():
        if stack.lora:  # the adapter the actor trains vs the one its engines serve as the current policy
            record = {"iteration": k, "role": r, "actor": stack.adapter_digest()}
            record["engines"] = stack.engine_adapter_digests()
        else:
            record = {"iteration": k, "role": r, "actor": stack.weights_digest(), "engines": stack.engine_digests()}
        pool = snapshots.pools.get(r) if not stack.lora else None
        snap = next((m for m in pool.members if m.version == snapshots.loaded.get(r)), None) if pool else None
        if snap is not None:  # (a snapshot evicted since it was loaded is not checked)
            record["pool_version"] = snap.version
            record["pool_file"] = params_digest(load_file(str(pool.path(snap))).items())
            record["pool_engines"] = stack.engine_digests(stack.pool_engines)
        with open(run_dir / SYNC_CHECKS_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")
        wrong = [i for i, d in enumerate(record["engines"]) if d != record["actor"]]
        wrong_pool = [i for i, d in enumerate(record.get("pool_engines", [])) if d != record["pool_file"]]
        if wrong or wrong_pool:
            what = "start-up" if k == 0 else f"iteration {k}"
            raise RuntimeError(
                f"--train.check_sync: after {what}, {r}'s engines {wrong} do not hold its actor's weights "
                f"and its pool engines {wrong_pool} not pool snapshot v{record.get('pool_version')} "
                f"(weight sync {topology['trained'][r]['weight_sync']}); digests in {run_dir / SYNC_CHECKS_FILE}"
            )
