"""Token-exact training data: one :class:`Segment` per prefix-consistent token sequence.

A rollout run in token mode (``policy={"mode": "tokens", ...}`` against vLLM or
SGLang) records exactly the ids the model saw and sampled. An episode is one
or more *segments* (a new one starts where pruning or context truncation
rewrote the history); each is one sequence for the trainer: ``input_ids``,
a ``loss_mask`` that is 1 exactly on sampled ids, the sampled ids'
``logprobs`` aligned with ``input_ids`` (0 where the mask is 0), and the
episode's ``reward`` and GRPO ``advantage``.

:func:`segments_of` derives them from a trajectory exactly as the service's
``export?layout=segments`` does; :meth:`rollbox.Client.segments` reads that
export. Both raise :class:`~rollbox.errors.TokenDataUnavailable` for an
episode run in chat mode, which has no ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import TokenDataUnavailable

__all__ = ["Segment", "segments_of", "segment_from_row"]


@dataclass
class Segment:
    """One token sequence of an episode.

    Attributes:
        episode_id, rollout_id, group_id, task_id: whose segment it is.
        index: the segment's index in its episode; ``count`` how many it has.
        input_ids: the segment's last prompt followed by its last completion
            (every earlier turn's prompt and completion is a prefix of it).
        loss_mask: 1 on ids the model sampled, 0 on prompt, tool output and
            template ids; as long as ``input_ids``.
        logprobs: the sampled ids' log probabilities at their positions, 0
            elsewhere; as long as ``input_ids``. ``logprobs_complete`` is False
            when the server sent none for some turn (those entries are 0).
        prompt_length: ``input_ids[:prompt_length]`` holds no sampled id
            (verl's prompt / response split).
        reward: the episode's reward, ``None`` when unscored (never train on it).
        advantage: the episode's GRPO advantage (reward − group mean), ``None``
            while its group is incomplete or when unscored.
        start_turn, end_turn: the model turns the segment spans; ``reason``
            why it starts (``start``, ``pruned``, ``context_truncated``,
            ``template``).
        policy_version: the version of the policy that produced its first turn;
            ``policy_versions`` one per turn.
    """

    episode_id: str
    rollout_id: str
    group_id: str
    task_id: str
    index: int
    count: int
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    logprobs_complete: bool
    prompt_length: int
    reward: float | None
    advantage: float | None
    start_turn: int = 0
    end_turn: int = 0
    reason: str = "start"
    termination: str = ""
    policy_version: str = ""
    policy_versions: list[str] = field(default_factory=list)
    tokenizer: dict[str, str] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        """Whether the episode has a reward to train on."""
        return self.reward is not None

    def response_ids(self) -> list[int]:
        """``input_ids[prompt_length:]``: the part from the first sampled id on."""
        return self.input_ids[self.prompt_length:]


def _reward_total(t: Mapping[str, Any]) -> float | None:
    r = t.get("reward")
    if not isinstance(r, dict):
        return None
    v = r.get("total")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def segments_of(trajectory: Mapping[str, Any]) -> list[Segment]:
    """The token segments of one trajectory (``rollbox.trajectory/v1``).

    Raises:
        TokenDataUnavailable: the episode ran in chat mode (no token ids), naming
            the episode and how its tokens were counted.
    """
    eid = str(trajectory.get("episode_id", ""))
    segs = trajectory.get("segments")
    if not segs:
        mode = (trajectory.get("policy") or {}).get("mode") or "chat"
        kinds = sorted({str(s.get("tokens")) for s in trajectory.get("steps", []) if s.get("type") == "model" and s.get("tokens")})
        how = f" (its turns' tokens are {', '.join(kinds)}, not exact)" if kinds else ""
        if mode == "tokens":
            raise TokenDataUnavailable(
                f"episode {eid} ran in token mode but has no segments: it ended before its first model turn "
                f"({(trajectory.get('termination') or {}).get('reason', 'unknown end')})")
        raise TokenDataUnavailable(
            f"episode {eid} ran in {mode} mode{how}: it has no token ids. Submit the rollout with "
            f"policy={{'mode': 'tokens', ...}} against a server with a tokenizer (vLLM, SGLang) for "
            f"input_ids, loss_mask and logprobs")
    reward = _reward_total(trajectory)
    group = trajectory.get("group") or None
    advantage = float(group["advantage"]) if reward is not None and group and "advantage" in group else None
    term = (trajectory.get("termination") or {}).get("reason", "")
    tok = (trajectory.get("policy") or {}).get("tokenizer") or {}
    out: list[Segment] = []
    steps = trajectory.get("steps", [])
    for k, seg in enumerate(segs):
        ids = [int(i) for i in seg.get("ids", [])]
        mask = [int(m) for m in seg.get("loss_mask", [])]
        logprobs = [0.0] * len(ids)
        complete = True
        prompt_length = len(ids)
        for i, m in enumerate(mask):
            if m == 1:
                prompt_length = i
                break
        versions: list[str] = []
        pos = 0
        for s in steps:
            if s.get("type") != "model" or s.get("segment") != k:
                continue
            versions.append(s.get("policy_version", ""))
            pos += len(s.get("prompt_ids") or []) + len(s.get("prompt_delta_ids") or [])
            completion = s.get("completion_ids") or []
            lps = s.get("logprobs")
            if s.get("logprobs_absent") or not isinstance(lps, list) or len(lps) != len(completion) or \
                    not all(isinstance(x, (int, float)) for x in lps):
                complete = False
                lps = None
            if lps is not None:
                for j in range(len(completion)):
                    if pos + j < len(logprobs):
                        logprobs[pos + j] = float(lps[j])
            pos += len(completion)
        out.append(Segment(
            episode_id=eid, rollout_id=str(trajectory.get("rollout_id", "")), group_id=str(trajectory.get("group_id", "")),
            task_id=str(trajectory.get("task_id", "")), index=k, count=len(segs), input_ids=ids, loss_mask=mask,
            logprobs=logprobs, logprobs_complete=complete, prompt_length=prompt_length, reward=reward, advantage=advantage,
            start_turn=int(seg.get("start_turn", 0)), end_turn=int(seg.get("end_turn", 0)), reason=str(seg.get("reason", "")),
            termination=term, policy_version=versions[0] if versions else "", policy_versions=versions,
            tokenizer={k2: str(tok.get(k2) or "") for k2 in ("model", "revision", "fingerprint")}))
    return out


def segment_from_row(row: Mapping[str, Any]) -> Segment:
    """A :class:`Segment` from one row of ``export?layout=segments``."""
    reward = row.get("reward")
    adv = row.get("advantage")
    return Segment(
        episode_id=row["episode_id"], rollout_id=row.get("rollout_id", ""), group_id=row.get("group_id", ""),
        task_id=row.get("task_id", ""), index=int(row.get("segment", 0)), count=int(row.get("segments", 1)),
        input_ids=list(row.get("input_ids") or []), loss_mask=list(row.get("loss_mask") or []),
        logprobs=[float(x) for x in row.get("logprobs") or []], logprobs_complete=bool(row.get("logprobs_complete")),
        prompt_length=int(row.get("prompt_length", 0)),
        reward=None if reward is None or not row.get("scored", True) else float(reward),
        advantage=None if adv is None or reward is None else float(adv),
        start_turn=int(row.get("start_turn", 0)), end_turn=int(row.get("end_turn", 0)), reason=row.get("reason", ""),
        termination=row.get("termination", ""), policy_version=row.get("policy_version", ""),
        policy_versions=list(row.get("policy_versions") or []),
        tokenizer={"model": row.get("tokenizer_model", ""), "revision": row.get("tokenizer_revision", ""),
                   "fingerprint": row.get("tokenizer_fingerprint", "")})
