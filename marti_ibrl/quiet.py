"""Start-up messages a user cannot act on, filtered in one place.

Unfiltered, every command opens with three of them:

* torch's ``import pynvml`` (``torch/cuda/__init__.py``): "The pynvml package is deprecated" — a FutureWarning about
  a package torch itself imports; nothing for a user to change.
* Ray's driver start: "Tip: In future versions of Ray, Ray will no longer override accelerator visible devices env
  var if num_gpus=0 ..." — a FutureWarning. Setting ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` would silence it too,
  but would also change which GPUs a zero-GPU actor sees on a cluster; we keep Ray's behaviour and drop the notice.
* DeepSpeed's accelerator detection on a machine without a GPU: "Setting accelerator to CPU. If you have GPU or other
  accelerator, we were unable to detect it." — logged at WARNING on every CPU run, which is this project's CI path.

Only these exact messages are filtered, by their text, so every other warning still shows. :func:`install` filters
them in this process (``marti-ibrl`` calls it first); :func:`pythonwarnings` is the ``PYTHONWARNINGS`` value that
filters the two Python warnings in the processes we start (Ray actors, engines), added by
:func:`marti_ibrl.procenv.child_env_vars`.
"""

from __future__ import annotations

import logging
import warnings

WARNINGS = (
    # (message prefix without ':' (PYTHONWARNINGS splits on it), category, module that warns or "" for any)
    ("The pynvml package is deprecated", FutureWarning, ""),
    ("Tip", FutureWarning, "ray._private.worker"),
)
LOGS = {"DeepSpeed": ("Setting accelerator to CPU",)}
"""Logger name -> message prefixes dropped from it."""


class _Drop(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def install() -> None:
    """Filter :data:`WARNINGS` and :data:`LOGS` in this process (idempotent; before torch, Ray or DeepSpeed load)."""
    for message, category, module in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, prefixes in LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(prefixes))


def pythonwarnings(existing: str = "") -> str:
    """``PYTHONWARNINGS`` for a child process: the user's own filters (``existing``) first, then :data:`WARNINGS`."""
    ours = [f"ignore:{m}:{c.__name__}:{mod}" if mod else f"ignore:{m}:{c.__name__}" for m, c, mod in WARNINGS]
    return ",".join([x for x in existing.split(",") if x] + ours)
