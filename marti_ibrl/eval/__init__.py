"""Evaluation after training (paper §5.2-5.4): the ``marti-ibrl eval``, ``diagnose`` and ``report`` commands.

* :mod:`.command` (``marti-ibrl eval``) around :mod:`.evaluator` (:class:`~.evaluator.Evaluator`: frozen policies
  against counterparts, seat-averaged, streamed to JSONL); :mod:`.dond_metrics`: the DoND metrics of Table 2.
* :mod:`.diagnose` (``marti-ibrl diagnose``): checkpoint diagnostics of a run (Fig. 5, Fig. 6).
* :mod:`.report` (``marti-ibrl report``): tables and ``report.md``; :mod:`.stats`: logistic GEE, Holm, run-level
  tests; :mod:`.figures`: the paper's figures (reward curves, in-system vs fixed, cross-checkpoint similarity).
* :mod:`.telesales`: the TeleSales held-out evaluation (``marti-ibrl telesales eval``).
"""
