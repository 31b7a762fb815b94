"""An iteration's numbers (the iteration table, tensorboard, ``history`` in the commit record), as functions of plain
records: the trajectories, each role's update status and sample split, the pools' sizes. docs/training.md names them."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from marti_ibrl.algorithm.advantages import GroupSpread
from marti_ibrl.algorithm.batching import RankSplit
from marti_ibrl.algorithm.pool import configurations
from marti_ibrl.rollout.dialogue import Trajectory
from marti_ibrl.training.checks import weights_moved


def iteration_metrics(
    k: int,
    trajectories: Sequence[Trajectory],
    *,
    roles: Sequence[str],
    configuration: str,
    schedule: Sequence[str],
    status: dict[str, dict],
    advantages: dict[str, list[float]],
    scored: dict[str, list[tuple[Trajectory, float]]],
    splits: dict[str, RankSplit],
    ranks: dict[str, int],
    spreads: dict[str, GroupSpread],
    synced: dict[str, dict | None],
    pools: dict,
    reward_stats: dict[str, float],
    seconds: dict[str, float],
) -> dict[str, float]:
    """Iteration k's metrics: the rollout's outcomes (``rollout/*``), Eq. 6's configuration and pool sizes, each
    seat's reward, utility and malformed rates, each trained role's update (``status``: its actor's numbers, and
    whether it stepped), mean advantage per experience (``advantages``, :func:`mean_advantages`), samples made (its
    group members and penalised attempts, ``scored``), trained and padding per rank (``splits``, ``ranks``: its
    data-parallel ranks), its groups and the informative ones (``spreads``), and what an adapter-only weight sync
    moved (``synced``)."""
    n = len(trajectories)
    m: dict[str, float] = {"iteration": k, **seconds}
    m["rollout/dialogues"] = float(n)  # B × G per pairing: twice that in a history iteration (Eq. 6)
    m["rollout/agreement"] = sum(t.outcome.agreed for t in trajectories) / n
    m["rollout/malformed"] = sum(t.outcome.malformed for t in trajectories) / n
    m["rollout/turns"] = mean(len(t.turns) for t in trajectories)
    m["rollout/truncated"] = sum(t.truncated for t in trajectories) / n
    m["rollout/failed"] = sum(t.failed for t in trajectories) / n
    m["pool/configuration"] = float(configurations(roles).index(configuration))
    for r, pool in pools.items():
        m[f"{r}/pool/size"] = float(len(pool))
        m[f"{r}/pool/snapshot_seconds"] = pool.members[-1].seconds if len(pool) else 0.0
    m.update(reward_stats)
    for r in roles:
        rewards = [t.rewards[r] for t in trajectories if r in t.rewards]
        m[f"{r}/reward"] = mean(rewards) if rewards else float("nan")
        m[f"{r}/reward_failed"] = sum(r in t.reward_failures for t in trajectories) / n
        m[f"{r}/reward/failures"] = float(sum(r in t.reward_failures for t in trajectories))
        m[f"{r}/utility"] = mean(t.outcome.utilities.get(r, 0.0) for t in trajectories)
        m[f"{r}/malformed"] = sum(t.outcome.info.get("fault_role") == r for t in trajectories) / n
        m[f"{r}/attempts_malformed"] = attempts_malformed(trajectories, r)
        if (nll := sampled_nll(trajectories, r)) is not None:
            m[f"{r}/sampled_nll"] = nll
        m[f"{r}/updated"] = float(r in status and weights_moved(status[r]))
        m[f"{r}/scheduled"] = float(r in schedule)
        m[f"{r}/current_share"] = sum(t.policies[r] == "current" for t in trajectories) / n
        for key, value in status.get(r, {}).items():
            if isinstance(value, int | float):
                m[f"{r}/{key}"] = float(value)
        if r in advantages:
            adv = advantages[r]
            m[f"{r}/adv_abs_mean"] = mean(abs(a) for a in adv) if adv else 0.0
    for r in scored:
        m.update(sample_metrics(r, len(scored[r]), splits.get(r) if r in status else None, ranks[r]))
    for r in scored:  # of the samples made, the penalised re-sampled attempts (the rest: its dialogues)
        m[f"{r}/samples_penalized"] = float(sum(1 for t, _ in scored[r] if t.outcome.info.get("attempt")))
    for r, spread in spreads.items():
        m[f"{r}/groups"], m[f"{r}/informative_groups"] = float(spread.groups), float(spread.informative)
    for r, info in synced.items():  # what an adapter-only sync moved (full-weight syncs report nothing)
        if info:
            m[f"{r}/sync/bytes"], m[f"{r}/sync/seconds"] = float(info["bytes"]), info["seconds"]
    return m


def mean_advantages(experiences: Sequence) -> list[float]:
    """Each sample's mean advantage over its action tokens (samples with none left out), for every row of every
    experience: an OpenRLHF ``Experience`` holds a batch of samples, and Eq. 4's advantages sum to zero within a
    group, so a mean taken over a whole batch would read near 0 for a batch that holds whole groups (``ROLE/adv_abs_mean``
    is the mean of the rows' absolute values)."""
    out = []
    for e in experiences:
        adv, mask = e.advantages, e.action_mask.bool()
        if adv.dim() == 1:  # one sample
            adv, mask = adv[None], mask[None]
        out += [float(row[m].mean()) for row, m in zip(adv, mask, strict=True) if m.any()]
    return out


def sampled_nll(trajectories: Sequence[Trajectory], role: str) -> float | None:
    """The mean of -log π(w) over the tokens ``role``'s current policy sampled this iteration (the engines' rollout
    log-probs at the sampling temperature): a Monte-Carlo estimate of the policy's per-token entropy on its own
    turns. None where the role's engines returned no log-probs (a frozen or remote counterpart)."""
    total, n = 0.0, 0
    for t in trajectories:
        view = t.views.get(role) if t.policies.get(role) == "current" else None
        if view is None or not view.has_logprobs:
            continue
        for start, end in view.action_ranges:
            total -= sum(view.logprobs[start:end])
            n += end - start
    return total / n if n else None


def attempts_malformed(trajectories: Sequence[Trajectory], role: str) -> float:
    """The share of ``role``'s generated turns the env refused, re-sampled ones included: the per-attempt malformed
    rate (``ROLE/malformed`` counts dialogues that ended malformed after the re-samples, §5's protocol)."""
    bad = sum(1 for t in trajectories for a in t.discarded if a.role == role)
    bad += sum(1 for t in trajectories for x in t.turns if x.role == role and not x.valid)
    total = sum(1 for t in trajectories for a in t.discarded if a.role == role)
    total += sum(1 for t in trajectories for x in t.turns if x.role == role)
    return bad / total if total else 0.0


def sample_metrics(role: str, made: int, split: RankSplit | None, ranks: int) -> dict[str, float]:
    """The role's samples this iteration: made (its group members, Eq. 4), trained (real samples, each once per
    epoch), padding (zero-weight samples filling the ranks' micro-batches), in total and per data-parallel rank.
    ``split`` is None when the role did not update (nothing trained)."""
    trained = split.trained if split else (0,) * ranks
    padding = split.padding if split else (0,) * ranks
    m = {
        f"{role}/samples_made": float(made),
        f"{role}/samples_trained": float(sum(trained)),
        f"{role}/samples_padding": float(sum(padding)),
    }
    for rank, (t, p) in enumerate(zip(trained, padding, strict=True)):
        m[f"{role}/rank{rank}/samples_trained"] = float(t)
        m[f"{role}/rank{rank}/samples_padding"] = float(p)
    return m


def update_mark(m: dict, role: str) -> str:
    """The iteration table's ``upd`` for a role: ``y`` it updated, ``0`` it updated with every advantage 0 (no
    informative group: the policy moved by its KL term only), ``-`` it did not update."""
    if not m.get(f"{role}/updated"):
        return "-"
    return "0" if m.get(f"{role}/informative_groups", 1.0) == 0 else "y"


def _table_head(roles: Sequence[str]) -> list[str]:
    return ["iter", "vs pool", "agree", "malf"] + [f"{r}:{c}" for r in roles for c in ("reward", "malf", "upd")]


def _table_cells(m: dict, roles: Sequence[str]) -> list[str]:
    names = ["-", *roles]  # configurations(): "both" shown as "-"
    config = names[int(m.get("pool/configuration", 0))]
    row = [f"{int(m['iteration'])}", config, f"{m['rollout/agreement']:.2f}", f"{m['rollout/malformed']:.2f}"]
    for r in roles:
        row += [f"{m[f'{r}/reward']:.2f}", f"{m[f'{r}/malformed']:.2f}", update_mark(m, r)]
    return row


def _widths(roles: Sequence[str], iterations: int) -> list[int]:
    """Column widths known before the first iteration: a live table's rows line up with its head."""
    cells = ["9" * len(str(iterations)), max(["-", *roles], key=len), "0.00", "0.00"] + ["-00.00", "0.00", "y"] * len(
        roles
    )
    return [max(len(h), len(c)) for h, c in zip(_table_head(roles), cells, strict=True)]


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths))


def table_head(roles: Sequence[str], iterations: int) -> str:
    """The head of the live iteration table (:func:`table_row` under it, one row as each iteration ends)."""
    return _line(_table_head(roles), _widths(roles, iterations))


def table_row(m: dict, roles: Sequence[str], iterations: int) -> str:
    """Iteration ``m``'s row of the per-iteration table, in :func:`table_head`'s columns: Eq. 6 configuration ("vs
    pool": whose current policy faced the other roles' snapshots), agreement and malformed rates, and per role its
    reward, malformed rate and whether it updated (:func:`update_mark`)."""
    return _line(_table_cells(m, roles), _widths(roles, iterations))
