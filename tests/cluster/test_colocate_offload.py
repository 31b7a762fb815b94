"""The CPU side of the colocated layouts (issue 37): OpenRLHF's own ``offload_deepspeed_states`` /
``reload_deepspeed_states`` (what ``--ds.enable_sleep`` calls around every update) round-trip a DeepSpeed engine's
states exactly on CPU, for ZeRO-2 and ZeRO-3, and the next step is the one it would have been without them. The
colocated trainer will make the same calls in the same order on CPU as on GPUs; this is what they do here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # torch.distributed + DeepSpeed in a subprocess, ~1 min on 2 cores

SCRIPT = r"""
import json, os, sys, torch, deepspeed
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
deepspeed.init_distributed(dist_backend="gloo")
from openrlhf.utils.deepspeed.deepspeed_utils import offload_deepspeed_states, reload_deepspeed_states

def engine(stage):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "none"}},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    return deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)[0]

def step(eng, x):
    loss = eng(x).pow(2).sum(); eng.backward(loss); eng.step(); return float(loss)

stage = int(sys.argv[1])
x = torch.randn(2, 32, generator=torch.Generator().manual_seed(1))
plain, slept = engine(stage), engine(stage)
losses = {"plain": [step(plain, x)], "slept": [step(slept, x)]}
offload_deepspeed_states(slept)
reload_deepspeed_states(slept)
losses["plain"] += [step(plain, x), step(plain, x)]
losses["slept"] += [step(slept, x), step(slept, x)]
print(json.dumps({"optimizer": type(slept.optimizer.optimizer).__name__, **losses}), flush=True)
"""


@pytest.mark.parametrize("stage", [2, 3])
def test_offload_and_reload_round_trip_on_cpu(stage, tmp_path):
    from child_env import END_OF_SCRIPT, child_env

    from marti_ibrl.procenv import listen_port

    script = tmp_path / "offload.py"
    script.write_text(SCRIPT + END_OF_SCRIPT)
    # child_env: the venv's DeepSpeed ops (make ds-ops), not a JIT build into ~/.cache (2+ CPU-minutes in CI)
    cmd = [sys.executable, str(script), str(stage), str(listen_port())]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=child_env())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["optimizer"] == "FusedAdam"  # OpenRLHF's offload asserts it: DeepSpeed's CPU accelerator provides it
    assert got["slept"] == got["plain"] and got["plain"][2] < got["plain"][0]  # exact, and still learning
