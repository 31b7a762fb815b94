"""The built-in environments' registry entries (:class:`~marti_ibrl.envs.spec.EnvSpec`): what ``--env.name dond``,
``dond3`` and ``telesales`` mean to every command. An entry names its environment's factory, reward and judges (in
``marti_ibrl.envs``, below) and its subcommands, evaluation and play hooks (above the environments, beside the
commands), so it lives above both: the environments import nothing of the commands. The registry
(:mod:`marti_ibrl.envs.registry`) loads these modules by name on first use (:data:`~marti_ibrl.envs.registry.BUILTIN`).
"""
