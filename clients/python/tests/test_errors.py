"""Typed errors and retries: against the real service, and against a stub for statuses it cannot be made to answer on demand."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from conftest import ANSWER_TASK, SLOW_TASK

import rollbox
from rollbox import (BadRequest, Client, Conflict, InsufficientStorage, NotFound, RateLimited, ServiceUnavailable,
                     TransportError, Unauthorized)


def test_bad_input_names_the_field(client: Client, policy_url: str) -> None:
    bad = dict(ANSWER_TASK, limits={"max_turns": -1})
    with pytest.raises(BadRequest) as e:
        client.submit([ANSWER_TASK, bad], group_size=1, policy={"base_url": policy_url, "model": "fake"})
    err = e.value
    assert err.status == 400 and err.code == "bad_request"
    assert err.field is not None and err.field.startswith("tasks[1]"), err
    assert "max_turns" in str(err)
    with pytest.raises(BadRequest) as e:
        client.submit(["add"], group_size=-1, policy={"base_url": policy_url, "model": "fake"})
    assert e.value.field == "group_size"
    with pytest.raises(ValueError, match="policy is required"):
        client.submit(["add"], group_size=1)


def test_unknown_ids_are_not_found(client: Client) -> None:
    for call in (lambda: client.status("r-nope"), lambda: client.cancel("r-nope"), lambda: client.episode("e-nope"),
                 lambda: list(client.episodes("r-nope"))):
        with pytest.raises(NotFound) as e:
            call()
        assert e.value.code == "not_found" and e.value.status == 404


def test_a_step_after_the_end_is_a_conflict(client: Client) -> None:
    env = client.env("add")
    env.reset()
    obs, reward, done, info = env.step([{"name": "finish", "arguments": {"answer": "4"}}])
    assert done and reward == 1.0
    with pytest.raises(Conflict) as e:
        env.step([{"name": "bash", "arguments": {"command": "true"}}])
    assert e.value.code == "episode_ended"


def test_unreachable_service_is_a_transport_error() -> None:
    c = Client("http://127.0.0.1:9", max_retries=2, backoff=0.01)
    with pytest.raises(TransportError, match="cannot connect"):
        c.status("r-x")
    assert len(c.retries) == 2


def test_429_is_retried_after_retry_after(start_service, policy_url: str, slow_policy_url: str) -> None:
    # One running and one queued episode fill this service.
    svc = start_service("--max-running", "1", "--max-queued", "1")
    # Two episodes ended just now: the service's Retry-After is estimated
    # from that rate (a second or two), not its 5 s for a service that has
    # ended none.
    warm = Client(svc.url).submit(["add"], group_size=2, policy={"base_url": policy_url, "model": "fake"})
    assert warm.wait(timeout=60, poll=0.05)["state"] == "done"
    policy = {"base_url": slow_policy_url, "model": "fake"}
    first = Client(svc.url).submit([SLOW_TASK], group_size=2, policy=policy)
    impatient = Client(svc.url, max_retries=0)
    with pytest.raises(RateLimited) as e:
        impatient.submit(["add"], group_size=1, policy=policy)
    assert e.value.status == 429 and e.value.code == "overloaded"
    assert e.value.retry_after is not None and e.value.retry_after >= 1
    waited = e.value.retry_after
    # The patient client is refused too, waits the Retry-After it was given,
    # and gets in once the first rollout is cancelled meanwhile.
    threading.Timer(0.5, lambda: Client(svc.url).cancel(first.id)).start()
    patient = Client(svc.url)
    t0 = time.monotonic()
    second = patient.submit(["add"], group_size=1, policy=policy)
    assert time.monotonic() - t0 >= waited
    r = patient.retries[0]
    assert (r.status, r.code, r.path, r.wait) == (429, "overloaded", "/v1/rollouts", waited)
    assert second.wait(timeout=60, poll=0.1)["state"] == "done"


class Stub(BaseHTTPRequestHandler):
    """Answers from a script of (status, headers, body) per path, recording requests."""

    script: dict[str, list[tuple[int, dict[str, str], Any]]] = {}
    seen: list[dict[str, Any]] = []

    def log_message(self, *a: Any) -> None:
        pass

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        Stub.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body})
        queue = Stub.script.get(self.path.split("?")[0], [])
        status, headers, payload = queue.pop(0) if len(queue) > 1 else queue[0]
        data = json.dumps(payload).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer


@pytest.fixture()
def stub() -> Iterator[str]:
    Stub.script, Stub.seen = {}, []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    # shutdown() waits for serve_forever's next poll: 20 ms, not the default 0.5 s.
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def err(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"code": code, "message": message}
    if field:
        e["field"] = field
    return {"error": e}


def test_503_is_retried_honouring_retry_after(stub: str) -> None:
    Stub.script["/v1/rollouts/r1"] = [
        (503, {"Retry-After": "1"}, err("recovering", "the service is recovering")),
        (200, {}, {"id": "r1", "state": "running", "episodes_total": 1, "episodes_done": 0}),
    ]
    c = Client(stub)
    t0 = time.monotonic()
    assert c.status("r1")["state"] == "running"
    assert time.monotonic() - t0 >= 1.0
    assert [(r.status, r.code, r.wait) for r in c.retries] == [(503, "recovering", 1.0)]


def test_retries_stop_at_max_retry_wait(stub: str) -> None:
    Stub.script["/v1/rollouts"] = [(429, {"Retry-After": "300"}, err("overloaded", "full"))]
    c = Client(stub, max_retry_wait=10)
    t0 = time.monotonic()
    with pytest.raises(RateLimited) as e:
        c.submit(["a"], policy={"base_url": "http://x/v1", "model": "m"})
    assert time.monotonic() - t0 < 5 and e.value.retry_after == 300
    assert len(Stub.seen) == 1


def test_507_disk_full_is_raised_at_once(stub: str) -> None:
    Stub.script["/v1/rollouts"] = [(507, {"Retry-After": "30"}, err("insufficient_storage", "the data directory has 10 MiB free, under the 1 GiB reserve"))]
    c = Client(stub)
    with pytest.raises(InsufficientStorage) as e:
        c.submit(["a"], policy={"base_url": "http://x/v1", "model": "m"})
    assert e.value.code == "insufficient_storage" and e.value.retry_after == 30 and "reserve" in e.value.message
    assert len(Stub.seen) == 1 and not c.retries
    Stub.script["/v1/episodes"] = [(503, {"Retry-After": "1"}, err("storage_unavailable", "read-only"))]
    with pytest.raises(ServiceUnavailable):
        Client(stub, max_retries=1).env("a").reset()


def test_json_bodies_and_bearer_tokens(stub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    Stub.script["/v1/rollouts"] = [(201, {}, {"id": "r1", "state": "queued"})]
    Stub.script["/v1/rollouts/r1"] = [(401, {}, err("unauthorized", "a bearer token is required"))]
    c = Client(stub, token="s3cret")
    assert c.submit([{"id": "a"}], 2, {"base_url": "http://x/v1", "model": "m"}).id == "r1"
    sent = Stub.seen[0]
    assert sent["headers"]["Content-Type"] == "application/json"
    assert sent["headers"]["Authorization"] == "Bearer s3cret"
    assert json.loads(sent["body"]) == {"tasks": [{"id": "a"}], "group_size": 2, "policy": {"base_url": "http://x/v1", "model": "m"}}
    with pytest.raises(Unauthorized) as e:
        c.status("r1")
    assert e.value.code == "unauthorized"
    monkeypatch.setenv("ROLLBOX_TOKEN", "from-env")
    Client(stub).submit(["a"], 1, {"base_url": "http://x/v1", "model": "m"})
    assert Stub.seen[-1]["headers"]["Authorization"] == "Bearer from-env"


def test_every_error_class_is_exported_and_typed() -> None:
    for name in ("BadRequest", "Unauthorized", "Forbidden", "NotFound", "RequestTimeout", "Conflict", "PayloadTooLarge",
                 "UnsupportedMediaType", "RateLimited", "ServerError", "ServiceUnavailable", "InsufficientStorage",
                 "TransportError", "ProtocolError", "TokenDataUnavailable"):
        assert issubclass(getattr(rollbox, name), rollbox.RollboxError)


def test_retry_after_forms() -> None:
    from rollbox._http import parse_retry_after
    assert parse_retry_after("3") == 3.0 and parse_retry_after(" 0.5 ") == 0.5 and parse_retry_after("-4") == 0.0
    assert parse_retry_after("nan") is None and parse_retry_after("soon") is None and parse_retry_after("") is None
    assert parse_retry_after("inf") == float("inf")  # longer than any max_retry_wait: raised at once
    assert parse_retry_after("Mon, 30 Nov 2026 00:00:00 GMT") == 0.0  # a date in the past: now
