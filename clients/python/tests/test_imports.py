"""Production episodes: import, late outcomes, export (docs/production.md)."""

from __future__ import annotations

import json
import uuid

from rollbox import Client


def chat(ext_id: str) -> dict:
    return {"id": ext_id, "policy_version": "v1", "model": "m",
            "messages": [{"role": "user", "content": "Rename foo to bar; ping ops@example.com"},
                         {"role": "assistant", "content": "Done."}]}


def test_import_outcomes_and_export(client: Client, tmp_path) -> None:
    ext = "py-" + uuid.uuid4().hex
    res = client.import_episodes([chat(ext), {"id": ext + "-bad", "messages": []}], source="pytest")
    assert res["accepted"] == 1 and res["duplicates"] == 0
    assert [(r["line"], r["field"]) for r in res["rejected"]] == [(2, "policy_version")]
    episode_id = res["episodes"][0]["id"]
    assert client.import_episodes([chat(ext)], source="pytest")["duplicates"] == 1

    out = client.add_outcomes(episode_id, [{"name": "accepted", "value": True, "at": "2026-01-01T00:00:00Z"}])
    assert out["status"] == "pending" and out["reward"]["total"] is None and out["reward"]["error_kind"] == "pending"
    again = client.add_outcomes(episode_id, [{"name": "accepted", "value": True, "at": "2026-01-01T00:00:00Z"}])
    assert again["duplicates"] == 1 and again["added"] == 0

    path = client.export_episodes(tmp_path / "prod.jsonl", source="pytest")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["import"]["external_id"] for r in rows] == [ext]
    assert "ops@example.com" not in path.read_text()
    assert rows[0]["redactions"] == [{"kind": "email", "path": "messages[0].content", "count": 1}]
