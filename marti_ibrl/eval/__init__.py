"""Evaluation after training (paper §5.2-5.4): the ``marti-ibrl eval``, ``diagnose`` and ``report`` commands.

* ``marti-ibrl eval`` (:mod:`marti_ibrl.commands.eval`): the environment's evaluation hook (``EnvSpec.evaluate``) on its arguments;
  DoND's is :mod:`.dond` (:class:`~.evaluator.Evaluator`: frozen policies against counterparts, seat-averaged,
  streamed to JSONL; :mod:`.dond.metrics`: the metrics of Table 2). :mod:`.episodes`: names and episode files,
  :mod:`.engines`: the engines evaluation commands serve checkpoints with, :mod:`.run_config`: ``--run``.
* :mod:`.diagnose` (``marti-ibrl diagnose``): checkpoint diagnostics of a run (Fig. 5, Fig. 6).
* :mod:`.report` (``marti-ibrl report``): tables and ``report.md``; :mod:`.stats`: logistic GEE, Holm, run-level
  tests; :mod:`.figures`: the paper's figures (reward curves, in-system vs fixed, cross-checkpoint similarity).
* :mod:`.telesales`: the TeleSales held-out evaluation (``marti-ibrl telesales eval``).
"""
