"""Isolated execution of untrusted code (see :mod:`agentboost.sandbox.sandbox`)."""

from .sandbox import Sandbox, SandboxConfig, SandboxResult, SandboxUnavailable

__all__ = ["Sandbox", "SandboxConfig", "SandboxResult", "SandboxUnavailable"]
