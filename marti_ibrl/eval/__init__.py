"""Held-out evaluation utilities (statistics for the paper's result tables)."""
