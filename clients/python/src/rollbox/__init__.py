"""Python client of Rollbox, the rollout sandbox runtime for RL agents.

::

    from rollbox import Client

    client = Client("http://127.0.0.1:7070")
    rollout = client.submit([{"id": "fix-add"}], group_size=8,
                            policy={"base_url": "http://127.0.0.1:8000/v1", "model": "Qwen3-8B"})
    for group in rollout.groups():          # GRPO groups as they complete
        for ep in group:
            print(ep.task_id, ep.reward, ep.advantage)

Rollout mode (:meth:`Client.submit`, streams, groups, export, cancel),
environment mode as a Gymnasium-style environment (:meth:`Client.env`,
:class:`AsyncClient` for asyncio), token-exact training data
(:meth:`Episode.segments`, :meth:`Client.segments`), and typed errors
(:mod:`rollbox.errors`). Standard library only.
"""

from ._http import Retry, RetryPolicy
from .client import AsyncClient, Client, EpisodeStream, Rollout, __version__
from .env import AsyncEnv, Env, normalize_tool_calls
from .errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientStorage,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    RequestTimeout,
    RollboxError,
    ServerError,
    ServiceUnavailable,
    TokenDataUnavailable,
    TransportError,
    Unauthorized,
    UnsupportedMediaType,
)
from .tokens import Segment, segments_of
from .types import Episode, Group, Policy

__all__ = [
    "AsyncClient", "AsyncEnv", "BadRequest", "Client", "Conflict", "Env", "Episode", "EpisodeStream",
    "Forbidden", "Group", "InsufficientStorage", "NotFound", "PayloadTooLarge", "Policy", "ProtocolError",
    "RateLimited", "RequestTimeout", "Retry", "RetryPolicy", "RollboxError", "Rollout", "Segment",
    "ServerError", "ServiceUnavailable", "TokenDataUnavailable", "TransportError", "Unauthorized",
    "UnsupportedMediaType", "__version__", "normalize_tool_calls", "segments_of",
]
