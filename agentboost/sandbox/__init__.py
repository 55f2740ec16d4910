"""Isolated execution of untrusted code (see :mod:`agentboost.sandbox.sandbox`)."""

from .sandbox import Sandbox, SandboxConfig, SandboxResult

__all__ = ["Sandbox", "SandboxConfig", "SandboxResult"]
