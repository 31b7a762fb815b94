"""The rooms around the IB-RL loop (:class:`marti_ibrl.trainer.IBRLTrainer`): a run's start-up (:mod:`.startup`), who
plays each seat (:mod:`.seating`), the opponent pools' snapshots (:mod:`.snapshots`), the rollout made ahead under
``--train.async_rollout`` (:mod:`.ahead`), what stops or warns a run (:mod:`.checks`), an iteration's numbers
(:mod:`.metrics`), and the random streams, scenario sampler and timer (:mod:`.records`)."""
