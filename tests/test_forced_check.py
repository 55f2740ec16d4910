"""The warm start's check, read off the demonstrations fed to the model (agentboost.train.forced).

Issue 23's seed goal: one seed (110) ended its warm start with 0.81 of the greedy check reproducing the
demonstrations, all in the sentence style greedy decoding picks, and GRPO, which rewards the bare number,
stayed at 0.34: the skill was there in one style only and the rollout check could not see it. The forced
check measures each style, and is exact where the rollout check was sampled.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from agentboost.agents.strands_agent import StrandsAgent  # noqa: E402
from agentboost.batch import episodes_to_batch  # noqa: E402
from agentboost.chat.template import ChatTemplate  # noqa: E402
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks  # noqa: E402
from agentboost.quickstart import ENV, QuickstartConfig, build_quickstart_model  # noqa: E402
from agentboost.rewards.answer import final_answer_text  # noqa: E402
from agentboost.train.demonstration import (  # noqa: E402
    demo_turns,
    reproduces_demonstration,
    warm_start,
    warm_start_check_rows,
)
from agentboost.train.forced import CHOICE, NOTHING, choice_token, forced, response_classes  # noqa: E402
from agentboost.train.logprobs import response_logprobs  # noqa: E402
from agentboost.train.sft import SFTRun, demonstration_episodes  # noqa: E402

from .test_quickstart_warm_start import _trainer as warm_start_trainer  # noqa: E402

AGENT = StrandsAgent(system_prompt=SYSTEM_PROMPT)
PAD = 0


@pytest.fixture(scope="module")
def sentence_only():
    """A tiny model that learnt the check tasks' sentence-style demonstrations by heart, and never saw the
    bare style: greedy decoding answers them right, in the sentence."""
    torch.manual_seed(0)
    # the vocabulary of the tables this fixture was made with (with " -" apart, its 300 steps leave one of the
    # two check tasks opening "3 - " with the other's operand: a memorising fixture, not a check of copying)
    cfg = QuickstartConfig(hidden_size=64, num_layers=2, num_heads=4, seed=0, train_tasks=32, demos=16,
                           warm_start_check_tasks=4, negative_sign_apart=False)  # fmt: skip
    rows = make_tasks(cfg.train_tasks, seed=0, max_ops=1, max_value=cfg.max_value, split="train")
    model, tokenizer = build_quickstart_model(cfg, rows)
    template = ChatTemplate(tokenizer)
    check_rows = warm_start_check_rows(cfg, rows)
    sentence = demonstration_episodes(check_rows, demo_turns(verbose=True), template, env=ENV, agent=AGENT)
    bare = demonstration_episodes(check_rows, demo_turns(verbose=False), template, env=ENV, agent=AGENT)
    run = SFTRun(model, sentence, pad_token_id=PAD, steps=300, lr=3e-3, batch_size=4,
                 schedule="constant")  # fmt: skip
    run.run()
    model.eval()
    return cfg, rows, check_rows, model, template, bare, sentence


def _trainer(model, template, rows, tmp_path):
    return warm_start_trainer((None, rows, model, template), tmp_path, max_tokens_per_call=48)


def test_forced_greedy_is_what_greedy_decoding_does(sentence_only, tmp_path) -> None:
    _, rows, check_rows, model, template, bare, sentence = sentence_only
    trainer = _trainer(model, template, rows, tmp_path)
    by_id = {row["task_id"]: row for row in check_rows}
    played = trainer.rollout(check_rows, n=1, sampling=replace(trainer.config.sampling, temperature=0.0), tag="g")
    in_sentence = forced(model, sentence, pad_token_id=PAD, rivals=[choice_token(e) for e in bare])
    in_bare = forced(model, bare, pad_token_id=PAD, rivals=[choice_token(e) for e in sentence])
    assert all(r.greedy and r.picked for r in in_sentence)  # learnt by heart
    for episode, s, b in zip(played, in_sentence, in_bare, strict=True):
        assert reproduces_demonstration(by_id[episode.task_id], episode) == (s.greedy and s.picked)
        assert s.picked == (final_answer_text(episode) or "").startswith("The answer") != b.picked
    assert not any(r.greedy for r in in_bare)  # the bare number is followed by the sentence's "." (never seen)


class _Scripted(torch.nn.Module):
    """A "model" that predicts each next token of its input (logit 20, every other 0), except where
    ``override(ids, j)`` returns {token: logit} for position j."""

    def __init__(self, vocab: int, override) -> None:
        super().__init__()
        self.config = type("Config", (), {"vocab_size": vocab})()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.override = override

    def forward(self, input_ids, attention_mask):
        logits = torch.zeros((*input_ids.shape, self.config.vocab_size))
        for b in range(input_ids.shape[0]):
            for j in range(input_ids.shape[1] - 1):
                logits[b, j, int(input_ids[b, j + 1])] = 20.0
                for token, value in (self.override(input_ids[b].tolist(), j) or {}).items():
                    logits[b, j, token] = value
        return type("Out", (), {"logits": logits})()


def test_a_bare_answer_s_first_digit_is_checked_not_given(sentence_only) -> None:
    """The first token of a bare answer is its style and its first digit: setting the style aside must not
    set the digit aside (a one-digit answer would go unchecked: a model answering bare with the wrong
    number passed)."""
    _, _, _, model, template, bare, sentence = sentence_only
    vocab = int(model.config.vocab_size)
    [episode], [other] = bare[:1], sentence[:1]
    digit, the = choice_token(episode), choice_token(other)
    wrong = next(t for t in template.encode("0123456789") if t != digit)
    mask = [0] * len(episode.prompt_ids) + list(episode.response_mask)
    choice_at = [j for j in range(1, len(mask)) if mask[j] and not mask[j - 1]][-1]
    assert episode.num_trajectories <= 1 and [*episode.prompt_ids, *episode.response_ids][choice_at] == digit

    def at_choice(scores):
        def override(ids, j):
            return scores if j == choice_at - 1 else None

        return override

    def run(scores):
        return forced(_Scripted(vocab, at_choice(scores)), [episode], pad_token_id=PAD, rivals=[the])[0]

    exact = run({})
    assert exact.greedy and exact.picked and exact.logprob == pytest.approx(0.0, abs=1e-2)
    assert run({the: 21.0}).greedy and not run({the: 21.0}).picked  # the sentence preferred, the digit next: set aside
    assert not run({wrong: 21.0}).greedy  # a wrong digit first: the bare answer is wrong
    assert not run({the: 22.0, wrong: 21.0}).greedy  # the style set aside, the wrong digit still beats the right one
    wrong_episode = forced(_Scripted(vocab, at_choice({wrong: 21.0})), [other], pad_token_id=PAD, rivals=[digit])[0]
    assert not wrong_episode.greedy  # the sentence's opening loses to a wrong digit that is not its rival


def test_masked_or_empty_demonstrations_reproduce_nothing(sentence_only) -> None:
    _, _, _, model, _, bare, _ = sentence_only
    import copy

    masked = copy.copy(bare[1])
    masked.masked = True
    got = forced(model, [bare[0], masked], pad_token_id=PAD)
    assert got[1] == NOTHING and got[0] != NOTHING and math.isfinite(got[0].logprob)


def test_chunks_and_two_trajectory_episodes_give_the_same_answers(sentence_only, monkeypatch) -> None:
    """One row per forward pass gives what one pass over all rows gives; with Strands' sliding window
    (two trajectories per episode) the choice is the answer's opening in the second trajectory."""
    import agentboost.train.forced as forced_module
    from agentboost.quickstart import quickstart_agent

    _, _, check_rows, model, template, bare, sentence = sentence_only
    together = forced(model, bare + sentence, pad_token_id=PAD)
    monkeypatch.setattr(forced_module, "_LOGITS_PER_CHUNK", 1)
    one_by_one = forced(model, bare + sentence, pad_token_id=PAD)
    for a, b in zip(together, one_by_one, strict=True):
        assert (a.greedy, a.picked) == (b.greedy, b.picked)
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3) and a.choice == pytest.approx(b.choice, abs=1e-3)
    windowed = quickstart_agent(QuickstartConfig(window_size=2))
    two = demonstration_episodes(check_rows, demo_turns(verbose=True), template, env=ENV, agent=windowed)
    assert all(e.num_trajectories == 2 for e in two)
    assert [choice_token(e) for e in two] == [choice_token(e) for e in sentence]  # "The", in the second
    assert all(math.isfinite(r.logprob) for r in forced(model, two, pad_token_id=PAD))


def test_forced_probabilities_are_the_model_tokens_probabilities(sentence_only) -> None:
    _, _, _, model, template, bare, sentence = sentence_only
    for episodes in (bare, sentence):
        batch = episodes_to_batch(episodes, pad_token_id=PAD)
        with torch.no_grad():
            expected = (response_logprobs(model, batch) * batch.response_mask).sum(dim=1)
        got = [r.logprob for r in forced(model, episodes, pad_token_id=PAD)]
        assert got == pytest.approx(expected.tolist(), abs=1e-3)
        hot = forced(model, episodes, pad_token_id=PAD, temperature=2.0)
        assert all(h.logprob < 0 and math.isfinite(h.logprob) for h in hot)
        assert [h.greedy for h in hot] == [r.greedy for r in forced(model, episodes, pad_token_id=PAD)]


def test_a_skill_in_one_style_only_does_not_count(sentence_only, tmp_path) -> None:
    """The rollout check counted this model's greedy episodes as the skill (1.0 reproduce the demonstrations,
    in the sentence); the check asks for both styles: 0.0, and the warm start goes on to its ceiling."""
    cfg, rows, _, model, template, _, _ = sentence_only
    trainer = _trainer(model, template, rows, tmp_path)
    frozen = QuickstartConfig(**{**cfg.__dict__, "sft_lr": 1e-12, "sft_batch": 2, "warm_start_check_every": 2,
                                 "sft_weight_decay": 0.0})  # fmt: skip
    report = warm_start(frozen, trainer, rows, steps=4, progress=False)
    last = report["checks"][-1]
    assert last["greedy_sentence"] == 1.0 and last["greedy_bare"] == 0.0
    assert report["check"] == 0.0 and not report["reached"] and report["steps"] == 4
    assert report["rollout_check"]["greedy"] == 1.0  # what the rollout check saw


def test_the_tally_names_the_tokens_greedy_decoding_gets_wrong(sentence_only) -> None:
    """Issue 23: seeds 102 and 107 copied everything but one token (the first; a bare answer's first
    digit) for a thousand warm-start steps. The check counts, per class of model token, what greedy decoding
    gets wrong, so the warm start can weigh that class (QuickstartConfig.warm_start_focus_at)."""
    _, _, _, model, template, bare, sentence = sentence_only
    vocab = int(model.config.vocab_size)
    [episode], [other] = bare[:1], sentence[:1]
    digit, the = choice_token(episode), choice_token(other)
    ids = [*episode.prompt_ids, *episode.response_ids]
    mask = [0] * len(episode.prompt_ids) + list(episode.response_mask)
    model_at = [j for j in range(len(mask)) if mask[j]]
    choice_at = [j for j in range(1, len(mask)) if mask[j] and not mask[j - 1]][-1]
    inner = model_at[3]  # a model token of the tool call
    wrong = next(t for t in range(vocab) if t not in (ids[inner], digit, the))

    def tally_of(scores_at):
        def override(_ids, j):
            return scores_at.get(j + 1)

        tally = {}
        result = forced(_Scripted(vocab, override), [episode], pad_token_id=PAD, rivals=[the], tally=tally)[0]
        return result, tally

    result, tally = tally_of({})
    assert result.greedy and sum(seen for seen, _ in tally.values()) == len(model_at)
    assert not any(missed for _, missed in tally.values()) and tally[CHOICE] == [1, 0]
    result, tally = tally_of({inner: {wrong: 21.0}, choice_at: {the: 21.0}})
    assert not result.greedy and tally[ids[inner]][1] == 1 and tally[CHOICE] == [1, 0]  # the rival set aside
    assert sum(missed for _, missed in tally.values()) == 1
    result, tally = tally_of({choice_at: {wrong: 21.0}})
    assert tally[CHOICE] == [1, 1] and sum(missed for _, missed in tally.values()) == 1
    # the classes training weighs are laid out as the batch's responses are
    batch = episodes_to_batch(bare + sentence, pad_token_id=PAD)
    rows = [row for e in bare + sentence for row in response_classes(e, PAD)]
    assert len(rows) == len(batch)
    for i, classes in enumerate(rows):
        has_loss = [c is not None for c in classes]
        assert has_loss == [bool(m) for m in batch.response_mask[i, : len(classes)].tolist()]
        assert classes.count(CHOICE) == 1
        opening = int(batch.responses[i, classes.index(CHOICE)])
        assert opening == choice_token((bare + sentence)[i])
        assert all(
            c == int(t)
            for c, t in zip(classes, batch.responses[i, : len(classes)].tolist(), strict=True)
            if c not in (None, CHOICE)
        )


def test_a_focused_loss_weighs_the_classes_it_names(sentence_only) -> None:
    """SFTRun.focus: the step follows the weighted mean over model tokens, the recorded loss stays the plain
    mean (comparable along the run: the restart's plateau test reads it); the weights survive a save."""
    _, _, _, model, _, bare, _ = sentence_only
    import copy

    episodes = bare[:2]
    run = SFTRun(copy.deepcopy(model), episodes, pad_token_id=PAD, steps=1, lr=1e-12, batch_size=2)
    batch = episodes_to_batch(run.usable, pad_token_id=PAD)  # batch_size = all: drawn in some order
    first = int(batch.responses[0, [c is not None for c in response_classes(run.usable[0], PAD)[0]].index(True)])
    run.focus = {CHOICE: 5.0, first: 3.0}
    weights = run._focus_weights(run.usable, batch.response_mask.shape)
    classes = [row for e in run.usable for row in response_classes(e, PAD)]
    for i, row in enumerate(classes):
        for j, c in enumerate(row):
            assert float(weights[i, j]) == {CHOICE: 5.0, first: 3.0}.get(c, 1.0)
    mask = batch.response_mask.float()

    def direction(loss_of):  # the unit gradient of a loss of the log-probs, on the weights before the step
        own = copy.deepcopy(run.model)
        own.train()
        lp = response_logprobs(own, batch)
        loss = loss_of(lp)
        loss.backward()
        flat = torch.cat([q.grad.flatten() for q in own.parameters() if q.grad is not None])
        return float(loss), flat / flat.norm()

    plain, plain_grad = direction(lambda lp: -(lp * mask).sum() / mask.sum())
    weighted, weighted_grad = direction(lambda lp: -(lp * mask * weights).sum() / (mask * weights).sum())
    state = copy.deepcopy(run.state_dict())
    loss = run.train_step()  # both episodes, in some order: a mean does not mind
    taken = torch.cat([q.grad.flatten() for q in run.model.parameters() if q.grad is not None])
    taken = taken / taken.norm()  # clipped or not: its direction
    assert loss == pytest.approx(plain, rel=1e-4) and abs(weighted - plain) > 1e-3  # recorded: the plain mean
    assert float(taken @ weighted_grad) > 0.9999 and float(plain_grad @ weighted_grad) < 0.999  # stepped: weighted
    restored = SFTRun(copy.deepcopy(model), episodes, pad_token_id=PAD, steps=1, lr=1e-12, batch_size=2)
    restored.load_state_dict(state)
    assert restored.focus == {CHOICE: 5.0, first: 3.0}
    restored.restart(1)  # fresh weights: what the old ones got wrong is forgotten
    assert restored.focus == {}
    del state["focus"]  # saved before focus existed: none
    restored.load_state_dict(state)
    assert restored.focus == {}
