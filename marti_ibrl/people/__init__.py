"""People in the loop: a person plays against a checkpoint in the browser, and annotators blind-label
recorded TeleSales calls (paper §5.4).

* :mod:`.store`: the SQLite file every page writes to (participants, games and their turns, calls to annotate,
  labels); every accepted action is committed at once, so closing a tab loses nothing finished;
* :mod:`.seat`: the policy's seat: a checkpoint (HF generate, in this process), an OpenAI-compatible endpoint or a
  scripted DoND bot, each producing one turn as the rollouts do;
* :mod:`.games`: one game of a person against the policy (DoND, TeleSales), its rules and scoring delegated to the
  environment classes;
* :mod:`.app`: the FastAPI app behind ``marti-ibrl play`` and ``marti-ibrl annotate`` (pages in ``static/``);
* :mod:`.annotate`: recorded calls shown blind, in an order of their own per annotator;
* :mod:`.agreement`: Cohen's κ between annotators and against the simulator (``annotate --report``);
* :mod:`.human_eval`: human games as eval episodes (``marti-ibrl eval --human-db``);
* the ``play`` and ``annotate`` subcommands: :mod:`marti_ibrl.commands.people`.

FastAPI and uvicorn are the ``people`` extra; every module here imports without them.
"""
