"""Production episodes: import, late outcomes, export (docs/production.md)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from rollbox import AsyncClient, Client


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


def test_the_async_client_imports_scores_and_exports(service, tmp_path) -> None:
    ext = "py-async-" + uuid.uuid4().hex

    async def main() -> tuple[dict, dict, dict, Path]:
        async with AsyncClient(service.url) as c:
            res = await c.import_episodes((e for e in [chat(ext)]), source="pytest-async")
            episode_id = res["episodes"][0]["id"]
            out = await c.add_outcomes(episode_id, iter([{"name": "accepted", "value": True, "at": "2026-01-01T00:00:00Z"}]))
            t = await c.episode(episode_id)
            path = await c.export_episodes(tmp_path / "prod.jsonl", source="pytest-async")
            return res, out, t, path

    res, out, t, path = asyncio.run(main())
    assert res["accepted"] == 1 and res["rejected"] == []
    assert out["added"] == 1 and out["status"] == "pending"
    assert t["episode_id"] == res["episodes"][0]["id"]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["import"]["external_id"] for r in rows] == [ext]
