"""assets/: the architecture diagram's text source renders, malformed sources are refused with the line,
and the committed figures stay small. (The figures themselves: python assets/make_assets.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ASSETS = Path(__file__).resolve().parent.parent / "assets"
FIGURES = ("architecture.png", "eval_report.png", "quickstart_curves.png", "viewer.png")
"""The figures the docs show (``eval_quickstart.png`` is drawn only from a quickstart run with a trained model)."""


def _diagram():
    spec = importlib.util.spec_from_file_location("assets_diagram", ASSETS / "diagram.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_architecture_source_renders_every_box_and_arrow(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    diagram = _diagram()
    parsed = diagram.parse((ASSETS / "architecture.txt").read_text(encoding="utf-8"))
    assert {"row", "env", "agent", "model", "backend", "episode", "verl", "local", "eval", "view"} <= set(parsed.boxes)
    assert ("model", "backend") in {(a.source, a.target) for a in parsed.arrows}
    assert parsed.boxes["model"].lines[0] == "TokenModel (a Strands model provider)"
    out = diagram.render(parsed, tmp_path / "a.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size < 300_000


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("box a 1 1 2 nope: A", "line 1: unknown style 'nope'"),
        ("box a 1 1 2 core: A\na -> b", "no box 'b'"),
        ("title t\nthis is not a line of the format", "line 2: cannot read"),
    ],
)
def test_malformed_sources_are_refused_naming_the_line(source, message) -> None:
    with pytest.raises(ValueError, match=message):
        _diagram().parse(source)


@pytest.mark.parametrize("name", FIGURES)
def test_the_readme_figures_are_committed(name) -> None:
    assert (ASSETS / name).is_file(), f"{ASSETS / name} is missing: python assets/make_assets.py"


def test_every_committed_figure_is_a_small_png() -> None:
    figures = sorted(ASSETS.glob("*.png"))
    assert figures
    for path in figures:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
        assert path.stat().st_size < 300_000, f"{path} is {path.stat().st_size} bytes"


def _make_assets(monkeypatch):
    spec = importlib.util.spec_from_file_location("assets_make_assets", ASSETS / "make_assets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def no_run(*args: str) -> None:
        raise AssertionError(f"ran agentboost {' '.join(args)}")

    monkeypatch.setattr(module, "agentboost", no_run)
    return module


def test_quickstart_curves_come_from_a_given_run_without_running_the_quickstart(tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    make_assets = _make_assets(monkeypatch)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text(
        "step,reward_mean,success_rate,tool_call_rate,eval/success_rate\n"
        "1,0.1,0.1,1.0,\n2,0.3,0.3,1.0,0.25\n3,0.5,0.5,0.9,\n4,0.6,0.6,1.0,0.5\n"
    )
    (run / "summary.json").write_text('{"before": {"eval/success_rate": 0.1}, "after": {"eval/success_rate": 0.5}}')
    history = make_assets.read_history(run)
    assert [h["step"] for h in history] == [1, 2, 3, 4] and "eval/success_rate" not in history[0]
    assert history[3]["eval/success_rate"] == 0.5
    figures = tmp_path / "figures"
    args = ["--only", "quickstart", "--quickstart-run", str(run), "--figures", str(figures), "--work", str(tmp_path)]
    assert make_assets.main(args) == 0
    assert (figures / "quickstart_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with pytest.raises(FileNotFoundError, match="holds no metrics.jsonl or metrics.csv"):
        make_assets.main(["--only", "quickstart", "--quickstart-run", str(tmp_path / "empty"), "--work", str(tmp_path)])
