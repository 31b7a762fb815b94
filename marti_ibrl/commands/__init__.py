"""The environments' own ``marti-ibrl`` subcommands, kept out of ``marti_ibrl/envs/`` (pure game logic).

Each environment's :class:`~marti_ibrl.envs.registry.EnvSpec` names the function that adds its subparsers
(``commands``); :func:`marti_ibrl.cli.build_parser` calls it for every registered environment:

* :mod:`.dond`: ``marti-ibrl dond sample`` / ``dond check-data``;
* :mod:`.telesales`: ``marti-ibrl telesales profiles`` / ``telesales eval`` and ``marti-ibrl sft``.

Every subcommand stores its handler ``(args) -> int`` as ``args.func``.
"""
