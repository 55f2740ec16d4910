"""The ``agentboost view`` page in a real headless Chromium: what a person sees and does.

Skipped, with the reason, when selenium, chromium or chromedriver is missing (CI installs them:
``.ci/run``)."""

from __future__ import annotations

import json

import pytest

from agentboost.cli.main import main as cli
from agentboost.viewer.browser import find_chromium, open_chromium
from tests.viewer_episodes import HOSTILE, make_episodes, write_jsonl

FOUND = find_chromium()
pytestmark = pytest.mark.skipif(isinstance(FOUND, str), reason=f"no headless browser: {FOUND}")


@pytest.fixture(scope="module")
def episodes(qwen25_template):
    return make_episodes(qwen25_template)


@pytest.fixture(scope="module")
def page(episodes, tmp_path_factory):
    directory = tmp_path_factory.mktemp("view")
    write_jsonl(directory / "episodes.jsonl", episodes)
    (directory / "manifest.json").write_text(json.dumps({"model": {"backend": "tiny", "tokenizer": None}}))
    assert cli(["view", str(directory)]) == 0
    return directory / "view.html"


@pytest.fixture(scope="module")
def browser(page):
    from selenium.webdriver.support.ui import WebDriverWait

    driver = open_chromium(width=1300, height=900)
    try:
        driver.get(page.as_uri())
        WebDriverWait(driver, 20).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        yield driver
    finally:
        driver.quit()


def _by(css: str):
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR, css


def visible_ids(driver) -> list[str]:
    return [
        e.get_attribute("data-id") for e in driver.find_elements(*_by("#episodes details.episode")) if e.is_displayed()
    ]


def shown(within, css: str, timeout: float = 10) -> list:
    """The elements ``css`` under ``within`` once there are some: a <details> renders its body on its
    ``toggle`` event, which the browser fires after the click returns (a person never sees the gap)."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(within, timeout).until(lambda w: w.find_elements(*_by(css)))


def console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_page_lists_every_episode_and_runs_nothing_from_the_data(browser, episodes) -> None:
    assert visible_ids(browser) == [e.id for e in episodes]
    assert browser.find_element(*_by("#visible-count")).text == "6 of 6 episodes shown"
    header = browser.find_element(*_by("#overview")).text
    assert "6 episodes in the file" in header and "tokenizer: offline:qwen2.5" in header
    # the hostile task id is shown as text, and nothing it holds ran or loaded
    summaries = [e.text for e in browser.find_elements(*_by("#episodes details.episode > summary"))]
    assert any(f"task t2{HOSTILE}" in text for text in summaries)
    assert browser.execute_script("return [window.__pwned, document.scripts.length, document.images.length]") == [
        None, 2, 0]  # fmt: skip
    assert console_errors(browser) == []


def test_filters_by_termination_reward_and_tool_errors(browser, episodes) -> None:
    completed = browser.find_element(*_by('input.term-filter[value="completed"]'))
    completed.click()
    assert visible_ids(browser) == ["t1:1", f"t2{HOSTILE}:1"]  # max_turns and infra_error remain
    assert browser.find_element(*_by("#visible-count")).text == "2 of 6 episodes shown"
    completed.click()
    assert len(visible_ids(browser)) == 6

    low = browser.find_element(*_by("#reward-min"))
    low.send_keys("0.5")
    assert visible_ids(browser) == ["t0:0", f"t2{HOSTILE}:0"]
    high = browser.find_element(*_by("#reward-max"))
    high.send_keys("0.9")
    assert visible_ids(browser) == [] and browser.find_element(*_by("#visible-count")).text == "0 of 6 episodes shown"
    from selenium.webdriver.common.keys import Keys

    for field in (low, high):  # as a person empties a field
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.BACKSPACE)
    assert len(visible_ids(browser)) == 6

    errors = browser.find_element(*_by("#tool-errors-only"))
    errors.click()
    assert visible_ids(browser) == ["t0:0"]
    errors.click()
    masked = browser.find_element(*_by("#masked-hide"))
    masked.click()
    assert f"t2{HOSTILE}:1" not in visible_ids(browser) and len(visible_ids(browser)) == 5
    masked.click()
    assert console_errors(browser) == []


def test_an_episode_shows_its_conversation_and_tokens(browser, episodes) -> None:
    card = browser.find_element(*_by('#episodes details.episode[data-id="t0:0"]'))
    card.find_element(*_by("summary")).click()
    calls = [e.text for e in shown(card, ".kind-tool_call .item-head")]
    assert calls == ["tool call → add · call 0", "tool call → explode · call 0", "tool call → fetch · call 1"]
    error = card.find_element(*_by(".status-error"))
    assert "tool result ← explode (error)" in error.text and "boom: x" in error.text
    results = [e.text for e in card.find_elements(*_by(".kind-tool_result .item-text"))]
    assert any(HOSTILE in text for text in results)  # shown literally
    assert "termination\ncompleted" in card.find_element(*_by("table.facts")).text.replace(" ", "\n")

    card.find_element(*_by("details.tokens-box > summary")).click()
    episode = episodes[0]
    trained = shown(card, ".tokens .tok.m1")
    assert len(trained) == episode.num_model_tokens
    assert "loss mask 1" in trained[0].get_attribute("title")
    assert "logprob -0.2500 (p 0.779)" in trained[0].get_attribute("title")
    from selenium.webdriver import ActionChains

    ActionChains(browser).move_to_element(trained[0]).perform()  # hovering shows this title
    area = card.find_element(*_by(".tokens"))
    prompt = card.find_elements(*_by(".tokens .tok.seg-prompt"))
    assert len(prompt) == len(episode.prompt_ids) and not prompt[0].is_displayed()  # the prompt starts folded
    card.find_element(*_by("button.prompt-toggle")).click()
    assert prompt[0].is_displayed() and prompt[0].text == "<|im_start|>"
    spans = card.find_elements(*_by(".tokens .tok"))
    response = "".join(s.get_attribute("textContent") for s in spans[len(episode.prompt_ids) :])
    assert "fetch" in response and HOSTILE in response and response.endswith("20<|im_end|>")
    assert "[" not in area.text.split("\n")[0]  # pieces, not ids
    card.find_element(*_by("summary")).click()
    assert browser.execute_script("return [window.__pwned, document.images.length]") == [None, 0]
    assert console_errors(browser) == []


def test_two_samples_of_a_task_side_by_side(browser) -> None:
    from selenium.webdriver.support.ui import Select

    browser.find_element(*_by("#compare > summary")).click()
    task = Select(browser.find_element(*_by("#compare-task")))
    assert [o.text.split(" (")[0] for o in task.options] == ["t0", "t1", f"t2{HOSTILE}"]
    columns = browser.find_elements(*_by("#compare-view .compare-col"))
    assert [c.get_attribute("data-id") for c in columns] == ["t0:0", "t0:1"]  # rewards 1 and 0
    assert all(c.is_displayed() for c in columns)
    assert "reward 1" in columns[0].text and "reward 0" in columns[1].text
    task.select_by_index(1)
    columns = browser.find_elements(*_by("#compare-view .compare-col"))
    assert [c.get_attribute("data-id") for c in columns] == ["t1:0", "t1:1"]
    assert "max_turns" in columns[1].find_element(*_by(".col-head")).text
    Select(browser.find_element(*_by("#compare-b"))).select_by_index(0)
    columns = browser.find_elements(*_by("#compare-view .compare-col"))
    assert [c.get_attribute("data-id") for c in columns] == ["t1:0", "t1:0"]
    assert console_errors(browser) == []
