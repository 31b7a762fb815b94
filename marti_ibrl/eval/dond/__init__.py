"""Deal-or-No-Deal evaluation (paper §5.2): :mod:`.evaluator` (frozen policies vs counterparts, seat-averaged, streamed
to JSONL), :mod:`.metrics` (Table 2's metrics from the episode files), :mod:`.command` (``marti-ibrl eval --env
dond``, the hook of its :class:`~marti_ibrl.envs.spec.EnvSpec`)."""
