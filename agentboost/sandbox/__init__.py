"""Isolated execution of untrusted code (see :mod:`agentboost.sandbox.sandbox`)."""

from .config import SandboxConfig, SandboxResult, SandboxUnavailable
from .sandbox import Sandbox

__all__ = ["Sandbox", "SandboxConfig", "SandboxResult", "SandboxUnavailable"]
