"""agentboost: train unmodified Strands Agents with RL on token-exact trajectories."""

__version__ = "0.1.0"
