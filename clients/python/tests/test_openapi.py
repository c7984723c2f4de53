"""The client follows the service's OpenAPI document: every route it serves has a Client method."""

from __future__ import annotations

import json

from conftest import REPO

from rollbox import Client
from rollbox.client import ROUTES


def routes(doc: dict) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops if m in ("get", "post", "put", "patch", "delete")}


def test_every_route_has_a_client_method(client: Client) -> None:
    served = routes(client.openapi())
    assert served == routes(json.loads((REPO / "runtime" / "openapi.json").read_text()))
    missing = sorted(served - ROUTES.keys())
    assert not missing, (f"routes the client does not call: {missing}; add a method to rollbox.Client and the "
                         f"route to ROUTES in clients/python/src/rollbox/client.py")
    gone = sorted(ROUTES.keys() - served)
    assert not gone, f"ROUTES names routes the service no longer has: {gone}"
    for name in set(ROUTES.values()):
        assert callable(getattr(Client, name)), name
    assert "rollbox_http_requests_total" in client.metrics()
