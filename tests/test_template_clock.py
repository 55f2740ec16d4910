"""Templates that print today's date (``strftime_now``, Llama 3.2/3.3): an episode renders every piece
with one moment, so a multi-turn episode that crosses midnight (or starts after the template was
probed on another day) stays token-exact instead of failing."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest
import transformers.utils.chat_template_utils as hf_templates

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.chat import template as template_module
from agentboost.chat.template import ChatTemplate
from agentboost.environments.strands_env import StrandsEnv
from agentboost.rollout import run_episode
from agentboost.types import Termination

from .conftest import tokenizer_for
from .helpers import add, calls_text

CLOCK = [datetime(2026, 11, 23, 23, 59, 58)]


class FakeDatetime(datetime):
    @classmethod
    def now(cls, tz=None):  # the clock every render reads (agentboost's and transformers' own)
        return CLOCK[0]


@pytest.fixture
def clock(monkeypatch):
    from agentboost import model as model_module

    CLOCK[0] = datetime(2026, 11, 23, 23, 59, 58)
    for module in (hf_templates, template_module, model_module):
        if hasattr(module, "datetime"):
            monkeypatch.setattr(module, "datetime", FakeDatetime)
    return CLOCK


class MidnightBackend(ScriptedBackend):
    """Midnight passes while the first call is being generated."""

    async def generate(self, request):
        result = await super().generate(request)
        CLOCK[0] = datetime(2026, 11, 24, 0, 0, 2)
        return result


def _episode(template: ChatTemplate, backend):
    env = StrandsEnv({"prompt": "What is 2 + 3?"}, tools=[add], reward_fn=lambda task, ep: float("5" in ep.final_text))
    return asyncio.run(run_episode(env, StrandsAgent(system_prompt="Be exact."), backend, template))


def test_an_episode_across_midnight_stays_token_exact(clock) -> None:
    template = ChatTemplate(tokenizer_for("llama3.2"))
    texts = [calls_text("llama3_json", [("add", {"a": 2, "b": 3})]), "5"]
    episode = _episode(template, MidnightBackend(text_script(template, texts)))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert len(episode.calls) == 2 and episode.reward == 1.0 and template.uses_clock
    prompt = template.decode(episode.prompt_ids)
    assert "Today Date: 23 Nov 2026" in prompt
    env_text = template.decode(episode.segments[2].token_ids)
    assert "Date" not in env_text and env_text.startswith("<|start_header_id|>")
    # The episode's tokens are the template's full render of the conversation at the episode's moment.
    from agentboost.chat.messages import strands_to_hf, system_message, tool_specs_to_openai

    hf = system_message("Be exact.") + strands_to_hf(episode.messages)
    full = template.render(hf, tools=tool_specs_to_openai([add.tool_spec]), add_generation_prompt=False,
                           now=datetime(2026, 11, 23, 23, 59, 58))  # fmt: skip
    assert template.decode(episode.prompt_ids + episode.response_ids) == full


def test_an_episode_that_starts_on_another_day_than_the_probe(clock) -> None:
    template = ChatTemplate(tokenizer_for("llama3.2"))  # probed on the 23rd
    CLOCK[0] = datetime(2026, 11, 25, 9, 0, 0)
    texts = [calls_text("llama3_json", [("add", {"a": 2, "b": 3})]), "5"]
    episode = _episode(template, ScriptedBackend(text_script(template, texts)))
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert "Today Date: 25 Nov 2026" in template.decode(episode.prompt_ids)
