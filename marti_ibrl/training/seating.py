"""Who plays each seat of an iteration (Eq. 6): every scenario once per pairing of the sampled configuration, with
the policy of every seat and the roles whose groups it feeds. Pure: snapshots are drawn here, loaded elsewhere
(pool engines: :meth:`~marti_ibrl.training.snapshots.SnapshotBook.load_pool_engines` before generation; a colocated
role's own engines: before the rollout pass that plays them, :func:`snapshot_loads`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from marti_ibrl.algorithm.pool import Pairing, Snapshot, pairings
from marti_ibrl.rollout.runner import Policy, Request
from marti_ibrl.training.records import stream


@dataclass
class Play:
    """One scenario as played in one pairing of Eq. 6: every seat's policy and the roles whose groups it feeds."""

    scenario: tuple[str, object]
    index: int  # the scenario's position in the batch (its seat rotation)
    policies: dict[str, Policy]
    learners: tuple[str, ...]
    pass_: int = 0  # the rollout pass (DialogueRunner.run): 0 for a pairing of current policies, then 1, 2, ...

    def request(self) -> Request:
        """What the runner plays: the scenario, its seats, its batch position as the seat rotation (both pairings of a
        scenario alternate openers alike) and its pass."""
        uid, scenario = self.scenario
        return Request(uid, scenario, self.policies, rotation=self.index, pass_=self.pass_)


def current_policy(stack) -> Policy:
    """π_θi: the role's current weights (a LoRA role: its current adapter) on its engines."""
    return Policy("current", stack.engines, stack.tokenizer, adapter=stack.adapter)


def snapshot_policy(role: str, stack, pool, snap: Snapshot) -> Policy:
    """π_θi^(<k) as snapshot ``snap`` of ``role``'s pool: an adapter its current engines serve per request (LoRA),
    its own engines holding the snapshot for the pass that plays it (colocated: no pool engines), or its pool
    engines (which must hold it before generation)."""
    name, path = f"pool:{snap.version}", str(pool.path(snap))
    if stack.lora:  # loaded by the engines on first use
        from marti_ibrl.lora import pool_adapter

        adapter = pool_adapter(role, stack.slot, snap.version, path)
        return Policy(name, stack.engines, stack.tokenizer, adapter=adapter)
    if not stack.pool_engines:
        return Policy(name, stack.engines, stack.tokenizer, weights=path)
    return Policy(name, stack.pool_engines, stack.tokenizer)


def seat_policies(
    configuration: str,
    scenarios: Sequence[tuple[str, object]],
    *,
    roles: Sequence[str],
    stacks: dict,
    snapshots,
    updates: dict[str, int],
    frozen: dict[str, list[Policy]],
    rng: random.Random,
    due: Sequence[str] | None = None,
) -> tuple[list[Play], dict, list[tuple[str, Snapshot]]]:
    """The iteration's plays: every scenario once per pairing of ``configuration`` (Eq. 6,
    :func:`~marti_ibrl.algorithm.pool.pairings`) over the trained roles (``stacks``; ``roles``: every seat), with the policy of every seat and
    the roles it feeds; the log entry (every policy that played each role's seat, each pairing's learners and
    seats); and the snapshots to load into pool engines before generation, as (role, snapshot).

    In a pairing, a trained role plays as its current policy, or, if the pairing takes it from history, as a
    snapshot drawn from its pool (``snapshots``: a :class:`~marti_ibrl.training.snapshots.SnapshotBook`; one per
    role and iteration, strictly older than its current policy, whose update count is ``updates[role]``; a pool
    without one lends the current policy). When that leaves nothing historical, the iteration is played as one
    all-current pairing feeding every role. A frozen role's counterpart is drawn per scenario and pairing
    (pool-of-N).

    ``due`` (u_i(k) of §4.2, the roles that update at k): a pairing none of whose learners is due is not played,
    since its dialogues would feed no update (the user's pairing on the agent's off-iterations); when no role is
    due at all, every pairing is played, for the iteration's metrics.
    """
    trained = list(stacks)
    cast: list[tuple[Pairing, dict[str, Policy]]] = []
    loads: list[tuple[str, Snapshot]] = []
    chosen = pairings(configuration, trained)
    feeding_due = [p for p in chosen if due is not None and set(p.learners) & set(due)]
    if feeding_due:
        chosen = feeding_due
    for pairing in chosen:
        fixed = {}
        for r, stack in stacks.items():
            snap = snapshots.pick(r, rng, updates[r]) if r in pairing.history else None
            if snap is None:
                fixed[r] = current_policy(stack)
                continue
            fixed[r] = snapshot_policy(r, stack, snapshots.pools[r], snap)
            if not stack.lora and stack.pool_engines:
                loads.append((r, snap))
        cast.append((pairing, fixed))
    if all(p.name == "current" for p in cast[0][1].values()):  # no history to face: current play for all
        cast = [(Pairing(tuple(trained), ()), cast[0][1])]
    # passes: the pairings of current policies first (0), then each facing history (1, 2, ...)
    numbers = iter(range(1, len(cast) + 1))
    passes = [0 if not pairing.history else next(numbers) for pairing, _ in cast]
    plays = [
        Play(scenario, i, {**fixed, **{r: rng.choice(ps) for r, ps in frozen.items()}}, pairing.learners, n)
        for (pairing, fixed), n in zip(cast, passes)
        for i, scenario in enumerate(scenarios)
    ]
    opponents = {r: ",".join(sorted({p.policies[r].name for p in plays})) for r in roles}
    log = [
        {"learners": list(pairing.learners), "seats": {r: p.name for r, p in fixed.items()}} for pairing, fixed in cast
    ]
    for entry, (_, fixed) in zip(log, cast):  # LoRA roles: the adapter (LoRARequest) each seat was served with
        adapters = {r: p.adapter.name for r, p in fixed.items() if p.adapter is not None}
        if adapters:
            entry["adapters"] = adapters
    return plays, {"opponents": opponents, "pairings": log}, loads


def seat_run(run, k: int, configuration: str, scenarios: Sequence[tuple[str, object]], due: Sequence[str] | None):
    """:func:`seat_policies` with a run's own parts (``run``: the trainer, or anything with its ``roles``, ``stacks``,
    ``snapshots``, ``updates``, ``frozen`` and ``cfg.train.seed``), drawing from iteration k's ``opponents`` stream."""
    return seat_policies(
        configuration,
        scenarios,
        roles=run.roles,
        stacks=run.stacks,
        snapshots=run.snapshots,
        updates=run.updates,
        frozen=run.frozen,
        rng=stream(run.cfg.train.seed, "opponents", k),
        due=due,
    )


def snapshot_loads(plays: Sequence[Play]) -> dict[int, dict[str, str]]:
    """Per rollout pass, the snapshot file each role's engines must hold for it (:attr:`Policy.weights`: a colocated
    role's pool snapshot served by its own engines); empty when no play needs one."""
    loads: dict[int, dict[str, str]] = {}
    for play in plays:
        for role, policy in play.policies.items():
            if policy.weights is not None:
                loads.setdefault(play.pass_, {})[role] = policy.weights
    return loads
