"""The learning references' runs (tests/golden.py, ``learn_<path>``): short seeded runs of five training paths from
the committed warm start ``recipes/dond/tiny-sft/`` with DoND's own reward, made by
``tests/e2e/test_e2e_learning.py``.

Every run is the demo's recipe (``recipes/dond/tiny-cpu.yaml``: the env's reward, utility on a deal and
``--env.invalid_penalty`` for a malformed ending, ``--train.penalize_resamples`` on, role2 updating every 2nd
iteration, GRPO groups) made small: 3 iterations of 4 scenarios x G = 4, one PPO epoch, no KL reference process
(``kl_coef`` 0, except LoRA, whose reference is its own base) and pools only where the path is about them. At the
seed each path runs, deals, penalised re-sampled attempts and informative advantage groups all occur within the
3 iterations (the reference records how many, tests/golden.py's ``counts``), so the rewards, the advantages and the
updates they drive are pinned, not only the mechanics.

One Ray serves every run of a session (:func:`shared_ray`): each run's start-up is its own processes only.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "dond" / "tiny-cpu.yaml"
WARM_START = ROOT / "recipes" / "dond" / "tiny-sft"  # head size 32: vLLM-CPU serves it too
ITERATIONS = 3
SEED = 1
_ROLES = ("--role1", "--role2")
_NO_KL = tuple(x for r in _ROLES for x in (f"{r}.kl_coef", "0"))
_NO_POOLS = ("--pool.probs", "[1,0,0]")
_NO_WARMUP = tuple(x for r in _ROLES for x in (f"{r}.lr_warmup_steps", "0"))
PATHS: dict[str, list[str]] = {
    # HF engines, one ZeRO-2 rank per role, synchronous, every iteration all-current (the demo's layout)
    "hf": ["--rollout.engine", "hf", *_NO_KL, *_NO_POOLS],
    # the same with opponent pools: agent1 faces agent2's history whenever there is one, which, with agent2 updating
    # every iteration, is at iteration 3 (its v1, on agent2's pool engine, beside the pairing of current policies)
    "separate": [
        *("--rollout.engine", "hf", *_NO_KL, "--pool.probs", "[0,1,0]", "--pool.size", "3"),
        *("--role2.update_every", "1"),
    ],
    # the rollout of k+1 beside the updates of k, data one update old, corrected by the engines' log-probs
    "async1": ["--rollout.engine", "hf", *_NO_KL, *_NO_POOLS, "--train.async_rollout", "true"],
    # rank-16 adapters on the frozen warm start, one engine set for both roles, adapter pools, KL to the base
    "lora": [
        *("--rollout.engine", "hf", "--rollout.share_engines", "true", "--pool.probs", "[0,1,0]", "--pool.size", "3"),
        *(x for r in _ROLES for x in (f"{r}.lora_rank", "16", f"{r}.lora_alpha", "32", f"{r}.lr", "2e-3")),
    ],
    # vLLM-CPU engines, 2 ZeRO-3 ranks per role (weights broadcast to the engines over gloo)
    "vllm_zero3": [
        *("--rollout.engine", "vllm", "--ds.zero_stage", "3", *_NO_KL, *_NO_POOLS),
        *(x for r in _ROLES for x in (f"{r}.num_gpus_per_node", "2")),
    ],
}
SLOTS = 8  # the most device slots one run takes (vllm_zero3: 2 x (2 ranks + 1 engine); separate: 2 x 3)


def flags(path: str, run_dir: Path | str) -> list[str]:
    """The run of ``path``: the demo's recipe from the warm start, small (module docstring)."""
    return [
        *("--config", str(RECIPE), "--role1.pretrain", str(WARM_START), "--role2.pretrain", str(WARM_START)),
        *("--train.iterations", str(ITERATIONS), "--train.seed", str(SEED), "--train.max_epochs", "1"),
        *("--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "4", *_NO_WARMUP),
        *("--ckpt.path", str(run_dir), "--ckpt.save_hf", "false", "--ray.log_to_driver", "false"),
        *PATHS[path],
    ]


@contextmanager
def shared_ray():
    """One local Ray for several runs (``marti_ibrl.backend.cluster.start_ray``, as a run starts it, with room for
    the largest): a trainer finds it up and starts only its own processes."""
    import ray

    from marti_ibrl.backend.cluster import start_ray

    start_ray(SLOTS, "cpu", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def learn(path: str, run_dir: Path, each_iteration: Callable[[list[str], dict], None] | None = None) -> dict:
    """Make the run of ``path`` in the Ray that is up: its history, roles and each role's final weights digest (a
    LoRA role's: its adapter's); every process and placement group it started is gone when this returns (also when
    it raised). ``each_iteration(roles, metrics)``: called as each iteration ends (tests/golden.py's ``watch``: it may
    raise, and the run stops there)."""
    from ray.util.placement_group import placement_group_table, remove_placement_group

    from marti_ibrl.backend.internals import placement_group
    from marti_ibrl.config import load_config
    from marti_ibrl.trainer import IBRLTrainer

    trainer = IBRLTrainer(load_config(flags(path, run_dir)))
    if each_iteration is not None:
        log_train = trainer.logger.log_train

        def logged(k: int, metrics: dict) -> None:
            log_train(k, metrics)
            if "iteration" in metrics:  # an iteration's metrics (not the transcripts' sample text, logged too)
                each_iteration(list(trainer.roles), metrics)

        trainer.logger.log_train = logged
    try:
        history = trainer.fit()
        digests = {r: s.adapter_digest() if s.lora else s.weights_digest() for r, s in trainer.stacks.items()}
    finally:
        trainer.close()
        for pg_id, pg in placement_group_table().items():  # the run's slots, free for the next run
            if pg["state"] != "REMOVED":
                remove_placement_group(placement_group(pg_id))
    return {"history": history, "roles": list(trainer.roles), "digests": digests}
