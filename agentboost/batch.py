"""Episodes -> training batch. The one conversion used by both the single-machine trainer and the
rLLM / veRL path (so there is no second copy of this logic).

Layout (veRL's): prompts left-padded to ``P``, responses right-padded to ``R``; ``input_ids`` is their
concatenation, ``attention_mask`` marks real tokens, ``position_ids`` count real tokens. Per row:

* ``response_mask``: the loss mask (1 on model tokens, 0 on env tokens, padding and masked episodes);
* ``token_level_scores``: the episode reward on the last real response token, 0 elsewhere;
* ``rollout_log_probs``: the sampling log-probabilities of response tokens (0 where there are none).

One row per trajectory: an episode of one trajectory is one row, as before; an episode whose agent
rewrote its history or that ran several agents is one row per trajectory (``row_episode`` names the
episode of each row), each with the reward of its agent (:meth:`Episode.reward_of`) on its last
token. Trajectories a setting leaves out of training (``TrajectoryInfo.trained``) are not rows.
:func:`row_advantages` gives every row its episode's GRPO advantage, computed over the episodes of the
task's group (not over rows: an episode of many trajectories counts once in its group). An episode with no
loss token in any of its rows (none of its trajectories trained, or no model token at all) is out of its
group's baseline like a masked one, on every route: it carries no gradient and gives no baseline.

Failed episodes are never dropped: an episode with no tokens at all becomes one pad prompt token and
one pad response token, all masked, reward 0. A row that does not fit ``P``/``R`` is cut (prompt: its
first tokens are dropped; response: its tail) and masked like a failure, with every other row of its
episode: reward 0, out of its GRPO group, never trained on half-seen. The episode itself is marked
(``masked = True``, ``metadata["batch_cut"]`` says why) so metrics, saved episodes and advantages all
agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .episode import Episode


@dataclass
class Batch:
    input_ids: Any
    attention_mask: Any
    position_ids: Any
    prompts: Any
    responses: Any
    response_mask: Any
    token_level_scores: Any
    rollout_log_probs: Any
    rewards: Any
    episode_ids: list[str]
    group_ids: list[str]
    terminations: list[str]
    masked: list[bool]
    """Per row: its episode is out of training and of its group's baseline (:attr:`episode_masked`)."""
    truncated: list[bool] = field(default_factory=list)
    row_episode: list[int] = field(default_factory=list)
    """Per row: the index of its episode in the list given to :func:`episodes_to_batch`."""
    row_agent: list[str] = field(default_factory=list)
    """Per row: the agent of its trajectory (``TrajectoryInfo.agent``)."""
    row_trajectory: list[int] = field(default_factory=list)
    """Per row: the index of its trajectory in its episode."""
    episode_rewards: list[dict[str, float]] = field(default_factory=list)
    """Per episode: ``{"": reward, agent: role reward, ...}`` (0 for masked episodes)."""
    episode_masked: list[bool] = field(default_factory=list)
    """Per episode: out of its group's baseline, advantage 0. Masked (a failure, or cut by the batch), or with no
    loss token in any row: no trained trajectory (a re-sampled sibling's, aux calls with ``train_aux_calls``
    off), no model token. verl's estimators read the same rule from the loss mask."""
    episode_groups: list[str] = field(default_factory=list)

    @property
    def prompt_length(self) -> int:
        return int(self.prompts.shape[1])

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def row_tokens(episode: Any, pad_token_id: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt, response, loss mask, rollout log-probs) of one row: an episode of one trajectory, or one
    :class:`~agentboost.episode.TokenTrajectory`. Never empty: an episode that has no tokens (it failed
    before the first call) becomes one masked pad token on each side."""
    if not episode.segments or not any(s.token_ids for s in episode.segments[1:]):
        return episode.prompt_ids or [pad_token_id], [pad_token_id], [0], [0.0]
    return episode.prompt_ids or [pad_token_id], episode.response_ids, episode.response_mask, episode.response_logprobs


def episode_rows(episode: Episode) -> list[Any]:
    """The rows of ``episode``: itself when it is one trajectory (or none), else its trained trajectories
    (an episode none of whose trajectories is trained keeps one masked row, so it is never dropped)."""
    if episode.num_trajectories <= 1:
        if episode.trajectory_info and not episode.trajectory_info[0].trained:
            return [_NoRow(episode.id)]
        return [episode]
    rows = [t for t in episode.trajectories if t.trained]
    return rows or [_NoRow(episode.id)]


@dataclass
class _NoRow:
    """The masked placeholder row of an episode that has no trainable trajectory."""

    id: str
    segments: list[Any] = field(default_factory=list)
    masked: bool = True
    prompt_ids: list[int] = field(default_factory=list)


def episodes_to_batch(
    episodes: list[Episode],
    *,
    pad_token_id: int,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    group_of: Any = None,
) -> Batch:
    """Pad and stack the rows of ``episodes`` (one per trajectory). ``group_of(episode) -> str`` names the
    GRPO group (default: the episode's ``metadata["group_id"]``, else its task id)."""
    import torch

    if not episodes:
        raise ValueError("no episodes to batch")
    group_of = group_of or (lambda e: str(e.metadata.get("group_id") or e.task_id or e.id))
    rows: list[tuple[int, Any, list[int], list[int], list[int], list[float]]] = []
    cut_reasons: dict[int, list[str]] = {}
    for e_index, episode in enumerate(episodes):
        for row in episode_rows(episode):
            prompt, response, mask, lps = row_tokens(row, pad_token_id)
            reasons = []
            if max_prompt_length is not None and len(prompt) > max_prompt_length:
                reasons.append(f"prompt of {len(prompt)} tokens > max_prompt_length={max_prompt_length}")
                prompt = prompt[-max_prompt_length:]
            if max_response_length is not None and len(response) > max_response_length:
                reasons.append(f"response of {len(response)} tokens > max_response_length={max_response_length}")
                keep = max_response_length
                response, mask, lps = response[:keep], mask[:keep], lps[:keep]
            if reasons:
                cut_reasons.setdefault(e_index, []).extend(
                    reasons if episode.num_trajectories <= 1 else [f"trajectory {row.index}: {r}" for r in reasons]
                )
            if isinstance(row, _NoRow):
                mask = [0] * len(mask)
            rows.append((e_index, row, prompt, response, mask, lps))
    for e_index, reasons in cut_reasons.items():
        episode = episodes[e_index]
        if not episode.masked:  # a failure's own reason stays; a cut episode is masked from here on
            episode.masked = True
            episode.metadata["batch_cut"] = "; ".join(reasons)
    width_p = max_prompt_length or max(len(r[2]) for r in rows)
    width_r = max_response_length or max(len(r[3]) for r in rows)
    n = len(rows)
    prompt_t = torch.full((n, width_p), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((n, width_p), dtype=torch.long)
    resp_t = torch.full((n, width_r), pad_token_id, dtype=torch.long)
    resp_attn = torch.zeros((n, width_r), dtype=torch.long)
    mask_t = torch.zeros((n, width_r), dtype=torch.long)
    lp_t = torch.zeros((n, width_r), dtype=torch.float32)
    scores = torch.zeros((n, width_r), dtype=torch.float32)
    rewards = torch.zeros(n, dtype=torch.float32)
    row_agent: list[str] = []
    row_trajectory: list[int] = []
    for i, (e_index, row, p, r, row_mask, lp) in enumerate(rows):
        episode = episodes[e_index]
        m = [0] * len(row_mask) if e_index in cut_reasons or episode.masked else row_mask
        agent = row.info.agent if hasattr(row, "info") else _first_agent(episode)
        prompt_t[i, width_p - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_attn[i, width_p - len(p) :] = 1
        resp_t[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        resp_attn[i, : len(r)] = 1
        mask_t[i, : len(m)] = torch.tensor(m, dtype=torch.long)
        lp_t[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        reward = episode.reward_of(agent)
        rewards[i] = reward
        scores[i, len(r) - 1] = reward
        row_agent.append(agent)
        row_trajectory.append(getattr(row, "index", 0))
    attention = torch.cat([prompt_attn, resp_attn], dim=1)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0) * attention
    episode_groups = [group_of(e) for e in episodes]
    trained = [False] * len(episodes)  # episodes with a loss token: the only ones in their group's baseline
    for (e_index, *_), has_loss in zip(rows, mask_t.any(dim=1).tolist(), strict=True):
        trained[e_index] = trained[e_index] or has_loss
    out = [e.masked or not trained[i] for i, e in enumerate(episodes)]
    return Batch(
        input_ids=torch.cat([prompt_t, resp_t], dim=1),
        attention_mask=attention,
        position_ids=positions,
        prompts=prompt_t,
        responses=resp_t,
        response_mask=mask_t,
        token_level_scores=scores,
        rollout_log_probs=lp_t,
        rewards=rewards,
        episode_ids=[episodes[r[0]].id for r in rows],
        group_ids=[episode_groups[r[0]] for r in rows],
        terminations=[episodes[r[0]].termination.value for r in rows],
        masked=[out[r[0]] for r in rows],
        truncated=[r[0] in cut_reasons for r in rows],
        row_episode=[r[0] for r in rows],
        row_agent=row_agent,
        row_trajectory=row_trajectory,
        episode_rewards=[_episode_rewards(e) for e in episodes],
        episode_masked=out,
        episode_groups=episode_groups,
    )


def _first_agent(episode: Episode) -> str:
    return episode.trajectory_info[0].agent if episode.trajectory_info else ""


def _episode_rewards(episode: Episode) -> dict[str, float]:
    out = {"": 0.0 if episode.masked else float(episode.reward)}
    for agent in {info.agent for info in episode.trajectory_info} | set(episode.role_rewards):
        out[agent] = episode.reward_of(agent)
    return out


def row_advantages(batch: Batch, *, eps: float = 1e-6, normalize_std: bool = True) -> Any:
    """Per row: its episode's GRPO advantage (docs/multi-agent.md, "Agents that rewrite their history, and multi-agent
    runs"). Computed over the unmasked episodes of the row's group, on the reward of the row's agent
    (the episode's reward unless the reward function gave that agent its own), then given to every row
    of the episode of that agent: an episode counts once in its group however many trajectories it has.
    Masked episodes and episodes without a loss token (:attr:`Batch.episode_masked`) are out of their group and
    get 0, and so does an episode with no such sibling."""
    import torch

    from .train.grpo import group_advantages

    advantages = torch.zeros(len(batch.row_episode), dtype=torch.float32)
    if not batch.row_episode:
        return advantages
    n_episodes = len(batch.episode_rewards)
    for agent in sorted(set(batch.row_agent)):
        values = torch.tensor(
            [batch.episode_rewards[e].get(agent, batch.episode_rewards[e][""]) for e in range(n_episodes)],
            dtype=torch.float32,
        )
        per_episode = group_advantages(values, batch.episode_groups, batch.episode_masked, eps=eps,
                                       normalize_std=normalize_std)  # fmt: skip
        for i, (e, row_agent) in enumerate(zip(batch.row_episode, batch.row_agent, strict=True)):
            if row_agent == agent and not batch.masked[i]:
                advantages[i] = per_episode[e]
    return advantages


_PER_EPISODE = frozenset({"episode_rewards", "episode_masked", "episode_groups"})


def select_rows(batch: Batch, idx: list[int]) -> Batch:
    """The rows ``idx`` of ``batch`` (tensors and per-row lists), padded as before."""
    import dataclasses

    import torch

    index = torch.tensor(idx, dtype=torch.long)
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if f.name in _PER_EPISODE:
            continue  # indexed by ``row_episode``, which keeps naming the same episodes
        if hasattr(value, "index_select"):
            changes[f.name] = value.index_select(0, index)
        elif isinstance(value, list) and value:
            changes[f.name] = [value[i] for i in idx]
    return dataclasses.replace(batch, **changes)


def compact(batch: Batch) -> Batch:
    """``batch`` without the prompt columns that are padding in every row (on the left) and the
    response columns that are padding in every row (on the right). Positions, masks and response column
    indices are unchanged for the columns kept, so a model sees exactly the same tokens."""
    import dataclasses

    width_p = batch.prompt_length
    real_p = batch.attention_mask[:, :width_p].any(0).nonzero()
    real_r = batch.attention_mask[:, width_p:].any(0).nonzero()
    first = int(real_p[0]) if real_p.numel() else width_p - 1
    last = int(real_r[-1]) + 1 if real_r.numel() else 1
    if first == 0 and last == batch.responses.shape[1]:
        return batch
    keep = slice(first, width_p + last)
    return dataclasses.replace(
        batch,
        input_ids=batch.input_ids[:, keep],
        attention_mask=batch.attention_mask[:, keep],
        position_ids=batch.position_ids[:, keep],
        prompts=batch.prompts[:, first:],
        responses=batch.responses[:, :last],
        response_mask=batch.response_mask[:, :last],
        token_level_scores=batch.token_level_scores[:, :last],
        rollout_log_probs=batch.rollout_log_probs[:, :last],
    )


def length_chunks(batch: Batch, idx: list[int], max_tokens: int) -> list[list[int]]:
    """Split the rows ``idx`` into chunks of similar length (shortest first) of at most ``max_tokens``
    rows x the width :func:`compact` leaves them (longest prompt + longest response of the chunk; a
    row wider than that is a chunk of its own): a short row then no longer pays for the longest
    episode of the batch in attention, MLPs and backward."""
    width_p = batch.prompt_length
    prompt = batch.attention_mask[:, :width_p].sum(1).tolist()
    response = batch.attention_mask[:, width_p:].sum(1).tolist()
    chunks: list[list[int]] = []
    widest = (0, 0)
    for i in sorted(idx, key=lambda i: (prompt[i] + response[i], i)):
        grown = (max(widest[0], prompt[i]), max(widest[1], response[i]))
        if chunks and (len(chunks[-1]) + 1) * (grown[0] + grown[1]) <= max_tokens:
            chunks[-1].append(i)
            widest = grown
        else:
            chunks.append([i])
            widest = (prompt[i], response[i])
    return chunks
