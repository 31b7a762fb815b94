"""What an end-to-end test sees of a trainer's rollouts: every trajectory it played, as it played them."""

from __future__ import annotations


def record_rollouts(trainer) -> list:
    """Wrap ``trainer.runner.run`` so that every trajectory it returns is also appended to the list returned here."""
    played, rollout = [], trainer.runner.run

    def run(*args, **kwargs):
        trajectories = rollout(*args, **kwargs)
        played.extend(trajectories)
        return trajectories

    trainer.runner.run = run
    return played
