"""Non-finite values never reach a checkpoint: the DeepSpeed strategy every role trains with skips a step whose loss or
gradients are NaN/inf (on every ZeRO stage and dtype) and counts it, as DeepSpeed counts its own overflow skips.
"""

from __future__ import annotations

import torch
from openrlhf.utils.deepspeed import DeepspeedStrategy


class NonFiniteError(RuntimeError):
    """A role's weights (or, under ZeRO-0, an update's loss) hold NaN or ±inf: nothing was written or stepped."""


class FiniteStepStrategy(DeepspeedStrategy):
    """OpenRLHF's DeepSpeed strategy, whose optimizer step is skipped on every rank when a loss of the accumulation
    window or an accumulated gradient is NaN or ±inf (:func:`skip_if_non_finite`): the weights and the Adam moments
    stay as they were, and DeepSpeed counts the step in ``skipped_steps`` (``ROLE/update/skipped``)."""

    _window_finite = True  # every loss of the current accumulation window was finite (this rank)

    @classmethod
    def of(cls, args) -> FiniteStepStrategy:
        """OpenRLHF's strategy for ``args`` (its own ``get_strategy``), as this class."""
        from openrlhf.utils import get_strategy

        guarded = cls.__new__(cls)
        guarded.__dict__.update(vars(get_strategy(args)))
        return guarded

    def backward(self, loss: torch.Tensor, model, optimizer, **kwargs) -> None:
        self._window_finite = self._window_finite and bool(torch.isfinite(loss.detach()).all())
        super().backward(loss, model, optimizer, **kwargs)

    def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs) -> None:
        from openrlhf.models import Actor

        engine = model.model if isinstance(model, Actor) else model
        if engine.is_gradient_accumulation_boundary():  # the call that steps (DeepSpeed's own test)
            skip_if_non_finite(engine, self._window_finite)
            self._window_finite = True
        super().optimizer_step(optimizer, model, scheduler, name, **kwargs)


def skip_if_non_finite(engine, losses_finite: bool) -> bool:
    """At an accumulation boundary, before ``engine.step()``: True, and the step set to be skipped, when a loss of the
    window (``losses_finite`` False) or an accumulated gradient is NaN or ±inf on any rank.

    The skip is DeepSpeed's fp16 overflow path, used for every dtype: a ZeRO optimizer whose ``overflow`` is set
    drops the gradients instead of stepping, the engine counts ``skipped_steps`` and leaves the LR schedule alone.
    DeepSpeed itself checks gradients only in fp16 (ZeRO-3) or fp16/bf16 (ZeRO-1/2); here the check is its own
    ``has_overflow`` (all-reduced over the data-parallel ranks) on every stage and dtype, plus the losses. ZeRO-0 has
    no such path: a non-finite loss there stops the update (:class:`NonFiniteError`)."""
    from deepspeed.accelerator import get_accelerator

    flag = torch.tensor([0.0 if losses_finite else 1.0], device=get_accelerator().current_device_name())
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    bad_loss = bool(flag.item())
    optimizer = engine.optimizer
    if not hasattr(optimizer, "has_overflow"):
        if bad_loss:
            raise NonFiniteError("a NaN/inf loss, and ZeRO-0 cannot skip an optimizer step: use --ds.zero_stage >= 1")
        return False
    skip = bad_loss or optimizer.has_overflow()
    decide_overflow(optimizer, skip)
    return skip


def decide_overflow(optimizer, skip: bool) -> None:
    """Make the ZeRO ``optimizer``'s next ``step()`` skip exactly when ``skip``.

    DeepSpeed 0.19.8 clears ``overflow`` when ``step()`` starts and sets it again only in its own check: ZeRO-1/2
    call ``check_overflow`` when ``check_grad_overflow`` is set (bf16 leaves it off: such a step trained into NaN),
    ZeRO-3 only in fp16 (``_overflow_check_and_loss_scale_update``). Both checks are pointed at this decision, which
    already holds DeepSpeed's own gradient test (``has_overflow``) and the losses; DeepSpeed's check of the gradient
    norm still follows in both. Instance attributes only: nothing of DeepSpeed's classes changes."""
    optimizer.overflow = skip

    def check_overflow(partition_gradients: bool = True) -> None:
        optimizer.overflow = skip

    optimizer.check_overflow = check_overflow
    if hasattr(optimizer, "check_grad_overflow"):  # ZeRO-1/2: step() calls check_overflow when this is set
        optimizer.check_grad_overflow = True
    from marti_ibrl.backend.internals import zero3_overflow_hooks

    zero3 = zero3_overflow_hooks(optimizer)
    if zero3 is not None:  # ZeRO-3: step() checks through this
        cleanup, checked_through = zero3

        def overflow_check_and_loss_scale_update(update_scale: bool = True) -> bool:
            optimizer.overflow = skip
            return cleanup() if update_scale else optimizer.overflow

        setattr(optimizer, checked_through, overflow_check_and_loss_scale_update)
