"""Environment mode as a Gymnasium-style environment, for trainers that own the agent loop.

::

    env = client.env(task)
    obs = env.reset()                      # {"messages": [...], "tools": [...]}
    while True:
        msg = my_model(obs["messages"], tools=obs["tools"])    # the trainer's own sampling
        obs, reward, done, info = env.step(msg.tool_calls)
        if done:
            break                          # reward: the verifier's, or None when unscored
    env.close()

Each ``step`` runs an assistant message's tool calls in the episode's sandbox
(``POST /v1/episodes/{id}/step``) and returns the tool results as OpenAI
``tool`` messages. When the episode ends (the model called ``finish``, or a
limit was reached) the environment asks for the reward
(``POST /v1/episodes/{id}/finish``) and returns it with ``done=True``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .errors import Conflict

if TYPE_CHECKING:
    from .client import AsyncClient, Client

__all__ = ["Env", "AsyncEnv", "normalize_tool_calls"]


def _reward_total(reward: Any) -> float | None:
    if not isinstance(reward, dict):
        return None
    v = reward.get("total")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def normalize_tool_calls(tool_calls: Iterable[Any] | None) -> list[dict[str, Any]]:
    """Tool calls in the API's form ``{"id", "name", "arguments"}``.

    Accepts the API's form (arguments as the raw text the model wrote, or as a
    dict), OpenAI's ``{"id", "type": "function", "function": {"name",
    "arguments"}}``, and objects with those attributes (the ``openai``
    package's tool calls).
    """
    out: list[dict[str, Any]] = []
    for i, c in enumerate(tool_calls or []):
        if not isinstance(c, Mapping):
            fn = getattr(c, "function", None)
            c = {"id": getattr(c, "id", None), "name": getattr(fn, "name", None) if fn is not None else getattr(c, "name", None),
                 "arguments": getattr(fn, "arguments", None) if fn is not None else getattr(c, "arguments", None)}
        elif "function" in c and isinstance(c["function"], Mapping):
            c = {"id": c.get("id"), "name": c["function"].get("name"), "arguments": c["function"].get("arguments")}
        name = c.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool_calls[{i}]: no function name in {c!r}")
        args = c.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, (str, Mapping)):
            raise ValueError(f"tool_calls[{i}].arguments: want the model's JSON text or a dict, got {type(args).__name__}")
        call: dict[str, Any] = {"name": name, "arguments": dict(args) if isinstance(args, Mapping) else args}
        if c.get("id"):
            call["id"] = str(c["id"])
        out.append(call)
    return out


def _arguments_text(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args)


class _EnvState:
    """What sync and async environments share: the request bodies and the bookkeeping."""

    def __init__(self, task: Mapping[str, Any] | str, backend: str | None, seed: int | None) -> None:
        self.task: dict[str, Any] = {"id": task} if isinstance(task, str) else dict(task)
        self.backend = backend
        self.seed = seed
        self.id: str | None = None
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.limits: dict[str, Any] = {}
        self.done = False
        self.finished = False
        self.reward: dict[str, Any] | None = None
        self.termination: dict[str, Any] | None = None
        self._pending: dict[str, Any] = {}

    def open_body(self, train_step: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"task": self.task}
        if self.backend:
            body["backend"] = self.backend
        if self.seed is not None:
            body["seed"] = self.seed
        if train_step is not None:
            if isinstance(train_step, bool) or not isinstance(train_step, int) or train_step < 0:
                raise ValueError(f"train_step: want a non-negative int, got {train_step!r}")
            body["train_step"] = train_step
        return body

    def opened(self, ans: Mapping[str, Any]) -> dict[str, Any]:
        self.id = ans["id"]
        self.messages = list(ans.get("messages") or [])
        self.tools = list(ans.get("tools") or [])
        self.limits = dict(ans.get("limits") or {})
        self.done = self.finished = False
        self.reward = self.termination = None
        return self.observation()

    def observation(self) -> dict[str, Any]:
        return {"messages": list(self.messages), "tools": list(self.tools)}

    def step_body(self, tool_calls: Iterable[Any] | None, content: str | None, extra: Mapping[str, Any]) -> dict[str, Any]:
        if self.id is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            raise Conflict(f"episode {self.id} has ended ({(self.termination or {}).get('reason', 'done')}); call reset() for a new one",
                           status=409, code="episode_ended", field="id")
        calls = normalize_tool_calls(tool_calls)
        body: dict[str, Any] = {"tool_calls": calls}
        if content:
            body["content"] = content
        body.update({k: v for k, v in extra.items() if v is not None})
        msg: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if calls:
            msg["tool_calls"] = [{"id": c.get("id", ""), "type": "function",
                                  "function": {"name": c["name"], "arguments": _arguments_text(c["arguments"])}} for c in calls]
        self._pending = msg
        return body

    def stepped(self, ans: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        results = list(ans.get("results") or [])
        msg = self._pending
        if "tool_calls" in msg:
            for tc, r in zip(msg["tool_calls"], results):
                tc["id"] = r.get("call_id", tc["id"])
        self.messages.append(msg)
        obs = [{"role": "tool", "tool_call_id": r.get("call_id", ""), "name": r.get("name", ""), "content": r.get("output", "")}
               for r in results]
        self.messages.extend(obs)
        done = bool(ans.get("done"))
        if done:
            self.done = True
            self.termination = ans.get("termination")
        return obs, done

    def finished_with(self, ans: Mapping[str, Any]) -> float | None:
        self.done = self.finished = True
        self.reward = ans.get("reward")
        self.termination = ans.get("termination") or self.termination
        return _reward_total(self.reward)

    def forked(self, episode_id: str) -> "_EnvState":
        """The state of a fork of this episode: the same conversation so far."""
        st = _EnvState(self.task, self.backend, self.seed)
        st.id = episode_id
        st.messages = [dict(m) for m in self.messages]
        st.tools = list(self.tools)
        st.limits = dict(self.limits)
        return st

    def info(self, ans: Mapping[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = {"episode_id": self.id, "results": list(ans.get("results") or [])}
        if self.done:
            info["termination"] = self.termination
            info["reward"] = self.reward
            info["scored"] = _reward_total(self.reward) is not None
        return info


class Env:
    """A Gymnasium-style environment over one environment-mode episode at a time.

    Attributes:
        id: the open episode's id (``None`` before :meth:`reset`).
        messages: the conversation so far (system and user prompt, then every
            assistant message and its tool results), in OpenAI format.
        tools: the episode's tool schemas in OpenAI function format.
        limits: the limits the episode runs under (``max_turns``, ...).
        reward: after the end, the reward object (``total``, ``components``, ...).
    """

    def __init__(self, client: "Client", task: Mapping[str, Any] | str, *, backend: str | None = None, seed: int | None = None) -> None:
        self._client = client
        self._s = _EnvState(task, backend, seed)

    def __enter__(self) -> "Env":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Env(task={self._s.task.get('id')!r}, episode={self._s.id!r}, done={self._s.done})"

    id = property(lambda self: self._s.id)
    messages = property(lambda self: self._s.messages)
    tools = property(lambda self: self._s.tools)
    limits = property(lambda self: self._s.limits)
    done = property(lambda self: self._s.done)
    reward = property(lambda self: self._s.reward)

    def reset(self, *, train_step: int | None = None) -> dict[str, Any]:
        """Opens a new episode (closing the previous one if it is still open).

        ``train_step`` is the trainer's step the episode is for: a ``parl``
        reward anneals its λ to their value at it (default 0).

        Returns the observation: ``{"messages": [...], "tools": [...]}``.
        """
        body = self._s.open_body(train_step)
        self.close()
        ans = self._client._t.json("POST", "/v1/episodes", json_body=body)
        return self._s.opened(ans)

    def step(self, tool_calls: Iterable[Any] | None, content: str | None = None, **turn: Any
             ) -> tuple[list[dict[str, Any]], float | None, bool, dict[str, Any]]:
        """Runs an assistant message's tool calls.

        Args:
            tool_calls: the calls (API, OpenAI or ``openai``-package form).
            content: the message's text, if any.
            **turn: other fields of the step request for the record
                (``prompt_token_ids``, ``completion_token_ids``, ``usage``,
                ``model``, ``latency_ms``, ``policy_version``, ``finish_reason``).

        Returns:
            ``(obs, reward, done, info)``: ``obs`` the tool results as OpenAI
            ``tool`` messages; ``reward`` 0.0 until the end, then the reward's
            total (``None`` when the episode is unscored: never train on it);
            ``info`` the raw ``results`` and, at the end, ``termination``,
            ``reward`` (the whole object) and ``scored``.
        """
        body = self._s.step_body(tool_calls, content, turn)
        ans = self._client._t.json("POST", f"/v1/episodes/{self._s.id}/step", json_body=body, retry=False)
        obs, done = self._s.stepped(ans)
        reward: float | None = 0.0
        if done:
            reward = self._finish({})
        return obs, reward, done, self._s.info(ans)

    def finish(self, answer: str | None = None, ids: list[str] | None = None) -> float | None:
        """Ends the episode now with an answer (as the ``finish`` tool would) and returns its reward total."""
        if self._s.id is None:
            raise RuntimeError("call reset() before finish()")
        if self._s.finished:
            return _reward_total(self._s.reward)
        body: dict[str, Any] = {}
        if answer is not None:
            body["answer"] = answer
        if ids is not None:
            body["ids"] = ids
        return self._finish(body)

    def _finish(self, body: dict[str, Any]) -> float | None:
        ans = self._client._t.json("POST", f"/v1/episodes/{self._s.id}/finish", json_body=body, retry=False)
        return self._s.finished_with(ans)

    def fork(self, n: int) -> list["Env"]:
        """Branches the open episode into ``n`` environments that go on from
        here independently (each with a fork of the sandbox's files and this
        conversation so far); this one goes on too. All or nothing."""
        if self._s.id is None or self._s.done:
            raise RuntimeError("fork needs an open episode: call reset(), and fork before the end")
        out = []
        for eid in self._client.fork(self._s.id, n):
            e = Env(self._client, self._s.task, backend=self._s.backend, seed=self._s.seed)
            e._s = self._s.forked(eid)
            out.append(e)
        return out

    def trajectory(self) -> dict[str, Any]:
        """The episode's trajectory so far (or its final record)."""
        if self._s.id is None:
            raise RuntimeError("no episode yet: call reset()")
        return self._client._t.json("GET", f"/v1/episodes/{self._s.id}")

    def close(self) -> None:
        """Closes the open episode (it ends ``cancelled``) unless it finished."""
        if self._s.id is not None and not self._s.finished:
            from .errors import NotFound
            try:
                self._client._t.json("DELETE", f"/v1/episodes/{self._s.id}")
            except NotFound:
                pass  # closed already (idle timeout, or the service restarted)
            self._s.finished = self._s.done = True


class AsyncEnv:
    """The asyncio version of :class:`Env` (``await env.reset()``, ``await env.step(...)``, ``await env.close()``).

    Requests run in the client's thread pool, so many environments step at once.
    """

    def __init__(self, client: "AsyncClient", task: Mapping[str, Any] | str, *, backend: str | None = None, seed: int | None = None) -> None:
        self._client = client
        self._s = _EnvState(task, backend, seed)

    async def __aenter__(self) -> "AsyncEnv":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncEnv(task={self._s.task.get('id')!r}, episode={self._s.id!r}, done={self._s.done})"

    id = property(lambda self: self._s.id)
    messages = property(lambda self: self._s.messages)
    tools = property(lambda self: self._s.tools)
    limits = property(lambda self: self._s.limits)
    done = property(lambda self: self._s.done)
    reward = property(lambda self: self._s.reward)

    async def reset(self, *, train_step: int | None = None) -> dict[str, Any]:
        body = self._s.open_body(train_step)
        await self.close()
        ans = await self._client._call(self._client._t.json, "POST", "/v1/episodes", json_body=body)
        return self._s.opened(ans)

    async def step(self, tool_calls: Iterable[Any] | None, content: str | None = None, **turn: Any
                   ) -> tuple[list[dict[str, Any]], float | None, bool, dict[str, Any]]:
        body = self._s.step_body(tool_calls, content, turn)
        ans = await self._client._call(self._client._t.json, "POST", f"/v1/episodes/{self._s.id}/step", json_body=body, retry=False)
        obs, done = self._s.stepped(ans)
        reward: float | None = 0.0
        if done:
            reward = await self._finish({})
        return obs, reward, done, self._s.info(ans)

    async def finish(self, answer: str | None = None, ids: list[str] | None = None) -> float | None:
        if self._s.id is None:
            raise RuntimeError("call reset() before finish()")
        if self._s.finished:
            return _reward_total(self._s.reward)
        body: dict[str, Any] = {}
        if answer is not None:
            body["answer"] = answer
        if ids is not None:
            body["ids"] = ids
        return await self._finish(body)

    async def _finish(self, body: dict[str, Any]) -> float | None:
        ans = await self._client._call(self._client._t.json, "POST", f"/v1/episodes/{self._s.id}/finish", json_body=body, retry=False)
        return self._s.finished_with(ans)

    async def fork(self, n: int) -> list["AsyncEnv"]:
        """See :meth:`Env.fork`."""
        if self._s.id is None or self._s.done:
            raise RuntimeError("fork needs an open episode: call reset(), and fork before the end")
        out = []
        for eid in await self._client.fork(self._s.id, n):
            e = AsyncEnv(self._client, self._s.task, backend=self._s.backend, seed=self._s.seed)
            e._s = self._s.forked(eid)
            out.append(e)
        return out

    async def trajectory(self) -> dict[str, Any]:
        if self._s.id is None:
            raise RuntimeError("no episode yet: call reset()")
        return await self._client._call(self._client._t.json, "GET", f"/v1/episodes/{self._s.id}")

    async def close(self) -> None:
        if self._s.id is not None and not self._s.finished:
            from .errors import NotFound
            try:
                await self._client._call(self._client._t.json, "DELETE", f"/v1/episodes/{self._s.id}")
            except NotFound:
                pass
            self._s.finished = self._s.done = True
