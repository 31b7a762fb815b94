"""marti_ibrl.quiet: the three start-up notices are gone, every other warning stays."""

from __future__ import annotations

import subprocess
import sys
import warnings

from marti_ibrl import quiet

IMPORTS = "import torch, deepspeed; from deepspeed.accelerator import get_accelerator; get_accelerator()"


def _output(code: str, env_extra: dict[str, str] | None = None) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "DS_ACCELERATOR")} | (env_extra or {})
    run = subprocess.run(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300
    )
    return run.stdout  # DeepSpeed logs to stdout, warnings go to stderr: both, as a user sees them


def test_the_startup_notices_are_filtered_and_only_they():
    loud = _output(IMPORTS)
    assert "The pynvml package is deprecated" in loud and "Setting accelerator to CPU" in loud  # the test can fail
    hushed = _output(f"from marti_ibrl import quiet; quiet.install(); {IMPORTS}")
    assert "pynvml" not in hushed and "Setting accelerator to CPU" not in hushed
    # child processes get the Python warnings' filters through PYTHONWARNINGS
    child = _output("import torch", {"PYTHONWARNINGS": quiet.pythonwarnings()})
    assert "pynvml" not in child


def test_other_warnings_still_show():
    quiet.install()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet.install()  # filters go in front of the "default" above
        warnings.warn("Tip: something else", FutureWarning, stacklevel=1)  # not from ray._private.worker
        warnings.warn("The pynvml package is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("another deprecation", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["Tip: something else", "another deprecation"]


def test_pythonwarnings_keeps_the_users_filters_first():
    value = quiet.pythonwarnings("error::UserWarning")
    assert value.split(",")[0] == "error::UserWarning"
    assert "ignore:The pynvml package is deprecated:FutureWarning" in value.split(",")
    assert "ignore:Tip:FutureWarning:ray._private.worker" in value.split(",")
    assert all(":" not in m for m, _, _ in quiet.WARNINGS)  # PYTHONWARNINGS fields are split on ':'
