"""What one IB-RL run draws and times between its steps: the scenarios of each iteration, the random streams every
random choice is drawn from (exact resume: a function of (seed, stream, iteration) only), and the step timer."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from contextlib import contextmanager


def stream(seed: int, name: str, k: int) -> random.Random:
    """The random stream ``name`` of iteration k: a function of (seed, name, k) only, so iteration k is drawn the same
    whether the run started at 1 or resumed at k (``trainer_state.json``, :mod:`marti_ibrl.commit`)."""
    return random.Random(f"{seed}/{name}/{k}")


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


class Timer:
    """Seconds per named step of an iteration, as ``timing/NAME`` metrics."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[f"timing/{name}"] = time.perf_counter() - start
