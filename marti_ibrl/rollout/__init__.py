"""Two-role (n-role) rollout: per-turn batched generation, per-role renderings and masks, engines."""
