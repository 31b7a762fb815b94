"""The IB-RL algorithm: per-role advantages (Eq. 4), masked loss (Eq. 5), staggered schedule (§4.2)."""
