"""Module layering: modules that share pieces import a third module, not each other; no import circles at all.

The circle check reads the source (every ``import``, at the top, in a function or under ``TYPE_CHECKING``): a
lazy import or one made for the type checker still ties the two modules together, and a cycle of them is one
refactoring away from an ``ImportError`` at start-up. Importing one's own parent package (``from .. import
__version__``) is not a circle: the package is initialised before its modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentboost"


def _imported_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(m for m in sys.modules if m.startswith('agentboost')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """agentboost module -> the agentboost modules its source imports (anywhere in it)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
        graph[name] = set()
        for imported in targets:
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith("agentboost") and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for child in graph.get(todo.pop(), ()):
            if child == goal:
                return True
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return False


def import_circles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import ``a -> b`` that is part of a circle (``b`` imports its way back to ``a``)."""
    return sorted((a, b) for a, edges in graph.items() for b in edges if reaches(graph, b, a))


def test_the_circle_check_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [("a", "b"), ("b", "c"), ("c", "a")]


def test_no_module_imports_itself_back_in_a_circle() -> None:
    """Issue 40: ``environments.tau2_env`` <-> ``rewards.tau2`` and ``sandbox.probe`` <-> ``sandbox.sandbox``
    (under ``TYPE_CHECKING``, for annotations) were the last two."""
    graph = import_graph()
    assert "agentboost.rewards.tau2" in graph["agentboost.environments.tau2_env"]  # the graph sees imports
    assert import_circles(graph) == []


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


def test_the_training_package_does_not_climb_up_to_the_quickstart() -> None:
    """Issue 40: ``train/run.py`` and ``cli/train.py`` imported ``agentboost.quickstart`` to format a run's summary;
    the quickstart's warm start and summary live in ``agentboost.train`` now and the quickstart is a preset on top."""
    graph = import_graph()
    training = [name for name in graph if name.startswith(("agentboost.train", "agentboost.cli.train"))]
    climbing = sorted(name for name in training if "agentboost.quickstart" in graph[name])
    assert climbing == []
