"""Environment mode as a Gymnasium-style environment, sync and asyncio, against a real `rollbox serve`."""

from __future__ import annotations

import asyncio

import pytest
from conftest import FILE_TASK

from rollbox import AsyncClient, Client


def test_a_loop_the_trainer_owns(client: Client) -> None:
    env = client.env(FILE_TASK)
    obs = env.reset()
    assert obs["messages"][-1] == {"role": "user", "content": FILE_TASK["prompt"]}
    assert sorted(t["function"]["name"] for t in obs["tools"]) == ["bash", "finish", "run_tests"]
    assert env.limits["max_turns"] == 5
    # OpenAI's tool-call form, arguments as the text the model wrote.
    obs, reward, done, info = env.step([{"id": "c1", "type": "function",
                                         "function": {"name": "bash", "arguments": '{"command": "echo hello > /work/out.txt; cat /work/out.txt"}'}}])
    assert obs == [{"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "hello\n"}]
    assert (reward, done) == (0.0, False)
    assert info["results"][0]["exit_code"] == 0
    obs, reward, done, info = env.step([{"name": "run_tests", "arguments": {}}])
    assert not done and info["results"][0]["exit_code"] == 0
    obs, reward, done, info = env.step([{"name": "finish", "arguments": {}}], content="done")
    assert done and reward == 1.0 and info["scored"]
    assert info["termination"]["reason"] == "finished"
    assert info["reward"]["components"] == {"tests": 1}
    # The conversation as the model would see it next.
    roles = [m["role"] for m in env.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert env.messages[-2]["content"] == "done"
    traj = env.trajectory()
    assert traj["termination"]["reason"] == "finished" and traj["reward"]["total"] == 1
    env.close()  # finished: nothing to close


def test_a_wrong_answer_scores_zero_and_finish_takes_an_answer(client: Client) -> None:
    with client.env(FILE_TASK) as env:
        env.reset()
        env.step([{"name": "bash", "arguments": {"command": "echo bye > /work/out.txt"}}])
        assert env.finish() == 0.0
        assert env.done and env.reward["total"] == 0
    with client.env("add") as env:
        env.reset()
        assert env.finish(answer="4") == 1.0


def test_close_cancels_an_open_episode_and_reset_starts_over(client: Client) -> None:
    env = client.env("add")
    env.reset()
    first = env.id
    env.step([{"name": "bash", "arguments": {"command": "true"}}])
    env.reset()  # closes the first
    assert env.id != first
    t = client.episode(first)
    assert t["termination"]["reason"] == "cancelled" and t["reward"] is None
    env.close()
    assert client.episode(env.id)["termination"]["reason"] == "cancelled"
    with pytest.raises(RuntimeError, match="reset"):
        client.env("add").step([])


def test_bad_tool_calls_are_refused_before_sending(client: Client) -> None:
    env = client.env("add")
    env.reset()
    with pytest.raises(ValueError, match="no function name"):
        env.step([{"arguments": {}}])
    with pytest.raises(ValueError, match="arguments"):
        env.step([{"name": "bash", "arguments": 3}])
    # An unknown tool is the model's mistake: a result, not an exception.
    obs, reward, done, info = env.step([{"name": "nope", "arguments": {}}])
    assert info["results"][0]["error_kind"] == "unknown_tool" and not done
    env.close()


def test_many_async_environments_at_once(service) -> None:
    async def one(c: AsyncClient, right: bool) -> float | None:
        async with c.env(FILE_TASK) as env:
            await env.reset()
            word = "hello" if right else "nope"
            await env.step([{"name": "bash", "arguments": {"command": f"echo {word} > /work/out.txt"}}])
            _, reward, done, _ = await env.step([{"name": "finish", "arguments": {}}])
            assert done
            return reward

    async def main() -> list[float | None]:
        async with AsyncClient(service.url, max_workers=16) as c:
            assert (await c.health())["status"] == "ok"
            return await asyncio.gather(*(one(c, i % 2 == 0) for i in range(12)))

    rewards = asyncio.run(main())
    assert rewards == [1.0, 0.0] * 6


def test_fork_branches_an_open_episode(client: Client) -> None:
    env = client.env(FILE_TASK)
    env.reset()
    env.step([{"name": "bash", "arguments": {"command": "echo hello > /work/out.txt"}}])
    wrong, kept = env.fork(2)
    assert {wrong.id, kept.id}.isdisjoint({env.id}) and wrong.id != kept.id
    assert kept.messages == env.messages and kept.tools == env.tools
    _, r_wrong, done, _ = wrong.step([{"name": "bash", "arguments": {"command": "echo nope > /work/out.txt"}}])
    assert not done
    assert wrong.finish() == 0.0
    assert kept.finish() == 1.0   # the parent's file, forked
    assert env.finish() == 1.0    # the parent went on, untouched by its forks
    t = client.episode(wrong.id)
    assert t["forked_from"]["episode_id"] == env.id
    with pytest.raises(RuntimeError, match="open episode"):
        env.fork(1)


def test_reset_takes_the_trainers_step(client: Client) -> None:
    env = client.env("add")
    env.reset(train_step=12)
    assert env.finish(answer="4") == 1.0
    assert client.episode(env.id)["train_step"] == 12
    env.reset()
    env.finish(answer="4")
    assert "train_step" not in client.episode(env.id)  # 0: absent
    with pytest.raises(ValueError, match="train_step"):
        env.reset(train_step=-1)
