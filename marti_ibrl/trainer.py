"""The IB-RL trainer (paper Algorithm 1). :meth:`IBRLTrainer.iteration` is one iteration, top to bottom."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from statistics import mean

import ray
from tqdm import tqdm

from marti_ibrl.algorithm.advantages import acted_with_current_policy, group_key
from marti_ibrl.algorithm.schedule import roles_due
from marti_ibrl.backend.openrlhf_glue import RoleStack, init_ray, resolve_device
from marti_ibrl.config import Config, to_yaml
from marti_ibrl.envs import make_env
from marti_ibrl.rewards import env_reward, load_reward_fn
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.rollout.render import role_experience
from marti_ibrl.rollout.runner import DialogueRunner, Policy

STATE_FILE = "trainer_state.json"


class ScenarioSampler:
    """Scenarios q for each iteration: a seeded shuffle of the training set, epoch after epoch."""

    def __init__(self, scenarios: Sequence[tuple[str, object]], seed: int):
        self.scenarios = list(scenarios)
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffled()

    def _shuffled(self) -> list[int]:
        order = list(range(len(self.scenarios)))
        random.Random(f"{self.seed}/{self.epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[tuple[str, object]]:
        out = []
        while len(out) < n:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled()
            out.append(self.scenarios[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffled()


def role_samples(trajectories: Sequence[Trajectory], role: str, max_len: int) -> list:
    """The role's OpenRLHF experiences: its own rendering and mask m_i, reward R_i, group (role, q).

    Only trajectories where the role's *current* policy acted enter (membership rule of Eq. 4).
    """
    samples = []
    for t in trajectories:
        if not acted_with_current_policy(t.policies, role):
            continue
        exp = role_experience(t.views[role], max_len, reward=t.rewards[role], label=t.scenario_uid)
        exp.group_ids = [group_key(role, t.scenario_uid)]
        samples.append(exp)
    return samples


class Timer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[f"timing/{name}"] = time.perf_counter() - start


class IBRLTrainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.roles = [r.name for r in cfg.roles]
        self.run_dir = Path(cfg.ckpt.path)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        self.env, scenarios = make_env(cfg.env, cfg.train.seed)
        self.sampler = ScenarioSampler(scenarios, cfg.train.seed)
        device = resolve_device(cfg)
        init_ray(cfg, device)
        self.stacks = {r.name: RoleStack.start(cfg, r, device) for r in cfg.roles}
        ray.get([ref for s in self.stacks.values() for ref in s.init_models(cfg.train.iterations)])
        reward_fns = {r.name: load_reward_fn(r.reward_fn) if r.reward_fn else env_reward(self.env) for r in cfg.roles}
        sampling = {
            "temperature": cfg.rollout.temperature,
            "top_p": cfg.rollout.top_p,
            "max_new_tokens": cfg.rollout.max_new_tokens,
        }
        self.runner = DialogueRunner(self.env, reward_fns, sampling, cfg.rollout.max_len, cfg.env.max_resamples)
        self.start_iteration = 1
        self.history: list[dict] = []
        if cfg.ckpt.load_enable and (self.run_dir / STATE_FILE).exists():
            self._resume()
        self.logger = self._make_logger()

    def policies(self) -> dict[str, Policy]:
        """Who plays each seat this iteration: every role's current policy (opponent pools: issue 3)."""
        return {r: Policy("current", s.engines, s.tokenizer) for r, s in self.stacks.items()}

    def iteration(self, k: int) -> dict[str, float]:
        """IB-RL iteration k (Alg. 1, lines 3-13)."""
        cfg, timer = self.cfg, Timer()
        with timer("sample"):
            scenarios = self.sampler.next_batch(cfg.rollout.batch_size)
        with timer("rollout"):  # shared trajectories; per-role rewards R_i(τ) scored as dialogues finish
            trajectories = self.runner.run(scenarios, cfg.rollout.n_samples_per_prompt, self.policies(), progress=True)
        due = roles_due(k, {r.name: r.update_every for r in cfg.roles})  # u_i(k), §4.2
        with timer("experience"), ThreadPoolExecutor(max(1, len(due))) as pool:  # per-role masks m_i + Eq. 4
            samples = {r: role_samples(trajectories, r, cfg.rollout.max_len) for r in due}
            experiences = dict(zip(due, pool.map(lambda r: self.stacks[r].make_experiences(samples[r]), due)))
        with timer("update"):  # Eq. 5, each role's own optimizer; roles that are not due do not step
            fit_refs = {r: self.stacks[r].fit_async(experiences[r]) for r in due}
            status = {r: ray.get(refs)[0] for r, refs in fit_refs.items()}
        with timer("weight_sync"):  # only updated roles re-sync their engines
            ray.get([ref for r in due for ref in self.stacks[r].sync_engines_async()])
        return self._metrics(k, trajectories, experiences, status, timer)

    def fit(self) -> list[dict]:
        cfg = self.cfg
        bar = tqdm(range(self.start_iteration, cfg.train.iterations + 1), desc="IB-RL", unit="it")
        for k in bar:
            metrics = self.iteration(k)
            self.history.append(metrics)
            self.logger.log_train(k, metrics)
            bar.set_postfix({f"{r}/reward": f"{metrics[f'{r}/reward']:.2f}" for r in self.roles})
            if cfg.ckpt.save_steps > 0 and k % cfg.ckpt.save_steps == 0 and k < cfg.train.iterations:
                self.save(k)
        self.save(cfg.train.iterations, final=True)
        self.logger.close()
        return self.history

    # -- checkpoints, logs -----------------------------------------------------------------------------------

    def save(self, k: int, final: bool = False) -> None:
        tag = f"global_step{k}"
        refs = [ref for s in self.stacks.values() for ref in s.save_checkpoint_async(tag, {"ibrl_iteration": k})]
        if final:
            refs += [ref for s in self.stacks.values() for ref in s.save_hf_async()]
        ray.get(refs)
        state = {"iteration": k, "sampler": self.sampler.state_dict(), "history": self.history}
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.run_dir / STATE_FILE)  # atomic: a half-written state is never picked up

    def _resume(self) -> None:
        state = json.loads((self.run_dir / STATE_FILE).read_text())
        self.start_iteration = state["iteration"] + 1
        self.sampler.load_state_dict(state["sampler"])
        self.history = state["history"]
        ray.get([ref for s in self.stacks.values() for ref in s.sync_engines_async()])

    def _make_logger(self):
        from openrlhf.utils.logging_utils import TensorboardLogger, WandbLogger

        args = next(iter(self.stacks.values())).args
        return WandbLogger(args) if self.cfg.logger.wandb_project else TensorboardLogger(args)

    def _metrics(self, k, trajectories, experiences, status, timer) -> dict[str, float]:
        n = len(trajectories)
        m: dict[str, float] = {"iteration": k, **timer.seconds}
        m["rollout/agreement"] = sum(t.outcome.agreed for t in trajectories) / n
        m["rollout/malformed"] = sum(t.outcome.malformed for t in trajectories) / n
        m["rollout/turns"] = mean(len(t.turns) for t in trajectories)
        m["rollout/truncated"] = sum(t.truncated for t in trajectories) / n
        for r in self.roles:
            m[f"{r}/reward"] = mean(t.rewards[r] for t in trajectories)
            m[f"{r}/utility"] = mean(t.outcome.utilities.get(r, 0.0) for t in trajectories)
            m[f"{r}/malformed"] = sum(t.outcome.info.get("fault_role") == r for t in trajectories) / n
            m[f"{r}/updated"] = float(r in status)
            for key, value in status.get(r, {}).items():
                if isinstance(value, int | float):
                    m[f"{r}/{key}"] = float(value)
            if r in experiences:
                adv = [float(e.advantages[e.action_mask.bool()].mean()) for e in experiences[r] if e.action_mask.any()]
                m[f"{r}/adv_abs_mean"] = mean(abs(a) for a in adv) if adv else 0.0
        return m


def summary_table(history: list[dict], roles: Sequence[str]) -> str:
    """Per-iteration, per-role table: reward, agreement rate, malformed rate, whether the role updated."""
    head = ["iter", "agree", "malf"] + [f"{r}:{c}" for r in roles for c in ("reward", "malf", "upd")]
    rows = [head]
    for m in history:
        row = [f"{int(m['iteration'])}", f"{m['rollout/agreement']:.2f}", f"{m['rollout/malformed']:.2f}"]
        for r in roles:
            row += [f"{m[f'{r}/reward']:.2f}", f"{m[f'{r}/malformed']:.2f}", "y" if m[f"{r}/updated"] else "-"]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def train(cfg: Config) -> list[dict]:
    trainer = IBRLTrainer(cfg)
    history = trainer.fit()
    print(summary_table(history, trainer.roles))
    return history
