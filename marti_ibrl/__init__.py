"""marti-ibrl: Isolated Bilateral RL (IB-RL) for strategic dialogue agents, as a thin plugin over OpenRLHF."""

__version__ = "0.1.0"
