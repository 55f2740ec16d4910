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
