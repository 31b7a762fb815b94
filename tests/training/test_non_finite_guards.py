"""Non-finite guards around a role's update: a NaN/inf loss or gradient skips the optimizer step (DeepSpeed's own
overflow skip, on every ZeRO stage and dtype), repeated skips stop the run before it saves, and no checkpoint, HF
export or snapshot is ever written from NaN/inf weights. (The reward guard: tests/rollout/test_runner_players.py; the
config's: tests/config/test_config.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fake_model import fake_checkpoint

from marti_ibrl.training.checks import TrainingStopped, count_skipped_updates, weights_moved


def test_skipped_updates_are_counted_and_repeated_ones_stop_the_run(capsys) -> None:
    in_a_row: dict[str, int] = {}
    ok, skipped = {"update/steps": 1.0, "update/skipped": 0.0}, {"update/steps": 1.0, "update/skipped": 1.0}
    assert (
        weights_moved(ok) and not weights_moved(skipped) and weights_moved({"update/steps": 2.0, "update/skipped": 1.0})
    )
    count_skipped_updates(1, {"agent1": skipped, "agent2": ok}, in_a_row, limit=2)
    assert in_a_row == {"agent1": 1, "agent2": 0}
    assert capsys.readouterr().out == (
        "iteration 1: agent1: 1 of 1 optimizer steps skipped for a NaN/inf loss or gradient norm (weights unchanged "
        "by them; 1 update(s) in a row)\n"
    )
    count_skipped_updates(2, {"agent1": ok}, in_a_row, limit=2)  # a clean update resets the count
    assert in_a_row == {"agent1": 0, "agent2": 0}
    count_skipped_updates(3, {"agent1": skipped}, in_a_row, limit=2)
    with pytest.raises(TrainingStopped) as e:
        count_skipped_updates(4, {"agent1": skipped, "agent2": ok}, in_a_row, limit=2)
    assert str(e.value) == (
        "--train.max_skipped_updates 2: agent1's last 2 updates (to iteration 4) had optimizer steps skipped for a "
        "NaN/inf loss or gradient norm; stopped before iteration 4 was saved (lower its --roleN.lr, check its rewards)"
    )


@pytest.fixture
def one_rank(tmp_path: Path):
    """A one-process gloo group, as a role's actor has (its ranks all-reduce the verdict)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Strategy:
    """Records what the guarded actor hands OpenRLHF's strategy to write."""

    def __init__(self, out: Path) -> None:
        self.args = SimpleNamespace(
            ckpt=SimpleNamespace(path=str(out / "ckpt"), output_dir=str(out / "hf"), max_num=3, max_mem=1000),
            train=SimpleNamespace(enable_ema=False),
            ds=SimpleNamespace(zero_stage=2),
        )
        self.written: list[str] = []

    def save_ckpt(self, model, path, tag, *args, **kwargs) -> None:
        self.written.append(f"ckpt:{tag}")

    def save_model(self, model, tokenizer, path) -> None:
        self.written.append(f"hf:{Path(path).name}")


def _actor(tmp_path: Path, poison: float | None):
    """A role's policy actor (the class Ray runs) around a small module, one weight set to ``poison``."""
    from marti_ibrl.backend.actors import RolePolicyActorBase

    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    if poison is not None:
        with torch.no_grad():
            module[1].weight[0, 1] = poison
    actor = object.__new__(RolePolicyActorBase)
    actor.actor = SimpleNamespace(model=SimpleNamespace(module=module))
    actor.strategy = _Strategy(tmp_path)
    actor.disable_ds_ckpt, actor.save_hf_ckpt, actor.tokenizer = False, False, None
    return actor


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
def test_nothing_is_written_from_non_finite_weights(tmp_path: Path, one_rank, poison: float) -> None:
    from marti_ibrl.backend.finite import NonFiniteError

    actor = _actor(tmp_path, poison)
    with pytest.raises(NonFiniteError, match=r"not written: 1 parameter tensors hold NaN/inf \(e\.g\. 1\.weight\)$"):
        actor.save_checkpoint("global_step3")
    with pytest.raises(NonFiniteError, match=r"^HF export .*/hf not written"):
        actor.save_model()
    with pytest.raises(NonFiniteError, match=r"^snapshot .*v000003\.safetensors not written"):
        actor.export_weights(str(tmp_path / "v000003.safetensors"), "fp32")
    assert actor.strategy.written == [] and not (tmp_path / "v000003.safetensors").exists()


def test_finite_weights_are_written(tmp_path: Path, one_rank) -> None:
    from safetensors.torch import load_file

    actor = _actor(tmp_path, None)
    actor.save_checkpoint("global_step3")
    actor.save_model()
    info = actor.export_weights(str(tmp_path / "v000003.safetensors"), "fp32")
    assert actor.strategy.written == ["ckpt:global_step3", "hf:hf"]
    saved = load_file(str(tmp_path / "v000003.safetensors"))
    assert info["bytes"] > 0 and torch.equal(saved["1.weight"], actor.actor.model.module[1].weight.detach())


# One process, one gloo rank: a DeepSpeed engine per (ZeRO stage, dtype) takes optimizer steps of two micro-batches
# each through the strategy's backward/optimizer_step, the second micro-batch's loss times 1, NaN, inf, then 1 again.
_STEPS = """
import json, os, sys
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
import torch, deepspeed
from openrlhf.utils.deepspeed import DeepspeedStrategy
from marti_ibrl.backend.finite import FiniteStepStrategy

deepspeed.init_distributed("gloo")
out = {}
for name in sys.argv[2:]:
    stage, dtype, kind = name.split("/")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": int(stage)}, "zero_allow_untested_optimizer": True}
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    cls = FiniteStepStrategy if kind == "guarded" else DeepspeedStrategy
    strategy = cls.__new__(cls)
    def weights():
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == "3"):
            return torch.cat([p.detach().float().flatten().clone() for p in engine.module.parameters()])
    log = []
    # "+nan": a NaN added to the loss, the gradients finite (no gradient check sees it); "*inf": the gradients too
    for poison in ("+0", "+nan", "*inf", "+0"):
        before = weights()
        for i in range(2):
            x = torch.randn(4, 16, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
            loss = engine(x).float().pow(2).mean()
            if i == 1:
                loss = loss + float(poison[1:]) if poison[0] == "+" else loss * float(poison[1:])
            strategy.backward(loss, engine, None)
            strategy.optimizer_step(None, engine, None)
        after = weights()
        log.append([poison, not torch.equal(before, after), bool(torch.isfinite(after).all()),
                    engine.skipped_steps, engine.global_steps])
    out[name] = log
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.e2e  # DeepSpeed engines (ZeRO-2/3 on gloo) in a subprocess: a minute on 2 busy cores
def test_deepspeed_skips_non_finite_steps_on_every_stage_and_dtype(tmp_path: Path) -> None:
    """fp32 (every ZeRO stage) and bf16 ZeRO-3, which DeepSpeed never checks, skip a NaN/inf step like the rest:
    weights untouched and finite, the step counted in ``skipped_steps`` (and ``global_steps``, which
    ``RolePolicyActorBase.fit`` reports as ``update/steps``), and the next finite step trains. DeepSpeed 0.19.8 skips a step whose gradient norm is not finite itself, in
    every stage and dtype; without the guard (OpenRLHF's own strategy) it takes a step whose loss is NaN while its
    gradients are finite. (The guard's first version switched DeepSpeed's own bf16 ZeRO-2 check off and so trained
    into NaN on 0.19.8: caught by this test in CI.)"""
    from child_env import END_OF_SCRIPT, child_env

    script = tmp_path / "steps.py"
    script.write_text(_STEPS + END_OF_SCRIPT)
    names = ["2/fp32/guarded", "3/fp32/guarded", "2/bf16/guarded", "3/bf16/guarded", "2/bf16/plain"]

    from marti_ibrl.procenv import listen_port

    run = subprocess.run(
        [sys.executable, str(script), str(listen_port()), *names],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(next(ln for ln in run.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    for name in names[:-1]:  # [poison, moved, finite, skipped_steps, global_steps] after each optimizer step
        assert result[name] == [
            ["+0", True, True, 0, 1],
            ["+nan", False, True, 1, 2],
            ["*inf", False, True, 2, 3],
            ["+0", True, True, 2, 4],
        ], name
    plain = result["2/bf16/plain"]  # DeepSpeed alone steps on the NaN loss (its gradients are finite) ...
    assert plain[1] == ["+nan", True, True, 0, 2] and plain[2][1:4] == [False, True, 1]  # ... and skips the inf ones


def test_cli_reports_a_stopped_run_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from marti_ibrl import trainer
    from marti_ibrl.cli import main

    def stopped(cfg):
        raise TrainingStopped("--train.max_skipped_updates 3: agent1's last 3 updates ...")

    monkeypatch.setattr(trainer, "train", stopped)
    ckpt = str(fake_checkpoint(tmp_path / "ckpt"))
    assert main(["train", "--role1.pretrain", ckpt, "--role2.pretrain", ckpt, "--train.device", "cpu"]) == 4
    assert capsys.readouterr().err == (
        "marti-ibrl train: error: --train.max_skipped_updates 3: agent1's last 3 updates ...\n"
    )


def test_a_write_refused_in_an_actor_stops_the_run_in_one_line() -> None:
    """The actor's NonFiniteError reaches the driver wrapped by Ray (its traceback in the message); the run stops
    with the actor's one line and the iteration."""
    from ray.exceptions import RayTaskError

    from marti_ibrl.backend.finite import NonFiniteError
    from marti_ibrl.trainer import IBRLTrainer
    from marti_ibrl.training.ahead import RolloutAhead

    cause = NonFiniteError(
        "checkpoint run/agent1/ckpt/_actor/global_step1 not written: 2 parameter tensors hold NaN/inf"
    )
    wrapped = RayTaskError("RolePolicyActor.save_checkpoint", "Traceback (most recent call last): ...", cause)

    def iteration(k):
        raise wrapped.as_instanceof_cause()

    trainer = object.__new__(IBRLTrainer)
    trainer.cfg = SimpleNamespace(train=SimpleNamespace(iterations=2, check_sync=False, async_rollout=False))
    trainer.start_iteration, trainer.topology, trainer.iteration = 1, {"nodes": []}, iteration
    trainer.ahead = RolloutAhead(enabled=False)  # (synchronous: no rollout thread)
    with pytest.raises(TrainingStopped) as e:
        trainer.fit()
    assert str(e.value) == f"iteration 1: {cause}"
