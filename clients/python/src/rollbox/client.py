"""The client of the rollout service (``rollbox serve``), following ``runtime/openapi.json``."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Mapping, TypeVar

from ._http import Retry, RetryPolicy, Transport
from .env import AsyncEnv, Env
from .errors import ProtocolError, TokenDataUnavailable, TransportError
from .tokens import Segment, segment_from_row
from .types import Episode, Group, Policy

__all__ = ["Client", "AsyncClient", "Rollout", "EpisodeStream", "ROUTES", "__version__"]

__version__ = "0.1.0"

T = TypeVar("T")

#: Rollout states after which nothing changes.
ENDED_STATES = frozenset({"done", "cancelled"})


#: Every route of the service's OpenAPI document (runtime/openapi.json) and
#: the Client method that calls it; a test holds it equal to the document.
ROUTES: dict[tuple[str, str], str] = {
    ("POST", "/v1/rollouts"): "submit",
    ("GET", "/v1/rollouts"): "rollouts",
    ("GET", "/v1/rollouts/{id}"): "status",
    ("DELETE", "/v1/rollouts/{id}"): "cancel",
    ("GET", "/v1/rollouts/{id}/episodes"): "episodes",
    ("GET", "/v1/rollouts/{id}/export"): "export",
    ("GET", "/v1/rollouts/{id}/summary"): "summary",
    ("POST", "/v1/rollouts/{id}/policy-version"): "announce_policy_version",
    ("POST", "/v1/policy-version"): "announce_policy_version",
    ("POST", "/v1/episodes"): "env",
    ("GET", "/v1/episodes/{id}"): "episode",
    ("DELETE", "/v1/episodes/{id}"): "env",
    ("POST", "/v1/episodes/{id}/step"): "env",
    ("POST", "/v1/episodes/{id}/finish"): "env",
    ("POST", "/v1/episodes/{id}/fork"): "fork",
    ("POST", "/v1/episodes/{id}/outcomes"): "add_outcomes",
    ("POST", "/v1/imports"): "import_episodes",
    ("GET", "/v1/export"): "export_episodes",
    ("GET", "/metrics"): "metrics",
    ("GET", "/v1/workers"): "workers",
    ("GET", "/healthz"): "health",
    ("GET", "/openapi.json"): "openapi",
}


def _task_json(t: Mapping[str, Any] | str) -> dict[str, Any]:
    return {"id": t} if isinstance(t, str) else dict(t)


class EpisodeStream(Iterator[Episode]):
    """The finished episodes of a rollout, read from its NDJSON stream.

    :attr:`offset` counts the episodes read so far: pass it as ``from_`` to
    :meth:`Client.episodes` to go on where a previous reader stopped (reading
    consumes nothing on the service). A connection that breaks is reopened at
    the offset, up to the client's ``max_retries`` times in a row, so no
    episode is skipped or repeated.
    """

    def __init__(self, client: "Client", rollout_id: str, *, from_: int = 0, follow: bool = True) -> None:
        self._client = client
        self.rollout_id = rollout_id
        self.offset = from_
        self.follow = follow
        self._lines: Iterator[bytes] | None = None
        self._broken = 0
        self._closed = False

    def __iter__(self) -> "EpisodeStream":
        return self

    def _open(self) -> Iterator[bytes]:
        q: dict[str, Any] = {"from": self.offset}
        if self.follow:
            q["stream"] = 1
        return self._client._t.lines(f"/v1/rollouts/{self.rollout_id}/episodes", q, self._client.stream_timeout)

    def __next__(self) -> Episode:
        while True:
            if self._closed:
                raise StopIteration
            if self._lines is None:
                self._lines = self._open()
            try:
                line = next(self._lines)
            except StopIteration:
                self._lines = None
                self._closed = True
                raise
            except TransportError:
                self._lines = None
                self._broken += 1
                if self._broken > self._client.retry.max_retries:
                    raise
                time.sleep(min(self._client.retry.max_backoff, self._client.retry.backoff * (2 ** (self._broken - 1))))
                continue
            self._broken = 0
            try:
                t = json.loads(line)
            except ValueError as e:
                raise ProtocolError(f"line {self.offset + 1} of the stream of rollout {self.rollout_id} is not JSON: {line[:200]!r}") from e
            self.offset += 1
            return Episode(t)

    def close(self) -> None:
        """Stops reading (closes the connection)."""
        if self._lines is not None:
            close = getattr(self._lines, "close", None)
            if close is not None:
                close()
        self._lines = None
        self._closed = True


def _groups(episodes: Iterable[Episode]) -> Iterator[Group]:
    """Assembles complete GRPO groups from a stream of episodes."""
    pending: dict[str, list[Episode]] = collections.OrderedDict()
    for ep in episodes:
        g = ep.group
        size = int(g.get("size") or 0) if g else 0
        members = pending.setdefault(ep.group_id, [])
        members.append(ep)
        if size and len(members) >= size:
            del pending[ep.group_id]
            yield Group(ep.group_id, members)
    for gid, members in pending.items():
        yield Group(gid, members, complete=False)


class Rollout:
    """A handle on one rollout (what :meth:`Client.submit` returns)."""

    def __init__(self, client: "Client", rollout_id: str, created: Mapping[str, Any] | None = None) -> None:
        self.client = client
        self.id = rollout_id
        self.created = dict(created or {})

    def __repr__(self) -> str:
        return f"Rollout({self.id!r})"

    def status(self) -> dict[str, Any]:
        """Progress: ``state`` (queued, running, done, cancelled), ``episodes_total``, ``episodes_done``, ..."""
        return self.client.status(self.id)

    def wait(self, *, poll: float = 1.0, timeout: float | None = None) -> dict[str, Any]:
        """Polls the status until the rollout has ended; returns the last status.

        Raises:
            TimeoutError: it had not ended after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status()
            if st.get("state") in ENDED_STATES:
                return st
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"rollout {self.id} is still {st.get('state')} after {timeout} s "
                                   f"({st.get('episodes_done')}/{st.get('episodes_total')} episodes done)")
            time.sleep(poll)

    def episodes(self, *, from_: int = 0, follow: bool = True) -> EpisodeStream:
        """See :meth:`Client.episodes`."""
        return self.client.episodes(self.id, from_=from_, follow=follow)

    def groups(self, *, from_: int = 0) -> Iterator[Group]:
        """See :meth:`Client.groups`."""
        return self.client.groups(self.id, from_=from_)

    def cancel(self) -> dict[str, Any]:
        return self.client.cancel(self.id)

    def summary(self) -> dict[str, Any]:
        return self.client.summary(self.id)

    def export(self, path: str | os.PathLike[str], *, format: str = "jsonl", layout: str = "episodes") -> Path:
        return self.client.export(self.id, path, format=format, layout=layout)

    def segments(self) -> Iterator[Segment]:
        return self.client.segments(self.id)

    def announce_policy_version(self, version: str) -> dict[str, Any]:
        return self.client.announce_policy_version(version, rollout_id=self.id)


class Client:
    """A client of one Rollbox rollout service.

    Args:
        base_url: the service, e.g. ``http://127.0.0.1:7070``.
        token: a bearer token for a service started with ``--auth-tokens``
            (sent as ``Authorization: Bearer TOKEN``); default
            ``$ROLLBOX_TOKEN``.
        timeout: seconds a request (not a stream) may take.
        stream_timeout: seconds a stream may stay silent (``None``: forever; a
            group can take long to complete).
        max_retries, max_retry_wait, backoff: see :class:`RetryPolicy` (429 and
            503 are retried honouring ``Retry-After``; ``max_retries=0`` turns
            retries off).
        on_retry: called with a :class:`Retry` before each wait.

    Errors are raised as the subclasses of :class:`rollbox.RollboxError`
    (``BadRequest``, ``NotFound``, ``RateLimited``, ...), carrying the API's
    ``code``, ``message`` and ``field``.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float | None = 120.0,
        stream_timeout: float | None = None,
        max_retries: int = 8,
        max_retry_wait: float = 600.0,
        backoff: float = 0.5,
        on_retry: Callable[[Retry], None] | None = None,
    ) -> None:
        if token is None:
            token = os.environ.get("ROLLBOX_TOKEN") or None
        self.retry = RetryPolicy(max_retries=max_retries, max_wait=max_retry_wait, backoff=backoff)
        self.retries: collections.deque[Retry] = collections.deque(maxlen=1000)

        def record(r: Retry) -> None:
            self.retries.append(r)
            if on_retry is not None:
                on_retry(r)

        self._t = Transport(base_url, token, timeout, self.retry, f"rollbox-python/{__version__}", record)
        self.base_url = self._t.base_url
        self.stream_timeout = stream_timeout

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def close(self) -> None:
        """Closes the kept-alive connections."""
        self._t.close()

    # service

    def health(self) -> dict[str, Any]:
        """``GET /healthz`` (a 503 while the service shuts down or cannot run anything is raised)."""
        return self._t.json("GET", "/healthz", retry=False)

    def openapi(self) -> dict[str, Any]:
        """The service's OpenAPI document."""
        return self._t.json("GET", "/openapi.json")

    def workers(self) -> Any:
        """``GET /v1/workers``: a cluster coordinator's rollout workers (docs/scale-out.md)."""
        return self._t.json("GET", "/v1/workers")

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        return self._t.request("GET", "/metrics").body.decode("utf-8", "replace")

    # rollout mode

    def submit(
        self,
        tasks: Iterable[Mapping[str, Any] | str],
        group_size: int = 1,
        policy: Policy | Mapping[str, Any] | None = None,
        *,
        backend: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        policy_version: str | None = None,
        max_staleness: int | None = None,
        **extra: Any,
    ) -> Rollout:
        """Submits tasks × group_size episodes against the trainer's policy server.

        Args:
            tasks: task objects (as a task file's lines) or ids (strings, or
                ``{"id": ...}``) of tasks the service was started with.
            group_size: episodes per task (the GRPO group).
            policy: a :class:`Policy` or the API's policy object
                (``base_url``, ``model``, ``sampling``, ``mode``, ...).
            backend: ``wasm`` or ``docker`` for tasks that name none.
            overrides: ``{"limits": {...}}`` replacing each task's limits.
            policy_version, max_staleness: see the API (token-mode trainers).
            **extra: other fields of the request, sent as given.

        Admission is all or nothing: a full service answers 429 and nothing is
        queued, so the submission is retried (honouring ``Retry-After``) within
        the retry policy before :class:`RateLimited` is raised.
        """
        if policy is None:
            raise ValueError("policy is required: Policy(base_url=..., model=...) or {'base_url': ..., 'model': ...}")
        body: dict[str, Any] = {
            "tasks": [_task_json(t) for t in tasks],
            "group_size": group_size,
            "policy": policy.to_json() if isinstance(policy, Policy) else dict(policy),
        }
        if backend is not None:
            body["backend"] = backend
        if overrides is not None:
            body["overrides"] = dict(overrides)
        if policy_version is not None:
            body["policy_version"] = policy_version
        if max_staleness is not None:
            body["max_staleness"] = max_staleness
        body.update(extra)
        ans = self._t.json("POST", "/v1/rollouts", json_body=body)
        return Rollout(self, ans["id"], ans)

    def rollout(self, rollout_id: str) -> Rollout:
        """A handle on an existing rollout (nothing is asked of the service)."""
        return Rollout(self, rollout_id)

    def rollouts(self) -> list[dict[str, Any]]:
        """Every rollout the service holds, oldest first, with its progress."""
        return list(self._t.json("GET", "/v1/rollouts").get("rollouts") or [])

    def status(self, rollout_id: str) -> dict[str, Any]:
        return self._t.json("GET", f"/v1/rollouts/{rollout_id}")

    def episodes(self, rollout_id: str, *, from_: int = 0, follow: bool = True) -> EpisodeStream:
        """The rollout's finished episodes.

        Args:
            from_: skip this many (resume: pass a previous stream's ``offset``).
            follow: True (default) streams until the rollout has ended and
                every episode was sent; an episode comes once its GRPO group is
                complete, with ``group`` statistics and its advantage. False
                returns the episodes finished so far and stops.
        """
        return EpisodeStream(self, rollout_id, from_=from_, follow=follow)

    def groups(self, rollout_id: str, *, from_: int = 0) -> Iterator[Group]:
        """The rollout's GRPO groups as they complete (each with its episodes' advantages).

        Groups left incomplete when the stream ends (never, unless the service
        lost episodes) are yielded last with ``complete=False``.
        """
        return _groups(self.episodes(rollout_id, from_=from_, follow=True))

    def cancel(self, rollout_id: str) -> dict[str, Any]:
        """Cancels the rollout: queued episodes end without starting, running ones at once."""
        return self._t.json("DELETE", f"/v1/rollouts/{rollout_id}")

    def summary(self, rollout_id: str) -> dict[str, Any]:
        """summary.json over the episodes finished so far (``reward_mean``, ``ends``, ``groups``, ...)."""
        return self._t.json("GET", f"/v1/rollouts/{rollout_id}/summary")

    def episode(self, episode_id: str) -> dict[str, Any]:
        """One episode's trajectory (live for an open environment episode)."""
        return self._t.json("GET", f"/v1/episodes/{episode_id}")

    def export(self, rollout_id: str, path: str | os.PathLike[str], *, format: str = "jsonl", layout: str = "episodes") -> Path:
        """Writes the rollout's finished episodes to a file (``jsonl`` or ``parquet``;
        layout ``episodes`` or ``segments``).

        The file is written under a temporary name and renamed when complete,
        so a broken download never leaves a truncated file at ``path``.
        """
        if format not in ("jsonl", "parquet"):
            raise ValueError(f"format {format!r} is not one of jsonl, parquet")
        if layout not in ("episodes", "segments"):
            raise ValueError(f"layout {layout!r} is not one of episodes, segments")
        dest = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".partial", dir=dest.parent or Path("."))
        try:
            with os.fdopen(fd, "wb") as f:
                self._t.download(f"/v1/rollouts/{rollout_id}/export", {"format": format, "layout": layout}, f, self.stream_timeout)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return dest

    def segments(self, rollout_id: str) -> Iterator[Segment]:
        """The rollout's token segments (``export?layout=segments``): per
        segment ``input_ids``, ``loss_mask``, ``logprobs``, ``reward`` and
        ``advantage``.

        Raises:
            TokenDataUnavailable: the rollout ran in chat mode (its episodes
                have no token ids).
        """
        st = self.status(rollout_id)
        mode = (st.get("policy") or {}).get("mode") or "chat"
        if mode != "tokens":
            raise TokenDataUnavailable(
                f"rollout {rollout_id} ran in {mode} mode: its episodes have no token ids. Submit it with "
                f"policy={{'mode': 'tokens', ...}} against a server with a tokenizer (vLLM, SGLang) for "
                f"input_ids, loss_mask and logprobs")
        return self._segment_rows(rollout_id)

    def _segment_rows(self, rollout_id: str) -> Iterator[Segment]:
        for line in self._t.lines(f"/v1/rollouts/{rollout_id}/export", {"format": "jsonl", "layout": "segments"}, self.stream_timeout):
            yield segment_from_row(json.loads(line))

    def announce_policy_version(self, version: str, *, rollout_id: str | None = None) -> dict[str, Any]:
        """Announces the policy version the inference server now runs (to every
        live rollout, or to one); episodes staler than their rollout's
        ``max_staleness`` end cancelled."""
        path = "/v1/policy-version" if rollout_id is None else f"/v1/rollouts/{rollout_id}/policy-version"
        return self._t.json("POST", path, json_body={"version": version})

    # environment mode

    def fork(self, episode_id: str, n: int) -> list[str]:
        """Branches an open environment episode into ``n`` new open episodes
        that share its steps so far (each with a fork of its sandbox's files);
        returns their ids. All or nothing. :meth:`Env.fork` gives them as
        environments."""
        return [str(i) for i in self._t.json("POST", f"/v1/episodes/{episode_id}/fork", json_body={"n": n}).get("ids") or []]

    def import_episodes(self, episodes: Iterable[Mapping[str, Any]] | bytes, *, source: str | None = None,
                        policy_version: str | None = None, group_by: str | None = None) -> dict[str, Any]:
        """Imports production episodes (OpenAI chat-completions episodes or
        Rollbox trajectories; objects, or NDJSON bytes) and returns the answer:
        ``accepted``, ``duplicates``, ``rejected`` (line, field, message) and
        the ``episodes`` ids. Resending is safe: ids already imported are
        duplicates, so 429 and 503 are retried."""
        body = episodes if isinstance(episodes, bytes) else b"".join(
            json.dumps(e, ensure_ascii=False).encode("utf-8") + b"\n" for e in episodes)
        query = {"source": source, "policy_version": policy_version, "group_by": group_by}
        target = self._t.url("/v1/imports", query)
        resp = self._t._with_retries("POST", "/v1/imports", target, True, lambda: self._t._once("POST", target, body))
        v = resp.json()
        if not isinstance(v, dict):
            raise ProtocolError(f"POST /v1/imports: the answer is not a JSON object: {resp.body[:200]!r}", status=resp.status)
        return v

    def add_outcomes(self, episode_id: str, signals: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Adds late outcome signals (``{"name", "value", "at"?, "source"?}``) to
        an imported episode; a signal already received is a duplicate, so a
        resend is safe. Returns ``status`` (pending or scored) and ``reward``."""
        return self._t.json("POST", f"/v1/episodes/{episode_id}/outcomes", json_body={"signals": list(signals)})

    def export_episodes(self, path: str | os.PathLike[str], *, format: str = "jsonl", layout: str = "episodes",
                        source: str | None = None, since: str | None = None, until: str | None = None,
                        policy_version: str | None = None, outcome: str | None = None) -> Path:
        """Writes every ended episode (rollouts and imports) the filters select
        to a file, in the columns of :meth:`export`, with group statistics over
        the episodes exported."""
        dest = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".partial", dir=dest.parent or Path("."))
        query = {"format": format, "layout": layout, "source": source, "since": since, "until": until,
                 "policy_version": policy_version, "outcome": outcome}
        try:
            with os.fdopen(fd, "wb") as f:
                self._t.download("/v1/export", query, f, self.stream_timeout)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return dest

    def env(self, task: Mapping[str, Any] | str, *, backend: str | None = None, seed: int | None = None) -> Env:
        """A Gymnasium-style environment for a task (an object, or the id of one the service knows).

        Nothing is opened until :meth:`Env.reset`.
        """
        return Env(self, task, backend=backend, seed=seed)


class AsyncClient:
    """The asyncio client: the same API as :class:`Client`, awaited.

    Requests run in a thread pool of ``max_workers`` threads (the standard
    library has no asynchronous HTTP client), each with its own kept-alive
    connection, so up to ``max_workers`` requests are in flight at once.
    """

    def __init__(self, base_url: str, token: str | None = None, *, max_workers: int = 64, **kw: Any) -> None:
        self.sync = Client(base_url, token, **kw)
        self._t = self.sync._t
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rollbox")

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.sync.close()

    async def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kw))

    def env(self, task: Mapping[str, Any] | str, *, backend: str | None = None, seed: int | None = None) -> AsyncEnv:
        """An asyncio Gymnasium-style environment (``await env.reset()``, ``await env.step(...)``)."""
        return AsyncEnv(self, task, backend=backend, seed=seed)

    async def fork(self, episode_id: str, n: int) -> list[str]:
        return await self._call(self.sync.fork, episode_id, n)

    async def openapi(self) -> dict[str, Any]:
        return await self._call(self.sync.openapi)

    async def metrics(self) -> str:
        return await self._call(self.sync.metrics)

    async def workers(self) -> Any:
        return await self._call(self.sync.workers)

    def rollout(self, rollout_id: str) -> Rollout:
        """A handle on an existing rollout (nothing is asked of the service; its methods block, as :meth:`submit`'s do)."""
        return self.sync.rollout(rollout_id)

    async def rollouts(self) -> list[dict[str, Any]]:
        return await self._call(self.sync.rollouts)

    async def episode(self, episode_id: str) -> dict[str, Any]:
        return await self._call(self.sync.episode, episode_id)

    async def import_episodes(self, episodes: Iterable[Mapping[str, Any]] | bytes, *, source: str | None = None,
                              policy_version: str | None = None, group_by: str | None = None) -> dict[str, Any]:
        """See :meth:`Client.import_episodes`."""
        if not isinstance(episodes, bytes):
            episodes = list(episodes)
        return await self._call(self.sync.import_episodes, episodes, source=source,
                                policy_version=policy_version, group_by=group_by)

    async def add_outcomes(self, episode_id: str, signals: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """See :meth:`Client.add_outcomes`."""
        return await self._call(self.sync.add_outcomes, episode_id, list(signals))

    async def export_episodes(self, path: str | os.PathLike[str], **kw: Any) -> Path:
        """See :meth:`Client.export_episodes`."""
        return await self._call(self.sync.export_episodes, path, **kw)

    async def health(self) -> dict[str, Any]:
        return await self._call(self.sync.health)

    async def submit(self, tasks: Iterable[Mapping[str, Any] | str], group_size: int = 1,
                     policy: Policy | Mapping[str, Any] | None = None, **kw: Any) -> Rollout:
        tasks = list(tasks)
        return await self._call(self.sync.submit, tasks, group_size, policy, **kw)

    async def status(self, rollout_id: str) -> dict[str, Any]:
        return await self._call(self.sync.status, rollout_id)

    async def cancel(self, rollout_id: str) -> dict[str, Any]:
        return await self._call(self.sync.cancel, rollout_id)

    async def summary(self, rollout_id: str) -> dict[str, Any]:
        return await self._call(self.sync.summary, rollout_id)

    async def export(self, rollout_id: str, path: str | os.PathLike[str], **kw: Any) -> Path:
        return await self._call(self.sync.export, rollout_id, path, **kw)

    async def announce_policy_version(self, version: str, *, rollout_id: str | None = None) -> dict[str, Any]:
        return await self._call(self.sync.announce_policy_version, version, rollout_id=rollout_id)

    async def episodes(self, rollout_id: str, *, from_: int = 0, follow: bool = True) -> AsyncIterator[Episode]:
        """The rollout's finished episodes, as an async iterator (see :meth:`Client.episodes`)."""
        stream = self.sync.episodes(rollout_id, from_=from_, follow=follow)
        sentinel = object()
        try:
            while True:
                ep = await self._call(next, stream, sentinel)
                if ep is sentinel:
                    return
                yield ep  # type: ignore[misc]
        finally:
            stream.close()

    async def groups(self, rollout_id: str, *, from_: int = 0) -> AsyncIterator[Group]:
        """The rollout's GRPO groups as they complete, as an async iterator."""
        it = self.sync.groups(rollout_id, from_=from_)
        sentinel = object()
        while True:
            g = await self._call(next, it, sentinel)
            if g is sentinel:
                return
            yield g  # type: ignore[misc]

    async def segments(self, rollout_id: str) -> AsyncIterator[Segment]:
        """The rollout's token segments, as an async iterator (see :meth:`Client.segments`;
        :class:`TokenDataUnavailable` is raised before the first segment)."""
        it = await self._call(self.sync.segments, rollout_id)
        sentinel = object()
        while True:
            seg = await self._call(next, it, sentinel)
            if seg is sentinel:
                return
            yield seg  # type: ignore[misc]
