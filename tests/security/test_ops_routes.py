"""The operator endpoints (every tenant's traffic and recent failures) are not on the public
API port, with a key or without (issue 21, item 3): the API serves them on its ops listener,
on loopback unless told otherwise."""

from __future__ import annotations

import httpx

from batchserve.testing.deployment import Stack
from tests.support import keys

OPS = ("/metrics", "/dashboard", "/dashboard/data")


async def test_the_public_port_has_no_operator_endpoint_and_the_ops_port_has_them(
    stack: Stack,
) -> None:
    stack.start_api()
    async with httpx.AsyncClient(timeout=10) as client:
        for path in OPS:
            for headers in ({}, keys.auth()):
                public = await client.get(f"{stack.url}{path}", headers=headers)
                assert public.status_code == 404, (path, public.text)
            assert (await client.get(f"{stack.ops_url}{path}")).status_code == 200, path
        assert (await client.get(f"{stack.url}/healthz")).status_code == 200  # probes stay
    listening = (stack.log_dir / "api.log").read_text()
    assert f"ops_listening url=http://127.0.0.1:{stack.ops_port}" in listening
