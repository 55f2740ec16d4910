"""Module layering: modules that share pieces import a third module, not each other."""

from __future__ import annotations

import subprocess
import sys


def _imported_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(m for m in sys.modules if m.startswith('agentboost')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_the_tau2_reward_and_environment_do_not_import_each_other_in_a_circle() -> None:
    assert "agentboost.environments.tau2_env" not in _imported_after("agentboost.rewards.tau2")
    domain = _imported_after("agentboost.environments.tau2_domain")
    assert "agentboost.rewards.tau2" not in domain and "agentboost.environments.tau2_env" not in domain


def test_the_provider_backend_and_the_provider_model_do_not_import_each_other_in_a_circle() -> None:
    """Issue 23: ``backends.provider_model`` imported ``backends.strands_provider``, which imported it back (in
    ``episode_model``); the pieces both need live in ``backends.provider_common``."""
    assert "agentboost.backends.strands_provider" not in _imported_after("agentboost.backends.provider_model")
    assert "agentboost.backends.provider_model" not in _imported_after("agentboost.backends.strands_provider")
    import ast
    from pathlib import Path

    source = Path(__file__).resolve().parents[1] / "agentboost" / "backends" / "provider_model.py"
    imported = {node.module for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.ImportFrom)}
    assert "strands_provider" not in {(m or "").rsplit(".", 1)[-1] for m in imported}  # not even lazily
