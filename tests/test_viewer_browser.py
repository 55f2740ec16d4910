"""The ``agentboost view`` page in a real headless Chromium: what a person sees and does, for episodes of
one trajectory and of several (a list of trajectories, each one's conversation and tokens).

Skipped, with the reason, when selenium, chromium or chromedriver is missing (CI installs them:
``.ci/run``)."""

from __future__ import annotations

import json

import pytest

from agentboost.cli.main import main as cli
from agentboost.episode import Episode
from agentboost.viewer.browser import find_chromium, open_chromium
from tests.viewer_episodes import HOSTILE, make_episodes, make_multi_trajectory_episodes, write_jsonl

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


def opened(page):
    from selenium.webdriver.support.ui import WebDriverWait

    driver = open_chromium(width=1300, height=900)
    try:
        driver.get(page.as_uri())
        WebDriverWait(driver, 20).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def browser(page):
    yield from opened(page)


@pytest.fixture(scope="module")
def multi(qwen25_template) -> list[Episode]:
    """``window:0`` (6 trajectories, a hostile agent name and a hostile detail), ``pair:0`` (main, helper),
    ``summary:0`` (an untrained aux trajectory)."""
    episodes = make_multi_trajectory_episodes(qwen25_template)
    episodes[0].trajectory_info[1].detail = f"edited {HOSTILE}"
    return episodes


@pytest.fixture(scope="module")
def multi_browser(multi, episodes, tmp_path_factory):
    """A page of one single-trajectory episode and the three of several, 4 trajectories shown per episode."""
    directory = tmp_path_factory.mktemp("view-multi")
    write_jsonl(directory / "episodes.jsonl", [episodes[0], *multi])
    out = directory / "view.html"
    assert cli(["view", str(directory / "episodes.jsonl"), "--tokenizer", "offline:qwen2.5", "--out", str(out),
                "--max-trajectories", "4"]) == 0  # fmt: skip
    yield from opened(out)


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


# -- episodes of several trajectories -------------------------------------------------------------------
def test_rows_show_trajectory_counts_and_filter_on_them(multi_browser) -> None:
    assert visible_ids(multi_browser) == ["t0:0", "window:0", "pair:0", "summary:0"]
    counts = {card.get_attribute("data-id"): [e.text for e in card.find_elements(*_by("summary .n-traj"))]
              for card in multi_browser.find_elements(*_by("#episodes details.episode"))}  # fmt: skip
    assert counts == {"t0:0": [], "window:0": ["6 trajectories"], "pair:0": ["2 trajectories"],
                      "summary:0": ["3 trajectories"]}  # fmt: skip
    several = multi_browser.find_element(*_by("#several-only"))
    assert several.is_displayed()
    several.click()
    assert visible_ids(multi_browser) == ["window:0", "pair:0", "summary:0"]
    several.click()
    assert len(visible_ids(multi_browser)) == 4
    assert "caps per trajectory" in multi_browser.find_element(*_by("#overview")).text
    assert console_errors(multi_browser) == []


def test_an_episode_lists_its_trajectories_and_shows_each_one(multi_browser, multi) -> None:
    window = multi[0]
    card = multi_browser.find_element(*_by('#episodes details.episode[data-id="window:0"]'))
    card.find_element(*_by("summary")).click()
    rows = shown(card, "table.trajs tr[data-index]")
    cells = [[td.text for td in row.find_elements(*_by("td"))] for row in rows]
    assert [c[0] for c in cells] == [f"#{t}" for t in range(6)]
    assert all(c[1] == f"adder{HOSTILE}" for c in cells)  # the agent's hostile name, as text
    assert [c[2] for c in cells] == ["start"] + ["history_rewritten"] * 5
    for c, trajectory in zip(cells, window.trajectories, strict=True):
        assert c[3] == " ".join(f"#{call.index}" for call in trajectory.calls)
        assert c[4:8] == [str(len(trajectory.prompt_ids)), str(len(trajectory.response_ids)),
                          str(trajectory.num_model_tokens), str(trajectory.info.rerendered_tokens)]  # fmt: skip
        assert c[8:] == ["yes", "1"]
    assert rows[1].find_elements(*_by("td"))[2].get_attribute("title") == f"edited {HOSTILE}"
    facts = card.find_element(*_by("table.facts")).text
    assert f"6 (start 1, history_rewritten 5), {window.rerendered_tokens} prompt tokens rendered again" in facts
    # the first trajectory is shown; another is one click away
    view = card.find_element(*_by(".traj-view"))
    assert view.get_attribute("data-index") == "0" and "selected" in rows[0].get_attribute("class")
    rows[1].find_element(*_by("button.traj-tab")).click()
    head = card.find_element(*_by(".traj-view .traj-head")).text
    assert f"opened by history_rewritten: edited {HOSTILE}" in head  # the hostile detail, as text
    rows[5].find_element(*_by("button.traj-tab")).click()
    view = card.find_element(*_by(".traj-view"))
    last = window.trajectories[5]
    assert view.get_attribute("data-index") == "5" and "selected" in rows[5].get_attribute("class")
    assert "selected" not in rows[0].get_attribute("class") + rows[1].get_attribute("class")
    answer = view.find_elements(*_by(".role-assistant.kind-text .item-text"))
    assert [a.text for a in answer] == [f"6 {HOSTILE}"]  # shown literally
    assert "from its first call on" in view.find_element(*_by(".history-note")).text
    view.find_element(*_by("details.tokens-box > summary")).click()
    trained = shown(view, ".tokens .tok.m1")
    assert len(trained) == last.num_model_tokens
    assert "call 6" in trained[0].get_attribute("title") and "logprob -0.2500" in trained[0].get_attribute("title")
    spans = view.find_elements(*_by(".tokens .tok"))
    assert len(spans) == len(last.prompt_ids) + len(last.response_ids)
    assert "".join(s.get_attribute("textContent") for s in spans[len(last.prompt_ids) :]).startswith("6 ")
    # a trajectory past --max-trajectories is listed, its view not embedded, and the page says so
    rows[2].find_element(*_by("button.traj-tab")).click()
    assert "not embedded" in card.find_element(*_by(".traj-view")).text
    card.find_element(*_by("summary")).click()
    assert multi_browser.execute_script("return [window.__pwned, document.images.length]") == [None, 0]
    assert console_errors(multi_browser) == []


def test_agents_their_rewards_and_an_untrained_trajectory(multi_browser, multi) -> None:
    card = multi_browser.find_element(*_by('#episodes details.episode[data-id="pair:0"]'))
    card.find_element(*_by("summary")).click()
    rows = shown(card, "table.trajs tr[data-index]")
    cells = [[td.text for td in row.find_elements(*_by("td"))] for row in rows]
    assert [(c[1], c[2], c[-1]) for c in cells] == [("main", "start", "1"), ("helper", "new_agent", "0.5000")]
    rows[1].find_element(*_by("button.traj-tab")).click()
    items = [e.text for e in card.find_elements(*_by(".traj-view .item-head"))]
    assert items == ["user", "tool call → add · call 1", "tool result ← add (success)", "assistant · call 2"]
    card.find_element(*_by("summary")).click()

    summary = multi[2]
    aux = next(t for t in summary.trajectories if t.info.agent == "aux")
    card = multi_browser.find_element(*_by('#episodes details.episode[data-id="summary:0"]'))
    card.find_element(*_by("summary")).click()
    row = shown(card, f'table.trajs tr[data-index="{aux.index}"]')[0]
    assert "untrained" in row.get_attribute("class") and row.find_elements(*_by("td"))[8].text == "no"
    row.find_element(*_by("button.traj-tab")).click()
    view = card.find_element(*_by(".traj-view"))
    assert "not trained" in view.find_element(*_by(".traj-head")).text
    view.find_element(*_by("details.tokens-box > summary")).click()
    model = shown(view, ".tokens .tok.seg-model")
    assert len(model) == aux.num_model_tokens and not view.find_elements(*_by(".tokens .tok.m1"))
    assert "loss mask 0 (trajectory not trained)" in model[0].get_attribute("title")
    assert console_errors(multi_browser) == []
