"""What the client hands back: episodes (trajectories) and GRPO groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence, overload

from .tokens import Segment, segments_of

__all__ = ["Episode", "Group", "Policy"]


@dataclass(frozen=True)
class Policy:
    """The trainer's OpenAI-compatible inference server, for rollout mode.

    Attributes:
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the server serves.
        sampling: ``temperature``, ``top_p``, ``max_tokens``, ``seed``, ``stop``,
            ``logprobs``, ``extra`` (merged into the request as is).
        mode: ``"chat"`` (chat completions) or ``"tokens"`` (token in, token
            out: exact ids, loss masks and logprobs; vLLM or SGLang).
        max_concurrency: this rollout's calls in flight (0: the service's cap).
        extra: other fields of the API's policy object (``max_retries``,
            ``timeout_s``, ``tokenize_url``).
    """

    base_url: str
    model: str
    sampling: Mapping[str, Any] | None = None
    mode: str = "chat"
    max_concurrency: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"base_url": self.base_url, "model": self.model}
        if self.sampling:
            out["sampling"] = dict(self.sampling)
        if self.mode != "chat":
            out["mode"] = self.mode
        if self.max_concurrency:
            out["max_concurrency"] = self.max_concurrency
        out.update(self.extra)
        return out


class Episode:
    """One finished episode: its trajectory (``rollbox.trajectory/v1``) as the service recorded it.

    The whole record is :attr:`trajectory` (a dict); the properties read the
    fields a trainer needs.
    """

    __slots__ = ("trajectory",)

    def __init__(self, trajectory: Mapping[str, Any]) -> None:
        self.trajectory: dict[str, Any] = dict(trajectory)

    def __repr__(self) -> str:
        return f"Episode({self.episode_id!r}, end={self.end!r}, reward={self.reward!r}, advantage={self.advantage!r})"

    @property
    def episode_id(self) -> str:
        return str(self.trajectory.get("episode_id", ""))

    @property
    def rollout_id(self) -> str:
        return str(self.trajectory.get("rollout_id", ""))

    @property
    def group_id(self) -> str:
        return str(self.trajectory.get("group_id", ""))

    @property
    def group_index(self) -> int:
        return int(self.trajectory.get("group_index", 0))

    @property
    def task_id(self) -> str:
        return str(self.trajectory.get("task_id", ""))

    @property
    def end(self) -> str:
        """How the episode ended: ``finished``, ``max_turns``, ``sandbox_error``, ..."""
        return str((self.trajectory.get("termination") or {}).get("reason", ""))

    @property
    def reward(self) -> float | None:
        """The reward's total; ``None`` when unscored (an infrastructure end): never a 0."""
        r = self.trajectory.get("reward")
        if not isinstance(r, dict):
            return None
        v = r.get("total")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return float(v)

    @property
    def scored(self) -> bool:
        return self.reward is not None

    @property
    def components(self) -> dict[str, float]:
        r = self.trajectory.get("reward")
        return dict(r.get("components") or {}) if isinstance(r, dict) else {}

    @property
    def group(self) -> dict[str, Any] | None:
        """The GRPO group's statistics (``size``, ``reward_mean``, ``reward_std``,
        ``advantage``, ``zero_variance``) once the group is complete."""
        g = self.trajectory.get("group")
        return dict(g) if isinstance(g, dict) else None

    @property
    def advantage(self) -> float | None:
        """reward − the group's mean over its scored episodes (no std division);
        ``None`` while the group is incomplete or when the episode is unscored."""
        g = self.group
        if g is None or not self.scored or "advantage" not in g:
            return None
        return float(g["advantage"])

    def segments(self) -> list[Segment]:
        """The episode's token segments (token mode only).

        Raises:
            TokenDataUnavailable: the episode ran in chat mode.
        """
        return segments_of(self.trajectory)


class Group(Sequence[Episode]):
    """The episodes of one task's GRPO group, complete, with their advantages."""

    def __init__(self, group_id: str, episodes: list[Episode], complete: bool = True) -> None:
        self.group_id = group_id
        self.episodes = sorted(episodes, key=lambda e: e.group_index)
        self.complete = complete

    def __repr__(self) -> str:
        return f"Group({self.group_id!r}, {len(self)} episodes, reward_mean={self.reward_mean!r}, complete={self.complete})"

    def __len__(self) -> int:
        return len(self.episodes)

    @overload
    def __getitem__(self, i: int) -> Episode: ...

    @overload
    def __getitem__(self, i: slice) -> list[Episode]: ...

    def __getitem__(self, i: int | slice) -> Episode | list[Episode]:
        return self.episodes[i]

    def __iter__(self) -> Iterator[Episode]:
        return iter(self.episodes)

    @property
    def task_id(self) -> str:
        return self.episodes[0].task_id if self.episodes else ""

    @property
    def stats(self) -> dict[str, Any]:
        for e in self.episodes:
            if e.group is not None:
                return e.group
        return {}

    @property
    def reward_mean(self) -> float | None:
        v = self.stats.get("reward_mean")
        return float(v) if v is not None and any(e.scored for e in self.episodes) else None

    @property
    def zero_variance(self) -> bool:
        """Every scored reward is equal: no learning signal."""
        return bool(self.stats.get("zero_variance", False))

    @property
    def rewards(self) -> list[float | None]:
        return [e.reward for e in self.episodes]

    @property
    def advantages(self) -> list[float | None]:
        return [e.advantage for e in self.episodes]
