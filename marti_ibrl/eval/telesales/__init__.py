"""The TeleSales held-out evaluation (paper §5.2 "Vehicle TeleSales", Table 1; Appendix D, Tables 8-12):
``marti-ibrl telesales eval`` (:mod:`marti_ibrl.commands.telesales`). Frozen sales policies call an LLM user simulator
on held-out evaluation profiles; the game itself (profiles, turn protocol, prompts) is :mod:`marti_ibrl.envs.telesales`.

* :mod:`.evaluator`: end to end: stories, calls, audits, resumable episode records, ``results.md``.
* :mod:`.env`: one evaluation call as a dialogue environment (:class:`~.env.TeleSalesEvalEnv`).
* :mod:`.agents`: the LLM roles: story compiler (Table 8), user simulator (Table 9), prompted sales agent
  (Table 10), auditor (Table 12).
* :mod:`.rubric`: Table 11, the simulator's per-turn behavior rubric B01-B18 and its score update.
* :mod:`.outputs`: labels, validators and JSON schemas of the LLMs' outputs (Tables 8-10, 12), call outcomes, the
  simulator's prompt, the story cache.
* :mod:`.metrics`: Table 1's metrics: Success@n, willingness/patience deltas, hallucination rate.
"""
