"""Regenerate the docs' figures with the project's own commands (no network).

    python assets/make_assets.py                                   # everything; runs the quickstart first
    python assets/make_assets.py --quickstart-run runs/quickstart  # reuse a finished quickstart run
    python assets/make_assets.py --only architecture,viewer

Figures (written into assets/, each under 300 KB):

* ``quickstart_curves.png``: reward, success and tool-call rate per GRPO step and held-out success
  before/after, from a quickstart run's ``metrics.jsonl`` (or ``metrics.csv``) and ``summary.json``
  when there is one (plotted by ``agentboost.train.metrics.plot_curves``, as the quickstart does). A
  run given with ``--quickstart-run`` is only read, never re-run; without it the script runs
  ``agentboost quickstart --run-dir <work>/quickstart --no-wandb`` (resumed if it exists).
* ``eval_report.png``: ``agentboost eval --example math`` with the tiny random model (``--backend
  tiny``) on the shipped math sample (``prepare_math_data.py --sample``): the report of a model that
  has learned nothing (every episode runs out of tokens).
* ``eval_quickstart.png``: ``agentboost eval`` of the quickstart's trained model (``<run>/final_model``)
  on held-out arithmetic tasks like the ones it trained on (4 samples at temperature 1 per task). Not
  redrawn for a run without ``final_model`` (an unfinished one).
* ``architecture.png``: ``assets/architecture.txt`` rendered by ``assets/diagram.py``.
* ``viewer.png``: ``agentboost view`` of that evaluation (of the math one for a run without
  ``final_model``), in headless Chromium (Debian: ``apt-get install chromium chromium-driver``; ``pip
  install selenium``), one episode and its tokens open.

Every command runs in the checkout with paths relative to it (the trained model through a link in
``--work``), so no figure shows an absolute path of the machine that made it; the viewer page is checked
for such paths before its screenshot is taken.

Intermediate runs go to ``--work`` (default ``runs/assets``); evaluations there resume, so a second
run of this script only redraws.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parent
REPO = ASSETS.parent
FIGURES = ("quickstart", "eval", "architecture", "viewer")
MAX_BYTES = 300_000

logger = logging.getLogger("make_assets")


def shown(path: Path) -> str:
    """``path`` as committed figures show it: relative to the checkout (the commands run there), never an
    absolute path of the machine that made them."""
    try:  # abspath, not resolve: the model link must stay a link
        return os.path.relpath(os.path.abspath(path), os.path.abspath(REPO))
    except ValueError:  # another drive (Windows)
        return path.name


def no_machine_paths(text: str, where: str, *paths: Path) -> None:
    """Refuse a figure's source (an HTML page) that names an absolute path of this machine: the checkout,
    ``paths`` (the runs it shows) or the usual scratch and home directories."""
    for root in (str(REPO.resolve()), *(str(p.resolve()) for p in paths), "/tmp/", "/root/", "/home/", "/work/"):
        if root in text:
            raise RuntimeError(f"{where} names the absolute path {root!r}: committed figures show relative ones")


def agentboost(*args: str) -> None:
    """Run an ``agentboost`` subcommand in a fresh interpreter (the command a user would type)."""
    command = [sys.executable, "-m", "agentboost.cli.main", *args]
    logger.info("$ agentboost %s", " ".join(args))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    subprocess.run(command, check=True, cwd=REPO, env=env, stdout=subprocess.DEVNULL)


def small_png(path: Path) -> Path:
    """Re-encode ``path`` with a 256-colour palette when it is over the size limit (flat figures
    lose nothing visible); refuse a figure that still does not fit."""
    if path.stat().st_size > MAX_BYTES:
        from PIL import Image

        with Image.open(path) as image:
            image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise RuntimeError(f"{path} is {size} bytes, over the {MAX_BYTES} byte limit for committed figures")
    logger.info("wrote %s (%d KB)", path, size // 1000)
    return path


# -- quickstart curves ---------------------------------------------------------------------------
def quickstart_run(run_dir: Path | None, work: Path) -> Path:
    """``run_dir`` when given (never re-run: it must hold the run's metrics), else a quickstart run in ``work``."""
    if run_dir is not None:
        if not any((run_dir / name).is_file() for name in ("metrics.jsonl", "metrics.csv")):
            raise FileNotFoundError(f"{run_dir} holds no metrics.jsonl or metrics.csv: not a quickstart run")
        return run_dir
    run_dir = work / "quickstart"
    agentboost("quickstart", "--run-dir", str(run_dir), "--no-wandb")
    return run_dir


def _number(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() else value


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics per step: ``metrics.jsonl``, else ``metrics.csv`` (an empty cell: not logged that step)."""
    jsonl = run_dir / "metrics.jsonl"
    if jsonl.is_file():
        return [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines() if line.strip()]
    with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as fh:
        return [{k: _number(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(fh)]


def quickstart_curves(run_dir: Path, figures: Path) -> Path:
    from agentboost.train.metrics import plot_curves

    history = read_history(run_dir)
    if not history:
        raise ValueError(f"{run_dir} has no logged GRPO step yet")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    points = {}
    if summary.get("before"):
        points["held-out success before GRPO"] = (0, summary["before"].get("eval/success_rate", 0.0))
    if summary.get("after"):
        points["held-out success after GRPO"] = (history[-1]["step"], summary["after"].get("eval/success_rate", 0.0))
    out = plot_curves(history, figures / "quickstart_curves.png", extra_points=points,
                      title="Quickstart: GRPO on arithmetic with a calculator tool")  # fmt: skip
    return small_png(out)


# -- evaluations -----------------------------------------------------------------------------------
def eval_tiny_math(work: Path, figures: Path) -> Path:
    """``agentboost eval`` of the tiny random model on the shipped math sample; its report is ``eval_report.png``.
    Returns the evaluation directory."""
    data = work / "math"
    subprocess.run([sys.executable, str(REPO / "examples/math/prepare_math_data.py"), "--sample", "--out-dir",
                    str(data), "--register", "no"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)  # fmt: skip
    out = work / "eval-math-tiny"
    agentboost("eval", "--example", "math", "--data", shown(data / "test.jsonl"), "--backend", "tiny", "--n", "4",
               "--workers", "0", "--seed", "0", "--max-turns", "4", "--max-tokens-per-call", "64",
               "--out", shown(out))  # fmt: skip
    shutil.copyfile(out / "report.png", figures / "eval_report.png")
    small_png(figures / "eval_report.png")
    return out


def eval_quickstart_model(run_dir: Path, work: Path, figures: Path) -> Path:
    """``agentboost eval`` of the quickstart's trained model (``<run>/final_model``) on held-out arithmetic
    tasks drawn as the run drew its own (its ``summary.json`` config), 4 samples at temperature 1 per task;
    its report is ``eval_quickstart.png``. Returns the evaluation directory."""
    from agentboost.environments.arithmetic import make_tasks
    from agentboost.quickstart import QuickstartConfig

    cfg = QuickstartConfig()
    summary_path = run_dir / "summary.json"
    config = json.loads(summary_path.read_text()).get("config", {}) if summary_path.is_file() else {}
    seed, max_ops, max_value = (config.get(k, getattr(cfg, k)) for k in ("seed", "max_ops", "max_value"))
    spaced = bool(config.get("spaced_expressions", True))  # runs from before the option were spaced
    rows = make_tasks(12, seed=seed, max_ops=max_ops, max_value=max_value, split="eval", spaced=spaced)
    data = work / "arithmetic-held-out.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = work / "eval-quickstart"
    shutil.rmtree(out, ignore_errors=True)  # this script's own scratch: `agentboost eval` refuses a used --out
    model = work / "quickstart-model"  # a link in the work directory: the report and the viewer name it relatively
    if model.is_symlink() or model.exists():
        model.unlink()
    model.symlink_to((run_dir / "final_model").resolve(), target_is_directory=True)
    agentboost("eval", "--example", "arithmetic", "--data", shown(data), "--backend", f"hf:{shown(model)}",
               "--n", "4", "--temperature", "1.0", "--seed", "0", "--workers", "0", "--max-turns", "4",
               "--max-tokens-per-call", "48", "--out", shown(out))  # fmt: skip
    shutil.copyfile(out / "report.png", figures / "eval_quickstart.png")
    small_png(figures / "eval_quickstart.png")
    return out


# -- architecture ----------------------------------------------------------------------------------
def architecture(figures: Path) -> Path:
    sys.path.insert(0, str(ASSETS))
    from diagram import parse, render

    source = (ASSETS / "architecture.txt").read_text(encoding="utf-8")
    return small_png(render(parse(source), figures / "architecture.png"))


# -- viewer screenshot -----------------------------------------------------------------------------
def viewer_screenshot(eval_dir: Path, work: Path, figures: Path, title: str) -> Path:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from agentboost.viewer.browser import open_chromium

    page = work / "view.html"
    agentboost("view", shown(eval_dir), "--out", shown(page), "--title", title)
    no_machine_paths(page.read_text(encoding="utf-8"), str(page), eval_dir, work)
    driver = open_chromium(width=1280, height=1000)
    try:
        driver.get(page.resolve().as_uri())  # --work may be given relative to the checkout
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        cards = driver.find_elements(By.CSS_SELECTOR, "#episodes details.episode")
        # the most telling episode: one that used a tool and earned a reward, else any with a tool call
        chosen = next((c for c in cards if "reward 1" in c.text and "0 tool calls" not in c.text), None)
        chosen = chosen or next((c for c in cards if "0 tool calls" not in c.text), cards[0])
        chosen.find_element(By.CSS_SELECTOR, "summary").click()
        chosen.find_element(By.CSS_SELECTOR, "details.tokens-box > summary").click()
        time.sleep(0.3)
        tokens = chosen.find_elements(By.CSS_SELECTOR, ".tokens .tok.m1")
        if tokens:  # the mouse on a trained token, as when reading its hover title
            from selenium.webdriver import ActionChains

            ActionChains(driver).move_to_element(tokens[0]).perform()
        driver.execute_script("window.scrollTo(0, 0)")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        if errors:
            raise RuntimeError(f"the viewer logged errors: {errors}")
        out = figures / "viewer.png"
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
    return small_png(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quickstart-run", type=Path, default=None,
                        help="a finished quickstart run directory (default: run one in --work)")  # fmt: skip
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "assets", help="intermediate runs")
    parser.add_argument("--figures", type=Path, default=ASSETS, help="where the PNGs go (default: assets/)")
    parser.add_argument("--only", default=",".join(FIGURES), help=f"comma-separated subset of {', '.join(FIGURES)}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = wanted - set(FIGURES)
    if unknown:
        parser.error(f"unknown figure(s) {sorted(unknown)}; known: {', '.join(FIGURES)}")
    args.work.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    figures = args.figures
    if "architecture" in wanted:
        architecture(figures)
    math_eval = eval_tiny_math(args.work, figures) if "eval" in wanted else None
    if wanted & {"quickstart", "viewer"}:
        run_dir = quickstart_run(args.quickstart_run, args.work)
        if "quickstart" in wanted:
            quickstart_curves(run_dir, figures)
        if "viewer" in wanted:
            if (run_dir / "final_model").is_dir():
                eval_dir = eval_quickstart_model(run_dir, args.work, figures)
                title = "agentboost view: the quickstart model on held-out tasks"
            else:  # an unfinished run: no trained model to evaluate
                logger.warning("%s has no final_model: eval_quickstart.png is not redrawn and viewer.png shows "
                               "the tiny random model on the math sample instead", run_dir)  # fmt: skip
                eval_dir = math_eval or eval_tiny_math(args.work, figures)
                title = "agentboost view: a random tiny model on the math sample"
            viewer_screenshot(eval_dir, args.work, figures, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
