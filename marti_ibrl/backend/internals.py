"""Every use of OpenRLHF's, Ray's and DeepSpeed's internals, in one place: each function names the public API that is
missing. The day one of them changes, this module is the one to fix; ``tests/package/test_structure.py`` fails on a private
access (an attribute or a module whose name starts with one underscore) anywhere else in the package. Overriding a
private method in a subclass (``super()._name(...)``) is the subclass's own business and stays where it is."""

from __future__ import annotations

from typing import Any


def actor_handles(group: Any) -> list:
    """An OpenRLHF ``RayActorGroup``'s Ray actor handles, in rank order (``duplicate_actors`` per data-parallel rank).
    Missing: a public accessor (OpenRLHF only runs methods on all of them, ``async_run_method``)."""
    return group._actor_handlers


def replicas(group: Any) -> int:
    """Handles per data-parallel rank of an OpenRLHF ``RayActorGroup`` (ring-attention / tensor-parallel actors share
    a rank's data). Missing: a public name for it."""
    return group.duplicate_actors


def actor_id(handle: Any) -> str:
    """A Ray actor handle's id, as hex, from outside the actor. Missing: ``ActorHandle`` has no public id (only
    ``ray.get_runtime_context()`` inside the actor)."""
    return handle._actor_id.hex()


def placement_group(hex_id: str) -> Any:
    """The ``PlacementGroup`` of an id from ``ray.util.placement_group_table()``. Missing: a public constructor from
    that table's ids (``ray.util.get_placement_group`` needs a name)."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(PlacementGroupID(bytes.fromhex(hex_id)))


def bootstrap_address(address: str) -> str | None:
    """``host:port`` of a Ray cluster address as ``ray.init`` reads it (``auto``: RAY_ADDRESS or this machine's
    cluster). Missing: Ray resolves it only inside ``ray.init``."""
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address(address)


def restart_accumulation(engine: Any, strategy: Any, gas: int) -> None:
    """Start a fresh gradient-accumulation window of ``gas`` micro-batches on a DeepSpeed engine and OpenRLHF's
    strategy (an update's size varies per iteration). Missing: DeepSpeed resets ``micro_steps`` only at construction;
    OpenRLHF reads ``accumulated_gradient`` once, at setup."""
    engine.micro_steps = 0
    strategy.accumulated_gradient = gas


def zero3_overflow_hooks(optimizer: Any) -> tuple[Any, str] | None:
    """DeepSpeed ZeRO-3's loss-scale update (``_loss_scale_update_and_overflow_cleanup``) and the name of the method
    its ``step()`` checks overflow through, where the optimizer has them (None: ZeRO-1/2). Missing: a public hook to
    decide a step's skip."""
    cleanup = getattr(optimizer, "_loss_scale_update_and_overflow_cleanup", None)
    return (cleanup, "_overflow_check_and_loss_scale_update") if cleanup is not None else None
