"""The docs site (``mkdocs.yml``, ``docs/``) builds in strict mode, and strict mode catches what it should.

Needs the ``docs`` extra (mkdocs-material, mkdocstrings); skipped without it. ``.ci/run`` installs it after the
main suite and runs this file. The README is the site's home page (``docs/hooks.py``), so its links are checked
like any page's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


def test_the_site_builds_strictly_with_the_readme_home_and_the_api_reference(tmp_path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-5000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "Two commands" in home and 'href="your-agent/"' in home  # README, its docs/ links made relative
    api = (tmp_path / "site" / "reference" / "rollout" / "index.html").read_text(encoding="utf-8")
    assert 'id="agentboost.rollout.run_episode"' in api and "RolloutSettings" in api  # from the docstrings
    assert (tmp_path / "site" / "assets" / "quickstart_curves.png").is_file()  # assets/, the figures' home
    curves = (tmp_path / "site" / "train-one-machine" / "index.html").read_text(encoding="utf-8")
    assert 'src="../assets/quickstart_curves.png"' in curves  # the page's ../assets/ (GitHub's view), on the site
    for page in (tmp_path / "site" / "reference").glob("*/index.html"):  # docstrings' Sphinx roles read as code
        assert not re.search(r":(mod|class|func|meth|attr):<code>|<code>~", page.read_text(encoding="utf-8")), page
    example = (tmp_path / "site" / "examples" / "tau2" / "index.html").read_text(encoding="utf-8")
    assert "Every episode gets a <strong>fresh tau2 domain environment</strong>" in example  # examples/tau2/README.md
    assert not (tmp_path / "site" / "hooks.py").exists() and not (tmp_path / "site" / "assets" / "diagram.py").exists()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy)
    shutil.copytree(ROOT / "docs", copy / "docs", symlinks=True)
    (copy / "assets").symlink_to(ROOT / "assets")
    (copy / "agentboost").symlink_to(ROOT / "agentboost")
    (copy / "examples").symlink_to(ROOT / "examples")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (copy / "README.md").write_text(readme + "\nSee [the pool](docs/pool.md#no-such-heading).\n", encoding="utf-8")
    page = copy / "docs" / "sandbox.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the examples](examples/math/README.md).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "'sandbox.md' contains a link 'examples/math/README.md'" in done.stderr, done.stderr[-3000:]
    assert "'pool.md#no-such-heading'" in done.stderr, done.stderr[-3000:]
