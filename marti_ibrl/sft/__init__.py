"""Warm start, for any environment with scripted players (DoND's training bots, a game's own ``scripted_players``):
SFT on their dialogues with OpenRLHF's own SFT trainer (``marti-ibrl sft --env NAME``, :mod:`~marti_ibrl.sft.make`).

Each dialogue gives one chat record per role, seen from that role's side exactly as the RL rollout renders it
(:class:`marti_ibrl.rollout.render.RoleView`; :func:`marti_ibrl.envs.base.role_messages`): its system prompt
(private input), the counterpart's turns as ``user``, its own turns as ``assistant``. A role that opens the dialogue has no ``user`` message before its first
``assistant`` turn, as in the rollout; OpenRLHF's multiturn SFT dataset handles that (the prompt of that turn is
``[system]`` + the generation header). Records end with the role's own last turn: OpenRLHF's multiturn
``preprocess_data`` builds the full text as ``render(messages[:-1], add_generation_prompt=True)`` + the rest, which
garbles a trailing ``user`` message (its header is replaced by an assistant header); trailing counterpart turns
carry no loss anyway.

Training runs ``python -m openrlhf.cli.train_sft`` as a single-rank subprocess (DeepSpeed, gloo on CPU).

One module per job: :mod:`~marti_ibrl.sft.make` (a warm start of any game, end to end), :mod:`~marti_ibrl.sft.presets`
(the DoND demo's warm-start settings), :mod:`~marti_ibrl.sft.data` (the
records), :mod:`~marti_ibrl.sft.train` (OpenRLHF's SFT trainer as a subprocess), :mod:`~marti_ibrl.sft.checks`
(validity of sampled turns, assistant NLL). Their public names are importable from here.
"""

from marti_ibrl.sft.checks import assistant_nll, protocol_validity, validity_report
from marti_ibrl.sft.data import RENDERING_KEYS, Record, rendering, sft_records, write_sft_data
from marti_ibrl.sft.presets import (
    DEMO_SFT,
    DEMO_TINY_MODEL,
    SMALL_TINY_MODEL,
    SMOLLM2_SFT,
    VALIDITY_MAX_NEW_TOKENS,
    VLLM_TINY_HEADS,
)
from marti_ibrl.sft.train import TENSORBOARD_SUBDIR, run_sft, sft_command, sft_loss_curve

__all__ = [
    "DEMO_SFT",
    "RENDERING_KEYS",
    "DEMO_TINY_MODEL",
    "SMALL_TINY_MODEL",
    "SMOLLM2_SFT",
    "TENSORBOARD_SUBDIR",
    "VALIDITY_MAX_NEW_TOKENS",
    "VLLM_TINY_HEADS",
    "Record",
    "assistant_nll",
    "protocol_validity",
    "rendering",
    "run_sft",
    "sft_command",
    "sft_loss_curve",
    "sft_records",
    "validity_report",
    "write_sft_data",
]
