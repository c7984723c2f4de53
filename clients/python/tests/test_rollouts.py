"""Rollout mode against a real `rollbox serve`: submit, stream, groups, resume, cancel, export."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
from conftest import ANSWER_TASK, FILE_TASK, SLOW_TASK, wait_for

from rollbox import Client, Policy


def test_groups_carry_rewards_and_advantages(client: Client, policy_url: str) -> None:
    rollout = client.submit([ANSWER_TASK, FILE_TASK], group_size=4, policy=Policy(policy_url, "fake"))
    groups = list(rollout.groups())
    assert sorted(g.task_id for g in groups) == ["add", "write-file"]
    for g in groups:
        assert g.complete and len(g) == 4
        # The fake plays the right and the wrong conversation twice each.
        assert sorted(g.rewards) == [0.0, 0.0, 1.0, 1.0], g
        assert g.reward_mean == 0.5 and not g.zero_variance
        for ep in g:
            assert ep.end == "finished"
            assert ep.advantage == pytest.approx(ep.reward - 0.5)
    st = rollout.status()
    assert st["state"] == "done" and st["episodes_done"] == 8
    assert rollout.summary()["reward_mean"] == 0.5


def test_tasks_by_id_and_the_stream_offset_resumes(client: Client, policy_url: str) -> None:
    rollout = client.submit(["add"], group_size=6, policy={"base_url": policy_url, "model": "fake"})
    whole = [e.episode_id for e in rollout.episodes()]
    assert len(whole) == 6 and len(set(whole)) == 6
    first = rollout.episodes()
    head = [next(first).episode_id for _ in range(2)]
    assert first.offset == 2
    first.close()
    rest = client.episodes(rollout.id, from_=first.offset)
    tail = [e.episode_id for e in rest]
    assert head + tail == whole
    assert rest.offset == 6
    # follow=False answers what has finished (in the order it finished) and stops.
    assert sorted(e.episode_id for e in rollout.episodes(follow=False)) == sorted(whole)


class CuttingProxy:
    """A TCP proxy that breaks every stream response in the middle of its second NDJSON line."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.cuts = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        up = socket.create_connection(self.target)
        req = c.recv(65536)
        stream = b"stream=1" in req.split(b"\r\n", 1)[0]
        up.sendall(req)
        seen = b""
        try:
            while data := up.recv(4096):
                seen += data
                end = seen.find(b"}\n")  # the end of the first line
                if stream and end >= 0 and len(seen) > end + 200:
                    c.sendall(data[: len(data) - (len(seen) - (end + 200))])
                    self.cuts += 1
                    break
                c.sendall(data)
        except OSError:
            pass
        finally:
            c.close()
            up.close()

    def close(self) -> None:
        self.sock.close()


def test_a_broken_stream_is_resumed_at_its_offset(service, policy_url: str) -> None:
    c = Client(service.url)
    rollout = c.submit(["write-file"], group_size=4, policy={"base_url": policy_url, "model": "fake"})
    rollout.wait(timeout=120)
    whole = [e.episode_id for e in rollout.episodes()]
    # Every stream through the proxy breaks inside its second line: the
    # client reconnects at its offset each time, and never yields a torn line.
    proxy = CuttingProxy(service.url)
    try:
        via = Client(proxy.url, max_retries=20, backoff=0.01)
        got = [e.episode_id for e in via.episodes(rollout.id)]
    finally:
        proxy.close()
    assert got == whole
    assert proxy.cuts >= 2  # one per line but the last, unless a chunk split a line end


def test_cancel_ends_queued_and_running_episodes(client: Client, slow_policy_url: str) -> None:
    rollout = client.submit([SLOW_TASK], group_size=3, policy={"base_url": slow_policy_url, "model": "fake"})
    wait_for(lambda: rollout.status()["state"] == "running")
    st = rollout.cancel()
    assert st["id"] == rollout.id
    st = rollout.wait(timeout=60, poll=0.1)
    assert st["state"] == "cancelled"
    eps = list(rollout.episodes())
    assert len(eps) == 3
    for e in eps:
        assert e.end == "cancelled"
        assert e.reward is None and not e.scored and e.advantage is None


def test_export_writes_whole_files_only(client: Client, policy_url: str, tmp_path: Path) -> None:
    rollout = client.submit(["add"], group_size=2, policy={"base_url": policy_url, "model": "fake"})
    rollout.wait(timeout=60, poll=0.1)
    out = rollout.export(tmp_path / "r.jsonl")
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and {json.loads(x)["rollout_id"] for x in lines} == {rollout.id}
    pq = rollout.export(tmp_path / "r.parquet", format="parquet")
    data = pq.read_bytes()
    assert data[:4] == b"PAR1" and data[-4:] == b"PAR1"
    with pytest.raises(ValueError, match="format 'csv'"):
        rollout.export(tmp_path / "r.csv", format="csv")
    # A refused export leaves nothing behind, not even a partial file.
    from rollbox import NotFound
    with pytest.raises(NotFound):
        client.export("r-does-not-exist", tmp_path / "gone.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "r.parquet"]


def test_rollouts_lists_what_the_service_holds(client: Client, policy_url: str) -> None:
    rollout = client.submit(["add"], group_size=1, policy={"base_url": policy_url, "model": "fake"})
    assert rollout.id in [r["id"] for r in client.rollouts()]
    rollout.wait(timeout=60, poll=0.1)
    assert client.health()["status"] == "ok"
    assert "/v1/rollouts" in client.openapi()["paths"]
