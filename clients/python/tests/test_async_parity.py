"""AsyncClient is "the same API as Client, awaited": every public method of
Client has a twin on AsyncClient that takes the same parameters and is awaited
(or async-iterated, where Client's returns an iterator). A method added to
Client alone fails here."""

from __future__ import annotations

import inspect

from rollbox import AsyncClient, Client

# Methods that ask nothing of the service and return an object, on both clients.
NO_REQUEST = {"env", "rollout"}


def _streams(fn: object) -> bool:
    ann = str(inspect.signature(fn).return_annotation)  # type: ignore[arg-type]
    return inspect.isgeneratorfunction(fn) or ann.startswith("Iterator") or ann == "EpisodeStream"


def test_every_client_method_has_an_async_twin() -> None:
    problems = []
    for name, fn in inspect.getmembers(Client, inspect.isfunction):
        if name.startswith("_"):
            continue
        twin = getattr(AsyncClient, name, None)
        if twin is None:
            problems.append(f"AsyncClient.{name} is missing")
            continue
        if name not in NO_REQUEST:
            if _streams(fn) and not inspect.isasyncgenfunction(twin):
                problems.append(f"AsyncClient.{name} is not an async iterator")
            elif not _streams(fn) and not inspect.iscoroutinefunction(twin):
                problems.append(f"AsyncClient.{name} is not a coroutine function")
        params = inspect.signature(twin).parameters
        takes_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for p in inspect.signature(fn).parameters.values():
            if p.name != "self" and p.kind is not p.VAR_KEYWORD and p.name not in params and not takes_kw:
                problems.append(f"AsyncClient.{name} has no parameter {p.name}")
    assert not problems, problems
