"""Every ``marti-ibrl`` subcommand, one module each: its parser (``add_*_parser(subparsers)``) and its handler
``(args) -> exit status``, stored as ``args.func``. :func:`marti_ibrl.cli.build_parser` adds them all.

* :mod:`.train`, :mod:`.plan` (the dry run), :mod:`.eval` (``EnvSpec.evaluate``; ``--human-db``), :mod:`.diagnose`,
  :mod:`.report`, :mod:`.demo`, :mod:`.patch`, :mod:`.model`, :mod:`.export_merged`;
* :mod:`.people`: ``play`` and ``annotate`` (one module: they share the web server's flags);
* the environments' own, added by their registry specs (``EnvSpec.commands``): :mod:`.dond` (``dond sample`` /
  ``dond check-data``), :mod:`.telesales` (``telesales profiles`` / ``telesales eval`` and ``sft``).

The work each command does lives in the package it names (``marti_ibrl.cluster.plan``, ``marti_ibrl.eval``, ...); these
modules only read flags, call it, and turn its errors into one line and an exit status.
"""
