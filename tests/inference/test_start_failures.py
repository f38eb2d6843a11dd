"""A replica whose model server cannot start (a NUL byte stored by an older release, no such
program) fails with the reason and gives its GPU share back; the backend goes on."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys

import pytest

from hub_ext.serving.spec import parse_spec

from .harness import service, stack, until


@pytest.mark.parametrize("command", [[sys.executable, "-c", "print(1)\x00"], ["/nonexistent/serve"]],
                         ids=["nul-in-command", "no-such-program"])
def test_a_replica_that_cannot_start_fails_and_frees_its_share(caplog, command):
    failed: list[str] = []

    async def main():
        async with stack() as st:
            spec = dataclasses.replace(parse_spec(service(name="broken")), command=command)
            svc = st.controller.put(spec)
            gone = svc.replica_gone

            def record(r, state, reason):
                failed.append(reason)
                gone(r, state, reason)

            svc.replica_gone = record
            request = asyncio.ensure_future(st.http.get(f"{st.url}/broken/"))  # starts a replica
            await until(lambda: failed, what="a failed replica")
            await st.controller.remove("broken")
            request.cancel()
            with contextlib.suppress(BaseException):
                await request
            await until(lambda: st.allocated_milli() == 0, what="the share given back")

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert failed[0].startswith("could not start "), failed
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
