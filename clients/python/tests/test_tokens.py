"""Token helpers: per segment input_ids, loss_mask, logprobs, advantage; a clear error without token data."""

from __future__ import annotations

import asyncio

import pytest
from conftest import ANSWER_TASK

from rollbox import AsyncClient, Client, Policy, TokenDataUnavailable


def test_segments_from_the_stream_equal_the_services_export(client: Client, policy_url: str) -> None:
    rollout = client.submit([ANSWER_TASK], group_size=4, policy=Policy(policy_url, "fake", mode="tokens"), policy_version="v7")
    mine = []
    for group in rollout.groups():
        for ep in group:
            segs = ep.segments()
            assert len(segs) == 1
            mine.extend(segs)
    theirs = list(rollout.segments())
    key = lambda s: (s.episode_id, s.index)  # noqa: E731
    for a, b in zip(sorted(mine, key=key), sorted(theirs, key=key), strict=True):
        assert vars(a) == vars(b)
    for s in mine:
        assert len(s.input_ids) == len(s.loss_mask) == len(s.logprobs) > 0
        assert set(s.loss_mask) == {0, 1}
        assert 0 < s.prompt_length < len(s.input_ids) and s.loss_mask[s.prompt_length] == 1
        assert not any(s.loss_mask[: s.prompt_length])
        # Logprobs sit exactly on the sampled ids.
        assert all((lp != 0) == (m == 1) for lp, m in zip(s.logprobs, s.loss_mask))
        assert s.logprobs_complete and s.policy_version == "v7"
        assert s.advantage == pytest.approx(s.reward - 0.5)
        assert s.tokenizer["fingerprint"]
    # The sampled ids are the completions the trajectory recorded.
    ep = next(iter(rollout.episodes()))
    sampled = [i for s in ep.segments() for i, m in zip(s.input_ids, s.loss_mask) if m]
    recorded = [i for st in ep.trajectory["steps"] if st["type"] == "model" for i in st["completion_ids"]]
    assert sampled == recorded


def test_chat_mode_has_no_token_data_and_says_so(client: Client, policy_url: str) -> None:
    rollout = client.submit([ANSWER_TASK], group_size=1, policy={"base_url": policy_url, "model": "fake"})
    ep = next(iter(rollout.episodes()))
    with pytest.raises(TokenDataUnavailable, match=r"ran in chat mode.*mode': 'tokens'"):
        ep.segments()
    with pytest.raises(TokenDataUnavailable, match=f"rollout {rollout.id} ran in chat mode"):
        rollout.segments()


def test_async_streams(service, policy_url: str) -> None:
    async def main() -> list[list[float | None]]:
        async with AsyncClient(service.url) as c:
            r = await c.submit(["add"], 2, {"base_url": policy_url, "model": "fake"})
            eps = [e async for e in c.episodes(r.id)]
            assert len(eps) == 2
            return [g.rewards async for g in c.groups(r.id)]

    assert [sorted(r) for r in asyncio.run(main())] == [[0.0, 1.0]]
